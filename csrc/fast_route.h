/* The headers middleware's send wrapper in C (fast_route.c): HeaderSenders,
 * made once, and the HeaderSender it makes per request, which adds the
 * request's decision headers to its response start. */
#ifndef MODERATO_FAST_ROUTE_H
#define MODERATO_FAST_ROUTE_H

#include "results.h"

/* The names fast_route.c reads (the state's route_names, ROUTE_NAME_COUNT):
 * str, then the legacy headers' names as bytes. */
#define ROUTE_NAMES(X)                                                                   \
    X(TYPE, "type", 0)                                                                   \
    X(HEADERS, "headers", 0)                                                             \
    X(START, "http.response.start", 0)                                                   \
    X(LOWER, "lower", 0)                                                                 \
    X(GET, "get", 0)                                                                     \
    X(LEGACY, "legacy", 0)                                                               \
    X(X_LIMIT, "x-ratelimit-limit", 1)                                                   \
    X(X_REMAINING, "x-ratelimit-remaining", 1)                                           \
    X(X_RESET, "x-ratelimit-reset", 1)

/* Create the HeaderSenders and HeaderSender types and the names they read in
 * this module's state and add the types to it. 0, or -1 with an exception
 * set. */
int fast_route_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_ROUTE_H */
