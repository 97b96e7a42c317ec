/* memory://'s commonest check in one C call (fast_check.c): the method
 * descriptor a limiter class's check_with_info becomes, the per-limiter
 * state it reads, and the completed awaitable the asyncio limiter returns. */
#ifndef MODERATO_FAST_CHECK_H
#define MODERATO_FAST_CHECK_H

#include "results.h"

/* Create the three types for this module object, keep them and the names
 * they read in its state and add the types to it. 0, or -1 with an
 * exception set. */
int fast_check_add_to_module(PyObject *module);

#endif /* MODERATO_FAST_CHECK_H */
