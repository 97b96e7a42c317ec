/* memory://'s commonest check in one C call.
 *
 * A limiter class's check_with_info becomes a FastMethod: a method
 * descriptor wrapping the Python method. Called with a text identity and
 * rate and no keyword but a cost of 1, None tenant, tenant_type and burst,
 * a text scope, a text or None algorithm and any shadow, on a limiter whose
 * _fast_check is a FastCheck (memory://, see moderato/fast_check.py), with
 * no metrics nor recorder, its breaker settled and no outage being logged,
 * and a plan already made for the rate, it takes the check itself: the
 * keys (build_keys), the store's decision (MemoryStore.decide) and the
 * result (check_result), the very C functions the Python path calls, with
 * the same arguments. Anything else, and anything that fails before the
 * store is asked, goes to the Python method unchanged: it raises what it
 * raises. What fails once the store was asked (the clock, a refusal, a
 * reply that does not decode) goes to the FastCheck's finish(), which takes
 * it the rest of the Python path's way.
 *
 * The asyncio limiter's method returns a ReadyCheck: a completed coroutine
 * (send, throw, close, __await__) whose first step returns the result or
 * raises the error, so `await`, asyncio.run() and create_task() take it as
 * they take a coroutine. The check is decided when the method is called,
 * not when it is first awaited; errors are raised when awaited, as a
 * coroutine's are. The blocking limiter's returns the result itself.
 *
 * Nothing here is kept between calls but the plans' compiled fields (a
 * dict by plan object, bounded): every condition is read on every call, so
 * a recorder or metrics attached later, a breaker that opened or a plan
 * cache that started over take effect on the next check.
 */
#include "fast_check.h"

#include <string.h>
#include <structmember.h>

#include "coroutine.h"
#include "decode.h"
#include "fast_aredis.h"
#include "fast_common.h"
#include "fast_redis.h"
#include "heap_type.h"
#include "keys.h"
#include "sequence.h"
#include "store_decide.h"

/* The texts of FAST_NAMES (fast_common.h), interned into the state below. */
#define FAST_NAME_TEXT(name, text) text,
static const char *const name_texts[] = {FAST_NAMES(FAST_NAME_TEXT)};
#undef FAST_NAME_TEXT

/* A compiled plan: its read fields (fast_common.h) and parsed, a capsule of
 * its fast_plan. */
enum { PLAN_PARSED = PLAN_READ_FIELDS, PLAN_FIELDS };

/* What a plan's checks repeat, parsed once: the store's arguments
 * (store_decision_new) and the keys' windows. */
typedef struct {
    store_decision *decision;
    int policies;
    long long windows_s[ACCEL_MAX_POLICIES];
} fast_plan;

/* ---- ReadyCheck: a completed coroutine --------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *result; /* or NULL */
    PyObject *error;  /* or NULL */
    int done;
} ready_object;

static PyObject *
ready_new(accel_state *state, PyObject *result, PyObject *error)
{
    ready_object *ready = PyObject_GC_New(ready_object, state->ready_type);
    if (ready == NULL) {
        return NULL;
    }
    ready->result = result;
    ready->error = error;
    ready->done = 0;
    PyObject_GC_Track(ready);
    return (PyObject *)ready;
}

#define READY_MEMBERS(X) X(result) X(error)
ACCEL_GC_FUNCTIONS(ready, ready_object, READY_MEMBERS)

/* The one step (coroutine.h): the result, or the error. Thrown into, it
 * ends as a coroutine that has not started does: the exception propagates. */
static int
ready_step(ready_object *ready, PyObject *value, PyObject *thrown, PyObject **out)
{
    *out = NULL;
    if (thrown != NULL) {
        ready->done = 1;
        Py_CLEAR(ready->result);
        Py_CLEAR(ready->error);
        PyErr_SetObject((PyObject *)Py_TYPE(thrown), thrown);
        Py_DECREF(thrown);
        return STEP_ERROR;
    }
    if (ready->done) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return STEP_ERROR;
    }
    if (value != Py_None) {
        PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started coroutine");
        return STEP_ERROR;
    }
    ready->done = 1;
    if (ready->error != NULL) {
        PyObject *error = ready->error;
        ready->error = NULL;
        Py_CLEAR(ready->result);
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
        return STEP_ERROR;
    }
    *out = ready->result;
    ready->result = NULL;
    return *out == NULL ? STEP_ERROR : STEP_RETURN;
}

