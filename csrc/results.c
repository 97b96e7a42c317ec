/* CheckResult and PolicyState: immutable records in C (results.h).
 *
 * They behave as the frozen dataclasses they replace: positional or keyword
 * construction with the same defaults, read-only fields (assigning raises
 * dataclasses.FrozenInstanceError), equality and hash over the fields (only
 * between records of one type), a repr listing every field, pickling, and
 * moderato.results attaches the dataclass field table so that
 * dataclasses.replace(), fields() and asdict() work on them. Every record,
 * whoever builds it, goes through results_new(): a field the caller does not
 * pass takes its default, none can be left missing.
 */
#include <stddef.h>
#include <string.h>

#include "heap_type.h"
#include "results.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *values[CHECK_RESULT_FIELDS]; /* PolicyState uses the first 6 */
} record_object;

typedef struct {
    const char *name;      /* the type's short name */
    int field_count;
    int required;          /* fields before the first with a default */
    const char *const *fields;
} record_layout;

static const char *const policy_state_fields[POLICY_STATE_FIELDS] = {
    "limit", "window_seconds", "remaining", "retry_after", "reset_at", "refill"};

static const char *const check_result_fields[CHECK_RESULT_FIELDS] = {
    "allowed",   "limit",    "remaining", "retry_after",   "reset_at", "window_seconds",
    "rate",      "algorithm", "policies", "bypassed", "shadow_denied", "refill"};

static const record_layout policy_state_layout = {"PolicyState", POLICY_STATE_FIELDS, 5,
                                                  policy_state_fields};
static const record_layout check_result_layout = {"CheckResult", CHECK_RESULT_FIELDS, 8,
                                                  check_result_fields};

/* The default of field i (i >= required): PolicyState's refill=None;
 * CheckResult's policies=(), bypassed=False, shadow_denied=False,
 * refill=None. A new reference. */
static PyObject *
default_value(const record_layout *layout, int i)
{
    if (layout == &check_result_layout && i == 8) {
        return PyTuple_New(0);
    }
    if (strcmp(layout->fields[i], "refill") == 0) {
        return Py_NewRef(Py_None);
    }
    return Py_NewRef(Py_False);
}

/* How many values a record of this type holds: its size says (the types
 * cannot be subclassed). */
static int
field_count_of(PyTypeObject *type)
{
    return (int)(((size_t)type->tp_basicsize - offsetof(record_object, values)) /
                 sizeof(PyObject *));
}

static const record_layout *
layout_of_type(PyTypeObject *type)
{
    return field_count_of(type) == CHECK_RESULT_FIELDS ? &check_result_layout
                                                        : &policy_state_layout;
}

PyObject *
results_field(PyObject *record, int i)
{
    return ((record_object *)record)->values[i];
}

PyObject *
results_new(PyTypeObject *type, PyObject **values, int count)
{
    const record_layout *layout = layout_of_type(type);
    record_object *record = (record_object *)type->tp_alloc(type, 0);
    if (record == NULL) {
        for (int i = 0; i < count; i++) {
            Py_XDECREF(values[i]);
        }
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        record->values[i] = values[i];
    }
    for (int i = count; i < layout->field_count; i++) {
        record->values[i] = default_value(layout, i);
        if (record->values[i] == NULL) {
            Py_DECREF(record);
            return NULL;
        }
    }
    return (PyObject *)record;
}

/* ---- the type slots ------------------------------------------------------------ */

