/* The blocking limiter's commonest check over one Redis server in one C call.
 *
 * The blocking RateLimiter's check_with_info is a FastMethod (fast_check.c).
 * When the limiter's _fast_check is a RedisFastCheck (moderato/fast_redis.py:
 * a BlockingRedisBackend over a plain RedisClient, TCP or unix, no TLS, on
 * Linux where the connections' sockets are blocking with kernel timeouts),
 * the FastMethod hands the commonest check (text identity, rate and scope,
 * no tenant, a cost of 1, no burst) here. With no metrics nor recorder, the
 * breaker settled, no outage being logged and a plan already made for the
 * rate, it is taken in C:
 *
 *   the keys (build_keys) and the EVALSHA (encode_evalsha), as the Python
 *   path builds them; an idle connection taken from the client's pool as
 *   RedisClient.evalsha() takes it (the last one given back, of the pool's
 *   generation, polled first when it sat idle longer than the client's
 *   IDLE_CHECK_AFTER_S); send() and recv() on its descriptor, the GIL
 *   released once around both; the reply framed here when it is a whole
 *   reply of integers, bulk strings, nils and arrays in that one read; the
 *   connection given back as evalsha() gives it back; the result by
 *   check_result.
 *
 * Anything unusual before the send (no idle connection, one to vet or of an
 * older generation, a budget or a timeout other than the command's, keys or
 * arguments C refuses) puts the connection back where it was and declines:
 * the Python method takes the check, nothing was sent. Anything unusual after
 * it (an error reply such as NOSCRIPT, a reply longer than one read, a
 * timeout, EOF, a signal handler's exception) goes to the RedisFastCheck's
 * rest(), with what was read or the error: the Python path from the point
 * its own first read returned (the connection closed on a failure, NOSCRIPT
 * repaired on the same connection, errors translated, the breaker and the
 * failure policy told). The command is never sent twice. A denial, a reply
 * check_result refuses, or a breaker or failure log that changed during the
 * round trip goes to finish(), which ends the check the Python path's way.
 *
 * Every condition is read on every call; nothing is kept between calls but
 * the plans' compiled fields (a dict by plan object, bounded).
 */
#include "fast_redis.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include "decode.h"
#include "fast_aredis.h"
#include "heap_type.h"
#include "keys.h"
#include "resp.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

/* The first read's buffer: a decision's reply is far smaller; a longer one
 * is finished by rest(). */
#define REDIS_READ_BYTES 16384
/* Nesting and length a reply framed here may have (a decision's: an array
 * of integers, or of arrays of them); deeper or longer ones go to rest(). */
#define REDIS_MAX_DEPTH 4
#define REDIS_MAX_ITEMS 4096

#define REDIS_NAME_TEXT(name, text) text,
static const char *const redis_name_texts[] = {REDIS_NAMES(REDIS_NAME_TEXT)};
#undef REDIS_NAME_TEXT

/* ---- RedisFastCheck: what one limiter's checks read ------------------------------- */

ACCEL_GC_FUNCTIONS(redis_check, redis_check_object, REDIS_CHECK_MEMBERS)

static PyObject *
redis_check_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    FAST_CONSTRUCTOR_TABLES(redis_check_object, REDIS_CHECK_ARGUMENTS, "idle_check_after_s", );
    PyObject *values[FAST_MAX_ARGUMENTS];
    PyObject *check = fast_limiter_new(type, args, kwargs, "UOO!OOOUOOOOO:RedisFastCheck",
                                       keywords, offsets, Py_ARRAY_LENGTH(offsets), values);
    if (check == NULL) {
        return NULL;
    }
    /* The keyword after the objects, read as the format unit "d" reads it. */
    double idle_check_after_s = PyFloat_AsDouble(values[Py_ARRAY_LENGTH(offsets)]);
    if (idle_check_after_s == -1.0 && PyErr_Occurred()) {
        Py_DECREF(check);
        return NULL;
    }
    ((redis_check_object *)check)->idle_check_after_s = idle_check_after_s;
    return check;
}