PyDoc_STRVAR(ready_doc,
"The outcome of a check decided when it was called, as a completed\n"
"coroutine: awaiting it returns the CheckResult or raises the error.");

ACCEL_COROUTINE_SLOTS(ready, ready_object, ready_doc, );

ACCEL_TYPE_SPEC(ready_spec, "moderato._accel.ReadyCheck", sizeof(ready_object),
                Py_TPFLAGS_HAVE_GC, ready_slots);

/* ---- FastCheck: what one limiter's checks read ----------------------------------- */

typedef struct {
    FAST_LIMITER_HEAD
    PyObject *backend;    /* the MemoryBackend: its clock is read per check */
    PyObject *store;      /* its MemoryStore */
    PyObject *wall_clock; /* the backend's default clock: the store reads its own */
    PyObject *shadowed;   /* shadowed(result, scope) */
} fast_check_object;

/* Every member (the head's: fast_common.h). */
#define FAST_CHECK_MEMBERS(X)                                                            \
    FAST_LIMITER_MEMBERS(X) X(backend) X(store) X(wall_clock) X(shadowed)

ACCEL_GC_FUNCTIONS(fast_check, fast_check_object, FAST_CHECK_MEMBERS)

static PyObject *
fast_check_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    /* The keywords, in order, each the member it sets. */
#define FAST_CHECK_ARGUMENTS(X)                                                          \
    FAST_LIMITER_ARGUMENTS(X) X(backend) X(store) X(wall_clock) X(shadowed)
    FAST_CONSTRUCTOR_TABLES(fast_check_object, FAST_CHECK_ARGUMENTS, );
    PyObject *values[FAST_MAX_ARGUMENTS];
    return fast_limiter_new(type, args, kwargs, "UOO!OOOUOOOOO:FastCheck", keywords, offsets,
                            Py_ARRAY_LENGTH(offsets), values);
}

PyDoc_STRVAR(fast_check_doc,
             FAST_LIMITER_DOC("FastCheck", "backend, store, wall_clock, shadowed",
                              "What a memory:// limiter's one-call checks read (its\n"
                              "_fast_check; built by moderato/fast_check.py). A FastMethod\n"
                              "takes a check this way only while it holds one."));

FAST_LIMITER_TYPE(fast_check, "moderato._accel.FastCheck", fast_check_object, fast_check_doc);

/* ---- the check ----------------------------------------------------------------- */

static void
fast_plan_free(PyObject *capsule)
{
    fast_plan *parsed = PyCapsule_GetPointer(capsule, NULL);
    if (parsed != NULL) {
        store_decision_free(parsed->decision);
        PyMem_Free(parsed);
    }
}

/* The plan's parsed part, from its fields and the first check's keys (built
 * by build_keys: its windows are valid ints): a new capsule, or NULL with an
 * error set (the plan is not compiled). */
static PyObject *
parse_plan(PyObject *module, PyObject *compiled, PyObject *keys)
{
    int policies;
    PyObject *windows = PyTuple_GET_ITEM(compiled, PLAN_WINDOWS);
    if (decode_check_plan(module, PyTuple_GET_ITEM(compiled, PLAN_SHAPE), &policies) < 0) {
        return NULL;
    }
    if (PySequence_Fast_GET_SIZE(windows) != policies || PyList_GET_SIZE(keys) != policies) {
        PyErr_SetString(PyExc_ValueError, "a plan's windows and rates differ in number");
        return NULL;
    }
    fast_plan *parsed = PyMem_Malloc(sizeof(fast_plan));
    if (parsed == NULL) {
        return PyErr_NoMemory();
    }
    parsed->policies = policies;
    for (int i = 0; i < policies; i++) {
        parsed->windows_s[i] = PyLong_AsLongLong(PySequence_Fast_ITEMS(windows)[i]);
    }
    parsed->decision = store_decision_new(PyTuple_GET_ITEM(compiled, PLAN_SCRIPT), keys,
                                          PyTuple_GET_ITEM(compiled, PLAN_ARGS));
    if (parsed->decision == NULL || store_decision_policies(parsed->decision) != policies) {
        if (parsed->decision != NULL) {
            store_decision_free(parsed->decision);
            PyErr_SetString(PyExc_ValueError, "a plan's keys and policies differ in number");
        }
        PyMem_Free(parsed);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(parsed, NULL, fast_plan_free);
    if (capsule == NULL) {
        store_decision_free(parsed->decision);
        PyMem_Free(parsed);
    }
    return capsule;
}

/* What compiling a plan needs of its first check: the module, and that
 * check's build_keys arguments but the windows (its algorithm's tag left
 * out: the plan's). */
typedef struct {
    PyObject *module;
    PyObject **key_args;
} plan_context;

/* fast_check's step in compiling a plan (fast_plan_step): its script a name
 * and its windows a tuple, the first check's keys built and the plan parsed
 * from them. */
static int
complete_plan(PyObject *compiled, void *context)
{
    const plan_context *first = context;
    PyObject **key_args = first->key_args;
    if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(compiled, PLAN_SCRIPT)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(compiled, PLAN_WINDOWS))) {
        return -1;
    }
    PyObject *build_args[7] = {key_args[0], PyTuple_GET_ITEM(compiled, PLAN_TAG), key_args[2],
                               key_args[3], key_args[4], PyTuple_GET_ITEM(compiled, PLAN_WINDOWS),
                               key_args[6]};
    PyObject *keys = keys_build(first->module, build_args, 7, NULL);
    PyObject *parsed = keys == NULL ? NULL : parse_plan(first->module, compiled, keys);
    Py_XDECREF(keys);
    if (parsed == NULL) {
        return -1;
    }
    PyTuple_SET_ITEM(compiled, PLAN_PARSED, parsed);
    return 0;
}

