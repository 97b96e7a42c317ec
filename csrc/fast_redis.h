/* The blocking limiter's commonest check over one Redis server in one C
 * call (fast_redis.c): the per-limiter state a FastMethod reads, and the
 * check itself, which fast_check.c's FastMethod hands it. */
#ifndef MODERATO_FAST_REDIS_H
#define MODERATO_FAST_REDIS_H

#include "fast_common.h"
#include "results.h"

/* The attribute and method names the one-call checks over Redis read
 * beyond fast_common.h's FAST_NAMES (in the module state's redis_names;
 * fast_redis.c interns them). */
#define REDIS_NAMES(X)                                                                   \
    X(SHA, "sha")                                                                        \
    X(IDLE, "_idle")                                                                     \
    X(POOL_GENERATION, "_generation")                                                    \
    X(WAITERS, "_waiters")                                                               \
    X(HAND_OVER, "_hand_over")                                                           \
    X(GIVE, "_give")                                                                     \
    X(GENERATION, "generation")                                                          \
    X(IDLE_SINCE, "idle_since")                                                          \
    X(BUDGET_S, "budget_s")                                                              \
    X(RETIMED, "_retimed")                                                               \
    X(KERNEL_TIMEOUTS, "_kernel_timeouts")                                               \
    X(SOCK, "_sock")                                                                     \
    X(FILENO, "fileno")                                                                  \
    X(POP, "pop")                                                                        \
    X(APPEND, "append")                                                                  \
    X(POOLS, "_pools")                                                                   \
    X(ONLY, "only")                                                                      \
    X(BATCHING, "batching")                                                              \
    X(USABLE, "usable")                                                                  \
    X(BATCH_OPEN, "batch_open")                                                          \
    X(PENDING, "_pending")                                                               \
    X(PICK, "pick")                                                                      \
    X(SEND_SCRIPT, "send_script")                                                        \
    X(ENTRIES, "_entries")

#define REDIS_NAME_ENUM(name, text) RNAME_##name,
enum { REDIS_NAMES(REDIS_NAME_ENUM) RNAME_END };
#undef REDIS_NAME_ENUM

#define NAME(state, name) ((state)->redis_names[RNAME_##name])


/* A compiled plan: (sha, key_tag, windows_s, unit_args, result_shape, script). */
enum { RPLAN_SHA, RPLAN_TAG, RPLAN_WINDOWS, RPLAN_ARGS, RPLAN_SHAPE, RPLAN_SCRIPT, RPLAN_FIELDS };

/* What one limiter's one-call checks over one Redis server read: a
 * RedisFastCheck (the blocking limiter's) or an AsyncRedisFastCheck (the
 * asyncio limiter's, fast_aredis.c), one layout: the head every one-call
 * check's object begins with (fast_common.h), then its own. The head's
 * finish is, for the asyncio limiter's, settle(limiter, plan, key, scope,
 * shadow, reply, error). */
typedef struct {
    FAST_LIMITER_HEAD
    PyObject *client;      /* the backend's RedisClient */
    PyObject *load_script; /* load_script(name) -> Script */
    union {
        PyObject *rest; /* blocking: rest(limiter, plan, scope, shadow, connection, taken_at,
                           keys, data, error) */
        PyObject *get_running_loop; /* asyncio: asyncio.get_running_loop */
    };
    double idle_check_after_s; /* blocking only */
    PyObject *cache;       /* asyncio: the backend's DenialCache, or None; blocking: NULL */
} redis_check_object;

/* Every object member of a redis_check_object: X(member) each. */
#define REDIS_CHECK_MEMBERS(X)                                                           \
    FAST_LIMITER_MEMBERS(X) X(client) X(load_script) X(rest) X(cache)

/* The constructors' object keywords, in order, each the member it sets: the
 * blocking check's (then idle_check_after_s, a number) and the asyncio
 * check's. */
#define REDIS_CHECK_ARGUMENTS(X) FAST_LIMITER_ARGUMENTS(X) X(client) X(load_script) X(rest)
#define AREDIS_CHECK_ARGUMENTS(X)                                                        \
    FAST_LIMITER_ARGUMENTS(X) X(client) X(load_script) X(get_running_loop) X(cache)

/* What a check over Redis sends, built before anything is sent. */
typedef struct {
    PyObject *scope;    /* the check's, or the global one (borrowed) */
    PyObject *plan;     /* each of the rest a new reference, or NULL */
    PyObject *compiled; /* the plan's compiled fields (RPLAN_*) */
    PyObject *keys;
    PyObject *payload;  /* the EVALSHA's bytes; None for the asyncio check, which
                         * encodes it once it knows its connection */
} redis_request;

/* The check of limiter (whose _fast_check is `check`, a RedisFastCheck or
 * an AsyncRedisFastCheck) for a text key and rate, a text scope (NULL: the
 * global one), a text or None algorithm and any shadow, when the limiter's
 * state lets it take the one-call path (fast_limiter_allows) and a plan is
 * made for the rate: its request built, then sent the blocking client's way
 * (here) or the asyncio one's (fast_aredis_send). 1 when taken by the
 * blocking check (*out the result, a new reference, or NULL with the error
 * set), 2 when taken by the asyncio one (*out the PendingCheck awaiting its
 * reply), 0 when declined (nothing sent, no exception set: the Python
 * method's). */
int fast_redis_check(accel_state *state, PyObject *module, PyObject *limiter, PyObject *check,
                     PyObject *key, PyObject *rate, PyObject *scope, PyObject *algorithm,
                     PyObject *shadow, PyObject **out);

/* Create the RedisFastCheck type and the names it reads in this module's
 * state and add the type to it. 0, or -1 with an exception set. */
int fast_redis_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_REDIS_H */
