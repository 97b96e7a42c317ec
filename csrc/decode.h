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

/* check_result's check of a plan; *policies, how many rates it holds. 0, or
 * -1 with the TypeError check_result raises for it. */
int decode_check_plan(PyObject *module, PyObject *plan, int *policies);

/* check_result(reply, plan) for a reply of these integers (2 + 3 per
 * policy, as many policies as the plan's rates) and a plan decode_check_plan
 * took: the same result, or NULL with the same error. */
PyObject *decode_values_result(PyObject *module, PyObject *plan, const long long *values,
                               int policies);

#endif /* MODERATO_DECODE_H */