PyDoc_STRVAR(redis_check_doc,
             FAST_LIMITER_DOC("RedisFastCheck",
                              "client, load_script, rest, idle_check_after_s",
                              "What a blocking limiter's one-call checks over one Redis\n"
                              "server read (its _fast_check; built by\n"
                              "moderato/fast_redis.py)."));

FAST_LIMITER_TYPE(redis_check, "moderato._accel.RedisFastCheck", redis_check_object,
                  redis_check_doc);

/* ---- what is read before anything is sent ---------------------------------------- */

/* A compiled plan over Redis is its read fields (fast_common.h), the
 * script's SHA in its name's place, and the script (RPLAN_*): this is the
 * step that makes them (fast_plan_step), load_script(name) and its sha, a
 * str. */
typedef struct {
    accel_state *state;
    redis_check_object *check;
} plan_context;

static int
complete_plan(PyObject *compiled, void *context)
{
    const plan_context *first = context;
    PyObject *script = PyObject_CallOneArg(first->check->load_script,
                                           PyTuple_GET_ITEM(compiled, RPLAN_SHA));
    PyObject *sha = script == NULL ? NULL : PyObject_GetAttr(script, NAME(first->state, SHA));
    if (sha == NULL) {
        Py_XDECREF(script);
        return -1;
    }
    /* The tuple is new, held by this compile alone: its items may change. */
    Py_DECREF(PyTuple_GET_ITEM(compiled, RPLAN_SHA));
    PyTuple_SET_ITEM(compiled, RPLAN_SHA, sha);
    PyTuple_SET_ITEM(compiled, RPLAN_SCRIPT, script);
    return PyUnicode_CheckExact(sha) ? 0 : -1;
}

/* The check's keys (*keys_out, a new reference, or NULL) and, when encode is
 * set, its EVALSHA's bytes (returned, a new reference; else None) from the
 * plan's compiled fields: NULL with an exception set when a key part or the
 * encoding fails (*keys_out may be set). */
static PyObject *
payload_of(accel_state *state, PyObject *module, redis_check_object *check, PyObject *compiled,
           PyObject *scope, PyObject *key, PyObject **keys_out, int encode)
{
    PyObject *key_args[7] = {check->prefix,
                             PyTuple_GET_ITEM(compiled, RPLAN_TAG),
                             state->names[NAME_EMPTY],
                             scope,
                             key,
                             PyTuple_GET_ITEM(compiled, RPLAN_WINDOWS),
                             check->secret};
    PyObject *keys = keys_build(module, key_args, 7, NULL);
    *keys_out = keys;
    if (keys == NULL) {
        return NULL;
    }
    if (!encode) {
        return Py_NewRef(Py_None);
    }
    PyObject *encode_args[3] = {PyTuple_GET_ITEM(compiled, RPLAN_SHA), keys,
                                PyTuple_GET_ITEM(compiled, RPLAN_ARGS)};
    return resp_encode_evalsha(module, encode_args, 3);
}

/* Let go of what a request holds. */
static void
request_release(redis_request *request)
{
    Py_CLEAR(request->payload);
    Py_CLEAR(request->keys);
    Py_CLEAR(request->compiled);
    Py_CLEAR(request->plan);
}

/* The request of limiter's check (fast_redis_check's arguments; encode: its
 * EVALSHA encoded, else its payload None): 1 (*request filled in), or 0 (declined: nothing held, no exception set; the
 * Python path raises what failed, a bad key part). */
