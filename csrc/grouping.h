/* A loop turn's checks joined into batched script calls on one Redis server,
 * in C (grouping.c): the Grouping and BatchedReply types, the steps of
 * moderato/redis/grouping.py's group_checks and BatchedReply. */
#ifndef MODERATO_GROUPING_H
#define MODERATO_GROUPING_H

#include "results.h"

/* Create the Grouping and BatchedReply types of this module object and add
 * them to it. 0, or -1 with an exception set. */
int grouping_add_to_module(PyObject *module);

#endif /* MODERATO_GROUPING_H */
