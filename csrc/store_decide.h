/* The top of memory://'s headers: the methods of the MemoryStore type
 * (memory.c) defined in files of their own, and the algorithms' table. */
#ifndef MODERATO_STORE_DECIDE_H
#define MODERATO_STORE_DECIDE_H

#include "store_algorithms.h"

/* Every algorithm, in STORE_ALGORITHM_NAMES' order (store_decide.c). */
extern const memory_algorithm *const store_algorithms[];
extern const int store_algorithm_count;

/* decide(): one decision (store_decide.c). */
PyObject *store_decide(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* delete_matching(): Redis's glob rules (store_glob.c). */
PyObject *store_delete_matching(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* dump() and load(), for tests (store_debug.c). */
PyObject *store_dump(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *store_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_STORE_DECIDE_H */
