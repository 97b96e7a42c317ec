/* The per-command path of moderato's asyncio Redis connection, in C.
 *
 * moderato/redis/connection.py's RedisConnection is a Python subclass of
 * ConnectionCore (and of asyncio.BufferedProtocol). The core holds what
 * every command touches as C members, each also an attribute of the same
 * name that the Python methods read and write as before: the futures'
 * deque (_pending), the write buffer, the batches' deadlines, the script
 * calls in flight, the read buffer and hiredis' Reader, the flags of the
 * loop turn's batch and flush. Its methods are the steps every command and
 * every read take, written out of connection.py's Python ones with the same
 * effects in the same order:
 *
 *   _queue(future, payload)   a command at the end of the pipeline; the
 *                             turn's one flush scheduled by its first;
 *   send_script(payload, script, keys, args)
 *                             the EVALSHA of a check: a new future queued,
 *                             its record kept for a NOSCRIPT re-send;
 *                             payload None when the connection joins its
 *                             turns (_group set): the EVALSHA is encoded by
 *                             the turn's flush, and only if the check is
 *                             not joined into a batched call (whose own
 *                             encoding would make the check's a waste);
 *   _schedule_flush()         loop.call_soon(self._flush), the batch's
 *                             deadline from loop.time();
 *   _flush()                  the turn's commands closed into a batch (its
 *                             deadline recorded, the timer armed if none
 *                             is) and written in one transport.write; when
 *                             two or more are new and _group is set, it is
 *                             called first (moderato/redis/grouping.py joins
 *                             adjacent checks into batched script calls),
 *                             then the checks left unencoded are encoded;
 *   get_buffer(sizehint)      the one read buffer;
 *   buffer_updated(nbytes)    the bytes read fed to the Reader, each reply
 *                             given to the oldest future (a done one, timed
 *                             out or cancelled, only frees its slot; an
 *                             error reply NOSCRIPT to _resend_after_noscript),
 *                             then the flush scheduled behind the wake-ups.
 *
 * Everything else (connecting, the handshake hold-back, timeouts, NOSCRIPT
 * repair, closing, fork) stays in Python and reads the same members. What
 * a read raises (a reply nobody asked for, malformed RESP) goes to the
 * Python _read_failed(error), which aborts the connection as before.
 * tests/connection_reference.py holds the Python steps this replaces; the
 * client's tests run against both.
 */
#include "connection_core.h"

#include <structmember.h>
#include <time.h>

#include "heap_type.h"
#include "resp.h"

ACCEL_NAME_TEXTS(CORE_NAMES, CNAME_, core_name_texts);


/* connection.py's states (_CONNECTING, _READY, _CLOSED). */
enum { CORE_CONNECTING, CORE_READY, CORE_CLOSED };

typedef struct {
    PyObject_HEAD
    PyObject *loop;         /* _loop */
    PyObject *pending;      /* _pending: a deque of futures, oldest first */
    PyObject *write_buffer; /* _write_buffer: a list of encoded commands */
    PyObject *scripts;      /* _scripts: a deque of (sequence, script, keys, args, resends) */
    PyObject *batches;      /* _batches: a deque of (deadline, batched total after it) */
    PyObject *reader;       /* _reader: hiredis.Reader */
    PyObject *read_buffer;  /* _read_buffer: a bytearray */
    PyObject *read_view;    /* _read_view: a memoryview of it */
    PyObject *transport;    /* _transport, or None */
    PyObject *timer;        /* _timer, or None */
    PyObject *future_type;  /* _future_type: asyncio.Future */
    PyObject *reply_error;  /* _reply_error: the type of an error reply */
    PyObject *call_soon;    /* _call_soon: the loop's call_soon */
    PyObject *call_at;      /* _call_at: the loop's call_at */
    PyObject *loop_time;    /* _loop_time: the loop's time, or None: time.monotonic's clock */
    PyObject *group;        /* _group: called by a flush of 2+ new commands, or NULL/None */
    double batch_deadline;  /* _batch_deadline */
    double command_timeout_s; /* _command_timeout_s */
    Py_ssize_t held;        /* _held */
    Py_ssize_t batched_total; /* _batched_total */
    Py_ssize_t unencoded;   /* checks queued unencoded (None) since the last flush */
    int state;              /* _state */
    char usable;            /* usable */
    char batch_open;        /* batch_open */
    char flush_due;         /* _flush_due */
} core_object;

