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
#include "results.h"
#include "sequence.h"

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

/* "<function> reply[<position>] (<field>) must be <expected>, got <value>" */
static int
value_error(const char *function, Py_ssize_t position, PyObject *value, const char *expected)
{
    PyObject *field = field_name(position);
    PyObject *quoted = field == NULL ? NULL : accel_quote(value);
    if (quoted != NULL) {
        PyErr_Format(PyExc_ValueError, "%s reply[%zd] (%U) must be %s, got %U", function,
                     position, field, expected, quoted);
    }
    Py_XDECREF(field);
    Py_XDECREF(quoted);
    return -1;
}

/* The range of reply[position], which may depend on the values before it. */
static int
check_range(const char *function, Py_ssize_t position, PyObject *value, const long long *values, int policies)
{
    long long number = values[position];
    if (position == 0) {
        return number == 0 || number == 1 ? 0 : value_error(function, position, value, "0 or 1");
    }
    if (position == 1) {
        if (number >= 0 && number < policies) {
            return 0;
        }
        PyObject *quoted = accel_quote(value);
        if (quoted != NULL) {
            PyErr_Format(PyExc_ValueError,
                         "%s reply[1] (deciding) must be a policy index 0..%d, got %U",
                         function, policies - 1, quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    switch ((position - DECODE_HEADER_INTS) % DECODE_POLICY_INTS) {
    case REMAINING_SCALED:
        if (number < 0 || number > ACCEL_MAX_SAFE_INTEGER) {
            return value_error(function, position, value, "0.." ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER));
        }
        return 0;
    case RETRY_MS:
        if (values[0] == 1 && number != 0) {
            return value_error(function, position, value, "0 on an admission");
        }
        if (number < -1 || number > ACCEL_MAX_SAFE_INTEGER) {
            return value_error(function, position, value,
                               "-1 (permanent) or 0.." ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER));
        }
        return 0;
    default: /* RESET_MS */
        if (number == -1 && values[position - 1] != -1) {
            return value_error(function, position, value,
                               "0.." ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER) " (-1 only for a "
                                                                         "permanent denial)");
        }
        if (number < -1 || number > ACCEL_MAX_SAFE_INTEGER) {
            return value_error(function, position, value,
                               "-1 (none) or 0.." ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER));
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
check_deciding(const char *function, const long long *values, int policies)
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
                 "%s reply[1] (deciding) is %d, but policy %d decides %s: it has the %s",
                 function, deciding, expected, allowed ? "this admission" : "this denial",
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
            PyErr_Format(PyExc_ValueError,
                         "decode_decision() policies must be 1.." ACCEL_TEXT(
                             ACCEL_MAX_POLICIES) ", got %U",
                         quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    return (int)policies;
}

/* Read and check the reply into values; returns -1 with a ValueError. */
static int
read_reply(const char *function, PyObject *reply, int policies, long long *values)
{
    Py_ssize_t expected_size = DECODE_HEADER_INTS + (Py_ssize_t)DECODE_POLICY_INTS * policies;
    if (!PyList_Check(reply)) {
        PyObject *quoted = accel_quote(reply);
        if (quoted != NULL) {
            PyErr_Format(PyExc_ValueError,
                         "%s reply must be a list of %zd ints, got %.100s %U", function,
                         expected_size, Py_TYPE(reply)->tp_name, quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    if (PyList_GET_SIZE(reply) != expected_size) {
        PyErr_Format(PyExc_ValueError,
                     "%s reply must hold %zd ints (2 + 3 per policy, %d policies), got %zd",
                     function, expected_size, policies, PyList_GET_SIZE(reply));
        return -1;
    }
    /* No Python code runs in this loop before an error, so the list cannot
     * change under it. */
    for (Py_ssize_t position = 0; position < expected_size; position++) {
        PyObject *item = PyList_GET_ITEM(reply, position);
        int overflow;
        if (!PyLong_Check(item) || PyBool_Check(item)) {
            return value_error(function, position, item, "an int");
        }
        values[position] = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow) {
            /* Out of every range: check_range names the right one. */
            values[position] = overflow > 0 ? LLONG_MAX : LLONG_MIN;
        }
        if (check_range(function, position, item, values, policies) < 0) {
            return -1;
        }
    }
    return check_deciding(function, values, policies);
}

/* Policy i's state as decode_decision returns it: (remaining_scaled, retry_ms, reset_ms). */
static PyObject *
policy_state(void *values, Py_ssize_t i)
{
    const long long *policy =
        (const long long *)values + DECODE_HEADER_INTS + DECODE_POLICY_INTS * i;
    return Py_BuildValue("(LLL)", policy[REMAINING_SCALED], policy[RETRY_MS], policy[RESET_MS]);
}

static PyObject *
build_result(long long *values, int policies)
{
    PyObject *states = accel_build_sequence(1, policies, policy_state, values);
    if (states == NULL) {
        return NULL;
    }
    return Py_BuildValue("(NLN)", PyBool_FromLong((long)values[0]), values[1], states);
}

PyObject *
decode_decision(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    long long values[DECODE_MAX_INTS];

    if (accel_check_arity("decode_decision", "reply, policies", 2, 2, nargs) < 0) {
        return NULL;
    }
    /* policies first: a wrong one is the caller's bug, not the reply's. */
    int policies = parse_policies(args[1]);
    if (policies < 0) {
        return NULL;
    }
    if (read_reply("decode_decision()", args[0], policies, values) < 0) {
        return NULL;
    }
    return build_result(values, policies);
}

/* -- check_result: the reply straight into the public result records -------- */

/* What a plan must be, for the TypeError naming what was wrong. */
#define PLAN_SHAPE                                                                          \
    "(CheckResult class, PolicyState class, rate str, algorithm str, "                      \
    "((limit, window_s[, refill]), ...))"

static int
plan_error(const char *what)
{
    PyErr_Format(PyExc_TypeError, "check_result() plan must be " PLAN_SHAPE ": %s", what);
    return -1;
}

/* Check the plan's shape; on success *policies is how many rates it holds. */
static int
read_plan(const accel_state *state, PyObject *plan, int *policies)
{
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 5) {
        return plan_error("not a 5-tuple");
    }
    /* The records are this module's types, built through their one door. */
    if (PyTuple_GET_ITEM(plan, 0) != (PyObject *)state->check_result_type ||
        PyTuple_GET_ITEM(plan, 1) != (PyObject *)state->policy_state_type) {
        return plan_error("items 0 and 1 must be moderato.results.CheckResult and PolicyState");
    }
    if (!PyUnicode_Check(PyTuple_GET_ITEM(plan, 2)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(plan, 3))) {
        return plan_error("items 2 and 3 must be str");
    }
    PyObject *rates = PyTuple_GET_ITEM(plan, 4);
    if (!PyTuple_Check(rates) || PyTuple_GET_SIZE(rates) < 1 ||
        PyTuple_GET_SIZE(rates) > ACCEL_MAX_POLICIES) {
        return plan_error("item 4 must be a tuple of 1 to " ACCEL_TEXT(ACCEL_MAX_POLICIES) " rates");
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rates); i++) {
        PyObject *rate = PyTuple_GET_ITEM(rates, i);
        if (!PyTuple_Check(rate) || PyTuple_GET_SIZE(rate) < 2 || PyTuple_GET_SIZE(rate) > 3 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(rate, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(rate, 1)) ||
            (PyTuple_GET_SIZE(rate) == 3 && !PyLong_CheckExact(PyTuple_GET_ITEM(rate, 2)))) {
            return plan_error("every rate must be a (limit, window_s) pair or a (limit, "
                              "window_s, refill) triple of ints");
        }
    }
    *policies = (int)PyTuple_GET_SIZE(rates);
    return 0;
}

/* One policy's public values, new references into out[0..5] in PolicyState's
 * field order: limit, window_seconds, remaining in whole requests (rounded
 * down), retry_after in seconds (rounded up; None for never), reset_at in
 * Unix seconds (None for none) and refill (a burst's; None without one). */
static int
policy_values(PyObject *rate, const long long *policy, PyObject **out)
{
    out[0] = Py_NewRef(PyTuple_GET_ITEM(rate, 0));
    out[1] = Py_NewRef(PyTuple_GET_ITEM(rate, 1));
    out[5] = Py_NewRef(PyTuple_GET_SIZE(rate) == 3 ? PyTuple_GET_ITEM(rate, 2) : Py_None);
    out[2] = PyLong_FromLongLong(policy[REMAINING_SCALED] / ACCEL_SCALE);
    long long retry_ms = policy[RETRY_MS];
    out[3] = retry_ms < 0 ? Py_NewRef(Py_None)
                          : PyLong_FromLongLong(retry_ms / 1000 + (retry_ms % 1000 != 0));
    /* 0 <= reset_ms <= 2**53 converts exactly, so one IEEE division rounds
     * as Python's reset_ms / 1000 does. */
    long long reset_ms = policy[RESET_MS];
    out[4] = reset_ms < 0 ? Py_NewRef(Py_None) : PyFloat_FromDouble((double)reset_ms / 1000.0);
    if (out[2] == NULL || out[3] == NULL || out[4] == NULL) {
        for (int i = 0; i < POLICY_STATE_FIELDS; i++) {
            Py_CLEAR(out[i]);
        }
        return -1;
    }
    return 0;
}

/* The CheckResult from checked values and a checked plan. */
static PyObject *
build_check_result(accel_state *state, PyObject *plan, const long long *values, int policies)
{
    PyObject *rates = PyTuple_GET_ITEM(plan, 4);
    PyObject *states = PyTuple_New(policies);
    if (states == NULL) {
        return NULL;
    }
    for (int i = 0; i < policies; i++) {
        PyObject *policy[POLICY_STATE_FIELDS];
        if (policy_values(PyTuple_GET_ITEM(rates, i),
                          values + DECODE_HEADER_INTS + DECODE_POLICY_INTS * i, policy) < 0) {
            Py_DECREF(states);
            return NULL;
        }
        PyObject *one =
            results_new(state->policy_state_type, policy, POLICY_STATE_FIELDS);
        if (one == NULL) {
            Py_DECREF(states);
            return NULL;
        }
        PyTuple_SET_ITEM(states, i, one);
    }
    /* The top-level fields are the deciding policy's. */
    int deciding = (int)values[1];
    PyObject *top[POLICY_STATE_FIELDS];
    if (policy_values(PyTuple_GET_ITEM(rates, deciding),
                      values + DECODE_HEADER_INTS + DECODE_POLICY_INTS * deciding, top) < 0) {
        Py_DECREF(states);
        return NULL;
    }
    /* In CheckResult's field order; bypassed and shadow_denied are False. */
    PyObject *fields[] = {PyBool_FromLong((long)values[0]),
                          top[0],
                          top[2],
                          top[3],
                          top[4],
                          top[1],
                          Py_NewRef(PyTuple_GET_ITEM(plan, 2)),
                          Py_NewRef(PyTuple_GET_ITEM(plan, 3)),
                          states,
                          Py_NewRef(Py_False),
                          Py_NewRef(Py_False),
                          top[5]};
    return results_new(state->check_result_type, fields,
                       (int)(sizeof(fields) / sizeof(fields[0])));
}

PyObject *
decode_check_result(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long long values[DECODE_MAX_INTS];
    int policies;

    if (accel_check_arity("check_result", "reply, plan", 2, 2, nargs) < 0) {
        return NULL;
    }
    accel_state *state = PyModule_GetState(module);
    PyObject *plan = args[1];
    /* The plan first: a wrong one is the caller's bug, not the reply's. */
    if (read_plan(state, plan, &policies) < 0 ||
        read_reply("check_result()", args[0], policies, values) < 0) {
        return NULL;
    }
    return build_check_result(state, plan, values, policies);
}

int
decode_check_plan(PyObject *module, PyObject *plan, int *policies)
{
    return read_plan(PyModule_GetState(module), plan, policies);
}

/* values[position] checked as read_reply checks a reply's item. */
static int
check_value(const char *function, Py_ssize_t position, const long long *values, int policies)
{
    /* The item only shows in an error: made for one. */
    if (check_range(function, position, Py_None, values, policies) == 0) {
        return 0;
    }
    PyErr_Clear();
    PyObject *value = PyLong_FromLongLong(values[position]);
    if (value != NULL) {
        check_range(function, position, value, values, policies);
        Py_DECREF(value);
    }
    return -1;
}

PyObject *
decode_values_result(PyObject *module, PyObject *plan, const long long *values, int policies)
{
    static const char function[] = "check_result()";
    Py_ssize_t size = DECODE_HEADER_INTS + (Py_ssize_t)DECODE_POLICY_INTS * policies;
    for (Py_ssize_t position = 0; position < size; position++) {
        if (check_value(function, position, values, policies) < 0) {
            return NULL;
        }
    }
    if (check_deciding(function, values, policies) < 0) {
        return NULL;
    }
    return build_check_result(PyModule_GetState(module), plan, values, policies);
}
