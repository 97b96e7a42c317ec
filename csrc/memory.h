/* The in-process store behind memory://: the decision scripts' math over a
 * bounded hash table of the same keys, in C. */
#ifndef MODERATO_MEMORY_H
#define MODERATO_MEMORY_H

#include "compat.h"

/* Create the MemoryStore type for this module object and add it, with the
 * tuple MEMORY_ALGORITHMS of the algorithms it implements. 0, or -1 with an
 * exception set. */
int memory_add_to_module(PyObject *module);

#endif /* MODERATO_MEMORY_H */
