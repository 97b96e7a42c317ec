/* Redis keys: building them from a decision's parts, the pattern matching an
 * identity's keys, and their cluster slot. */
#ifndef MODERATO_KEYS_H
#define MODERATO_KEYS_H

#include "compat.h"

/* build_keys(prefix, algorithm, tenant, scope, identity, windows_s, /, secret=None)
 * -> list[bytes] */
PyObject *keys_build(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames);

/* key_pattern(prefix, tenant, scope, identity, /, secret=None) -> bytes */
PyObject *keys_pattern(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames);

/* key_slot(key, /) -> int */
PyObject *keys_slot(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_KEYS_H */
