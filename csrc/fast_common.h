/* What the one-call checks share (fast_check.c: memory://'s;
 * fast_redis.c: the blocking limiter's over one Redis server and the
 * request both checks over Redis send; fast_aredis.c: the asyncio
 * limiter's): the head of their per-limiter objects and its constructor,
 * the names all read, the limiter's conditions, the plan lookup and the
 * compiled-plan cache. Static inline functions: each check's file compiles
 * them into its own path, as when each had a copy.
 */
#ifndef MODERATO_FAST_COMMON_H
#define MODERATO_FAST_COMMON_H

#include <stddef.h>
#include <string.h>

#include "heap_type.h"
#include "results.h"

/* Most compiled plans a check object keeps before it starts over (plans.py's
 * MAX_PLANS). */
#define FAST_MAX_COMPILED 4096

/* The attribute and keyword names fast_check.c interns into the state's
 * names (FAST_NAME_COUNT, results.h); the checks over Redis read the ones
 * they share from there, their own from redis_names (fast_redis.h). */
#define FAST_NAMES(X)                                                                    \
    X(FAST_CHECK, "_fast_check")                                                         \
    X(METRICS, "metrics")                                                                \
    X(RECORDER, "recorder")                                                              \
    X(SETTLED, "settled")                                                                \
    X(ACTIVE, "active")                                                                  \
    X(CLOCK, "clock")                                                                    \
    X(SHADOW, "shadow")                                                                  \
    X(PLANS, "_plans")                                                                   \
    X(SCRIPT_NAME, "script_name")                                                        \
    X(KEY_TAG, "key_tag")                                                                \
    X(WINDOWS_S, "windows_s")                                                            \
    X(UNIT_ARGS, "unit_args")                                                            \
    X(RESULT_SHAPE, "result_shape")                                                      \
    X(COST, "cost")                                                                      \
    X(TENANT_TYPE, "tenant_type")                                                        \
    X(SCOPE, "scope")                                                                    \
    X(ALGORITHM, "algorithm")                                                            \
    X(TENANT, "tenant")                                                                  \
    X(BURST, "burst")                                                                    \
    X(EMPTY, "")

#define FAST_NAME_ENUM(name, text) NAME_##name,
enum { FAST_NAMES(FAST_NAME_ENUM) NAME_END };
#undef FAST_NAME_ENUM

/* A compiled plan's first fields, read from the plan in this order: its
 * script name (fast_redis.c puts the script's SHA in its place), key tag,
 * windows, unit arguments and result shape. A check may keep more after
 * them. */
enum { PLAN_SCRIPT, PLAN_TAG, PLAN_WINDOWS, PLAN_ARGS, PLAN_SHAPE, PLAN_READ_FIELDS };

/* The members both per-limiter objects begin with, in this order (so that
 * either is a fast_limiter). */
#define FAST_LIMITER_HEAD                                                                \
    PyObject_HEAD                                                                        \
    PyObject *prefix;      /* the key space's prefix (str) */                            \
    PyObject *secret;      /* its identity secret (bytes) or None */                     \
    PyObject *defaults;    /* Plans.defaults: the default algorithm's plans by rate */   \
    PyObject *plans;       /* the Plans: its _plans by (rate, algorithm) */              \
    PyObject *breaker;     /* the limiter's breaker: settled */                          \
    PyObject *failure_log; /* its OutageLog: active */                                   \
    PyObject *global_scope;                                                              \
    PyObject *finish;      /* fast_check.finish(limiter, plan, scope, shadow, reply,     \
                              outcome) */                                                \
    PyObject *compiled;    /* {plan: (script, key_tag, windows_s, unit_args, shape, ...)} */

typedef struct {
    FAST_LIMITER_HEAD
} fast_limiter;

/* The head's members set by a constructor, each its keyword, first in
 * every constructor (format "UOO!OOOUO", PyDict_Type before defaults); and
 * all the head's members (for ACCEL_GC_FUNCTIONS). */
#define FAST_LIMITER_ARGUMENTS(X)                                                        \
    X(prefix) X(secret) X(defaults) X(plans) X(breaker) X(failure_log) X(global_scope)    \
    X(finish)
#define FAST_LIMITER_MEMBERS(X) FAST_LIMITER_ARGUMENTS(X) X(compiled)

/* Most keywords a constructor takes: the head's and a check's own. */
#define FAST_MAX_ARGUMENTS 13

/* In a constructor of object_type whose keywords are ARGUMENTS (an X-macro
 * of the members they set, in order): static char *keywords[] (ARGUMENTS'
 * names, the extra keywords given, NULL) and static const Py_ssize_t
 * offsets[] (ARGUMENTS' members, for fast_limiter_new). The extra keywords
 * end with a comma, or are empty (a trailing comma then). The count is taken
 * with sizeof: Py_ARRAY_LENGTH is no constant expression on 3.13 with gcc. */