/* The rest of the Python path for a check the store was asked: the
 * decision's result, shadow mode on a denial. A new reference, or NULL with
 * the error set. */
static PyObject *
shadow_step(accel_state *state, PyObject *limiter, fast_check_object *fast, PyObject *result,
            PyObject *scope, PyObject *shadow)
{
    if (Py_TYPE(result) != state->check_result_type || results_field(result, 0) != Py_False) {
        return result;
    }
    int on;
    if (shadow == Py_None) {
        PyObject *setting = PyObject_GetAttr(limiter, state->names[NAME_SHADOW]);
        on = setting == NULL ? -1 : PyObject_IsTrue(setting);
        Py_XDECREF(setting);
    }
    else {
        on = PyObject_IsTrue(shadow);
    }
    if (on <= 0) {
        if (on < 0) {
            Py_CLEAR(result);
        }
        return result;
    }
    PyObject *shadowed = PyObject_CallFunctionObjArgs(fast->shadowed, result, scope, NULL);
    Py_DECREF(result);
    return shadowed;
}

/* Item i of a reply, from its integers. */
static PyObject *
reply_integer(void *values, Py_ssize_t i)
{
    return PyLong_FromLongLong(((const long long *)values)[i]);
}

/* The check past the point where the store was asked: the result (new
 * reference) or NULL with the error set. bases: the policies' base keys. */
static PyObject *
decide(accel_state *state, PyObject *module, PyObject *limiter, fast_check_object *fast,
       PyObject *plan, PyObject *compiled, const fast_plan *parsed, const char *const *bases,
       const Py_ssize_t *base_sizes, PyObject *scope, PyObject *shadow)
{
    long long values[2 + 3 * ACCEL_MAX_POLICIES];
    PyObject *reply = NULL, *result = NULL;
    int64_t now_ms = 0;
    int decided = -1;
    PyObject *clock = PyObject_GetAttr(fast->backend, state->names[NAME_CLOCK]);
    if (clock != NULL) {
        PyObject *now = clock == fast->wall_clock ? Py_NewRef(Py_None) : PyObject_CallNoArgs(clock);
        Py_DECREF(clock);
        if (now != NULL) {
            /* What MemoryStore.decide() reads of its now_ms argument. */
            decided = parse_now_or_clock("decide", now, &now_ms);
            Py_DECREF(now);
        }
    }
    if (decided == 0) {
        decided = store_decide_with(fast->store, parsed->decision, bases, base_sizes, now_ms,
                                    values);
    }
    if (decided == 0) {
        result = decode_values_result(module, PyTuple_GET_ITEM(compiled, PLAN_SHAPE), values,
                                      parsed->policies);
        if (result != NULL) {
            return shadow_step(state, limiter, fast, result, scope, shadow);
        }
        if (PyErr_ExceptionMatches(PyExc_TypeError) ||
            PyErr_ExceptionMatches(PyExc_ValueError)) {
            /* The reply the store gave, for finish() to decode as the Python path does. */
            PyErr_Clear();
            reply = accel_build_sequence(0, 2 + 3 * (Py_ssize_t)parsed->policies, reply_integer,
                                         values);
            if (reply == NULL) {
                return NULL;
            }
        }
    }
    /* finish() takes it from here as the Python path would: a reply that did not
     * decode, or what the clock or the store raised. */
    PyObject *error = NULL;
    if (reply == NULL) {
        error = accel_take_exception();
        if (error == NULL) {
            return NULL;
        }
    }
    result = PyObject_CallFunctionObjArgs(fast->finish, limiter, plan, scope, shadow,
                                          reply != NULL ? reply : Py_None,
                                          error != NULL ? error : Py_None, NULL);
    Py_XDECREF(reply);
    Py_XDECREF(error);
    return result;
}

