/* The asyncio limiter's commonest check over one Redis server in one C call.
 *
 * The asyncio RateLimiter's check_with_info is a FastMethod (fast_check.c).
 * When the limiter's _fast_check is an AsyncRedisFastCheck
 * (moderato/fast_redis.py: a RedisBackend of its own over a plain
 * RedisClient: TCP, TLS or unix; no Cluster, Sentinel, redis-py client nor
 * denial cache), the FastMethod hands the commonest check (text identity,
 * rate and scope, no tenant, a cost of 1, no burst) here. With no metrics
 * nor recorder, the breaker settled, no outage being logged, a plan already
 * made for the rate, a running event loop whose pool the client already
 * holds, and a usable connection in it, it is sent from C:
 *
 *   the keys (build_keys) and the EVALSHA (encode_evalsha), as the Python
 *   path builds them; the connection chosen as RedisClient.evalsha()
 *   chooses it (the pool's only one, else the one its batch of this loop
 *   turn is open on or that has nothing in flight, else pick()); the
 *   command queued by that connection's send_script(), which is what
 *   evalsha() calls: the same pipelining, timeout, NOSCRIPT repair and
 *   failure of every pending command when the connection is lost.
 *
 * What the call returns is a PendingCheck: a coroutine-like awaitable
 * (send, throw, close, __await__) that waits on the connection's future
 * and, once it has the reply, builds the result by check_result. Anything
 * the Python path would do more than that (an error or a timeout thrown
 * in, a reply check_result refuses, a denial in shadow mode, a breaker,
 * failure log, metrics or recorder that changed during the round trip)
 * goes to the AsyncRedisFastCheck's settle(), which takes it the Python
 * path's way from the await on. The command is never sent twice.
 *
 * Anything unusual before the send (no running loop, no pool yet, no
 * usable connection, keys or arguments C refuses) declines with nothing
 * queued: the Python method takes the check. As memory://'s one-call check
 * is decided when called, this one is sent when called, not when first
 * awaited; a coroutine of the Python path sends at its first step.
 */
#include "fast_aredis.h"

#include "decode.h"
#include "fast_redis.h"
#include "heap_type.h"
#include "keys.h"
#include "resp.h"

/* ---- AsyncRedisFastCheck: what one asyncio limiter's checks read ------------------- */

/* The constructor's keywords, in order, each the member it sets. */
#define AREDIS_CHECK_ARGUMENTS(X)                                                        \
    X(prefix) X(secret) X(client) X(defaults) X(plans) X(breaker) X(failure_log)         \
    X(load_script) X(finish) X(rest) X(global_scope)

ACCEL_GC_FUNCTIONS(aredis_check, redis_check_object, REDIS_CHECK_MEMBERS)

static PyObject *
aredis_check_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    /* settle and get_running_loop are kept as finish and rest (fast_redis.h). */
    static char *keywords[] = {"prefix",      "secret",      "client",
                               "defaults",    "plans",       "breaker",
                               "failure_log", "load_script", "settle",
                               "get_running_loop", "global_scope", NULL};
    PyObject *values[sizeof(keywords) / sizeof(keywords[0]) - 1];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UOOO!OOOOOOU:AsyncRedisFastCheck", keywords,
                                     &values[0], &values[1], &values[2], &PyDict_Type,
                                     &values[3], &values[4], &values[5], &values[6],
                                     &values[7], &values[8], &values[9], &values[10])) {
        return NULL;
    }
    if (values[1] != Py_None && !PyBytes_Check(values[1])) {
        PyErr_Format(PyExc_TypeError,
                     "AsyncRedisFastCheck() secret must be bytes or None, not %.100s",
                     Py_TYPE(values[1])->tp_name);
        return NULL;
    }
    redis_check_object *check = (redis_check_object *)type->tp_alloc(type, 0);
    if (check == NULL) {
        return NULL;
    }
    check->compiled = PyDict_New();
    if (check->compiled == NULL) {
        Py_DECREF(check);
        return NULL;
    }
    PyObject **value = values;
#define TAKE_ARGUMENT(member) check->member = Py_NewRef(*value++);
    AREDIS_CHECK_ARGUMENTS(TAKE_ARGUMENT)
#undef TAKE_ARGUMENT
    check->idle_check_after_s = 0.0;
    return (PyObject *)check;
}