static PyObject *
record_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    const record_layout *layout = layout_of_type(type);
    PyObject *values[CHECK_RESULT_FIELDS] = {NULL};
    Py_ssize_t positional = PyTuple_GET_SIZE(args);
    if (positional > layout->field_count) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d positional arguments but %zd were given",
                     layout->name, layout->field_count, positional);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < positional; i++) {
        values[i] = PyTuple_GET_ITEM(args, i);
    }
    if (kwargs != NULL) {
        PyObject *name, *value;
        Py_ssize_t at = 0;
        while (PyDict_Next(kwargs, &at, &name, &value)) {
            int found = -1;
            for (int i = 0; i < layout->field_count && PyUnicode_Check(name); i++) {
                if (PyUnicode_CompareWithASCIIString(name, layout->fields[i]) == 0) {
                    found = i;
                    break;
                }
            }
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R",
                             layout->name, name);
                return NULL;
            }
            if (values[found] != NULL) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                             layout->name, layout->fields[found]);
                return NULL;
            }
            values[found] = value;
        }
    }
    for (int i = 0; i < layout->required; i++) {
        if (values[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", layout->name,
                         layout->fields[i]);
            return NULL;
        }
    }
    for (int i = 0; i < layout->field_count; i++) {
        values[i] = values[i] != NULL ? Py_NewRef(values[i]) : default_value(layout, i);
        if (values[i] == NULL) {
            for (int j = 0; j < i; j++) {
                Py_DECREF(values[j]);
            }
            return NULL;
        }
    }
    return results_new(type, values, layout->field_count);
}

static int
record_traverse(PyObject *self, visitproc visit, void *arg)
{
    record_object *record = (record_object *)self;
    for (int i = 0; i < field_count_of(Py_TYPE(self)); i++) {
        Py_VISIT(record->values[i]);
    }
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
record_clear(PyObject *self)
{
    record_object *record = (record_object *)self;
    for (int i = 0; i < field_count_of(Py_TYPE(self)); i++) {
        Py_CLEAR(record->values[i]);
    }
    return 0;
}

ACCEL_GC_DEALLOC(record)

/* The fields as a tuple, a new reference. */
static PyObject *
record_tuple(PyObject *self)
{
    const record_layout *layout = layout_of_type(Py_TYPE(self));
    record_object *record = (record_object *)self;
    PyObject *tuple = PyTuple_New(layout->field_count);
    if (tuple == NULL) {
        return NULL;
    }
    for (int i = 0; i < layout->field_count; i++) {
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(record->values[i]));
    }
    return tuple;
}

/* As the dataclass's __eq__: the field tuples compared, for one type only. */
static PyObject *
record_richcompare(PyObject *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *mine = record_tuple(self);
    PyObject *theirs = mine == NULL ? NULL : record_tuple(other);
    PyObject *result = theirs == NULL ? NULL : PyObject_RichCompare(mine, theirs, op);
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return result;
}

/* As a frozen dataclass's __hash__: the hash of the field tuple. */
static Py_hash_t
record_hash(PyObject *self)
{
    PyObject *tuple = record_tuple(self);
    if (tuple == NULL) {
        return -1;
    }
    Py_hash_t hash = PyObject_Hash(tuple);
    Py_DECREF(tuple);
    return hash;
}

/* "CheckResult(allowed=True, limit=10, ...)", as the dataclass writes it. */
static PyObject *
record_repr(PyObject *self)
{
    const record_layout *layout = layout_of_type(Py_TYPE(self));
    record_object *record = (record_object *)self;
    int entered = Py_ReprEnter(self);
    if (entered != 0) {
        return entered > 0 ? PyUnicode_FromString("...") : NULL;
    }
    PyObject *parts = PyList_New(layout->field_count);
    for (int i = 0; parts != NULL && i < layout->field_count; i++) {
        PyObject *part = PyUnicode_FromFormat("%s=%R", layout->fields[i], record->values[i]);
        if (part == NULL) {
            Py_CLEAR(parts);
            break;
        }
        PyList_SET_ITEM(parts, i, part);
    }
    PyObject *result = NULL;
    if (parts != NULL) {
        PyObject *separator = PyUnicode_FromString(", ");
        PyObject *joined = separator == NULL ? NULL : PyUnicode_Join(separator, parts);
        if (joined != NULL) {
            result = PyUnicode_FromFormat("%s(%U)", layout->name, joined);
        }
        Py_XDECREF(joined);
        Py_XDECREF(separator);
        Py_DECREF(parts);
    }
    Py_ReprLeave(self);
    return result;
}