/* ---- FastMethod: the descriptor ----------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *function; /* the Python method */
    /* check's: NULL for check_with_info; else what makes check's answer of
     * check_with_info's outcome (its result, or the asyncio limiter's
     * awaitable of it), and check's own name, docstring and signature. */
    PyObject *then, *name, *doc, *signature;
    int blocking; /* the blocking limiter's: the result itself, errors raised */
    vectorcallfunc vectorcall;
} fast_method_object;

/* The one-call path of check_with_info(limiter, key, rate, **keywords): 1
 * when taken (*out the outcome: a new reference, or NULL with the error
 * set; *taken_state the module's state), 2 when taken by the asyncio
 * limiter's check over Redis (*out its awaitable already), 0 when declined (nothing done, no
 * exception set). */
static int
fast_path(fast_method_object *method, PyObject *const *args, PyObject *kwnames,
          PyObject **out, accel_state **taken_state)
{
    PyObject *limiter = args[0], *key = args[1], *rate = args[2];
    if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(rate)) {
        return 0;
    }
    PyObject *module = PyType_GetModule(Py_TYPE(method));
    accel_state *state = module == NULL ? NULL : PyModule_GetState(module);
    if (state == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *scope = NULL, *algorithm = Py_None, *shadow = Py_None;
    Py_ssize_t keyword_count = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < keyword_count; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[3 + i];
        if (name == state->names[NAME_COST]) {
            int overflow;
            if (!PyLong_CheckExact(value) || PyLong_AsLongAndOverflow(value, &overflow) != 1) {
                PyErr_Clear();
                return 0;
            }
        }
        else if (name == state->names[NAME_SCOPE]) {
            if (!PyUnicode_CheckExact(value)) {
                return 0;
            }
            scope = value;
        }
        else if (name == state->names[NAME_ALGORITHM]) {
            if (value != Py_None && !PyUnicode_CheckExact(value)) {
                return 0;
            }
            algorithm = value;
        }
        else if (name == state->names[NAME_SHADOW]) {
            shadow = value;
        }
        else if (name != state->names[NAME_TENANT_TYPE] && name != state->names[NAME_TENANT] &&
                 name != state->names[NAME_BURST]) {
            return 0; /* a name not interned, or not the method's: the Python path's */
        }
        else if (value != Py_None) {
            return 0;
        }
    }
    PyObject *found = PyObject_GetAttr(limiter, state->names[NAME_FAST_CHECK]);
    if (found != NULL && (Py_TYPE(found) == state->redis_check_type ||
                          Py_TYPE(found) == state->aredis_check_type)) {
        /* The blocking or the asyncio limiter over one Redis server
         * (fast_redis.c; for the asyncio one's, 2: *out is the awaitable
         * itself). */
        int redis_taken = fast_redis_check(state, module, limiter, found, key, rate, scope,
                                           algorithm, shadow, out);
        Py_DECREF(found);
        return redis_taken;
    }
    if (found == NULL || Py_TYPE(found) != state->fast_check_type) {
        PyErr_Clear();
        Py_XDECREF(found);
        return 0;
    }
    fast_check_object *fast = (fast_check_object *)found;
    if (scope == NULL) {
        scope = fast->global_scope;
    }
    PyObject *plan = NULL, *compiled;
    int taken = 0;
    PyObject *secret = fast->secret == Py_None ? NULL : fast->secret;
    PyObject *key_args[7] = {fast->prefix, NULL, state->names[NAME_EMPTY], scope, key, NULL,
                             fast->secret};
    plan_context first = {module, key_args};
    if (!fast_limiter_allows(state, limiter, (fast_limiter *)fast) ||
        (plan = fast_find_plan(state, (fast_limiter *)fast, rate, algorithm)) == NULL ||
        (compiled = fast_compiled_plan(state, (fast_limiter *)fast, plan, PLAN_FIELDS,
                                       complete_plan, &first)) == NULL) {
        goto done;
    }
    Py_INCREF(compiled);
    const fast_plan *parsed = PyCapsule_GetPointer(PyTuple_GET_ITEM(compiled, PLAN_PARSED), NULL);
    /* The keys as build_keys makes them, in place. */
    char keys[ACCEL_MAX_POLICIES][KEYS_MAX_BYTES];
    const char *bases[ACCEL_MAX_POLICIES];
    Py_ssize_t base_sizes[ACCEL_MAX_POLICIES];
    key_args[1] = PyTuple_GET_ITEM(compiled, PLAN_TAG);
    Py_ssize_t head_size = keys_write_head(key_args, secret, keys[0]);
    if (head_size < 0) {
        PyErr_Clear(); /* the Python path raises it, as its KeyPartError */
        Py_DECREF(compiled);
        goto done;
    }
    for (int i = 0; i < parsed->policies; i++) {
        if (i > 0) {
            memcpy(keys[i], keys[0], (size_t)head_size);
        }
        bases[i] = keys[i];
        base_sizes[i] = keys_write_window(keys[i] + head_size, parsed->windows_s[i]) - keys[i];
    }
    /* From here the store is asked: the check is taken whatever happens. */
    taken = 1;
    *taken_state = state;
    *out = decide(state, module, limiter, fast, plan, compiled, parsed, bases, base_sizes, scope,
                  shadow);
    Py_DECREF(compiled);
