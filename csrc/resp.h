/* RESP2 encoding of Redis commands: one exact-size bytes object per call. */
#ifndef MODERATO_RESP_H
#define MODERATO_RESP_H

#include "compat.h"

/* encode_command(*args) -> bytes */
PyObject *resp_encode_command(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* encode_evalsha(sha, keys, args, /) -> bytes */
PyObject *resp_encode_evalsha(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_RESP_H */
