/* Decoding of the decision reply shared by every algorithm's Lua script. */
#ifndef MODERATO_DECODE_H
#define MODERATO_DECODE_H

#include "compat.h"

/* decode_decision(reply, policies, /)
 * -> (allowed, deciding, ((remaining_scaled, retry_ms, reset_ms), ...)) */
PyObject *decode_decision(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* The field names check_result sets, interned once per module object. */
#define RESULT_FIELD_COUNT 11
typedef struct {
    PyObject *field[RESULT_FIELD_COUNT];
} decode_state;

int decode_init_state(decode_state *state);
void decode_clear_state(decode_state *state);

/* check_result(reply, plan, /) -> CheckResult
 * plan = (CheckResult, PolicyState, rate, algorithm, ((limit, window_s), ...)):
 * the reply checked as decode_decision checks it, then built straight into
 * the public result objects (moderato.results). The module object must
 * hold a decode_state as its state. */
PyObject *decode_check_result(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_DECODE_H */
