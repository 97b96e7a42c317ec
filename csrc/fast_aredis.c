/* The asyncio limiter's commonest check over one Redis server in one C call.
 *
 * The asyncio RateLimiter's check_with_info is a FastMethod (fast_check.c).
 * When the limiter's _fast_check is an AsyncRedisFastCheck
 * (moderato/fast_aredis.py: a RedisBackend of its own, its denials
 * remembered or not, over a plain RedisClient: TCP, TLS or unix; no
 * Cluster, Sentinel nor redis-py client), the FastMethod hands the
 * commonest check (text identity,
 * rate and scope, no tenant, a cost of 1, no burst) to fast_redis_check(),
 * which builds its request as for the blocking check and hands it here
 * (fast_aredis_send). With no metrics
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
 *
 * With the denial cache, DenialCachingBackend's steps: a check whose
 * identity the cache remembers a denial for is declined before anything is
 * sent (the Python path looks it up); any other is sent with the cache's
 * ticket (its clock and generation, read before the send); an admitted
 * reply forgets the denial it contradicts; a denial goes to settle(), which
 * remembers it (DenialCache.record).
 */
#include "fast_aredis.h"

#include "connection_core.h"
#include "coroutine.h"
#include "decode.h"
#include "heap_type.h"
#include "keys.h"
#include "resp.h"

/* ---- AsyncRedisFastCheck: what one asyncio limiter's checks read ------------------- */

ACCEL_GC_FUNCTIONS(aredis_check, redis_check_object, REDIS_CHECK_MEMBERS)

static PyObject *
aredis_check_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    FAST_CONSTRUCTOR_TABLES(redis_check_object, AREDIS_CHECK_ARGUMENTS, );
    PyObject *values[FAST_MAX_ARGUMENTS];
    return fast_limiter_new(type, args, kwargs, "UOO!OOOUOOOOO:AsyncRedisFastCheck", keywords,
                            offsets, Py_ARRAY_LENGTH(offsets), values);
}

PyDoc_STRVAR(aredis_check_doc,
             FAST_LIMITER_DOC("AsyncRedisFastCheck",
                              "client, load_script, get_running_loop, cache",
                              "What an asyncio limiter's one-call checks over one Redis\n"
                              "server read (its _fast_check; built by\n"
                              "moderato/fast_aredis.py). Its finish is the settle() that\n"
                              "ends a check the Python path's way from the await on; cache\n"
                              "the backend's DenialCache, or None."));

FAST_LIMITER_TYPE(aredis_check, "moderato._accel.AsyncRedisFastCheck", redis_check_object,
                  aredis_check_doc);

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
    /* With a denial cache (else NULL): what remembering its denial needs, as
     * DenialCachingBackend's ticket has it, and the cache. */
    PyObject *cache;
    PyObject *first_key;
    PyObject *issued_s;   /* cache.clock() before the command was sent */
    PyObject *generation; /* cache.generation then */
    int done;
} pending_object;

#define PENDING_MEMBERS(X)                                                               \
    X(future) X(iter) X(check) X(limiter) X(plan) X(key) X(scope) X(shadow) X(shape)     \
    X(cache) X(first_key) X(issued_s) X(generation)
ACCEL_GC_FUNCTIONS(pending, pending_object, PENDING_MEMBERS)

/* Whether the check's shadow setting (its own, else the limiter's) is on:
 * 1, 0, or -1 with an exception set. */
static int
shadow_on(accel_state *state, pending_object *pending)
{
    if (pending->shadow != Py_None) {
        return PyObject_IsTrue(pending->shadow);
    }
    PyObject *setting = PyObject_GetAttr(pending->limiter, state->names[NAME_SHADOW]);
    int on = setting == NULL ? -1 : PyObject_IsTrue(setting);
    Py_XDECREF(setting);
    return on;
}

/* An admission forgets the denial of this check's identity its cache
 * remembers, if any: DenialCache.record()'s admitted case (an empty cache
 * has none). 0, or -1 (no exception set: settle() then takes the check). */