/* Frozen: every assignment and deletion raises FrozenInstanceError. */
static int
record_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    accel_state *state = accel_state_of_type(Py_TYPE(self));
    if (state == NULL) {
        return -1;
    }
    PyErr_Format(state->frozen_error, value == NULL ? "cannot delete field %R"
                                                    : "cannot assign to field %R",
                 name);
    return -1;
}

static PyObject *
record_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *tuple = record_tuple(self);
    if (tuple == NULL) {
        return NULL;
    }
    return Py_BuildValue("(ON)", (PyObject *)Py_TYPE(self), tuple);
}

static PyObject *
check_result_permanent(PyObject *self, void *Py_UNUSED(closure))
{
    record_object *record = (record_object *)self;
    int allowed = PyObject_IsTrue(record->values[0]);
    if (allowed < 0) {
        return NULL;
    }
    return PyBool_FromLong(!allowed && record->values[3] == Py_None);
}

static PyObject *
check_result_status_code(PyObject *self, void *closure)
{
    record_object *record = (record_object *)self;
    int allowed = PyObject_IsTrue(record->values[0]);
    if (allowed < 0) {
        return NULL;
    }
    if (allowed) {
        return PyLong_FromLong(200);
    }
    PyObject *permanent = check_result_permanent(self, closure);
    if (permanent == NULL) {
        return NULL;
    }
    long code = permanent == Py_True ? 422 : 429;
    Py_DECREF(permanent);
    return PyLong_FromLong(code);
}