#define FAST_CONSTRUCTOR_TABLES(object_type, ARGUMENTS, ...)                               \
    typedef object_type fast_constructed;                                                 \
    static char *keywords[] = {ARGUMENTS(FAST_KEYWORD_) __VA_ARGS__ NULL};                \
    static const Py_ssize_t offsets[] = {ARGUMENTS(FAST_OFFSET_)};                        \
    Py_BUILD_ASSERT(sizeof(keywords) / sizeof(keywords[0]) - 1 <= FAST_MAX_ARGUMENTS)
#define FAST_KEYWORD_(member) #member,
#define FAST_OFFSET_(member) offsetof(fast_constructed, member),

/* A new object of type from its constructor's arguments, or NULL with an
 * exception set: parsed by format (the head's "UOO!OOOUO", then one object
 * unit for each further keyword, then ":" and the type's name) into
 * values[] (FAST_MAX_ARGUMENTS of them; the caller reads those past count,
 * the extra keywords'), secret (values[1]) bytes or None, values[i] set to
 * the member at offsets[i] (offsetof) for i < count, its compiled-plan cache
 * made. */
static inline PyObject *
fast_limiter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs, const char *format,
                 char **keywords, const Py_ssize_t *offsets, Py_ssize_t count, PyObject **values)
{
    /* Addresses past the format's units are not read. */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &values[0], &values[1],
                                     &PyDict_Type, &values[2], &values[3], &values[4],
                                     &values[5], &values[6], &values[7], &values[8], &values[9],
                                     &values[10], &values[11], &values[12])) {
        return NULL;
    }
    if (values[1] != Py_None && !PyBytes_Check(values[1])) {
        PyErr_Format(PyExc_TypeError, "%s() secret must be bytes or None, not %.100s",
                     strchr(format, ':') + 1, Py_TYPE(values[1])->tp_name);
        return NULL;
    }
    fast_limiter *fast = (fast_limiter *)type->tp_alloc(type, 0);
    if (fast == NULL) {
        return NULL;
    }
    fast->compiled = PyDict_New();
    if (fast->compiled == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        *(PyObject **)((char *)fast + offsets[i]) = Py_NewRef(values[i]);
    }
    return (PyObject *)fast;
}

static inline PyObject *
fast_limiter_compiled_count(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(PyDict_GET_SIZE(((fast_limiter *)self)->compiled));
}

/* A per-limiter type's docstring: its signature (the head's keywords, then
 * its own), then its text. */
#define FAST_LIMITER_DOC(name, own_keywords, text)                                       \
    name "(*, prefix, secret, defaults, plans, breaker, failure_log, global_scope,\n"     \
         "    finish, " own_keywords ")\n--\n\n" text

/* A per-limiter type <prefix>: its attributes (<prefix>_getset:
 * compiled_count), slots (<prefix>_slots: collected by
 * ACCEL_GC_FUNCTIONS(prefix, ...), made by <prefix>_new) and spec
 * (<prefix>_spec), named qualname. */
#define FAST_LIMITER_TYPE(prefix, qualname, object_type, doc)                            \
    static PyGetSetDef prefix##_getset[] = {                                             \
        {"compiled_count", fast_limiter_compiled_count, NULL,                            \
         "Plans compiled for the one-call path so far (for tests).", NULL},              \
        {NULL, NULL, NULL, NULL, NULL},                                                  \
    };                                                                                   \
    ACCEL_GC_TYPE(prefix, qualname, object_type, doc, ACCEL_TPFLAGS_IMMUTABLE,            \
                  {Py_tp_new, prefix##_new}, {Py_tp_getset, prefix##_getset})

/* Whether owner.<name> is wanted (by identity): 1 or 0, never an exception.
 * Read with getattr, not from the instances' __dict__: asking for the
 * __dict__ of an object whose attributes CPython keeps inline (3.11 on)
 * would make one, and slow every Python read of its attributes. */
static inline int
fast_attribute_is(PyObject *owner, PyObject *name, PyObject *wanted)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL) {
        PyErr_Clear();
        return 0;
    }
    int matches = value == wanted;
    Py_DECREF(value);
    return matches;
}

/* The breaker settled and no outage being logged: the Python path then tells
 * neither anything after a decision. 1 or 0, never an exception. */
static inline int
fast_quiet(accel_state *state, fast_limiter *fast)
{
    return fast_attribute_is(fast->breaker, state->names[NAME_SETTLED], Py_True) &&
           fast_attribute_is(fast->failure_log, state->names[NAME_ACTIVE], Py_False);
}