#define CORE_MEMBERS(X)                                                                  \
    X(loop) X(pending) X(write_buffer) X(scripts) X(batches) X(reader) X(read_buffer)    \
    X(read_view) X(transport) X(timer) X(future_type) X(reply_error) X(call_soon)        \
    X(call_at) X(loop_time) X(group)

ACCEL_GC_FUNCTIONS(core, core_object, CORE_MEMBERS)

/* The module state of the defining class of a method (the core itself). */
#define CORE_STATE(defining_class) ((accel_state *)PyType_GetModuleState(defining_class))

#define CORE_METHOD(name)                                                                \
    static PyObject *name(PyObject *self, PyTypeObject *defining_class,                  \
                          PyObject *const *args, size_t nargsf, PyObject *kwnames)

/* A member that must be set (by the Python __init__) before a method runs. */
static int
core_ready(core_object *core)
{
    if (core->pending == NULL || core->write_buffer == NULL || core->scripts == NULL ||
        core->batches == NULL || core->reader == NULL || core->read_buffer == NULL ||
        core->read_view == NULL || core->future_type == NULL || core->reply_error == NULL ||
        core->call_soon == NULL || core->call_at == NULL || core->loop_time == NULL ||
        core->loop == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ConnectionCore used before its __init__ set it up");
        return 0;
    }
    return 1;
}

/* A method's call checked: its fixed count of positional arguments and no
 * keywords, the core set up by its __init__. The module state of the
 * method's defining class, or NULL with an exception set. */
static accel_state *
core_called(const char *name, PyObject *self, PyTypeObject *defining_class, size_t nargsf,
            PyObject *kwnames, Py_ssize_t wanted)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != wanted || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments (%zd given)", name,
                     wanted, nargs);
        return NULL;
    }
    accel_state *state = CORE_STATE(defining_class);
    if (state == NULL || !core_ready((core_object *)self)) {
        return NULL;
    }
    return state;
}

/* A method's payload: bytes, else a TypeError naming the method's
 * signature. 1, or 0 with the error set. */
static int
core_payload(PyObject *payload, const char *signature)
{
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, signature);
        return 0;
    }
    return 1;
}

/* obj.name(arg): a new reference, or NULL with the error set. */
static PyObject *
call_one(PyObject *obj, PyObject *name, PyObject *arg)
{
    return PyObject_CallMethodOneArg(obj, name, arg);
}

/* Schedule the one flush of this loop turn (none is: flush_due). 0, or -1. */
static int
schedule_flush(accel_state *state, core_object *core)
{
    core->flush_due = 0;
    double now_s;
    if (core->loop_time == Py_None) {
        /* asyncio's own loops: their time() is time.monotonic(), CLOCK_MONOTONIC
         * on this platform, read here without the Python call. */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        now_s = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
    }
    else {
        PyObject *now = PyObject_CallNoArgs(core->loop_time);
        now_s = now == NULL ? -1.0 : PyFloat_AsDouble(now);
        Py_XDECREF(now);
        if (now_s == -1.0 && PyErr_Occurred()) {
            return -1;
        }
    }
    /* From the first command of the batch (or the read that scheduled it, a
     * little earlier): no caller of this batch waits longer than the timeout. */
    core->batch_deadline = now_s + core->command_timeout_s;
    PyObject *flush = PyObject_GetAttr((PyObject *)core, CNAME(state, FLUSH));
    PyObject *handle = flush == NULL ? NULL : PyObject_CallOneArg(core->call_soon, flush);
    Py_XDECREF(flush);
    Py_XDECREF(handle);
    return handle == NULL ? -1 : 0;
}