static int
request_of(accel_state *state, PyObject *module, PyObject *limiter, redis_check_object *check,
           PyObject *key, PyObject *rate, PyObject *scope, PyObject *algorithm,
           redis_request *request, int encode)
{
    fast_limiter *fast = (fast_limiter *)check;
    *request = (redis_request){scope == NULL ? check->global_scope : scope, NULL, NULL, NULL, NULL};
    if (!fast_limiter_allows(state, limiter, fast)) {
        return 0;
    }
    request->plan = fast_find_plan(state, fast, rate, algorithm);
    if (request->plan == NULL) {
        return 0;
    }
    plan_context first = {state, check};
    PyObject *compiled =
        fast_compiled_plan(state, fast, request->plan, RPLAN_FIELDS, complete_plan, &first);
    if (compiled != NULL) {
        request->compiled = Py_NewRef(compiled);
        request->payload = payload_of(state, module, check, compiled, request->scope, key,
                                      &request->keys, encode);
        if (request->payload != NULL &&
            (encode ? PyBytes_CheckExact(request->payload) : request->payload == Py_None)) {
            return 1;
        }
    }
    PyErr_Clear(); /* the Python path raises it (a bad key part), or takes the check */
    request_release(request);
    return 0;
}

static double
monotonic_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); /* time.monotonic()'s clock on Linux */
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* A connection out of the pool and what the check reads of it. */
typedef struct {
    PyObject *idle;       /* the pool's idle connections (a deque) */
    PyObject *connection; /* taken from it, or NULL */
    PyObject *sock;       /* its socket */
    int fd;
    double taken_at;
} taken_connection;

static void
taken_release(taken_connection *taken)
{
    Py_CLEAR(taken->sock);
    Py_CLEAR(taken->connection);
    Py_CLEAR(taken->idle);
}

/* Put a connection back where it was taken from, nothing having been sent:
 * the pool is as it was (the GIL was held since it was taken). */
