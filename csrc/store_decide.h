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
/* decide()'s arguments parsed once for a caller that repeats them with other
 * keys (fast_check.c): the algorithm's name, keys (any of the keys the
 * arguments go with: only their number and distinctness are checked) and
 * args as decide() takes them. NULL with the error decide() would raise for
 * them. */
typedef struct store_decision store_decision;
store_decision *store_decision_new(PyObject *algorithm, PyObject *keys, PyObject *args);
void store_decision_free(store_decision *decision);
/* How many policies (base keys) it decides. */
int store_decision_policies(const store_decision *decision);
/* decide(algorithm, keys, args, now_ms) on a MemoryStore with those parsed
 * arguments and these base keys (as many as the policies, distinct as the
 * ones it was parsed with), the reply's integers into values (2 + 3 per
 * policy): 0, or -1 with the error decide() raises. */
int store_decide_with(PyObject *store, const store_decision *decision, const char *const *bases,
                      const Py_ssize_t *base_sizes, int64_t now_ms, long long *values);

/* delete_matching(): Redis's glob rules (store_glob.c). */
PyObject *store_delete_matching(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* dump() and load(), for tests (store_debug.c). */
PyObject *store_dump(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *store_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_STORE_DECIDE_H */
