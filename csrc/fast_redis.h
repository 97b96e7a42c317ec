/* The blocking limiter's commonest check over one Redis server in one C
 * call (fast_redis.c): the per-limiter state a FastMethod reads, and the
 * check itself, which fast_check.c's FastMethod hands it. */
#ifndef MODERATO_FAST_REDIS_H
#define MODERATO_FAST_REDIS_H

#include "fast_common.h"
#include "results.h"

/* The attribute and method names both one-call checks over Redis read (in
 * the module state's redis_names; fast_redis.c interns them). */
#define REDIS_NAMES(X)                                                                   \
    X(METRICS, "metrics")                                                                \
    X(RECORDER, "recorder")                                                              \
    X(SETTLED, "settled")                                                                \
    X(ACTIVE, "active")                                                                  \
    X(PLANS, "_plans")                                                                   \
    X(SCRIPT_NAME, "script_name")                                                        \
    X(KEY_TAG, "key_tag")                                                                \
    X(WINDOWS_S, "windows_s")                                                            \
    X(UNIT_ARGS, "unit_args")                                                            \
    X(RESULT_SHAPE, "result_shape")                                                      \
    X(SHA, "sha")                                                                        \
    X(EMPTY, "")                                                                         \
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
    X(SHADOW, "shadow")                                                                  \
    X(POOLS, "_pools")                                                                   \
    X(ONLY, "only")                                                                      \
    X(BATCHING, "batching")                                                              \
    X(USABLE, "usable")                                                                  \
    X(BATCH_OPEN, "batch_open")                                                          \
    X(PENDING, "_pending")                                                               \
    X(PICK, "pick")                                                                      \
    X(SEND_SCRIPT, "send_script")

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
    PyObject *rest;        /* blocking: rest(limiter, plan, scope, shadow, connection,
                              taken_at, keys, data, error); asyncio: get_running_loop */
    double idle_check_after_s; /* blocking only */
} redis_check_object;

/* Every object member of a redis_check_object: X(member) each. */
#define REDIS_CHECK_MEMBERS(X) FAST_LIMITER_MEMBERS(X) X(client) X(load_script) X(rest)

/* Whether owner.<name> is `wanted` (by identity): 1 or 0, never an exception. */
int fast_redis_attribute_is(PyObject *owner, PyObject *name, PyObject *wanted);

/* The breaker settled and no outage being logged. */
int fast_redis_quiet(accel_state *state, redis_check_object *check);

/* The check's plan, a new reference, or NULL (declined, no exception). */
PyObject *fast_redis_find_plan(accel_state *state, redis_check_object *check, PyObject *rate,
                               PyObject *algorithm);

/* The plan's compiled fields (RPLAN_*), a borrowed tuple, or NULL (declined,
 * no exception). */
PyObject *fast_redis_compiled_plan(accel_state *state, redis_check_object *check,
                                   PyObject *plan);

/* The check's keys (*keys_out, a new reference, or NULL) and its EVALSHA's bytes
 * (returned, a new reference) from the plan's compiled fields: NULL with an
 * exception set when a key part or the encoding fails (*keys_out may be set). */
PyObject *fast_redis_payload(accel_state *state, PyObject *module, redis_check_object *check,
                             PyObject *compiled, PyObject *scope, PyObject *key,
                             PyObject **keys_out);

/* The check of limiter (whose _fast_check is `check`, a RedisFastCheck)
 * for a text key and rate, a text scope (NULL: the global one), a text or
 * None algorithm and any shadow: 1 when taken (*out the result, a new
 * reference, or NULL with the error set), 0 when declined (nothing sent,
 * no exception set: the Python method's). */
int fast_redis_check(accel_state *state, PyObject *module, PyObject *limiter, PyObject *check,
                     PyObject *key, PyObject *rate, PyObject *scope, PyObject *algorithm,
                     PyObject *shadow, PyObject **out);

/* Create the RedisFastCheck type and the names it reads in this module's
 * state and add the type to it. 0, or -1 with an exception set. */
int fast_redis_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_REDIS_H */