static void
put_back(accel_state *state, taken_connection *taken)
{
    PyObject *done = PyObject_CallMethodOneArg(taken->idle, NAME(state, APPEND), taken->connection);
    if (done == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(done);
}

/* Whether a connection's attribute equals the client's (the generations). */
static int
same_generation(accel_state *state, PyObject *client, PyObject *connection)
{
    PyObject *mine = PyObject_GetAttr(connection, NAME(state, GENERATION));
    PyObject *pool = mine == NULL ? NULL : PyObject_GetAttr(client, NAME(state, POOL_GENERATION));
    int same = pool == NULL ? -1 : PyObject_RichCompareBool(mine, pool, Py_EQ);
    Py_XDECREF(mine);
    Py_XDECREF(pool);
    return same;
}

/* An idle connection ready for the command as RedisClient.evalsha() would use
 * it unvetted: 1 (taken filled in), or 0 (declined: the pool as it was, no
 * exception set). */
static int
take_connection(accel_state *state, redis_check_object *check, taken_connection *taken)
{
    taken->idle = PyObject_GetAttr(check->client, NAME(state, IDLE));
    if (taken->idle == NULL) {
        goto declined;
    }
    taken->connection = PyObject_CallMethodNoArgs(taken->idle, NAME(state, POP));
    if (taken->connection == NULL) {
        goto declined; /* none idle (IndexError): the Python path opens or waits */
    }
    PyObject *connection = taken->connection;
    if (same_generation(state, check->client, connection) != 1 ||
        !fast_attribute_is(connection, NAME(state, BUDGET_S), Py_None) ||
        !fast_attribute_is(connection, NAME(state, RETIMED), Py_False) ||
        !fast_attribute_is(connection, NAME(state, KERNEL_TIMEOUTS), Py_True)) {
        goto put_back;
    }
    PyObject *idle_since = PyObject_GetAttr(connection, NAME(state, IDLE_SINCE));
    double since = idle_since == NULL ? -1.0 : PyFloat_AsDouble(idle_since);
    Py_XDECREF(idle_since);
    if (since == -1.0 && PyErr_Occurred()) {
        goto put_back;
    }
    taken->sock = PyObject_GetAttr(connection, NAME(state, SOCK));
    PyObject *fileno =
        taken->sock == NULL ? NULL : PyObject_CallMethodNoArgs(taken->sock, NAME(state, FILENO));
    long fd = fileno == NULL ? -1 : PyLong_AsLong(fileno);
    Py_XDECREF(fileno);
    if (fd < 0 || fd > INT_MAX) {
        goto put_back;
    }
    taken->fd = (int)fd;
    taken->taken_at = monotonic_s();
    if (taken->taken_at - since > check->idle_check_after_s) {
        /* Idle long enough to be vetted: a connection with something to read
         * was closed by the server or is out of step; the Python path closes
         * it and takes another. */
        struct pollfd readable = {.fd = taken->fd, .events = POLLIN, .revents = 0};
        if (poll(&readable, 1, 0) != 0) {
            goto put_back;
        }
    }
    return 1;
put_back:
    put_back(state, taken);
declined:
    PyErr_Clear();
    taken_release(taken);
    return 0;
}

/* Give a connection whose reply was read whole back as evalsha() does: idle
 * since the command began, first to a waiting thread if one is; closed if
 * the pool was closed meanwhile. 0, or -1 with an exception set. */
static int
give_back(accel_state *state, redis_check_object *check, taken_connection *taken)
{
    PyObject *client = check->client, *connection = taken->connection, *done;
    int same = same_generation(state, client, connection);
    if (same < 0) {
        return -1;
    }
    if (!same) {
        done = PyObject_CallMethodOneArg(client, NAME(state, GIVE), connection);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *since = PyFloat_FromDouble(taken->taken_at);
    if (since == NULL || PyObject_SetAttr(connection, NAME(state, IDLE_SINCE), since) < 0) {
        Py_XDECREF(since);
        return -1;
    }
    Py_DECREF(since);
    done = PyObject_CallMethodOneArg(taken->idle, NAME(state, APPEND), connection);
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    PyObject *waiters = PyObject_GetAttr(client, NAME(state, WAITERS));
    int waiting = waiters == NULL ? -1 : PyObject_IsTrue(waiters);
    Py_XDECREF(waiters);
    if (waiting <= 0) {
        return waiting;
    }
    done = PyObject_CallMethodNoArgs(client, NAME(state, HAND_OVER));
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* ---- the round trip ---------------------------------------------------------------- */

/* Send `payload` whole and make the first read, the GIL released once around
 * both. Returns the bytes read (0: the server closed the connection), or -1
 * with an exception set (the OSError of a failed call, BlockingIOError for a
 * kernel timeout; a signal handler's exception), as socket.sendall() and
 * recv_into() raise them. */
static Py_ssize_t
round_trip(int fd, const char *payload, Py_ssize_t size, char *buffer, Py_ssize_t capacity)
{
    Py_ssize_t sent = 0, got = -1;
    for (;;) {
        int interrupted = 0, failure = 0;
        Py_BEGIN_ALLOW_THREADS
        while (sent < size) {
            ssize_t n = send(fd, payload + sent, (size_t)(size - sent), MSG_NOSIGNAL);
            if (n < 0) {
                failure = errno;
                break;
            }
            sent += n;
        }
        if (!failure) {
            ssize_t n = recv(fd, buffer, (size_t)capacity, 0);
            if (n < 0) {
                failure = errno;
            }
            else {
                got = n;
            }
        }
        Py_END_ALLOW_THREADS
        if (failure == EINTR) {
            interrupted = 1;
        }
        else if (failure) {
            errno = failure;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (!interrupted) {
            return got;
        }
        /* As socket methods do: run the signal handlers, then go on. */
        if (PyErr_CheckSignals() < 0) {
            return -1;
        }
    }
}

/* ---- framing a reply ------------------------------------------------------------------ */

/* A RESP line's number at data[*at], up to its CRLF: 1 (*number set, *at past
 * the line), 0 (not a whole, plain number of at most 18 digits). */
static int
read_number(const char *data, Py_ssize_t size, Py_ssize_t *at, long long *number)
{
    Py_ssize_t i = *at;
    int negative = 0, digits = 0;
    long long value = 0;
    if (i < size && data[i] == '-') {
        negative = 1;
        i++;
    }
    while (i < size && data[i] >= '0' && data[i] <= '9') {
        if (++digits > 18) {
            return 0;
        }
        value = value * 10 + (data[i] - '0');
        i++;
    }
    if (digits == 0 || i + 1 >= size || data[i] != '\r' || data[i + 1] != '\n') {
        return 0;
    }
    *at = i + 2;
    *number = negative ? -value : value;
    return 1;
}

/* One reply at data[*at] of the kinds a decision's is made of, as hiredis'
 * Reader gives it: an integer (int), a bulk string (bytes), a nil (None), an
 * array of these (list). 1 (*value a new reference), 0 (anything else, or
 * not whole: rest() frames it), -1 (an exception set). */
static int
frame_reply(const char *data, Py_ssize_t size, Py_ssize_t *at, int depth, PyObject **value)
{
    long long number;
    if (*at >= size) {
        return 0;
    }
    char kind = data[(*at)++];
    if ((kind != ':' && kind != '$' && kind != '*') || !read_number(data, size, at, &number)) {
        return 0;
    }
    if (kind == ':') {
        *value = PyLong_FromLongLong(number);
        return *value == NULL ? -1 : 1;
    }
    if (number == -1) {
        *value = Py_NewRef(Py_None);
        return 1;
    }
    if (number < 0) {
        return 0;
    }
    if (kind == '$') {
        if (number > size - *at - 2 || data[*at + number] != '\r' ||
            data[*at + number + 1] != '\n') {
            return 0;
        }
        *value = PyBytes_FromStringAndSize(data + *at, (Py_ssize_t)number);
        *at += (Py_ssize_t)number + 2;
        return *value == NULL ? -1 : 1;
    }
    if (depth >= REDIS_MAX_DEPTH || number > REDIS_MAX_ITEMS) {
        return 0;
    }
    PyObject *list = PyList_New((Py_ssize_t)number);
    if (list == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < (Py_ssize_t)number; i++) {
        PyObject *item;
        int framed = frame_reply(data, size, at, depth + 1, &item);
        if (framed <= 0) {
            Py_DECREF(list);
            return framed;
        }
        PyList_SET_ITEM(list, i, item);
    }
    *value = list;
    return 1;
}

/* ---- the check ---------------------------------------------------------------------------- */

/* The reply read whole: the connection given back, then the result. A new
 * reference, or NULL with the error set. */
static PyObject *
decided(accel_state *state, PyObject *module, PyObject *limiter, redis_check_object *check,
        taken_connection *taken, const redis_request *request, PyObject *shadow, PyObject *reply)
{
    if (give_back(state, check, taken) < 0) {
        return NULL; /* raised from the pool's code, as from evalsha() */
    }
    PyObject *result_args[2] = {reply, PyTuple_GET_ITEM(request->compiled, RPLAN_SHAPE)};
    PyObject *result = decode_check_result(module, result_args, 2);
    if (result != NULL && Py_TYPE(result) == state->check_result_type &&
        results_field(result, 0) == Py_True && fast_quiet(state, (fast_limiter *)check) &&
        fast_attribute_is(limiter, state->names[NAME_METRICS], Py_None)) {
        return result;
    }
    /* A denial (shadow mode), a reply check_result refused (the BackendError
     * naming the script), or a breaker, failure log or metrics that changed
     * meanwhile: the Python path's end. */
    PyErr_Clear();
    PyObject *rest = PyObject_CallFunctionObjArgs(check->finish, limiter, request->plan,
                                                  request->scope, shadow, reply,
                                                  result != NULL ? result : Py_None, NULL);
    Py_XDECREF(result);
    return rest;
}

/* Send the request on an idle connection of the pool and read the reply:
 * fast_redis_check's 1 or 0. */
static int
round_trip_check(accel_state *state, PyObject *module, PyObject *limiter,
                 redis_check_object *check, const redis_request *request, PyObject *shadow,
                 PyObject **out)
{
    taken_connection taken = {NULL, NULL, NULL, -1, 0.0};
    if (!take_connection(state, check, &taken)) {
        return 0; /* the Python path takes the check */
    }
    /* From here the command is sent: the check is taken whatever happens. */
    char buffer[REDIS_READ_BYTES];
    /* taken.sock is held meanwhile: its descriptor stays open. */
    Py_ssize_t got = round_trip(taken.fd, PyBytes_AS_STRING(request->payload),
                                PyBytes_GET_SIZE(request->payload), buffer,
                                (Py_ssize_t)sizeof(buffer));
    PyObject *reply = NULL, *data = NULL, *error = NULL;
    if (got < 0) {
        error = accel_take_exception();
    }
    else if (got == 0) {
        error = PyObject_CallNoArgs(PyExc_EOFError);
    }
    else {
        Py_ssize_t at = 0;
        int framed = frame_reply(buffer, got, &at, 0, &reply);
        if (framed == 1 && at != got) {
            Py_CLEAR(reply); /* more than one reply: rest() keeps the stream in step */
            framed = 0;
        }
        if (framed < 0) {
            error = accel_take_exception();
        }
        else if (framed == 0) {
            data = PyBytes_FromStringAndSize(buffer, got);
            if (data == NULL) {
                error = accel_take_exception();
            }
        }
    }
    if (reply != NULL) {
        *out = decided(state, module, limiter, check, &taken, request, shadow, reply);
        Py_DECREF(reply);
    }
    else if (data == NULL && error == NULL) {
        *out = NULL; /* no exception to hand over: cannot happen, but never pass NULL on */
        PyErr_SetString(PyExc_SystemError, "fast_redis: an empty outcome");
    }
    else {
        PyObject *taken_at = PyFloat_FromDouble(taken.taken_at);
        *out = taken_at == NULL
                   ? NULL
                   : PyObject_CallFunctionObjArgs(check->rest, limiter, request->plan,
                                                  request->scope, shadow, taken.connection,
                                                  taken_at, request->keys,
                                                  data != NULL ? data : Py_None,
                                                  error != NULL ? error : Py_None, NULL);
        Py_XDECREF(taken_at);
        Py_XDECREF(data);
        Py_XDECREF(error);
    }
    taken_release(&taken);
    return 1;
}

int
fast_redis_check(accel_state *state, PyObject *module, PyObject *limiter, PyObject *found,
                 PyObject *key, PyObject *rate, PyObject *scope, PyObject *algorithm,
                 PyObject *shadow, PyObject **out)
{
    redis_check_object *check = (redis_check_object *)found;
    redis_request request;
    /* The asyncio check encodes its EVALSHA once it knows its connection (one that
     * joins its turns takes it unencoded: fast_aredis_send). */
    int asyncio_check = Py_TYPE(found) == state->aredis_check_type;
    if (!request_of(state, module, limiter, check, key, rate, scope, algorithm, &request,
                    !asyncio_check)) {
        return 0;
    }
    int taken = asyncio_check
                    ? fast_aredis_send(state, limiter, check, &request, key, shadow, out)
                    : round_trip_check(state, module, limiter, check, &request, shadow, out);
    request_release(&request);
    return taken;
}

/* ---- the module's part ---------------------------------------------------------------- */

int
fast_redis_add_to_module(PyObject *module)
{
    Py_BUILD_ASSERT(RNAME_END == REDIS_NAME_COUNT);
    accel_state *state = PyModule_GetState(module);
    if (fast_intern_names(state->redis_names, redis_name_texts, REDIS_NAME_COUNT) < 0) {
        return -1;
    }
    return accel_add_type(module, &redis_check_spec, "RedisFastCheck", &state->redis_check_type);
}
