/* Parsing of rate strings such as "100/minute" or "10/second;1000/day". */
#ifndef MODERATO_RATE_H
#define MODERATO_RATE_H

#include "compat.h"

/* parse_rate(text, /) -> tuple[tuple[int, int], ...] of (limit, window_s) */
PyObject *rate_parse(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_RATE_H */