/* Whether the limiter's state lets its check take the one-call path: no
 * metrics nor recorder, and quiet. 1 or 0, never an exception. */
static inline int
fast_limiter_allows(accel_state *state, PyObject *limiter, fast_limiter *fast)
{
    return fast_attribute_is(limiter, state->names[NAME_METRICS], Py_None) &&
           fast_attribute_is(limiter, state->names[NAME_RECORDER], Py_None) &&
           fast_quiet(state, fast);
}

/* The check's plan, a new reference, or NULL (declined, no exception). */
static inline PyObject *
fast_find_plan(accel_state *state, fast_limiter *fast, PyObject *rate, PyObject *algorithm)
{
    PyObject *plan;
    if (algorithm == Py_None) {
        plan = PyDict_GetItemWithError(fast->defaults, rate);
        Py_XINCREF(plan);
    }
    else {
        PyObject *plans = PyObject_GetAttr(fast->plans, state->names[NAME_PLANS]);
        PyObject *pair = plans == NULL ? NULL : PyTuple_Pack(2, rate, algorithm);
        plan = pair == NULL || !PyDict_Check(plans) ? NULL : PyDict_GetItemWithError(plans, pair);
        Py_XINCREF(plan);
        Py_XDECREF(pair);
        Py_XDECREF(plans);
    }
    PyErr_Clear();
    return plan;
}

/* A check's own step in compiling a plan: given the tuple of `fields` items
 * whose first PLAN_READ_FIELDS are read, its unit arguments a tuple, check
 * or replace those and set the rest. 0, or -1 (declined; any exception set
 * is cleared). */
typedef int (*fast_plan_step)(PyObject *compiled, void *context);

/* A plan's first check: its compiled fields made and kept (see
 * fast_compiled_plan). */
static inline PyObject *
fast_compile_plan(accel_state *state, fast_limiter *fast, PyObject *plan, Py_ssize_t fields,
                  fast_plan_step complete, void *context)
{
    PyObject *compiled = PyTuple_New(fields);
    if (compiled == NULL) {
        PyErr_Clear();
        return NULL;
    }
    static const int names[PLAN_READ_FIELDS] = {NAME_SCRIPT_NAME, NAME_KEY_TAG, NAME_WINDOWS_S,
                                                NAME_UNIT_ARGS, NAME_RESULT_SHAPE};
    for (int i = 0; i < PLAN_READ_FIELDS; i++) {
        PyObject *value = PyObject_GetAttr(plan, state->names[names[i]]);
        if (value == NULL) {
            Py_DECREF(compiled);
            PyErr_Clear();
            return NULL;
        }
        PyTuple_SET_ITEM(compiled, i, value);
    }
    if (!PyTuple_CheckExact(PyTuple_GET_ITEM(compiled, PLAN_ARGS)) ||
        complete(compiled, context) < 0) {
        Py_DECREF(compiled);
        PyErr_Clear();
        return NULL;
    }
    if (PyDict_GET_SIZE(fast->compiled) >= FAST_MAX_COMPILED) {
        PyDict_Clear(fast->compiled);
    }
    int stored = PyDict_SetItem(fast->compiled, plan, compiled);
    Py_DECREF(compiled);
    if (stored < 0) {
        PyErr_Clear();
        return NULL;
    }
    /* The dict holds it now; a collection while storing cannot have
     * dropped it: nothing else refers to the dict. */
    return PyDict_GetItemWithError(fast->compiled, plan);
}

/* The plan's compiled fields, a borrowed tuple of `fields` items, or NULL
 * (declined: no exception set). Compiled on the plan's first check here
 * (complete() the check's own step); the cache starts over past
 * FAST_MAX_COMPILED plans. */
static inline PyObject *
fast_compiled_plan(accel_state *state, fast_limiter *fast, PyObject *plan, Py_ssize_t fields,
                   fast_plan_step complete, void *context)
{
    PyObject *compiled = PyDict_GetItemWithError(fast->compiled, plan);
    if (compiled != NULL || PyErr_Occurred()) {
        PyErr_Clear();
        return compiled;
    }
    return fast_compile_plan(state, fast, plan, fields, complete, context);
}

/* names[i] = texts[i] interned, for count names (a check's names kept in
 * the module state). 0, or -1 with an exception set. */
static inline int
fast_intern_names(PyObject **names, const char *const *texts, int count)
{
    for (int i = 0; i < count; i++) {
        names[i] = PyUnicode_InternFromString(texts[i]);
        if (names[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

#endif /* MODERATO_FAST_COMMON_H */
