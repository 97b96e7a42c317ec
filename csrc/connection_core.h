/* The per-command path of moderato's asyncio Redis connection in C
 * (connection_core.c): ConnectionCore, the base of
 * moderato/redis/connection.py's RedisConnection. */
#ifndef MODERATO_CONNECTION_CORE_H
#define MODERATO_CONNECTION_CORE_H

#include "heap_type.h"
#include "results.h"

/* The names the core and its Grouping (grouping.c: the turn's checks joined into
 * batched calls) read, each X(prefix, NAME, "text"), listed once: interned into the
 * module state's core_names when the module is made, CNAME(state, NAME) in both. */
#define CORE_NAMES(X, P)                                                                 \
    X(P, APPEND, "append")                                                               \
    X(P, POPLEFT, "popleft")                                                             \
    X(P, FEED, "feed")                                                                   \
    X(P, GETS, "gets")                                                                   \
    X(P, DONE, "done")                                                                   \
    X(P, SET_RESULT, "set_result")                                                       \
    X(P, SET_EXCEPTION, "set_exception")                                                 \
    X(P, WRITE, "write")                                                                 \
    X(P, FLUSH, "_flush")                                                                \
    X(P, ON_TIMER, "_on_timer")                                                          \
    X(P, RESEND, "_resend_after_noscript")                                               \
    X(P, READ_FAILED, "_read_failed")                                                    \
    X(P, CLOSED_ERROR, "_closed_error")                                                  \
    X(P, MESSAGE, "message")                                                             \
    X(P, NOSCRIPT, "NOSCRIPT")                                                           \
    X(P, LOOP, "loop")                                                                   \
    X(P, SENT, "sent")                                                                   \
    X(P, JOIN, "join")                                                                   \
    X(P, SHA, "sha")                                                                     \
    /* and what only its Grouping reads */                                               \
    X(P, SOURCE, "source")                                                               \
    X(P, ADD_DONE_CALLBACK, "add_done_callback")                                         \
    X(P, POP, "pop")                                                                     \
    X(P, WRITE_BUFFER, "_write_buffer")                                                  \
    X(P, HELD, "_held")                                                                  \
    X(P, BATCHED_TOTAL, "_batched_total")                                                \
    X(P, SCRIPTS, "_scripts")                                                            \
    X(P, LOADS, "_loads")                                                                \
    X(P, LOADED_FORMS, "_loaded_forms")                                                  \
    X(P, PENDING, "_pending")                                                            \
    X(P, FUTURE_TYPE, "_future_type")                                                    \
    X(P, LOOP_ATTRIBUTE, "_loop")                                                        \
    X(P, SCRIPT, "SCRIPT")                                                               \
    X(P, LOAD, "LOAD")                                                                   \
    X(P, REPEAT, "=")                                                                    \
    X(P, OWN_KEYS, "K")                                                                  \
    X(P, OWN_COST, "C")                                                                  \
    X(P, OWN_KEYS_AND_COST, "KC")

ACCEL_NAME_ENUMS(CORE_NAMES, CNAME_, CNAME_END);

#define CNAME(state, name) ((state)->core_names[CNAME_##name])

/* Create the ConnectionCore type and the names it reads in this module's
 * state and add the type to it. 0, or -1 with an exception set. */
int connection_core_add_to_module(PyObject *module);

/* Whether connection is a ConnectionCore that joins its turns (_group set): its
 * send_script then takes a check unencoded (payload None). */
int connection_core_joins(accel_state *state, PyObject *connection);

#endif /* MODERATO_CONNECTION_CORE_H */