static PyObject *
aredis_check_compiled_count(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(PyDict_GET_SIZE(((redis_check_object *)self)->compiled));
}

static PyGetSetDef aredis_check_getset[] = {
    {"compiled_count", aredis_check_compiled_count, NULL,
     "Plans compiled for the one-call path so far (for tests).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(aredis_check_doc,
"AsyncRedisFastCheck(*, prefix, secret, client, defaults, plans, breaker,\n"
"                    failure_log, load_script, settle, get_running_loop,\n"
"                    global_scope)\n"
"--\n"
"\n"
"What an asyncio limiter's one-call checks over one Redis server read (its\n"
"_fast_check; built by moderato/fast_redis.py).");

static PyType_Slot aredis_check_slots[] = {
    ACCEL_GC_SLOTS(aredis_check, aredis_check_doc),
    {Py_tp_new, aredis_check_new},
    {Py_tp_getset, aredis_check_getset},
    {0, NULL},
};

ACCEL_TYPE_SPEC(aredis_check_spec, "moderato._accel.AsyncRedisFastCheck",
                sizeof(redis_check_object), Py_TPFLAGS_HAVE_GC | ACCEL_TPFLAGS_IMMUTABLE,
                aredis_check_slots);

/* ---- PendingCheck: the awaitable of a check sent --------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *future;  /* the connection's future of the reply, until the outcome */
    PyObject *iter;    /* its __await__ iterator, once stepped */
    PyObject *check;   /* the AsyncRedisFastCheck */
    PyObject *limiter;
    PyObject *plan;
    PyObject *key;
    PyObject *scope;
    PyObject *shadow;
    PyObject *shape;   /* the plan's result_shape */
    int done;
} pending_object;

#define PENDING_MEMBERS(X)                                                               \
    X(future) X(iter) X(check) X(limiter) X(plan) X(key) X(scope) X(shadow) X(shape)
ACCEL_GC_FUNCTIONS(pending, pending_object, PENDING_MEMBERS)

enum { STEP_YIELD, STEP_RETURN, STEP_ERROR };

/* Whether the check's shadow setting (its own, else the limiter's) is on:
 * 1, 0, or -1 with an exception set. */
static int
shadow_on(accel_state *state, pending_object *pending)
{
    if (pending->shadow != Py_None) {
        return PyObject_IsTrue(pending->shadow);
    }
    PyObject *setting = PyObject_GetAttr(pending->limiter, NAME(state, SHADOW));
    int on = setting == NULL ? -1 : PyObject_IsTrue(setting);
    Py_XDECREF(setting);
    return on;
}

/* The check's result from the reply (error NULL) or from what the await
 * raised (reply NULL): a new reference, or NULL with the error set. */
static PyObject *
pending_outcome(accel_state *state, PyObject *module, pending_object *pending, PyObject *reply,
                PyObject *error)
{
    redis_check_object *check = (redis_check_object *)pending->check;
    if (error == NULL) {
        PyObject *result_args[2] = {reply, pending->shape};
        PyObject *result = decode_check_result(module, result_args, 2);
        if (result != NULL && Py_TYPE(result) == state->check_result_type &&
            fast_redis_quiet(state, check) &&
            fast_redis_attribute_is(pending->limiter, NAME(state, METRICS), Py_None) &&
            fast_redis_attribute_is(pending->limiter, NAME(state, RECORDER), Py_None) &&
            (results_field(result, 0) == Py_True || shadow_on(state, pending) == 0)) {
            return result;
        }
        /* A reply check_result refused (the BackendError naming the script), a
         * denial in shadow mode, or a breaker, failure log, metrics or recorder
         * that changed meanwhile: the Python path's end. */
        PyErr_Clear();
        Py_XDECREF(result);
    }
    return PyObject_CallFunctionObjArgs(check->finish, pending->limiter, pending->plan,
                                        pending->key, pending->scope, pending->shadow,
                                        reply != NULL ? reply : Py_None,
                                        error != NULL ? error : Py_None, NULL);
}

/* The future's iterator, stepped with value (or NULL when it ended): 1 (*out
 * the value it yields), 0 (*reply its result), -1 (*error what it raised). */
