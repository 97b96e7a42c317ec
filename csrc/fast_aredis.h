/* The asyncio limiter's commonest check over one Redis server in one C call
 * (fast_aredis.c): the per-limiter state a FastMethod reads, the check
 * itself, which fast_check.c's FastMethod hands it, and the awaitable it
 * returns. */
#ifndef MODERATO_FAST_AREDIS_H
#define MODERATO_FAST_AREDIS_H

#include "fast_redis.h"
#include "results.h"

/* Send the request of limiter's check (fast_redis_check built it; the
 * caller releases it) on a connection of this loop's pool: 2 when sent
 * (*out the PendingCheck awaiting its reply, a new reference, or NULL with
 * the error set), 0 when declined (nothing sent, no exception set: the
 * Python method's). */
int fast_aredis_send(accel_state *state, PyObject *limiter, redis_check_object *check,
                     const redis_request *request, PyObject *key, PyObject *shadow,
                     PyObject **out);

/* Create the AsyncRedisFastCheck and PendingCheck types in this module's
 * state and add them to it. 0, or -1 with an exception set. */
int fast_aredis_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_AREDIS_H */