done:
    Py_XDECREF(plan);
    Py_DECREF(found);
    return taken;
}

/* check_with_info's outcome: the result (the blocking limiter's) or an
 * awaitable of it (the asyncio one's), a new reference, or NULL with the
 * error set. */
static PyObject *
fast_method_outcome(fast_method_object *method, PyObject *const *args, size_t nargsf,
                    PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) == 3) {
        PyObject *result = NULL;
        accel_state *state = NULL;
        int taken = fast_path(method, args, kwnames, &result, &state);
        if (taken == 2) {
            return result; /* an awaitable of its own (fast_aredis.c) */
        }
        if (taken) {
            if (method->blocking) {
                return result;
            }
            if (result != NULL) {
                return ready_new(state, result, NULL);
            }
            PyObject *error = accel_take_exception();
            return error == NULL ? NULL : ready_new(state, NULL, error);
        }
    }
    return PyObject_Vectorcall(method->function, args, nargsf, kwnames);
}

static PyObject *
fast_method_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                       PyObject *kwnames)
{
    fast_method_object *method = (fast_method_object *)callable;
    PyObject *outcome = fast_method_outcome(method, args, nargsf, kwnames);
    if (outcome == NULL || method->then == NULL) {
        return outcome;
    }
    PyObject *answer = PyObject_CallOneArg(method->then, outcome);
    Py_DECREF(outcome);
    return answer;
}

static PyObject *
fast_method_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"function", "blocking", "then", "name", "doc", "signature", NULL};
    PyObject *function, *then = Py_None, *name = Py_None, *doc = Py_None, *signature = Py_None;
    int blocking = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$pOUOO:FastMethod", keywords, &function,
                                     &blocking, &then, &name, &doc, &signature)) {
        return NULL;
    }
    if (!PyCallable_Check(function) || (then != Py_None && !PyCallable_Check(then))) {
        PyErr_Format(PyExc_TypeError,
                     "FastMethod() function and then must be callable, not %.100s",
                     Py_TYPE(PyCallable_Check(function) ? then : function)->tp_name);
        return NULL;
    }
    if ((then == Py_None) != (name == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "FastMethod() takes then= and name= together");
        return NULL;
    }
    fast_method_object *method = (fast_method_object *)type->tp_alloc(type, 0);
    if (method == NULL) {
        return NULL;
    }
    method->function = Py_NewRef(function);
    if (then != Py_None) {
        method->then = Py_NewRef(then);
        method->name = Py_NewRef(name);
        method->doc = Py_NewRef(doc);
        method->signature = Py_NewRef(signature);
    }
    method->blocking = blocking;
    method->vectorcall = fast_method_vectorcall;
    return (PyObject *)method;
}