static int
step_future(pending_object *pending, PyObject *value, PyObject **out, PyObject **reply,
            PyObject **error)
{
    if (pending->iter == NULL) {
        PyAsyncMethods *methods = Py_TYPE(pending->future)->tp_as_async;
        if (methods == NULL || methods->am_await == NULL) {
            PyErr_Format(PyExc_TypeError, "the client returned %.100s, not a future",
                         Py_TYPE(pending->future)->tp_name);
        }
        else {
            pending->iter = methods->am_await(pending->future);
        }
        if (pending->iter == NULL) {
            *error = accel_take_exception();
            return -1;
        }
    }
#if PY_VERSION_HEX >= 0x030A0000
    PyObject *got;
    PySendResult sent = PyIter_Send(pending->iter, value, &got);
    if (sent == PYGEN_NEXT) {
        *out = got;
        return 1;
    }
    if (sent == PYGEN_RETURN) {
        *reply = got;
        return 0;
    }
#else
    PyObject *got = value == Py_None
                        ? Py_TYPE(pending->iter)->tp_iternext(pending->iter)
                        : PyObject_CallMethod(pending->iter, "send", "O", value);
    if (got != NULL) {
        *out = got;
        return 1;
    }
    if (!PyErr_Occurred()) {
        *reply = Py_NewRef(Py_None);
        return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_StopIteration)) {
        PyObject *stop = accel_take_exception();
        *reply = stop == NULL ? NULL : PyObject_GetAttrString(stop, "value");
        Py_XDECREF(stop);
        if (*reply != NULL) {
            return 0;
        }
    }
#endif
    *error = accel_take_exception();
    return -1;
}

/* One step of the awaitable: sent value (None), or thrown (an exception
 * instance, a new reference given over). STEP_YIELD (*out: what to yield),
 * STEP_RETURN (*out: the result) or STEP_ERROR (an exception set). */
static int
pending_step(pending_object *pending, PyObject *value, PyObject *thrown, PyObject **out)
{
    *out = NULL;
    if (pending->done) {
        Py_XDECREF(thrown);
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return STEP_ERROR;
    }
    PyObject *reply = NULL, *error = thrown;
    if (error == NULL && step_future(pending, value, out, &reply, &error) == 1) {
        return STEP_YIELD;
    }
    pending->done = 1;
    Py_CLEAR(pending->iter);
    Py_CLEAR(pending->future);
    PyObject *module = PyType_GetModule(Py_TYPE(pending));
    accel_state *state = module == NULL ? NULL : PyModule_GetState(module);
    if (state == NULL || (reply == NULL && error == NULL)) {
        Py_XDECREF(reply);
        Py_XDECREF(error);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError, "fast_aredis: an empty outcome");
        }
        return STEP_ERROR;
    }
    *out = pending_outcome(state, module, pending, reply, error);
    Py_XDECREF(reply);
    Py_XDECREF(error);
    /* Nothing more is read: let go of what the check held. */
    Py_CLEAR(pending->limiter);
    Py_CLEAR(pending->plan);
    Py_CLEAR(pending->key);
    Py_CLEAR(pending->scope);
    Py_CLEAR(pending->shadow);
    Py_CLEAR(pending->shape);
    Py_CLEAR(pending->check);
    return *out == NULL ? STEP_ERROR : STEP_RETURN;
}

/* A step's outcome as an iterator's: the value yielded, or NULL with
 * StopIteration(result) or the error set. */
static PyObject *
as_iterator_step(int stepped, PyObject *out)
{
    if (stepped == STEP_YIELD) {
        return out;
    }
    if (stepped == STEP_RETURN) {
        /* StopIteration(result), its value taken as given even if it is a tuple. */
        PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, out);
        Py_DECREF(out);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
    }
    return NULL;
}

static PyObject *
pending_iternext(PyObject *self)
{
    PyObject *out;
    int stepped = pending_step((pending_object *)self, Py_None, NULL, &out);
    return as_iterator_step(stepped, out);
}

static PyObject *
pending_send(PyObject *self, PyObject *value)
{
    PyObject *out;
    int stepped = pending_step((pending_object *)self, value, NULL, &out);
    return as_iterator_step(stepped, out);
}

