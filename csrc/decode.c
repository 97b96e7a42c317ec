/* Decoding of a decision reply:
 *
 *     [allowed, deciding, remaining_scaled_0, retry_ms_0, reset_ms_0, ...]
 *
 * The reply comes from a script inside Redis, which a bug, an old script or
 * someone else's data can get wrong, so every value is checked against the
 * contract before the Python layer sees it. The list is read once into C
 * integers, and the result is built from those: nothing that runs while the
 * result is allocated (a garbage-collector callback) can change what was
 * checked.
 */
#include <limits.h>

#include "contract.h"
#include "decode.h"
#include "errors.h"

#define DECODE_HEADER_INTS 2    /* allowed, deciding */
#define DECODE_POLICY_INTS 3    /* remaining_scaled, retry_ms, reset_ms */
#define DECODE_MAX_INTS (DECODE_HEADER_INTS + DECODE_POLICY_INTS * ACCEL_MAX_POLICIES)

enum { REMAINING_SCALED, RETRY_MS, RESET_MS };

static const char *const policy_fields[DECODE_POLICY_INTS] = {
    "remaining_scaled", "retry_ms", "reset_ms"};

/* What reply[position] is, for an error message. */
static PyObject *
field_name(Py_ssize_t position)
{
    if (position == 0) {
        return PyUnicode_FromString("allowed");
    }
    if (position == 1) {
        return PyUnicode_FromString("deciding");
    }
    Py_ssize_t offset = position - DECODE_HEADER_INTS;
    return PyUnicode_FromFormat("%s of policy %zd", policy_fields[offset % DECODE_POLICY_INTS],
                                offset / DECODE_POLICY_INTS);
}

/* "decode_decision() reply[<position>] (<field>) must be <expected>, got <value>" */
static int
value_error(Py_ssize_t position, PyObject *value, const char *expected)
{
    PyObject *field = field_name(position);
    PyObject *quoted = field == NULL ? NULL : accel_quote(value);
    if (quoted != NULL) {
        PyErr_Format(PyExc_ValueError, "decode_decision() reply[%zd] (%U) must be %s, got %U",
                     position, field, expected, quoted);
    }
    Py_XDECREF(field);
    Py_XDECREF(quoted);
    return -1;
}