static int
forget_denial(accel_state *state, pending_object *pending)
{
    PyObject *entries = PyObject_GetAttr(pending->cache, NAME(state, ENTRIES));
    int forgotten = entries != NULL && PyDict_CheckExact(entries) ? 0 : -1;
    if (forgotten == 0 && PyDict_GET_SIZE(entries) > 0) {
        PyObject *entry_key = PyTuple_Pack(2, pending->plan, pending->first_key);
        forgotten = entry_key == NULL ? -1 : PyDict_DelItem(entries, entry_key);
        Py_XDECREF(entry_key);
        if (forgotten < 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
            forgotten = 0; /* nothing remembered for it */
        }
    }
    Py_XDECREF(entries);
    PyErr_Clear();
    return forgotten;
}

/* Whether C ends a check whose reply decoded to result, with nothing left
 * for the Python path to do: 1 or 0, never an exception. */
static int
ends_in_c(accel_state *state, pending_object *pending, PyObject *result)
{
    if (Py_TYPE(result) != state->check_result_type ||
        !fast_limiter_allows(state, pending->limiter, (fast_limiter *)pending->check)) {
        return 0;
    }
    if (results_field(result, 0) == Py_True) {
        return pending->cache == NULL || forget_denial(state, pending) == 0;
    }
    /* A denial: remembered by settle() when there is a cache. */
    int shadowing = pending->cache == NULL ? shadow_on(state, pending) : 1;
    PyErr_Clear();
    return shadowing == 0;
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
        if (result != NULL && ends_in_c(state, pending, result)) {
            return result;
        }
        /* A reply check_result refused (the BackendError naming the script), a
         * denial in shadow mode or to remember, or a breaker, failure log,
         * metrics or recorder that changed meanwhile: the Python path's end. */
        PyErr_Clear();
        Py_XDECREF(result);
    }
#define OR_NONE(object) ((object) != NULL ? (object) : Py_None)
    return PyObject_CallFunctionObjArgs(
        check->finish, pending->limiter, pending->plan, pending->key, pending->scope,
        pending->shadow, OR_NONE(reply), OR_NONE(error), OR_NONE(pending->cache),
        OR_NONE(pending->first_key), OR_NONE(pending->issued_s), OR_NONE(pending->generation),
        NULL);
#undef OR_NONE
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

/* One step of the awaitable (coroutine.h): sent value (None), or thrown
 * (an exception instance, a new reference given over): what throw() raises
 * where the check awaits its reply (a task's cancellation, the client's
 * error) goes to settle(), the Python path's way. */
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
    Py_CLEAR(pending->cache);
    Py_CLEAR(pending->first_key);
    Py_CLEAR(pending->issued_s);
    Py_CLEAR(pending->generation);
    return *out == NULL ? STEP_ERROR : STEP_RETURN;
}

/* Closed, the check is dropped where it awaits its reply; the reply, when it
 * comes, only frees the connection's slot for it. */
PyDoc_STRVAR(pending_doc,
"A check over Redis sent when it was called, as a coroutine: awaiting it\n"
"waits for the reply and returns the CheckResult or raises the error.");

ACCEL_COROUTINE_SLOTS(pending, pending_object, pending_doc, {Py_tp_iter, pending_await}, );

ACCEL_TYPE_SPEC(pending_spec, "moderato._accel.PendingCheck", sizeof(pending_object),
                Py_TPFLAGS_HAVE_GC, pending_slots);

/* ---- the check ----------------------------------------------------------------- */

/* Whether connection may take this loop turn's next command as evalsha()'s
 * own test has it: usable, and its batch of this turn open or nothing in
 * flight. 1 or 0, never an exception. */