/* Put one command at the end of the pipeline, answered through future. 0, or -1. */
static int
queue(accel_state *state, core_object *core, PyObject *future, PyObject *payload)
{
    PyObject *done = call_one(core->pending, CNAME(state, APPEND), future);
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    if (PyList_Append(core->write_buffer, payload) < 0) {
        return -1;
    }
    if (!core->batch_open) {
        core->batch_open = 1;
        if (core->flush_due && schedule_flush(state, core) < 0) {
            return -1;
        }
    }
    return 0;
}

CORE_METHOD(core_queue)
{
    accel_state *state = core_called("_queue", self, defining_class, nargsf, kwnames, 2);
    if (state == NULL || !core_payload(args[1], "_queue(future, payload: bytes)") ||
        queue(state, (core_object *)self, args[0], args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

CORE_METHOD(core_schedule_flush)
{
    accel_state *state = core_called("_schedule_flush", self, defining_class, nargsf, kwnames, 0);
    (void)args;
    if (state == NULL || schedule_flush(state, (core_object *)self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The error of a command refused by a closed connection: raised, NULL. */
static PyObject *
refused(accel_state *state, PyObject *self)
{
    PyObject *args[2] = {self, Py_False};
    PyObject *error = PyObject_VectorcallMethod(CNAME(state, CLOSED_ERROR), args,
                                                1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                state->core_sent_keyword);
    if (error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL;
}

/* _asyncio's Future and _get_running_loop into the state, once: 0, or -1. */
static int
take_c_asyncio(accel_state *state)
{
    PyObject *module = PyImport_ImportModule("_asyncio");
    state->c_future_type = module == NULL ? NULL : PyObject_GetAttrString(module, "Future");
    state->c_running_loop =
        state->c_future_type == NULL ? NULL : PyObject_GetAttrString(module, "_get_running_loop");
    Py_XDECREF(module);
    if (state->c_running_loop == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ImportError) &&
            !PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_CLEAR(state->c_future_type);
            return -1;
        }
        PyErr_Clear(); /* no C asyncio: every future is made with its loop named */
        Py_XSETREF(state->c_future_type, Py_NewRef(Py_None));
        state->c_running_loop = Py_NewRef(Py_None);
    }
    return 0;
}

/* A new future of the connection's loop, as asyncio.Future(loop=loop). When that
 * loop is the running one, asyncio.Future(), which takes the running loop: the
 * same future, without the keyword's dict made and parsed per command. */
static PyObject *
new_future(accel_state *state, core_object *core)
{
    if (state->c_running_loop == NULL && take_c_asyncio(state) < 0) {
        return NULL;
    }
    if (core->future_type == state->c_future_type) {
        PyObject *running = PyObject_CallNoArgs(state->c_running_loop);
        if (running == NULL) {
            return NULL;
        }
        int same = running == core->loop;
        Py_DECREF(running);
        if (same) {
            return PyObject_CallNoArgs(core->future_type);
        }
    }
    PyObject *args[2] = {NULL, core->loop};
    return PyObject_Vectorcall(core->future_type, args + 1, PY_VECTORCALL_ARGUMENTS_OFFSET,
                               state->core_loop_keyword);
}

/* Whether the connection joins its turns (_group set). */
#define CORE_JOINS(core) ((core)->group != NULL && (core)->group != Py_None)

int
connection_core_joins(accel_state *state, PyObject *connection)
{
    return PyObject_TypeCheck(connection, state->core_type) &&
           CORE_JOINS((core_object *)connection);
}

/* EVALSHA script.sha keys args, encoded (a new reference), or NULL. */
static PyObject *
encode_call(accel_state *state, PyObject *script, PyObject *keys, PyObject *args)
{
    PyObject *sha = PyObject_GetAttr(script, CNAME(state, SHA));
    if (sha == NULL) {
        return NULL;
    }
    PyObject *call[3] = {sha, keys, args};
    PyObject *payload = resp_encode_evalsha(NULL, call, 3);
    Py_DECREF(sha);
    return payload;
}

CORE_METHOD(core_send_script)
{
    core_object *core = (core_object *)self;
    accel_state *state = core_called("send_script", self, defining_class, nargsf, kwnames, 4);
    if (state == NULL || (args[0] != Py_None &&
                          !core_payload(args[0], "send_script(payload: bytes | None, script, "
                                                 "keys, args)"))) {
        return NULL;
    }
    if (!core->usable) {
        return refused(state, self);
    }
    /* Unencoded (None) only while the turn may join it; a connection that does
     * not join encodes it now, as its caller would have. */
    PyObject *payload = args[0] != Py_None || CORE_JOINS(core)
                            ? Py_NewRef(args[0])
                            : encode_call(state, args[1], args[2], args[3]);
    if (payload == NULL) {
        return NULL;
    }
    PyObject *future = new_future(state, core);
    if (future == NULL) {
        Py_DECREF(payload);
        return NULL;
    }
    int queued = queue(state, core, future, payload);
    core->unencoded += payload == Py_None;
    Py_DECREF(payload);
    if (queued < 0) {
        Py_DECREF(future);
        return NULL;
    }
    /* Its place in the pipeline: the count of commands queued up to it. */
    Py_ssize_t sequence = core->batched_total + PyList_GET_SIZE(core->write_buffer) - core->held;
    PyObject *number = PyLong_FromSsize_t(sequence);
    PyObject *record = number == NULL ? NULL : PyTuple_New(5);
    if (record == NULL) {
        Py_XDECREF(number);
        Py_DECREF(future);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, number);
    PyTuple_SET_ITEM(record, 1, Py_NewRef(args[1]));
    PyTuple_SET_ITEM(record, 2, Py_NewRef(args[2]));
    PyTuple_SET_ITEM(record, 3, Py_NewRef(args[3]));
    PyTuple_SET_ITEM(record, 4, PyLong_FromLong(0));
    PyObject *done = call_one(core->scripts, CNAME(state, APPEND), record);
    Py_DECREF(record);
    if (done == NULL) {
        Py_DECREF(future);
        return NULL;
    }
    Py_DECREF(done);
    return future;
}

/* The number at index of the deque's first tuple; 0, or -1 with an error set. */
static int
first_number(PyObject *deque, Py_ssize_t index, Py_ssize_t *number)
{
    PyObject *first = PySequence_GetItem(deque, 0);
    if (first == NULL) {
        return -1;
    }
    if (!PyTuple_Check(first) || PyTuple_GET_SIZE(first) <= index) {
        Py_DECREF(first);
        PyErr_SetString(PyExc_TypeError, "a connection's record is not a tuple");
        return -1;
    }
    *number = PyLong_AsSsize_t(PyTuple_GET_ITEM(first, index));
    Py_DECREF(first);
    return *number == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Drop the deque's records whose number (at index) is at most answered. */
static int
forget_answered(accel_state *state, PyObject *deque, Py_ssize_t index, Py_ssize_t answered)
{
    while (PyObject_Length(deque) > 0) {
        Py_ssize_t number;
        if (first_number(deque, index, &number) < 0) {
            return -1;
        }
        if (number > answered) {
            break;
        }
        PyObject *gone = PyObject_CallMethodNoArgs(deque, CNAME(state, POPLEFT));
        if (gone == NULL) {
            return -1;
        }
        Py_DECREF(gone);
    }
    return 0;
}

/* Close the turn's new commands into a batch: its deadline recorded, the
 * timer armed if none is. 0, or -1. */
static int
close_batch(accel_state *state, core_object *core, Py_ssize_t new_commands)
{
    Py_ssize_t batched_total = core->batched_total + new_commands;
    core->batched_total = batched_total;
    Py_ssize_t batches = PyObject_Length(core->batches);
    Py_ssize_t scripts = PyObject_Length(core->scripts);
    if (batches < 0 || scripts < 0) {
        return -1;
    }
    if (batches > 0 || scripts > 0) {
        /* Forget what is answered in full; keeps both deques short under load. */
        Py_ssize_t in_flight = PyObject_Length(core->pending);
        if (in_flight < 0) {
            return -1;
        }
        Py_ssize_t answered = batched_total - in_flight;
        if (forget_answered(state, core->batches, 1, answered) < 0 ||
            forget_answered(state, core->scripts, 0, answered) < 0) {
            return -1;
        }
    }
    PyObject *deadline = PyFloat_FromDouble(core->batch_deadline);
    PyObject *total = deadline == NULL ? NULL : PyLong_FromSsize_t(batched_total);
    PyObject *batch = total == NULL ? NULL : PyTuple_Pack(2, deadline, total);
    Py_XDECREF(total);
    PyObject *done = batch == NULL ? NULL : call_one(core->batches, CNAME(state, APPEND), batch);
    Py_XDECREF(batch);
    if (done == NULL) {
        Py_XDECREF(deadline);
        return -1;
    }
    Py_DECREF(done);
    if (core->timer == NULL || core->timer == Py_None) {
        PyObject *on_timer = PyObject_GetAttr((PyObject *)core, CNAME(state, ON_TIMER));
        PyObject *timer = NULL;
        if (on_timer != NULL) {
            PyObject *call_args[2] = {deadline, on_timer};
            timer = PyObject_Vectorcall(core->call_at, call_args, 2, NULL);
            Py_DECREF(on_timer);
        }
        if (timer == NULL) {
            Py_DECREF(deadline);
            return -1;
        }
        Py_XSETREF(core->timer, timer);
    }
    Py_DECREF(deadline);
    return 0;
}

/* Hand the write buffer to the transport in one write, and empty it. 0, or -1. */
static int
write_out(accel_state *state, core_object *core)
{
    PyObject *buffer = core->write_buffer;
    Py_ssize_t count = PyList_GET_SIZE(buffer);
    if (count > 0 && core->transport != NULL && core->transport != Py_None) {
        PyObject *data;
        if (count == 1) {
            data = Py_NewRef(PyList_GET_ITEM(buffer, 0));
        }
        else {
            PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
            data = empty == NULL ? NULL : call_one(empty, CNAME(state, JOIN), buffer);
            Py_XDECREF(empty);
        }
        PyObject *done = data == NULL ? NULL : call_one(core->transport, CNAME(state, WRITE), data);
        Py_XDECREF(data);
        if (done == NULL) {
            return -1;
        }
        Py_DECREF(done);
        if (PyList_SetSlice(buffer, 0, PyList_GET_SIZE(buffer), NULL) < 0) {
            return -1;
        }
    }
    core->held = 0;
    return 0;
}

/* Encode the turn's checks queued unencoded (None) and not joined, each from its
 * record in _scripts (numbered by its place in the pipeline). 0, or -1. */
static int
encode_left(accel_state *state, core_object *core)
{
    PyObject *buffer = core->write_buffer;
    Py_ssize_t record_at = -1;
    int records_read = 0;
    for (Py_ssize_t at = PyList_GET_SIZE(buffer) - 1; at >= core->held; at--) {
        /* (at checked again: a script's sha may be Python code, which may change it) */
        if (at >= PyList_GET_SIZE(buffer) || PyList_GET_ITEM(buffer, at) != Py_None) {
            continue;
        }
        Py_ssize_t number = core->batched_total + at - core->held + 1;
        if (!records_read) {
            Py_ssize_t records = PyObject_Length(core->scripts);
            if (records < 0) {
                return -1;
            }
            record_at = records - 1;
            records_read = 1;
        }
        PyObject *record = NULL;
        Py_ssize_t found = -1;
        /* The records are in the order of their numbers: walk back to this one. */
        for (; record_at >= 0; record_at--) {
            record = PySequence_GetItem(core->scripts, record_at);
            if (record == NULL) {
                return -1;
            }
            if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) != 5) {
                Py_DECREF(record);
                PyErr_SetString(PyExc_TypeError, "a connection's script record is not a 5-tuple");
                return -1;
            }
            found = PyLong_AsSsize_t(PyTuple_GET_ITEM(record, 0));
            if (found <= number) {
                break;
            }
            Py_DECREF(record);
            record = NULL;
        }
        if (found == -1 && PyErr_Occurred()) {
            Py_XDECREF(record);
            return -1;
        }
        if (record == NULL || found != number) {
            Py_XDECREF(record);
            PyErr_SetString(PyExc_RuntimeError, "a check queued unencoded has no script record");
            return -1;
        }
        PyObject *payload = encode_call(state, PyTuple_GET_ITEM(record, 1),
                                        PyTuple_GET_ITEM(record, 2), PyTuple_GET_ITEM(record, 3));
        Py_DECREF(record);
        if (payload == NULL) {
            return -1;
        }
        if (PyList_SetItem(buffer, at, payload) < 0) { /* takes payload, lets None go */
            return -1;
        }
    }
    return 0;
}

CORE_METHOD(core_flush)
{
    core_object *core = (core_object *)self;
    accel_state *state = core_called("_flush", self, defining_class, nargsf, kwnames, 0);
    (void)args;
    if (state == NULL) {
        return NULL;
    }
    if (core->state == CORE_CLOSED) {
        Py_RETURN_NONE; /* the flag stays down: nothing is sent any more */
    }
    core->flush_due = 1;
    core->batch_open = 0;
    Py_ssize_t new_commands = PyList_GET_SIZE(core->write_buffer) - core->held;
    if (core->state == CORE_READY && new_commands > 1 && core->group != NULL &&
        core->group != Py_None) {
        /* It may join the new commands into fewer: count them again. */
        PyObject *grouped = PyObject_CallNoArgs(core->group);
        if (grouped == NULL) {
            return NULL;
        }
        Py_DECREF(grouped);
        new_commands = PyList_GET_SIZE(core->write_buffer) - core->held;
    }
    if (core->unencoded > 0) {
        /* Counted, not read from _group: encoded even if _group was unset meanwhile. */
        core->unencoded = 0;
        if (new_commands > 0 && encode_left(state, core) < 0) {
            return NULL;
        }
    }
    if (core->state == CORE_READY) {
        /* Written before the batch is recorded: the bookkeeping then overlaps
         * the server's work instead of delaying the write (transport.write
         * runs no callback of this connection: a failure is reported from a
         * later loop turn). */
        if (write_out(state, core) < 0) {
            return NULL;
        }
    }
    else {
        /* While connecting the batch is only recorded and held back. */
        core->held = PyList_GET_SIZE(core->write_buffer);
    }
    if (new_commands > 0 && close_batch(state, core, new_commands) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

CORE_METHOD(core_get_buffer)
{
    (void)args;
    if (core_called("get_buffer", self, defining_class, nargsf, kwnames, 1) == NULL) {
        return NULL;
    }
    return Py_NewRef(((core_object *)self)->read_view);
}

/* Whether reply is an error reply NOSCRIPT: 1, 0, or -1 with an error set. */
static int
is_noscript(accel_state *state, PyObject *reply)
{
    PyObject *message = PyObject_GetAttr(reply, CNAME(state, MESSAGE));
    if (message == NULL) {
        return -1;
    }
    int matches = PyUnicode_Check(message)
                      ? (int)PyUnicode_Tailmatch(message, CNAME(state, NOSCRIPT), 0,
                                                 PY_SSIZE_T_MAX, -1)
                      : 0;
    Py_DECREF(message);
    return matches;
}

/* Give one reply to the oldest future. 0, or -1 with an error set. */
static int
answer(accel_state *state, core_object *core, PyObject *reply)
{
    PyObject *future = PyObject_CallMethodNoArgs(core->pending, CNAME(state, POPLEFT));
    if (future == NULL) {
        return -1; /* IndexError: a reply nobody asked for */
    }
    PyObject *done = PyObject_CallMethodNoArgs(future, CNAME(state, DONE));
    int is_done = done == NULL ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (is_done != 0) {
        /* Done means cancelled or timed out: the reply only frees the slot. */
        Py_DECREF(future);
        return is_done < 0 ? -1 : 0;
    }
    PyObject *set;
    if ((PyObject *)Py_TYPE(reply) != core->reply_error) {
        set = call_one(future, CNAME(state, SET_RESULT), reply);
    }
    else {
        int resent = 0;
        Py_ssize_t scripts = PyObject_Length(core->scripts);
        if (scripts < 0) {
            Py_DECREF(future);
            return -1;
        }
        if (scripts > 0) {
            int noscript = is_noscript(state, reply);
            if (noscript < 0) {
                Py_DECREF(future);
                return -1;
            }
            if (noscript) {
                PyObject *again = call_one((PyObject *)core, CNAME(state, RESEND), future);
                resent = again == NULL ? -1 : PyObject_IsTrue(again);
                Py_XDECREF(again);
                if (resent < 0) {
                    Py_DECREF(future);
                    return -1;
                }
            }
        }
        set = resent ? Py_NewRef(Py_None) : call_one(future, CNAME(state, SET_EXCEPTION), reply);
    }
    Py_DECREF(future);
    Py_XDECREF(set);
    return set == NULL ? -1 : 0;
}

/* The replies of one read; 0, or -1 with an error set. */
static int
read_replies(accel_state *state, core_object *core, PyObject *nbytes)
{
    PyObject *feed_args[4] = {core->reader, core->read_buffer, NULL, nbytes};
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        return -1;
    }
    feed_args[2] = zero;
    PyObject *fed = PyObject_VectorcallMethod(CNAME(state, FEED), feed_args,
                                              4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(zero);
    if (fed == NULL) {
        return -1;
    }
    Py_DECREF(fed);
    PyObject *reply = PyObject_CallMethodNoArgs(core->reader, CNAME(state, GETS));
    if (reply == NULL) {
        return -1;
    }
    if (reply == Py_False) {
        Py_DECREF(reply);
        return 0; /* a part of a reply: nobody to wake yet */
    }
    while (reply != Py_False) {
        int answered = answer(state, core, reply);
        Py_DECREF(reply);
        if (answered < 0) {
            return -1;
        }
        reply = PyObject_CallMethodNoArgs(core->reader, CNAME(state, GETS));
        if (reply == NULL) {
            return -1;
        }
    }
    Py_DECREF(reply);
    if (core->flush_due && core->state == CORE_READY) {
        /* Behind the wake-ups just scheduled: what the answered tasks send next
         * leaves in this loop turn. Its deadline runs from now, a little before
         * they send. */
        return schedule_flush(state, core);
    }
    return 0;
}

CORE_METHOD(core_buffer_updated)
{
    accel_state *state = core_called("buffer_updated", self, defining_class, nargsf, kwnames, 1);
    if (state == NULL) {
        return NULL;
    }
    if (read_replies(state, (core_object *)self, args[0]) == 0) {
        Py_RETURN_NONE;
    }
    /* What the read raised, to the Python side: it aborts the connection for
     * a reply nobody asked for or malformed RESP, and raises anything else. */
    PyObject *error = accel_take_exception();
    if (error == NULL) {
        return NULL;
    }
    PyObject *handled = call_one(self, CNAME(state, READ_FAILED), error);
    Py_DECREF(error);
    return handled;
}

#define CORE_METHOD_FLAGS (METH_METHOD | METH_FASTCALL | METH_KEYWORDS)
#define CORE_METHOD_ENTRY(name, function, doc)                                           \
    {name, (PyCFunction)(void (*)(void))function, CORE_METHOD_FLAGS, doc}
static PyMethodDef core_methods[] = {
    CORE_METHOD_ENTRY("send_script", core_send_script,
                      "send_script(payload, script, keys, args): queue an encoded EVALSHA "
                      "(None: encoded by the flush unless joined); the future of its reply."),
    CORE_METHOD_ENTRY("_queue", core_queue,
                      "_queue(future, payload): one command at the end of the pipeline."),
    CORE_METHOD_ENTRY("_schedule_flush", core_schedule_flush,
                      "Schedule the one write of this loop turn."),
    CORE_METHOD_ENTRY("_flush", core_flush,
                      "Close this turn's commands into a batch and write them in one go."),
    CORE_METHOD_ENTRY("get_buffer", core_get_buffer, "The read buffer (a memoryview)."),
    CORE_METHOD_ENTRY("buffer_updated", core_buffer_updated,
                      "Feed what was read to the Reader and answer the oldest futures."),
    {NULL, NULL, 0, NULL},
};
#undef CORE_METHOD_ENTRY

#define CORE_OBJECT_MEMBER(name, member)                                                 \
    {name, T_OBJECT_EX, offsetof(core_object, member), 0, NULL},
static PyMemberDef core_members[] = {
    CORE_OBJECT_MEMBER("_loop", loop)
    CORE_OBJECT_MEMBER("_pending", pending)
    CORE_OBJECT_MEMBER("_write_buffer", write_buffer)
    CORE_OBJECT_MEMBER("_scripts", scripts)
    CORE_OBJECT_MEMBER("_batches", batches)
    CORE_OBJECT_MEMBER("_reader", reader)
    CORE_OBJECT_MEMBER("_read_buffer", read_buffer)
    CORE_OBJECT_MEMBER("_read_view", read_view)
    CORE_OBJECT_MEMBER("_future_type", future_type)
    CORE_OBJECT_MEMBER("_reply_error", reply_error)
    CORE_OBJECT_MEMBER("_call_soon", call_soon)
    CORE_OBJECT_MEMBER("_call_at", call_at)
    CORE_OBJECT_MEMBER("_loop_time", loop_time)
    {"_transport", T_OBJECT, offsetof(core_object, transport), 0, NULL},
    {"_timer", T_OBJECT, offsetof(core_object, timer), 0, NULL},
    {"_group", T_OBJECT, offsetof(core_object, group), 0, NULL},
    {"_batch_deadline", T_DOUBLE, offsetof(core_object, batch_deadline), 0, NULL},
    {"_command_timeout_s", T_DOUBLE, offsetof(core_object, command_timeout_s), 0, NULL},
    {"_held", T_PYSSIZET, offsetof(core_object, held), 0, NULL},
    {"_batched_total", T_PYSSIZET, offsetof(core_object, batched_total), 0, NULL},
    {"_state", T_INT, offsetof(core_object, state), 0, NULL},
    {"usable", T_BOOL, offsetof(core_object, usable), 0, NULL},
    {"batch_open", T_BOOL, offsetof(core_object, batch_open), 0, NULL},
    {"_flush_due", T_BOOL, offsetof(core_object, flush_due), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};
#undef CORE_OBJECT_MEMBER

PyDoc_STRVAR(core_doc,
"The per-command path of moderato's asyncio Redis connection\n"
"(moderato/redis/connection.py's RedisConnection is its subclass): the\n"
"pipeline's state as members, and the steps every command and read take.");

ACCEL_GC_TYPE(core, "moderato._accel.ConnectionCore", core_object, core_doc, Py_TPFLAGS_BASETYPE,
              {Py_tp_methods, core_methods}, {Py_tp_members, core_members});

int
connection_core_add_to_module(PyObject *module)
{
    Py_BUILD_ASSERT(CNAME_END == CORE_NAME_COUNT);
    accel_state *state = PyModule_GetState(module);
    for (int i = 0; i < CORE_NAME_COUNT; i++) {
        state->core_names[i] = PyUnicode_InternFromString(core_name_texts[i]);
        if (state->core_names[i] == NULL) {
            return -1;
        }
    }
    state->core_loop_keyword = PyTuple_Pack(1, CNAME(state, LOOP));
    state->core_sent_keyword = PyTuple_Pack(1, CNAME(state, SENT));
    if (state->core_loop_keyword == NULL || state->core_sent_keyword == NULL) {
        return -1;
    }
    return accel_add_type(module, &core_spec, "ConnectionCore", &state->core_type);
}
