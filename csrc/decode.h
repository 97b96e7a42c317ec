/* Decoding of the decision reply shared by every algorithm's Lua script. */
#ifndef MODERATO_DECODE_H
#define MODERATO_DECODE_H

#include "compat.h"

/* decode_decision(reply, policies, /)
 * -> (allowed, deciding, ((remaining_scaled, retry_ms, reset_ms), ...)) */
PyObject *decode_decision(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_DECODE_H */