#define FAST_METHOD_MEMBERS(X) X(function) X(then) X(name) X(doc) X(signature)
ACCEL_GC_FUNCTIONS(fast_method, fast_method_object, FAST_METHOD_MEMBERS)

/* A method: bound to an instance, itself on the class. */
static PyObject *
fast_method_get(PyObject *self, PyObject *instance, PyObject *Py_UNUSED(owner))
{
    if (instance == NULL || instance == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, instance);
}

/* Any other attribute is the Python method's (__name__, __doc__, __code__,
 * __defaults__...), so that help(), inspect and the docs see it. */
static PyObject *
fast_method_getattro(PyObject *self, PyObject *name)
{
    fast_method_object *method = (fast_method_object *)self;
    PyObject *function = method->function;
    if (method->then != NULL && PyUnicode_Check(name)) {
        /* check's own: its name, words and signature, not check_with_info's */
        if (PyUnicode_CompareWithASCIIString(name, "__name__") == 0) {
            return Py_NewRef(method->name);
        }
        if (PyUnicode_CompareWithASCIIString(name, "__qualname__") == 0) {
            PyObject *owner = PyObject_GetAttrString(function, "__qualname__");
            if (owner == NULL) {
                return NULL;
            }
            /* check_with_info's class, then check's own name */
            Py_ssize_t dot = PyUnicode_FindChar(owner, '.', 0, PyUnicode_GET_LENGTH(owner), -1);
            PyObject *head = dot < 0 ? NULL : PyUnicode_Substring(owner, 0, dot + 1);
            Py_DECREF(owner);
            if (dot < 0) {
                return dot == -1 ? Py_NewRef(method->name) : NULL;
            }
            if (head == NULL) {
                return NULL;
            }
            PyObject *qualname = PyUnicode_Concat(head, method->name);
            Py_DECREF(head);
            return qualname;
        }
        if (PyUnicode_CompareWithASCIIString(name, "__doc__") == 0) {
            return Py_NewRef(method->doc);
        }
        if (PyUnicode_CompareWithASCIIString(name, "__signature__") == 0 &&
            method->signature != Py_None) {
            return Py_NewRef(method->signature);
        }
    }
    if (PyUnicode_Check(name) &&
        (PyUnicode_CompareWithASCIIString(name, "__doc__") == 0 ||
         PyUnicode_CompareWithASCIIString(name, "__module__") == 0)) {
        return PyObject_GetAttr(function, name);
    }
    PyObject *value = PyObject_GenericGetAttr(self, name);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        value = PyObject_GetAttr(function, name);
    }
    return value;
}

static PyObject *
fast_method_wrapped(PyObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(((fast_method_object *)self)->function);
}

static PyGetSetDef fast_method_getset[] = {
    {"__wrapped__", fast_method_wrapped, NULL, "The Python method.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(fast_method_doc,
"FastMethod(function, *, blocking, then=None, name=None, doc=None, signature=None)\n"
"--\n"
"\n"
"check_with_info as a method descriptor: a limiter's commonest check on\n"
"memory:// in one C call, any other the Python method's (function).\n"
"With then: check, the same call with then(outcome) its answer (a denial\n"
"raised), named, documented and signed as given.");

ACCEL_VECTORCALL_TYPE(fast_method, "moderato._accel.FastMethod", fast_method_object,
                      fast_method_doc, Py_TPFLAGS_METHOD_DESCRIPTOR, {Py_tp_new, fast_method_new},
                      {Py_tp_descr_get, fast_method_get}, {Py_tp_getattro, fast_method_getattro},
                      {Py_tp_getset, fast_method_getset});

/* ---- the module's part ---------------------------------------------------------------- */

int
fast_check_add_to_module(PyObject *module)
{
    Py_BUILD_ASSERT(NAME_END == FAST_NAME_COUNT);
    accel_state *state = PyModule_GetState(module);
    if (fast_intern_names(state->names, name_texts, FAST_NAME_COUNT) < 0 ||
        accel_add_type(module, &ready_spec, "ReadyCheck", &state->ready_type) < 0 ||
        accel_add_type(module, &fast_check_spec, "FastCheck", &state->fast_check_type) < 0 ||
        accel_add_type(module, &fast_method_spec, "FastMethod", &state->fast_method_type) < 0) {
        return -1;
    }
    return 0;
}
