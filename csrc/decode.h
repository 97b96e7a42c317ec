/* Decoding of the decision reply shared by every algorithm's Lua script. */
#ifndef MODERATO_DECODE_H
#define MODERATO_DECODE_H

#include "compat.h"

/* decode_decision(reply, policies, /)
 * -> (allowed, deciding, ((remaining_scaled, retry_ms, reset_ms), ...)) */
PyObject *decode_decision(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* check_result(reply, plan, /) -> CheckResult
 * plan = (CheckResult, PolicyState, rate, algorithm, ((limit, window_s), ...)):
 * the reply checked as decode_decision checks it, then built straight into
 * the public result records (results.h). The module object must hold an
 * accel_state as its state. */
PyObject *decode_check_result(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_DECODE_H */
