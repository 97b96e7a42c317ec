/* A decorated route's per-request steps in C (fast_route.c): the headers
 * middleware's send wrapper (HeaderSenders, made once, and the HeaderSender
 * it makes per request, which adds the request's decision headers to its
 * response start), and RouteArguments, a one-limit route's check arguments
 * from what its first request worked out (stack.alone_arguments). */
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
    X(X_RESET, "x-ratelimit-reset", 1)                                                   \
    X(EMPTY, "", 0)                                                                      \
    X(EXEMPT_WHEN, "exempt_when", 0)                                                     \
    X(ROUTER, "router", 0)                                                               \
    X(APP_ROOT_PATH, "app_root_path", 0)                                                 \
    X(ROOT_PATH, "root_path", 0)                                                         \
    X(ENDPOINT, "endpoint", 0)                                                           \
    X(METHOD, "method", 0)                                                               \
    X(ROUTES, "routes", 0)                                                               \
    X(DEPENDENCY_OVERRIDES, "dependency_overrides", 0)                                   \
    X(LIMITER, "limiter", 0)                                                             \
    X(RATE, "rate", 0)                                                                   \
    X(KEY, "key", 0)                                                                     \
    X(TENANT, "tenant", 0)                                                               \
    X(COST, "cost", 0)                                                                   \
    X(API_KEY_HEADER, "api_key_header", 0)                                               \
    X(RULES, "rules", 0)                                                                 \
    X(TRUSTED_PROXIES, "trusted_proxies", 0)                                             \
    X(CLIENT, "client", 0)                                                               \
    X(SCOPE, "scope", 0)

/* Create the HeaderSenders, HeaderSender and RouteArguments types and the names they read in
 * this module's state and add the types to it. 0, or -1 with an exception
 * set. */
int fast_route_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_ROUTE_H */