static int
joinable(accel_state *state, PyObject *connection)
{
    if (connection == Py_None || !fast_attribute_is(connection, NAME(state, USABLE), Py_True)) {
        return 0;
    }
    if (fast_attribute_is(connection, NAME(state, BATCH_OPEN), Py_True)) {
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
    PyObject *loop = PyObject_CallNoArgs(check->get_running_loop);
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
         !fast_attribute_is(connection, NAME(state, USABLE), Py_True))) {
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

/* Whether the denial cache remembers a denial for this check (its plan and
 * first key): 1 (the Python path looks it up), 0, or -1 (declined); no
 * exception set. */
static int
remembered(accel_state *state, PyObject *cache, PyObject *plan, PyObject *first_key)
{
    PyObject *entries = PyObject_GetAttr(cache, NAME(state, ENTRIES));
    int found = entries != NULL && PyDict_CheckExact(entries) ? 0 : -1;
    if (found == 0 && PyDict_GET_SIZE(entries) > 0) { /* an empty cache answers nothing */
        PyObject *entry_key = PyTuple_Pack(2, plan, first_key);
        found = entry_key == NULL ? -1 : PyDict_Contains(entries, entry_key);
        Py_XDECREF(entry_key);
    }
    Py_XDECREF(entries);
    PyErr_Clear();
    return found;
}

/* The denial cache's ticket of a check about to be sent, as
 * DenialCachingBackend.start_check takes it: the cache's clock (issued
 * before it is sent, so before Redis reads its clock) and generation. 0, or
 * -1 (declined, no exception set). */
static int
take_ticket(accel_state *state, PyObject *cache, PyObject **issued_s, PyObject **generation)
{
    PyObject *clock = PyObject_GetAttr(cache, state->names[NAME_CLOCK]);
    *issued_s = clock == NULL ? NULL : PyObject_CallNoArgs(clock);
    Py_XDECREF(clock);
    *generation = *issued_s == NULL ? NULL : PyObject_GetAttr(cache, NAME(state, GENERATION));
    if (*generation == NULL) {
        Py_CLEAR(*issued_s);
        PyErr_Clear();
        return -1;
    }
    return 0;
}

int
fast_aredis_send(accel_state *state, PyObject *limiter, redis_check_object *check,
                 const redis_request *request, PyObject *key, PyObject *shadow, PyObject **out)
{
    PyObject *cache = check->cache == Py_None ? NULL : check->cache;
    PyObject *first_key = cache == NULL ? NULL : PyList_GET_ITEM(request->keys, 0);
    if (cache != NULL && remembered(state, cache, request->plan, first_key) != 0) {
        return 0; /* the Python path looks it up */
    }
    PyObject *connection = connection_for(state, check);
    if (connection == NULL) {
        return 0; /* the Python path takes the check */
    }
    PyObject *issued_s = NULL, *generation = NULL;
    if (cache != NULL && take_ticket(state, cache, &issued_s, &generation) < 0) {
        Py_DECREF(connection);
        return 0;
    }
    PyObject *compiled = request->compiled;
    /* A connection that joins its turns takes the check unencoded: its flush
     * encodes it only if it is not joined into a batched call. */
    PyObject *payload = Py_NewRef(request->payload);
    if (!connection_core_joins(state, connection)) {
        PyObject *encode_args[3] = {PyTuple_GET_ITEM(compiled, RPLAN_SHA), request->keys,
                                    PyTuple_GET_ITEM(compiled, RPLAN_ARGS)};
        Py_SETREF(payload, resp_encode_evalsha(NULL, encode_args, 3));
    }
    PyObject *send_args[5] = {connection, payload, PyTuple_GET_ITEM(compiled, RPLAN_SCRIPT),
                              request->keys, PyTuple_GET_ITEM(compiled, RPLAN_ARGS)};
    PyObject *future = payload == NULL ? NULL
                                       : PyObject_VectorcallMethod(
                                             NAME(state, SEND_SCRIPT), send_args,
                                             5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(payload);
    Py_DECREF(connection);
    if (future == NULL) {
        PyErr_Clear(); /* closed meanwhile, nothing queued: the Python path's */
        Py_XDECREF(issued_s);
        Py_XDECREF(generation);
        return 0;
    }
    /* From here the command is queued: the check is taken whatever happens. */
    pending_object *pending = PyObject_GC_New(pending_object, state->pending_check_type);
    if (pending != NULL) {
        pending->future = future; /* given over */
        pending->iter = NULL;
        pending->check = Py_NewRef((PyObject *)check);
        pending->limiter = Py_NewRef(limiter);
        pending->plan = Py_NewRef(request->plan);
        pending->key = Py_NewRef(key);
        pending->scope = Py_NewRef(request->scope);
        pending->shadow = Py_NewRef(shadow);
        pending->shape = Py_NewRef(PyTuple_GET_ITEM(compiled, RPLAN_SHAPE));
        pending->cache = cache == NULL ? NULL : Py_NewRef(cache);
        pending->first_key = first_key == NULL ? NULL : Py_NewRef(first_key);
        pending->issued_s = issued_s; /* given over */
        pending->generation = generation;
        pending->done = 0;
        PyObject_GC_Track(pending);
    }
    else {
        Py_DECREF(future);
        Py_XDECREF(issued_s);
        Py_XDECREF(generation);
    }
    *out = (PyObject *)pending;
    return 2;
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