#if PY_VERSION_HEX >= 0x030A0000
static PySendResult
pending_am_send(PyObject *self, PyObject *value, PyObject **presult)
{
    int stepped = pending_step((pending_object *)self, value, NULL, presult);
    return stepped == STEP_YIELD ? PYGEN_NEXT : stepped == STEP_RETURN ? PYGEN_RETURN : PYGEN_ERROR;
}
#endif

static PyObject *
pending_await(PyObject *self)
{
    return Py_NewRef(self);
}

/* throw(type[, value[, traceback]]): raised where the check awaits its
 * reply, as into the Python path's coroutine (a task's cancellation, the
 * client's error): settle() takes it the Python path's way. */
static PyObject *
pending_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected 1 to 3 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *thrown = args[0];
    if (PyExceptionInstance_Check(thrown)) {
        PyErr_SetObject((PyObject *)Py_TYPE(thrown), thrown);
    }
    else if (PyExceptionClass_Check(thrown)) {
        PyErr_SetObject(thrown, nargs >= 2 ? args[1] : Py_None);
    }
    else {
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
        return NULL;
    }
    PyObject *error = accel_take_exception();
    if (error == NULL) {
        return NULL;
    }
    PyObject *out;
    int stepped = pending_step((pending_object *)self, Py_None, error, &out);
    return as_iterator_step(stepped, out);
}

/* close(): the check is dropped where it awaits its reply; the reply, when
 * it comes, only frees the connection's slot for it. */
static PyObject *
pending_close(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    pending_object *pending = (pending_object *)self;
    pending->done = 1;
    (void)pending_clear(self);
    Py_RETURN_NONE;
}