static PyMethodDef record_methods[] = {
    {"__reduce__", record_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef check_result_getset[] = {
    {"permanent", check_result_permanent, NULL,
     "A denial that waiting cannot fix: the cost exceeds the policy's capacity.", NULL},
    {"status_code", check_result_status_code, NULL,
     "200 when allowed, 429 for a denial, 422 for a permanent one.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define FIELD(i, name, doc) \
    {name, T_OBJECT_EX, offsetof(record_object, values) + (i) * sizeof(PyObject *), \
     READONLY, doc}

static PyMemberDef policy_state_members[POLICY_STATE_FIELDS + 1] = {
    FIELD(0, "limit",
          "The most the policy admits at once: its limit in requests per window, or "
             "its burst."),
    FIELD(1, "window_seconds",
          "The policy's window, in seconds."),
    FIELD(2, "remaining",
          "Whole unit-cost requests that still fit, rounded down; None when unknown "
             "(bypass)."),
    FIELD(3, "retry_after",
          "Seconds until the cost fits (rounded up); 0 when admitted; None if it never "
             "will."),
    FIELD(4, "reset_at",
          "Unix time from the backend's clock; None for a permanent denial or a bypass."),
    FIELD(5, "refill",
          "With a burst: the requests the bucket regains per window (limit is the "
             "burst); None without one (limit per window)."),
    {NULL, 0, 0, 0, NULL},
};

static PyMemberDef check_result_members[CHECK_RESULT_FIELDS + 1] = {
    FIELD(0, "allowed",
          "Whether the request may proceed."),
    FIELD(1, "limit",
          "The deciding policy's limit."),
    FIELD(2, "remaining",
          "The deciding policy's remaining whole requests; None when unknown (bypass)."),
    FIELD(3, "retry_after",
          "The deciding policy's retry_after; None if waiting never helps."),
    FIELD(4, "reset_at",
          "The deciding policy's reset_at; None for a permanent denial or a bypass."),
    FIELD(5, "window_seconds",
          "The deciding policy's window, in seconds."),
    FIELD(6, "rate",
          "The rate text checked."),
    FIELD(7, "algorithm",
          "The algorithm that decided."),
    FIELD(8, "policies",
          "Every policy of the rate, in its order (PolicyState)."),
    FIELD(9, "bypassed",
          "True when the backend could not decide and fail-open let the request through."),
    FIELD(10, "shadow_denied",
          "True when the limit denied the request but shadow mode let it through."),
    FIELD(11, "refill",
          "The deciding policy's refill per window with a burst; None without one."),
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(policy_state_doc,
"PolicyState(limit, window_seconds, remaining, retry_after, reset_at, refill=None)\n"
"--\n"
"\n"
"One policy's view of a decision (several policies can be decided at once).");

PyDoc_STRVAR(check_result_doc,
"CheckResult(allowed, limit, remaining, retry_after, reset_at, window_seconds,\n"
"            rate, algorithm, policies=(), bypassed=False, shadow_denied=False,\n"
"            refill=None)\n"
"--\n"
"\n"
"The outcome of one check.\n"
"\n"
"The top-level fields describe the deciding policy: on a denial the one\n"
"that must be waited on longest, on an admission the one with the fewest\n"
"requests left (the one that headers report).");

/* The slots both record types share; check_result also has getters. */
#define RECORD_SLOTS(doc, members)                                                          \
    ACCEL_GC_SLOTS(record, doc), {Py_tp_new, record_new},                                   \
        {Py_tp_richcompare, record_richcompare}, {Py_tp_hash, record_hash},                 \
        {Py_tp_repr, record_repr}, {Py_tp_setattro, record_setattro},                       \
        {Py_tp_methods, record_methods}, {Py_tp_members, (members)}

static PyType_Slot policy_state_slots[] = {
    RECORD_SLOTS(policy_state_doc, policy_state_members),
    {0, NULL},
};

static PyType_Slot check_result_slots[] = {
    RECORD_SLOTS(check_result_doc, check_result_members),
    {Py_tp_getset, check_result_getset},
    {0, NULL},
};

/* Not immutable types: moderato.results attaches the dataclass field table
 * (__dataclass_fields__) once, at import. */
ACCEL_TYPE_SPEC(policy_state_spec, "moderato.results.PolicyState",
                offsetof(record_object, values) + POLICY_STATE_FIELDS * sizeof(PyObject *),
                Py_TPFLAGS_HAVE_GC, policy_state_slots);
ACCEL_TYPE_SPEC(check_result_spec, "moderato.results.CheckResult", sizeof(record_object),
                Py_TPFLAGS_HAVE_GC, check_result_slots);

/* Add one type to the module (accel_add_type) and give it __match_args__. */
static int
add_record_type(PyObject *module, PyType_Spec *spec, const record_layout *layout,
                PyTypeObject **out)
{
    if (accel_add_type(module, spec, layout->name, out) < 0) {
        return -1;
    }
    PyObject *match_args = PyTuple_New(layout->field_count);
    for (int i = 0; match_args != NULL && i < layout->field_count; i++) {
        PyObject *name = PyUnicode_InternFromString(layout->fields[i]);
        if (name == NULL) {
            Py_CLEAR(match_args);
            break;
        }
        PyTuple_SET_ITEM(match_args, i, name);
    }
    int set = match_args == NULL
                  ? -1
                  : PyObject_SetAttrString((PyObject *)*out, "__match_args__", match_args);
    Py_XDECREF(match_args);
    return set;
}

int
results_add_to_module(PyObject *module)
{
    accel_state *state = PyModule_GetState(module);
    PyObject *dataclasses = PyImport_ImportModule("dataclasses");
    if (dataclasses == NULL) {
        return -1;
    }
    state->frozen_error = PyObject_GetAttrString(dataclasses, "FrozenInstanceError");
    Py_DECREF(dataclasses);
    if (state->frozen_error == NULL) {
        return -1;
    }
    if (add_record_type(module, &policy_state_spec, &policy_state_layout,
                        &state->policy_state_type) < 0 ||
        add_record_type(module, &check_result_spec, &check_result_layout,
                        &state->check_result_type) < 0) {
        return -1;
    }
    return 0;
}
