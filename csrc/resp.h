/* RESP2 encoding of Redis commands: one exact-size bytes object per call. */
#ifndef MODERATO_RESP_H
#define MODERATO_RESP_H

#include "compat.h"

/* encode_command(*args) -> bytes */
PyObject *resp_encode_command(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* encode_evalsha(sha, keys, args, /) -> bytes */
PyObject *resp_encode_evalsha(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* len(encode_evalsha(sha, keys, args)) for any 40-digit sha, without writing it
 * (what a check's EVALSHA will take in a batch's bytes bound); -1 with the error
 * encode_evalsha would raise. */
Py_ssize_t resp_evalsha_size(PyObject *keys, PyObject *args);

/* The last exact tuple of arguments resp_evalsha_size_memo measured (borrowed: it
 * must outlive the memo's use) and their framed size; {NULL, 0} to begin. */
typedef struct {
    PyObject *args;
    Py_ssize_t size;
} resp_size_memo;

/* resp_evalsha_size, the arguments' size taken from memo when args is the exact tuple
 * it last measured (a turn's checks of one plan send one tuple), memo updated. */
Py_ssize_t resp_evalsha_size_memo(PyObject *keys, PyObject *args, resp_size_memo *memo);

/* evalsha_size(keys, args, /) -> int */
PyObject *resp_evalsha_size_function(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_RESP_H */