static PyMethodDef pending_methods[] = {
    {"send", pending_send, METH_O, "Step the check: yield its future, or end with the result."},
    {"throw", (PyCFunction)(void (*)(void))pending_throw, METH_FASTCALL,
     "Raise the exception where the check awaits its reply."},
    {"close", pending_close, METH_NOARGS, "Drop the check."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(pending_doc,
"A check over Redis sent when it was called, as a coroutine: awaiting it\n"
"waits for the reply and returns the CheckResult or raises the error.");

static PyType_Slot pending_slots[] = {
    ACCEL_GC_SLOTS(pending, pending_doc),
    {Py_tp_iter, pending_await},
    {Py_tp_iternext, pending_iternext},
    {Py_tp_methods, pending_methods},
    {Py_am_await, pending_await},
#if PY_VERSION_HEX >= 0x030A0000
    {Py_am_send, pending_am_send},
#endif
    {0, NULL},
};

ACCEL_TYPE_SPEC(pending_spec, "moderato._accel.PendingCheck", sizeof(pending_object),
                Py_TPFLAGS_HAVE_GC, pending_slots);

/* ---- the check ----------------------------------------------------------------- */

/* Whether connection may take this loop turn's next command as evalsha()'s
 * own test has it: usable, and its batch of this turn open or nothing in
 * flight. 1 or 0, never an exception. */
static int
joinable(accel_state *state, PyObject *connection)
{
    if (connection == Py_None || !fast_redis_attribute_is(connection, NAME(state, USABLE), Py_True)) {
        return 0;
    }
    if (fast_redis_attribute_is(connection, NAME(state, BATCH_OPEN), Py_True)) {
        return 1;
    }
    PyObject *pending = PyObject_GetAttr(connection, NAME(state, PENDING));
    Py_ssize_t in_flight = pending == NULL ? -1 : PyObject_Length(pending);
    Py_XDECREF(pending);
    if (in_flight < 0) {
        PyErr_Clear();
    }
    return in_flight == 0;
}

/* The connection of this loop's pool the command goes to, as
 * RedisClient.evalsha() chooses it: a new reference, or NULL (declined, no
 * exception, nothing sent). */
static PyObject *
connection_for(accel_state *state, redis_check_object *check)
{
    PyObject *loop = PyObject_CallNoArgs(check->rest); /* get_running_loop() */
    PyObject *pools = loop == NULL ? NULL : PyObject_GetAttr(check->client, NAME(state, POOLS));
    PyObject *pool = NULL;
    if (pools != NULL && PyDict_CheckExact(pools)) {
        pool = PyDict_GetItemWithError(pools, loop);
        Py_XINCREF(pool);
    }
    Py_XDECREF(pools);
    Py_XDECREF(loop);
    if (pool == NULL) {
        PyErr_Clear(); /* no running loop, or its first command: the Python path */
        return NULL;
    }
    PyObject *connection = PyObject_GetAttr(pool, NAME(state, ONLY));
    if (connection != NULL &&
        (connection == Py_None ||
         !fast_redis_attribute_is(connection, NAME(state, USABLE), Py_True))) {
        Py_DECREF(connection);
        connection = PyObject_GetAttr(pool, NAME(state, BATCHING));
        if (connection != NULL && !joinable(state, connection)) {
            Py_DECREF(connection);
            /* Opens one if it must; raises when none can take it (the Python
             * path then asks again and gets the same answer as its error). */
            connection = PyObject_CallMethodNoArgs(pool, NAME(state, PICK));
        }
    }
    Py_DECREF(pool);
    if (connection == NULL) {
        PyErr_Clear();
    }
    return connection;
}

int
fast_aredis_check(accel_state *state, PyObject *module, PyObject *limiter, PyObject *found,
                  PyObject *key, PyObject *rate, PyObject *scope, PyObject *algorithm,
                  PyObject *shadow, PyObject **out)
{
    redis_check_object *check = (redis_check_object *)found;
    if (scope == NULL) {
        scope = check->global_scope;
    }
    if (!fast_redis_attribute_is(limiter, NAME(state, METRICS), Py_None) ||
        !fast_redis_attribute_is(limiter, NAME(state, RECORDER), Py_None) ||
        !fast_redis_quiet(state, check)) {
        return 0;
    }
    PyObject *plan = fast_redis_find_plan(state, check, rate, algorithm);
    if (plan == NULL) {
        return 0;
    }
    PyObject *keys = NULL, *payload = NULL, *connection = NULL, *future = NULL;
    int taken = 0;
    PyObject *compiled = fast_redis_compiled_plan(state, check, plan);
    if (compiled == NULL) {
        goto done;
    }
    Py_INCREF(compiled);
    payload = fast_redis_payload(state, module, check, compiled, scope, key, &keys);
    if (payload == NULL || (connection = connection_for(state, check)) == NULL) {
        PyErr_Clear(); /* the Python path raises it (a bad key part), or takes the check */
        Py_DECREF(compiled);
        goto done;
    }
    PyObject *send_args[5] = {connection, payload, PyTuple_GET_ITEM(compiled, RPLAN_SCRIPT), keys,
                              PyTuple_GET_ITEM(compiled, RPLAN_ARGS)};
    future = PyObject_VectorcallMethod(NAME(state, SEND_SCRIPT), send_args,
                                       5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (future == NULL) {
        PyErr_Clear(); /* closed meanwhile, nothing queued: the Python path's */
        Py_DECREF(compiled);
        goto done;
    }
    /* From here the command is queued: the check is taken whatever happens. */
    taken = 1;
    pending_object *pending = PyObject_GC_New(pending_object, state->pending_check_type);
    if (pending != NULL) {
        pending->future = future;
        future = NULL;
        pending->iter = NULL;
        pending->check = Py_NewRef(found);
        pending->limiter = Py_NewRef(limiter);
        pending->plan = Py_NewRef(plan);
        pending->key = Py_NewRef(key);
        pending->scope = Py_NewRef(scope);
        pending->shadow = Py_NewRef(shadow);
        pending->shape = Py_NewRef(PyTuple_GET_ITEM(compiled, RPLAN_SHAPE));
        pending->done = 0;
        PyObject_GC_Track(pending);
    }
    *out = (PyObject *)pending;
    Py_DECREF(compiled);
done:
    Py_XDECREF(future);
    Py_XDECREF(connection);
    Py_XDECREF(payload);
    Py_XDECREF(keys);
    Py_DECREF(plan);
    return taken;
}

/* ---- the module's part ---------------------------------------------------------------- */

int
fast_aredis_add_to_module(PyObject *module)
{
    accel_state *state = PyModule_GetState(module);
    if (accel_add_type(module, &aredis_check_spec, "AsyncRedisFastCheck",
                       &state->aredis_check_type) < 0 ||
        accel_add_type(module, &pending_spec, "PendingCheck", &state->pending_check_type) < 0) {
        return -1;
    }
    return 0;
}
