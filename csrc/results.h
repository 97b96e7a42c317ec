/* The public result types, CheckResult and PolicyState, as C types owned by
 * the module state (moderato.results re-exports them). Both are immutable
 * records of named fields: one constructor, one door, for Python callers
 * and for check_result() alike. */
#ifndef MODERATO_RESULTS_H
#define MODERATO_RESULTS_H

#include "compat.h"

#define POLICY_STATE_FIELDS 6
#define CHECK_RESULT_FIELDS 12

/* The names fast_check.c reads: its FAST_NAMES, counted. */
#define FAST_NAME_COUNT 20
#define REDIS_NAME_COUNT 24
#define CORE_NAME_COUNT 37
#define ROUTE_NAME_COUNT 28

/* The module state of moderato._accel. */
typedef struct {
    PyTypeObject *check_result_type;
    PyTypeObject *policy_state_type;
    PyObject *frozen_error; /* dataclasses.FrozenInstanceError */
    /* fast_check.c's types and the attribute and keyword names it reads */
    PyTypeObject *fast_method_type;
    PyTypeObject *fast_check_type;
    PyTypeObject *ready_type;
    PyObject *names[FAST_NAME_COUNT];
    /* fast_redis.c's type and the names it reads */
    PyTypeObject *redis_check_type;
    PyObject *redis_names[REDIS_NAME_COUNT];
    /* fast_aredis.c's types: the asyncio limiter's check over one Redis server */
    PyTypeObject *aredis_check_type;
    PyTypeObject *pending_check_type;
    /* connection_core.c's type, the names it reads and its calls' keywords */
    PyTypeObject *core_type;
    PyObject *core_names[CORE_NAME_COUNT];
    PyObject *core_loop_keyword; /* ("loop",) */
    PyObject *core_sent_keyword; /* ("sent",) */
    /* _asyncio's Future and _get_running_loop, taken at a connection's first
     * future (Py_None each when _asyncio cannot give them), else NULL */
    PyObject *c_future_type;
    PyObject *c_running_loop;
    /* grouping.c's slot of a batched call (its Grouping makes them) */
    PyTypeObject *batched_reply_type;
    /* fast_route.c's types (the headers middleware's send wrapper) and the names
     * it reads */
    PyTypeObject *header_senders_type;
    PyTypeObject *header_sender_type;
    PyTypeObject *route_arguments_type;
    PyObject *route_names[ROUTE_NAME_COUNT];
    PyObject *empty_tuple;
} accel_state;

/* The state's references but names: X(member) each. module.c visits and
 * clears them, and the names, in one place. */
#define ACCEL_STATE_REFERENCES(X)                                                      \
    X(check_result_type) X(policy_state_type) X(frozen_error) X(fast_method_type)      \
    X(fast_check_type) X(ready_type) X(redis_check_type) X(aredis_check_type)          \
    X(pending_check_type) X(core_type) X(core_loop_keyword) X(core_sent_keyword)      \
    X(c_future_type) X(c_running_loop) X(batched_reply_type)                           \
    X(header_senders_type) X(header_sender_type) X(route_arguments_type) X(empty_tuple)

/* The state of the module object that made type (one of this module's):
 * NULL with an exception set if there is none. */
static inline accel_state *
accel_state_of_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModule(type);
    return module == NULL ? NULL : (accel_state *)PyModule_GetState(module);
}

/* The module state of a vectorcall that takes exactly `positional` positional
 * arguments and no keywords; NULL with TypeError(usage) otherwise (or the
 * state lookup's error). */
static inline accel_state *
accel_positional_call(PyObject *callable, size_t nargsf, PyObject *kwnames, Py_ssize_t positional,
                      const char *usage)
{
    if (PyVectorcall_NARGS(nargsf) != positional
        || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    return accel_state_of_type(Py_TYPE(callable));
}

/* A CheckResult's field i, borrowed (the record must be a CheckResult). */
PyObject *results_field(PyObject *record, int i);

/* Create both types for this module object, keep them in its state and add
 * them to it. 0, or -1 with an exception set. */
int results_add_to_module(PyObject *module);

/* A new record of type (one of the two) from count values, each a new
 * reference that is consumed, even on failure. count may be short of the
 * type's fields: the rest take their defaults. */
PyObject *results_new(PyTypeObject *type, PyObject **values, int count);

#endif /* MODERATO_RESULTS_H */
