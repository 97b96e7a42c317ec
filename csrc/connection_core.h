/* The per-command path of moderato's asyncio Redis connection in C
 * (connection_core.c): ConnectionCore, the base of
 * moderato/redis/connection.py's RedisConnection. */
#ifndef MODERATO_CONNECTION_CORE_H
#define MODERATO_CONNECTION_CORE_H

#include "results.h"

/* Create the ConnectionCore type and the names it reads in this module's
 * state and add the type to it. 0, or -1 with an exception set. */
int connection_core_add_to_module(PyObject *module);

/* Whether connection is a ConnectionCore that joins its turns (_group set): its
 * send_script then takes a check unencoded (payload None). */
int connection_core_joins(accel_state *state, PyObject *connection);

#endif /* MODERATO_CONNECTION_CORE_H */