/* The range of reply[position], which may depend on the values before it. */
static int
check_range(Py_ssize_t position, PyObject *value, const long long *values, int policies)
{
    long long number = values[position];
    if (position == 0) {
        return number == 0 || number == 1 ? 0 : value_error(position, value, "0 or 1");
    }
    if (position == 1) {
        if (number >= 0 && number < policies) {
            return 0;
        }
        PyObject *quoted = accel_quote(value);
        if (quoted != NULL) {
            PyErr_Format(PyExc_ValueError,
                         "decode_decision() reply[1] (deciding) must be a policy index "
                         "0..%d, got %U",
                         policies - 1, quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    switch ((position - DECODE_HEADER_INTS) % DECODE_POLICY_INTS) {
    case REMAINING_SCALED:
        if (number < 0 || number > ACCEL_MAX_SCALED) {
            return value_error(position, value, "0..9007199254740992");
        }
        return 0;
    case RETRY_MS:
        if (values[0] == 1 && number != 0) {
            return value_error(position, value, "0 on an admission");
        }
        if (number < -1 || number > ACCEL_MAX_SCALED) {
            return value_error(position, value, "-1 (permanent) or 0..9007199254740992");
        }
        return 0;
    default: /* RESET_MS */
        if (number == -1 && values[position - 1] != -1) {
            return value_error(position, value,
                               "0..9007199254740992 (-1 only for a permanent denial)");
        }
        if (number < -1 || number > ACCEL_MAX_SCALED) {
            return value_error(position, value, "-1 (none) or 0..9007199254740992");
        }
        return 0;
    }
}

/* Whether policy a decides before policy b: on a denial the one with the
 * longest retry, -1 (permanent) counting as infinite; on an admission the
 * one with the fewest remaining. */
static int
decides_before(const long long *values, int allowed, int a, int b)
{
    const long long *policy_a = values + DECODE_HEADER_INTS + DECODE_POLICY_INTS * a;
    const long long *policy_b = values + DECODE_HEADER_INTS + DECODE_POLICY_INTS * b;
    if (allowed) {
        return policy_a[REMAINING_SCALED] < policy_b[REMAINING_SCALED];
    }
    if (policy_b[RETRY_MS] == -1) {
        return 0;
    }
    return policy_a[RETRY_MS] == -1 || policy_a[RETRY_MS] > policy_b[RETRY_MS];
}

/* The deciding index must be the one the contract's rule picks, ties going
 * to the lowest index. */
static int
check_deciding(const long long *values, int policies)
{
    int allowed = (int)values[0];
    int deciding = (int)values[1];
    int expected = 0;
    for (int i = 1; i < policies; i++) {
        if (decides_before(values, allowed, i, expected)) {
            expected = i;
        }
    }
    if (deciding == expected) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "decode_decision() reply[1] (deciding) is %d, but policy %d decides %s: it "
                 "has the %s",
                 deciding, expected, allowed ? "this admission" : "this denial",
                 allowed ? "fewest remaining" : "longest retry");
    return -1;
}

static int
parse_policies(PyObject *value)
{
    int overflow;
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "decode_decision() policies must be int, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    long long policies = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || policies < 1 || policies > ACCEL_MAX_POLICIES) {
        PyObject *quoted = accel_quote(value);
        if (quoted != NULL) {
            PyErr_Format(PyExc_ValueError, "decode_decision() policies must be 1..16, got %U",
                         quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    return (int)policies;
}

/* Read and check the reply into values; returns -1 with a ValueError. */
static int
read_reply(PyObject *reply, int policies, long long *values)
{
    Py_ssize_t expected_size = DECODE_HEADER_INTS + (Py_ssize_t)DECODE_POLICY_INTS * policies;
    if (!PyList_Check(reply)) {
        PyObject *quoted = accel_quote(reply);
        if (quoted != NULL) {
            PyErr_Format(PyExc_ValueError,
                         "decode_decision() reply must be a list of %zd ints, got %.100s %U",
                         expected_size, Py_TYPE(reply)->tp_name, quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    if (PyList_GET_SIZE(reply) != expected_size) {
        PyErr_Format(PyExc_ValueError,
                     "decode_decision() reply must hold %zd ints (2 + 3 per policy, %d "
                     "policies), got %zd",
                     expected_size, policies, PyList_GET_SIZE(reply));
        return -1;
    }
    /* No Python code runs in this loop before an error, so the list cannot
     * change under it. */
    for (Py_ssize_t position = 0; position < expected_size; position++) {
        PyObject *item = PyList_GET_ITEM(reply, position);
        int overflow;
        if (!PyLong_Check(item) || PyBool_Check(item)) {
            return value_error(position, item, "an int");
        }
        values[position] = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow) {
            /* Out of every range: check_range names the right one. */
            values[position] = overflow > 0 ? LLONG_MAX : LLONG_MIN;
        }
        if (check_range(position, item, values, policies) < 0) {
            return -1;
        }
    }
    return check_deciding(values, policies);
}

static PyObject *
build_result(const long long *values, int policies)
{
    PyObject *states = PyTuple_New(policies);
    if (states == NULL) {
        return NULL;
    }
    for (int i = 0; i < policies; i++) {
        const long long *policy = values + DECODE_HEADER_INTS + DECODE_POLICY_INTS * i;
        PyObject *state = Py_BuildValue("(LLL)", policy[REMAINING_SCALED], policy[RETRY_MS],
                                        policy[RESET_MS]);
        if (state == NULL) {
            Py_DECREF(states);
            return NULL;
        }
        PyTuple_SET_ITEM(states, i, state);
    }
    return Py_BuildValue("(NLN)", PyBool_FromLong((long)values[0]), values[1], states);
}

PyObject *
decode_decision(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    long long values[DECODE_MAX_INTS];

    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "decode_decision() takes exactly 2 arguments (reply, policies) "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    /* policies first: a wrong one is the caller's bug, not the reply's. */
    int policies = parse_policies(args[1]);
    if (policies < 0) {
        return NULL;
    }
    if (read_reply(args[0], policies, values) < 0) {
        return NULL;
    }
    return build_result(values, policies);
}
