/* The asyncio limiter's commonest check over one Redis server in one C call
 * (fast_aredis.c): the per-limiter state a FastMethod reads, the check
 * itself, which fast_check.c's FastMethod hands it, and the awaitable it
 * returns. */
#ifndef MODERATO_FAST_AREDIS_H
#define MODERATO_FAST_AREDIS_H

#include "results.h"

/* The check of limiter (whose _fast_check is `check`, an
 * AsyncRedisFastCheck) for a text key and rate, a text scope (NULL: the
 * global one), a text or None algorithm and any shadow: 1 when taken (*out
 * the PendingCheck awaiting its reply, a new reference, or NULL with the
 * error set), 0 when declined (nothing sent, no exception set: the Python
 * method's). */
int fast_aredis_check(accel_state *state, PyObject *module, PyObject *limiter, PyObject *check,
                      PyObject *key, PyObject *rate, PyObject *scope, PyObject *algorithm,
                      PyObject *shadow, PyObject **out);

/* Create the AsyncRedisFastCheck and PendingCheck types in this module's
 * state and add them to it. 0, or -1 with an exception set. */
int fast_aredis_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_AREDIS_H */
