/* A loop turn's checks joined into batched script calls on one Redis server,
 * in C (issue 30).
 *
 * moderato/redis/grouping.py's group_checks() (its _join() with _Calls) and
 * its BatchedReply are the reference; these are the same steps with the same
 * effects in the same order, for the single server's connections (a
 * cluster node's stay in Python):
 *
 *   Grouping(forms, parts, max_policies, max_bytes, retrieve, copy,
 *            connection_error, reply_error)
 *       what the joining reads (grouping._batching()'s tables and bounds,
 *       and what a load and a failed batch need); called with a connection
 *       (a ConnectionCore, or tests/connection_reference.py's Python one),
 *       it joins that connection's turn: each run of adjacent calls of one
 *       decision script (not a re-send) becomes one call of its batched form,
 *       cut at the algorithm's units (a check PART_UNITS, a repeat of the one
 *       before it its algorithm's), max_policies policy units and max_bytes,
 *       in grouping._append_parts' layout (the markers), a SCRIPT LOAD
 *       queued before a form's first call on the connection, the records in
 *       _scripts and the slots in _pending as the Python steps leave them;
 *       a check queued unencoded (None in _write_buffer, its record all its
 *       EVALSHA needs) is measured by resp_evalsha_size and, if not joined,
 *       left None for the connection's flush to encode;
 *   BatchedReply
 *       a batched call's slot in _pending: done(), set_result(reply) (the
 *       flat reply split per check, each check's future given its list or
 *       its refusal, a reply that does not add up failing each check with
 *       RedisConnectionError) and set_exception(error) (a copy per check).
 *
 * The connection's members are read as attributes, once per turn, so the
 * joining runs the same on the C core and on the Python reference core.
 * tests/redis/test_grouping_in_c.py runs the same turns through both
 * implementations and compares what they leave.
 */
#include "grouping.h"

#include "connection_core.h"
#include "contract.h"
#include "heap_type.h"
#include "resp.h"

/* A name it reads: connection_core.h's CORE_NAMES, in its module's state. */
#define GNAME(grouping, name) CNAME((grouping)->state, name)

typedef struct {
    PyObject_HEAD
    PyObject *forms;            /* dict: a decision script's SHA1 -> its batched form */
    PyObject *parts; /* dict: a decision script's SHA1 -> (units a call takes, a repeat's) */
    PyObject *retrieve;         /* grouping._retrieve: a load's done callback */
    PyObject *copy;             /* copy.copy */
    PyObject *connection_error; /* RedisConnectionError */
    PyObject *reply_error;      /* RedisReplyError */
    Py_ssize_t max_policies;
    Py_ssize_t max_bytes;
    /* its module's state (the names it reads, ("loop",), BatchedReply): the module
     * lives as long as the type, which each of its objects holds */
    accel_state *state;
} grouping_object;

/* Its references, listed once: traverse and clear are both made from these. */
#define GROUPING_MEMBERS(X)                                                              \
    X(forms) X(parts) X(retrieve) X(copy) X(connection_error) X(reply_error)
ACCEL_GC_FUNCTIONS(grouping, grouping_object, GROUPING_MEMBERS)

/* -- a batched call's slot ------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *parts;    /* list: each check's future, in the order decided */
    PyObject *grouping; /* the Grouping that made it: names and error types */
    char done;
} reply_object;

#define REPLY_MEMBERS(X) X(parts) X(grouping)
ACCEL_GC_FUNCTIONS(reply, reply_object, REPLY_MEMBERS)

/* future.done(): 1, 0, or -1 with an error set. */
static int
future_done(grouping_object *grouping, PyObject *future)
{
    PyObject *done = PyObject_CallMethodNoArgs(future, GNAME(grouping, DONE));
    if (done == NULL) {
        return -1;
    }
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    return is_done;
}

/* future.<method>(value) unless the future is done. 0, or -1. */
static int
settle(grouping_object *grouping, PyObject *future, PyObject *method, PyObject *value)
{
    int done = future_done(grouping, future);
    if (done != 0) {
        return done < 0 ? -1 : 0;
    }
    PyObject *set = PyObject_CallMethodOneArg(future, method, value);
    Py_XDECREF(set);
    return set == NULL ? -1 : 0;
}

static PyObject *
reply_done(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    reply_object *reply = (reply_object *)self;
    if (reply->done) {
        Py_RETURN_TRUE;
    }
    grouping_object *grouping = (grouping_object *)reply->grouping;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(reply->parts); i++) {
        int done = future_done(grouping, PyList_GET_ITEM(reply->parts, i));
        if (done <= 0) {
            return done < 0 ? NULL : Py_NewRef(Py_False);
        }
    }
    Py_RETURN_TRUE;
}

/* Each check failed with its own copy of error (one instance raised in many
 * tasks would gather every task's traceback). 0, or -1. */
static int
fail_each(reply_object *reply, PyObject *error)
{
    grouping_object *grouping = (grouping_object *)reply->grouping;
    reply->done = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(reply->parts); i++) {
        PyObject *part = PyList_GET_ITEM(reply->parts, i);
        int done = future_done(grouping, part);
        if (done != 0) {
            if (done < 0) {
                return -1;
            }
            continue;
        }
        PyObject *copied = PyObject_CallOneArg(grouping->copy, error);
        if (copied == NULL) {
            return -1;
        }
        PyObject *set = PyObject_CallMethodOneArg(part, GNAME(grouping, SET_EXCEPTION), copied);
        Py_DECREF(copied);
        if (set == NULL) {
            return -1;
        }
        Py_DECREF(set);
    }
    return 0;
}

static PyObject *
reply_set_exception(PyObject *self, PyObject *error)
{
    if (fail_each((reply_object *)self, error) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The count of entries a head sending what changed (-1 - mask) takes after it, when
 * before_length entries (-1: no decision before) take mask's bits; else -1. */
static Py_ssize_t
changed_count(long long head, Py_ssize_t before_length)
{
    /* mask below 2^62 and 2^before_length (split_reply's bound too) */
    if (head < -(1LL << 62) || before_length < 0) {
        return -1;
    }
    unsigned long long mask = (unsigned long long)(-1 - head);
    if (mask >> (before_length < 62 ? before_length : 62)) {
        return -1;
    }
    Py_ssize_t count = 0;
    for (; mask; mask >>= 1) {
        count += (Py_ssize_t)(mask & 1);
    }
    return count;
}

/* Whether reply is count checks' flat reply (lua/batch.lua: per check its
 * length then its entries, or one error entry, or what changed since the decision
 * before: -1 - mask, then mask's entries): grouping.split_reply's test.
 * 1, 0, or -1 with an error set. */
static int
adds_up(grouping_object *grouping, PyObject *reply, Py_ssize_t count)
{
    if (!PyList_CheckExact(reply)) {
        return 0;
    }
    Py_ssize_t at = 0, size = PyList_GET_SIZE(reply), items = 0;
    Py_ssize_t before_length = -1; /* the decision before's entries; -1: none */
    while (at < size && items < count) {
        PyObject *head = PyList_GET_ITEM(reply, at);
        if (PyLong_CheckExact(head)) {
            int overflow = 0;
            long long length = PyLong_AsLongLongAndOverflow(head, &overflow);
            if (length == -1 && PyErr_Occurred()) {
                return -1;
            }
            if (overflow != 0) {
                return 0;
            }
            if (length >= 0) {
                if (length > size - at - 1) {
                    return 0;
                }
                before_length = (Py_ssize_t)length;
                at += 1 + (Py_ssize_t)length;
            }
            else {
                Py_ssize_t changed = changed_count(length, before_length);
                if (changed < 0 || changed > size - at - 1) {
                    return 0;
                }
                at += 1 + changed;
            }
        }
        else {
            int refusal = PyObject_IsInstance(head, grouping->reply_error);
            if (refusal <= 0) {
                return refusal;
            }
            before_length = -1;
            at += 1;
        }
        items++;
    }
    return at == size && items == count;
}

/* The decision reply[at] (-1 - mask, adds_up checked) sends: a copy of before with
 * mask's entries those after it. A new reference, *at moved past them; NULL on error. */
static PyObject *
changed_decision(PyObject *reply, Py_ssize_t *at, PyObject *before)
{
    unsigned long long mask =
        (unsigned long long)(-1 - PyLong_AsLongLong(PyList_GET_ITEM(reply, *at)));
    PyObject *item = PyList_GetSlice(before, 0, PyList_GET_SIZE(before));
    if (item == NULL) {
        return NULL;
    }
    Py_ssize_t from = *at + 1;
    for (Py_ssize_t index = 0; mask; mask >>= 1, index++) {
        if (mask & 1) {
            PyList_SetItem(item, index, Py_NewRef(PyList_GET_ITEM(reply, from)));
            from++;
        }
    }
    *at = from;
    return item;
}

static PyObject *
reply_set_result(PyObject *self, PyObject *value)
{
    reply_object *reply = (reply_object *)self;
    grouping_object *grouping = (grouping_object *)reply->grouping;
    reply->done = 1;
    Py_ssize_t count = PyList_GET_SIZE(reply->parts);
    int whole = adds_up(grouping, value, count);
    if (whole < 0) {
        return NULL;
    }
    if (!whole) {
        PyObject *error = PyObject_CallFunction(
            grouping->connection_error, "N",
            PyUnicode_FromFormat("a batched call of %zd checks was answered %.200R", count,
                                 value));
        if (error == NULL || fail_each(reply, error) < 0) {
            Py_XDECREF(error);
            return NULL;
        }
        Py_DECREF(error);
        Py_RETURN_NONE;
    }
    Py_ssize_t at = 0;
    PyObject *before = NULL; /* the decision before (a new reference), NULL: none */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *part = PyList_GET_ITEM(reply->parts, i);
        PyObject *head = PyList_GET_ITEM(value, at);
        int settled;
        if (PyLong_CheckExact(head)) {
            long long length = PyLong_AsLongLong(head);
            PyObject *item;
            if (length >= 0) {
                Py_ssize_t end = at + 1 + (Py_ssize_t)length;
                item = PyList_GetSlice(value, at + 1, end);
                at = end;
            }
            else {
                item = changed_decision(value, &at, before);
            }
            if (item == NULL) {
                Py_XDECREF(before);
                return NULL;
            }
            settled = settle(grouping, part, GNAME(grouping, SET_RESULT), item);
            Py_XSETREF(before, item);
        }
        else {
            settled = settle(grouping, part, GNAME(grouping, SET_EXCEPTION), head);
            Py_CLEAR(before);
            at += 1;
        }
        if (settled < 0) {
            Py_XDECREF(before);
            return NULL;
        }
    }
    Py_XDECREF(before);
    Py_RETURN_NONE;
}

static PyMethodDef reply_methods[] = {
    {"done", reply_done, METH_NOARGS,
     "Answered, or every check gone (cancelled or timed out)."},
    {"set_result", reply_set_result, METH_O,
     "The call's flat reply: each check's future given its entry."},
    {"set_exception", reply_set_exception, METH_O,
     "The call failed as a whole: each check's future given a copy of the error."},
    {NULL, NULL, 0, NULL},
};

static PyObject *
reply_get_parts(PyObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(((reply_object *)self)->parts);
}

static PyGetSetDef reply_getset[] = {
    {"_parts", reply_get_parts, NULL, "Each check's future, in the order decided.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(reply_doc,
"The slot of one batched call in a connection's _pending (grouping.BatchedReply's\n"
"steps in C): the call's reply or failure handed to each check's future.");

ACCEL_GC_TYPE(reply, "moderato._accel.BatchedReply", reply_object, reply_doc,
              ACCEL_TPFLAGS_IMMUTABLE, {Py_tp_new, accel_refuse_new},
              {Py_tp_methods, reply_methods}, {Py_tp_getset, reply_getset});

/* -- joining a turn ------------------------------------------------------------- */

/* A sequence's length; -1 with an error set. */
#define LENGTH(sequence) PyObject_Length(sequence)

/* list.append for a new reference, which it takes. 0, or -1. */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL) {
        return -1;
    }
    int result = PyList_Append(list, item);
    Py_DECREF(item);
    return result;
}

/* list.extend(items). 0, or -1. */
static int
extend(PyObject *list, PyObject *items)
{
    if (PyList_CheckExact(items) || PyTuple_CheckExact(items)) {
        /* A check's few keys or arguments: appended one by one, cheaper than a slice. */
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
            if (PyList_Append(list, PySequence_Fast_GET_ITEM(items, i)) < 0) {
                return -1;
            }
        }
        return 0;
    }
    Py_ssize_t size = PyList_GET_SIZE(list);
    return PyList_SetSlice(list, size, size, items);
}

/* a[1:] == b[1:] for two sequences of one length. 1, 0, or -1. */
static int
tails_equal(PyObject *a, PyObject *b)
{
    if (Py_TYPE(a) == Py_TYPE(b) && (PyList_CheckExact(a) || PyTuple_CheckExact(a))) {
        Py_ssize_t size = PySequence_Fast_GET_SIZE(a);
        for (Py_ssize_t i = 1; i < size && i < PySequence_Fast_GET_SIZE(b); i++) {
            int equal = PyObject_RichCompareBool(PySequence_Fast_GET_ITEM(a, i),
                                                 PySequence_Fast_GET_ITEM(b, i), Py_EQ);
            if (equal <= 0) {
                return equal;
            }
        }
        return PySequence_Fast_GET_SIZE(a) == PySequence_Fast_GET_SIZE(b);
    }
    PyObject *tail_a = PySequence_GetSlice(a, 1, PY_SSIZE_T_MAX);
    PyObject *tail_b = tail_a == NULL ? NULL : PySequence_GetSlice(b, 1, PY_SSIZE_T_MAX);
    int equal = tail_b == NULL ? -1 : PyObject_RichCompareBool(tail_a, tail_b, Py_EQ);
    Py_XDECREF(tail_a);
    Py_XDECREF(tail_b);
    return equal;
}

/* A part in full: its key count, argument count, arguments; its keys. 0, or -1. */
static int
append_full(PyObject *args, PyObject *keys, PyObject *part_keys, PyObject *part_args)
{
    Py_ssize_t key_count = LENGTH(part_keys), arg_count = LENGTH(part_args);
    if (key_count < 0 || arg_count < 0 || append_new(args, PyLong_FromSsize_t(key_count)) < 0 ||
        append_new(args, PyLong_FromSsize_t(arg_count)) < 0 || extend(args, part_args) < 0) {
        return -1;
    }
    return extend(keys, part_keys);
}

/* A part against the part before it (grouping._append_parts): 1 if sent as a
 * marker, 0 if it goes in full, -1 with an error set. */
static int
append_marker(grouping_object *grouping, PyObject *args, PyObject *keys, PyObject *part,
              PyObject *before)
{
    PyObject *part_keys = PyTuple_GET_ITEM(part, 2), *part_args = PyTuple_GET_ITEM(part, 3);
    PyObject *before_keys = PyTuple_GET_ITEM(before, 2);
    PyObject *before_args = PyTuple_GET_ITEM(before, 3);
    int same_args = PyObject_RichCompareBool(part_args, before_args, Py_EQ);
    if (same_args < 0) {
        return -1;
    }
    Py_ssize_t key_count = LENGTH(part_keys), before_key_count = LENGTH(before_keys);
    if (key_count < 0 || before_key_count < 0) {
        return -1;
    }
    if (same_args) {
        int same_keys = PyObject_RichCompareBool(part_keys, before_keys, Py_EQ);
        if (same_keys != 0) {
            return same_keys < 0 ? -1
                                 : (PyList_Append(args, GNAME(grouping, REPEAT)) < 0 ? -1 : 1);
        }
        if (key_count != before_key_count) {
            return 0;
        }
        if (PyList_Append(args, GNAME(grouping, OWN_KEYS)) < 0 || extend(keys, part_keys) < 0) {
            return -1;
        }
        return 1;
    }
    Py_ssize_t arg_count = LENGTH(part_args), before_arg_count = LENGTH(before_args);
    if (arg_count < 0 || before_arg_count < 0) {
        return -1;
    }
    if (arg_count == 0 || arg_count != before_arg_count || key_count != before_key_count) {
        return 0;
    }
    int same_fields = tails_equal(part_args, before_args);
    if (same_fields <= 0) {
        return same_fields;
    }
    int same_keys = PyObject_RichCompareBool(part_keys, before_keys, Py_EQ);
    PyObject *cost = same_keys < 0 ? NULL : PySequence_GetItem(part_args, 0);
    if (cost == NULL) {
        return -1;
    }
    int failed = PyList_Append(args, same_keys ? GNAME(grouping, OWN_COST)
                                               : GNAME(grouping, OWN_KEYS_AND_COST)) < 0 ||
                 PyList_Append(args, cost) < 0 || (!same_keys && extend(keys, part_keys) < 0);
    Py_DECREF(cost);
    return failed ? -1 : 1;
}

/* The parts' keys and arguments in lua/batch.lua's layout. 0, or -1. */
static int
append_parts(grouping_object *grouping, PyObject *args, PyObject *keys, PyObject *const *parts,
             Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        int marker = i == 0 ? 0 : append_marker(grouping, args, keys, parts[i], parts[i - 1]);
        if (marker < 0 || (marker == 0 && append_full(args, keys, PyTuple_GET_ITEM(parts[i], 2),
                                                      PyTuple_GET_ITEM(parts[i], 3)) < 0)) {
            return -1;
        }
    }
    return 0;
}

/* What the joining reads of a connection, once per turn (new references). */
typedef struct {
    PyObject *buffer, *scripts, *loads, *pending, *loaded, *future_type, *loop;
    Py_ssize_t first, base;
} turn_state;

static void
turn_release(turn_state *turn)
{
    Py_CLEAR(turn->buffer);
    Py_CLEAR(turn->scripts);
    Py_CLEAR(turn->loads);
    Py_CLEAR(turn->pending);
    Py_CLEAR(turn->loaded);
    Py_CLEAR(turn->future_type);
    Py_CLEAR(turn->loop);
}

/* connection.<name> as a Py_ssize_t. 0, or -1. */
static int
read_size(PyObject *connection, PyObject *name, Py_ssize_t *out)
{
    PyObject *value = PyObject_GetAttr(connection, name);
    if (value == NULL) {
        return -1;
    }
    *out = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* deque.<method>(item) for a new reference, which it takes. 0, or -1. */
static int
call_taking(PyObject *deque, PyObject *method, PyObject *item)
{
    if (item == NULL) {
        return -1;
    }
    PyObject *done = PyObject_CallMethodOneArg(deque, method, item);
    Py_DECREF(item);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* A record for the sequence number: (number, *record[1:]). */
static PyObject *
renumbered(PyObject *record, Py_ssize_t number)
{
    Py_ssize_t size = PyTuple_GET_SIZE(record);
    PyObject *copy = PyTuple_New(size);
    PyObject *value = copy == NULL ? NULL : PyLong_FromSsize_t(number);
    if (value == NULL) {
        Py_XDECREF(copy);
        return NULL;
    }
    PyTuple_SET_ITEM(copy, 0, value);
    for (Py_ssize_t i = 1; i < size; i++) {
        PyTuple_SET_ITEM(copy, i, Py_NewRef(PyTuple_GET_ITEM(record, i)));
    }
    return copy;
}

/* The place the last payload of the buffer takes in the pipeline. */
#define SEQUENCE(turn) ((turn)->base + PyList_GET_SIZE((turn)->buffer) - (turn)->first)

/* Queue SCRIPT LOAD of form before its first batched call here. 0, or -1. */
static int
load_form(grouping_object *grouping, turn_state *turn, PyObject *form, PyObject *sha)
{
    int loaded = PySet_Contains(turn->loaded, sha);
    if (loaded != 0) {
        return loaded < 0 ? -1 : 0;
    }
    if (PySet_Add(turn->loaded, sha) < 0) {
        return -1;
    }
    PyObject *call_args[2] = {NULL, turn->loop};
    PyObject *load = PyObject_Vectorcall(turn->future_type, call_args + 1,
                                         PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         grouping->state->core_loop_keyword);
    if (load == NULL) {
        return -1;
    }
    PyObject *added = PyObject_CallMethodOneArg(load, GNAME(grouping, ADD_DONE_CALLBACK),
                                                grouping->retrieve);
    PyObject *source = added == NULL ? NULL : PyObject_GetAttr(form, GNAME(grouping, SOURCE));
    Py_XDECREF(added);
    PyObject *command = NULL;
    if (source != NULL) {
        PyObject *words[3] = {GNAME(grouping, SCRIPT), GNAME(grouping, LOAD), source};
        command = resp_encode_command(NULL, words, 3);
        Py_DECREF(source);
    }
    if (append_new(turn->buffer, command) < 0 ||
        call_taking(turn->pending, GNAME(grouping, APPEND), load) < 0) {
        return -1;
    }
    PyObject *number = PyLong_FromSsize_t(SEQUENCE(turn));
    if (number == NULL) {
        return -1;
    }
    int stored = PyDict_SetItem(turn->loads, sha, number);
    Py_DECREF(number);
    return stored;
}

/* One batched call in place of the run's parts. 0, or -1. */
static int
put_batch(grouping_object *grouping, turn_state *turn, PyObject *form, PyObject *const *parts,
          PyObject *const *futures, Py_ssize_t count)
{
    accel_state *state = grouping->state;
    PyObject *keys = PyList_New(0);
    PyObject *args = keys == NULL ? NULL : Py_BuildValue("[n]", count);
    PyObject *sha = args == NULL ? NULL : PyObject_GetAttr(form, GNAME(grouping, SHA));
    reply_object *reply = NULL;
    int result = -1;
    if (sha == NULL || append_parts(grouping, args, keys, parts, count) < 0) {
        goto done;
    }
    reply = PyObject_GC_New(reply_object, state->batched_reply_type);
    if (reply == NULL) {
        goto done;
    }
    Py_INCREF(state->batched_reply_type);
    reply->grouping = Py_NewRef((PyObject *)grouping);
    reply->done = 0;
    reply->parts = PyList_New(count);
    PyObject_GC_Track(reply);
    if (reply->parts == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyList_SET_ITEM(reply->parts, i, Py_NewRef(futures[i]));
    }
    if (load_form(grouping, turn, form, sha) < 0) {
        goto done;
    }
    PyObject *call[3] = {sha, keys, args};
    if (append_new(turn->buffer, resp_encode_evalsha(NULL, call, 3)) < 0 ||
        call_taking(turn->pending, GNAME(grouping, APPEND), Py_NewRef((PyObject *)reply)) < 0) {
        goto done;
    }
    result = call_taking(turn->scripts, GNAME(grouping, APPEND),
                         Py_BuildValue("(nOOOi)", SEQUENCE(turn), form, keys, args, 0));
done:
    Py_XDECREF(reply);
    Py_XDECREF(sha);
    Py_XDECREF(keys);
    Py_XDECREF(args);
    return result;
}

/* A lone command back in its place (renumbered if a script call). 0, or -1. */
static int
put_alone(grouping_object *grouping, turn_state *turn, PyObject *payload, PyObject *future,
          PyObject *record)
{
    if (PyList_Append(turn->buffer, payload) < 0 ||
        call_taking(turn->pending, GNAME(grouping, APPEND), Py_NewRef(future)) < 0) {
        return -1;
    }
    if (record == NULL) {
        return 0;
    }
    return call_taking(turn->scripts, GNAME(grouping, APPEND),
                       renumbered(record, SEQUENCE(turn)));
}

/* A check's weight in a batched call unless sent as the check before it again
 * (moderato.scripts.BATCH_PART_UNITS, grouping._PART_UNITS). */
#define PART_UNITS 4

/* Per new command: its record (or NULL), its run key (its script's batched
 * form, borrowed from forms, or NULL: it stays alone), the units its
 * algorithm's checks may weigh in a call and a repeat's units. */
typedef struct {
    PyObject *record;
    PyObject *form;
    Py_ssize_t units;
    Py_ssize_t repeat_units;
} command_info;

/* Whether a record's re-sends are 0 (record[4] == 0). 1, 0, or -1. */
static int
not_resent(PyObject *resends)
{
    if (PyLong_CheckExact(resends)) {
        int overflow;
        long value = PyLong_AsLongAndOverflow(resends, &overflow);
        return value == -1 && PyErr_Occurred() ? -1 : (overflow == 0 && value == 0);
    }
    PyObject *zero = PyLong_FromLong(0);
    int fresh = zero == NULL ? -1 : PyObject_RichCompareBool(resends, zero, Py_EQ);
    Py_XDECREF(zero);
    return fresh;
}

/* The run key and parts of a record (grouping._Calls.run_keys); before: the
 * command before it, whose script's are taken again when it is the same
 * object. 0, or -1. */
static int
run_key(grouping_object *grouping, command_info *info, const command_info *before)
{
    PyObject *record = info->record;
    info->form = NULL;
    info->units = 0;
    info->repeat_units = 0;
    if (record == NULL) {
        return 0;
    }
    int fresh = not_resent(PyTuple_GET_ITEM(record, 4));
    if (fresh <= 0) {
        return fresh;
    }
    if (before != NULL && before->form != NULL &&
        PyTuple_GET_ITEM(before->record, 1) == PyTuple_GET_ITEM(record, 1)) {
        info->form = before->form;
        info->units = before->units;
        info->repeat_units = before->repeat_units;
        return 0;
    }
    PyObject *sha = PyObject_GetAttr(PyTuple_GET_ITEM(record, 1), GNAME(grouping, SHA));
    if (sha == NULL) {
        return -1;
    }
    info->form = PyDict_GetItemWithError(grouping->forms, sha);
    PyObject *parts = info->form == NULL ? NULL : PyDict_GetItemWithError(grouping->parts, sha);
    Py_DECREF(sha);
    if (parts != NULL) {
        if (!PyTuple_CheckExact(parts) || PyTuple_GET_SIZE(parts) != 2) {
            PyErr_SetString(PyExc_TypeError, "Grouping's parts: (units, repeat units) tuples");
            return -1;
        }
        info->units = PyLong_AsSsize_t(PyTuple_GET_ITEM(parts, 0));
        info->repeat_units = PyLong_AsSsize_t(PyTuple_GET_ITEM(parts, 1));
        if ((info->units == -1 || info->repeat_units == -1) && PyErr_Occurred()) {
            return -1;
        }
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* grouping._decimal: an argument's number when sent as 1 to digits - 1 ASCII
 * digits (a str, bytes, or an int, sent as its decimal). 1 with *number set,
 * 0, or -1 with an error set. */
static int
short_decimal(PyObject *value, int digits, long long *number)
{
    long long bound = 1;
    for (int i = 1; i < digits; i++) {
        bound *= 10;
    }
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long got = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (got == -1 && PyErr_Occurred()) {
            return -1;
        }
        *number = got;
        return overflow == 0 && got >= 0 && got < bound;
    }
    const char *text;
    Py_ssize_t length;
    if (PyUnicode_CheckExact(value)) {
        if (!PyUnicode_IS_ASCII(value)) {
            return 0;
        }
        text = (const char *)PyUnicode_1BYTE_DATA(value);
        length = PyUnicode_GET_LENGTH(value);
    }
    else if (PyBytes_CheckExact(value)) {
        text = PyBytes_AS_STRING(value);
        length = PyBytes_GET_SIZE(value);
    }
    else {
        return 0;
    }
    if (length < 1 || length >= digits) {
        return 0;
    }
    long long got = 0;
    for (Py_ssize_t i = 0; i < length; i++) {
        if (text[i] < '0' || text[i] > '9') {
            return 0;
        }
        got = got * 10 + (text[i] - '0');
    }
    *number = got;
    return 1;
}

/* grouping._straight_line: whether a check's arguments take its script's
 * one-policy straight-line path (so a repeat of it weighs its algorithm's
 * repeat units). 1, 0, or -1 with an error set. */
static int
straight_line(PyObject *record)
{
    PyObject *args = PyTuple_GET_ITEM(record, 3);
    Py_ssize_t key_count = LENGTH(PyTuple_GET_ITEM(record, 2)), arg_count = LENGTH(args);
    if (key_count < 0 || arg_count < 0) {
        return -1;
    }
    if (key_count != 1 || (arg_count != 4 && arg_count != 5)) {
        return 0;
    }
    PyObject *values[5] = {NULL, NULL, NULL, NULL, NULL};
    int taken = -1;
    for (Py_ssize_t i = 0; i < arg_count; i++) {
        values[i] = PySequence_GetItem(args, i);
        if (values[i] == NULL) {
            goto done;
        }
    }
    taken = 0;
    if (arg_count == 5) {
        PyObject *refill = values[4];
        int empty = (PyUnicode_CheckExact(refill) && PyUnicode_GET_LENGTH(refill) == 0) ||
                    (PyBytes_CheckExact(refill) && PyBytes_GET_SIZE(refill) == 0);
        if (!empty) {
            goto done;
        }
    }
    long long apply = 0, cost = 0, capacity = 0, window = 0;
    static const int digits[4] = {16, 2, 14, 6};
    long long *numbers[4] = {&cost, &apply, &capacity, &window};
    for (int i = 0; i < 4; i++) {
        int got = short_decimal(values[i], digits[i], numbers[i]);
        if (got <= 0) {
            taken = got;
            goto done;
        }
    }
    taken = apply == 1 && 1 <= cost && cost <= capacity &&
            capacity <= ACCEL_MAX_CAPACITY_SCALED && 1 <= window && window <= ACCEL_MAX_WINDOW_S;
done:
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(values[i]);
    }
    return taken;
}

/* The bytes a new command takes: its payload's, or for a check queued
 * unencoded (None), its EVALSHA's from its record (memo: the turn's records
 * hold the arguments it names). -1 with an error set. */
static Py_ssize_t
payload_size(PyObject *payload, PyObject *record, resp_size_memo *memo)
{
    if (payload == Py_None) {
        return resp_evalsha_size_memo(PyTuple_GET_ITEM(record, 2), PyTuple_GET_ITEM(record, 3),
                                      memo);
    }
    return LENGTH(payload);
}

/* Cut the new commands into runs; *runs set to how many, stops[r] each run's
 * end. 0, or -1. */
static int
find_runs(grouping_object *grouping, turn_state *turn, command_info *infos, Py_ssize_t count,
          Py_ssize_t *stops, Py_ssize_t *runs)
{
    Py_ssize_t start = 0;
    resp_size_memo memo = {NULL, 0};
    *runs = 0;
    while (start < count) {
        Py_ssize_t stop = start + 1;
        PyObject *form = infos[start].form;
        if (form != NULL) {
            Py_ssize_t size = payload_size(PyList_GET_ITEM(turn->buffer, turn->first + start),
                                           infos[start].record, &memo);
            Py_ssize_t policies = LENGTH(PyTuple_GET_ITEM(infos[start].record, 2));
            if (size < 0 || policies < 0) {
                return -1;
            }
            /* Weighed as append_parts sends them: a repeat ("=") its algorithm's units. */
            Py_ssize_t units = PART_UNITS;
            policies *= PART_UNITS;
            while (stop < count && infos[stop].form == form) {
                PyObject *after = infos[stop].record, *before = infos[stop - 1].record;
                Py_ssize_t more =
                    payload_size(PyList_GET_ITEM(turn->buffer, turn->first + stop), after, &memo);
                Py_ssize_t more_policies = LENGTH(PyTuple_GET_ITEM(after, 2));
                if (more < 0 || more_policies < 0) {
                    return -1;
                }
                int repeat = PyObject_RichCompareBool(PyTuple_GET_ITEM(after, 3),
                                                      PyTuple_GET_ITEM(before, 3), Py_EQ);
                if (repeat > 0) {
                    repeat = PyObject_RichCompareBool(PyTuple_GET_ITEM(after, 2),
                                                      PyTuple_GET_ITEM(before, 2), Py_EQ);
                }
                if (repeat > 0) {
                    repeat = straight_line(after);
                }
                if (repeat < 0) {
                    return -1;
                }
                Py_ssize_t weight = repeat ? infos[start].repeat_units : PART_UNITS;
                size += more;
                units += weight;
                policies += more_policies * weight;
                if (units > infos[start].units || size > grouping->max_bytes ||
                    policies > grouping->max_policies) {
                    break;
                }
                stop++;
            }
        }
        stops[(*runs)++] = stop;
        start = stop;
    }
    return 0;
}

/* The turn's records (each a 5-tuple), newest first, into records by number. */
static int
collect_turn(turn_state *turn, PyObject *turn_records, command_info *infos, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(turn_records); i++) {
        PyObject *record = PyList_GET_ITEM(turn_records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) != 5) {
            PyErr_SetString(PyExc_TypeError, "a connection's script record is not a 5-tuple");
            return -1;
        }
        Py_ssize_t number = PyLong_AsSsize_t(PyTuple_GET_ITEM(record, 0));
        if (number == -1 && PyErr_Occurred()) {
            return -1;
        }
        Py_ssize_t index = number - turn->base - 1;
        if (index >= count) {
            PyErr_SetString(PyExc_IndexError, "list assignment index out of range");
            return -1;
        }
        infos[index].record = record;
    }
    return 0;
}

/* The records numbered past base, newest first (a new list), or NULL. */
static PyObject *
turn_records(turn_state *turn)
{
    PyObject *records = PyList_New(0);
    Py_ssize_t size = records == NULL ? -1 : LENGTH(turn->scripts);
    if (size < 0) {
        Py_XDECREF(records);
        return NULL;
    }
    for (Py_ssize_t i = size - 1; i >= 0; i--) {
        PyObject *record = PySequence_GetItem(turn->scripts, i);
        if (record == NULL) {
            Py_DECREF(records);
            return NULL;
        }
        PyObject *first = PyTuple_Check(record) && PyTuple_GET_SIZE(record) > 0
                              ? PyTuple_GET_ITEM(record, 0)
                              : NULL;
        Py_ssize_t number = first == NULL ? -2 : PyLong_AsSsize_t(first);
        if (number == -2 || (number == -1 && PyErr_Occurred())) {
            Py_DECREF(record);
            Py_DECREF(records);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "a connection's script record is not a tuple");
            }
            return NULL;
        }
        if (number <= turn->base) {
            Py_DECREF(record);
            break;
        }
        if (append_new(records, record) < 0) {
            Py_DECREF(records);
            return NULL;
        }
    }
    return records;
}

/* Whether a load was queued this turn (a NOSCRIPT repair). 1, 0, or -1. */
static int
loaded_this_turn(turn_state *turn)
{
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(turn->loads, &position, &key, &value)) {
        Py_ssize_t at = PyLong_AsSsize_t(value);
        if (at == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (at > turn->base) {
            return 1;
        }
    }
    return 0;
}

/* deque.pop() count times: the items, oldest first, into out. 0, or -1. */
static int
pop_each(grouping_object *grouping, PyObject *deque, Py_ssize_t count, PyObject **out)
{
    for (Py_ssize_t i = count - 1; i >= 0; i--) {
        PyObject *item = PyObject_CallMethodNoArgs(deque, GNAME(grouping, POP));
        if (item == NULL) {
            return -1;
        }
        if (out != NULL) {
            out[i] = item;
        }
        else {
            Py_DECREF(item);
        }
    }
    return 0;
}

/* Put the turn's commands back, each run of two or more as one batched call. */
static int
rebuild(grouping_object *grouping, turn_state *turn, command_info *infos, Py_ssize_t count,
        Py_ssize_t turn_count, const Py_ssize_t *stops, Py_ssize_t runs)
{
    PyObject **futures = PyMem_Calloc((size_t)count, sizeof(PyObject *));
    PyObject **parts = PyMem_Calloc((size_t)count, sizeof(PyObject *));
    PyObject *payloads = NULL;
    int result = -1;
    if (futures == NULL || parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (pop_each(grouping, turn->pending, count, futures) < 0 ||
        pop_each(grouping, turn->scripts, turn_count, NULL) < 0) {
        goto done;
    }
    Py_ssize_t size = PyList_GET_SIZE(turn->buffer);
    payloads = PyList_GetSlice(turn->buffer, turn->first, size);
    if (payloads == NULL || PyList_SetSlice(turn->buffer, turn->first, size, NULL) < 0) {
        goto done;
    }
    Py_ssize_t start = 0;
    for (Py_ssize_t r = 0; r < runs; r++) {
        Py_ssize_t stop = stops[r];
        if (stop - start == 1) {
            if (put_alone(grouping, turn, PyList_GET_ITEM(payloads, start), futures[start],
                          infos[start].record) < 0) {
                goto done;
            }
        }
        else {
            for (Py_ssize_t i = start; i < stop; i++) {
                parts[i - start] = infos[i].record;
            }
            if (put_batch(grouping, turn, infos[start].form, parts, futures + start,
                          stop - start) < 0) {
                goto done;
            }
        }
        start = stop;
    }
    result = 0;
done:
    if (futures != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_XDECREF(futures[i]);
        }
    }
    PyMem_Free(futures);
    PyMem_Free(parts);
    Py_XDECREF(payloads);
    return result;
}

static int
is_list(PyObject *value)
{
    return PyList_Check(value);
}

static int
is_dict(PyObject *value)
{
    return PyDict_Check(value);
}

static int
is_set(PyObject *value)
{
    return PySet_Check(value);
}

/* connection.<name> (a new reference), TypeError unless check(it) when check
 * is given; NULL with an error set. */
static PyObject *
read_member(PyObject *connection, PyObject *name, int (*check)(PyObject *), const char *what)
{
    PyObject *value = PyObject_GetAttr(connection, name);
    if (value != NULL && check != NULL && !check(value)) {
        PyErr_Format(PyExc_TypeError, "a connection's %U is not %s", name, what);
        Py_CLEAR(value);
    }
    return value;
}

/* Read what the joining reads of connection. 0, or -1. */
static int
turn_read(grouping_object *grouping, PyObject *connection, turn_state *turn)
{
    turn->buffer = read_member(connection, GNAME(grouping, WRITE_BUFFER), is_list, "a list");
    if (turn->buffer == NULL || read_size(connection, GNAME(grouping, HELD), &turn->first) < 0 ||
        read_size(connection, GNAME(grouping, BATCHED_TOTAL), &turn->base) < 0) {
        return -1;
    }
    turn->scripts = read_member(connection, GNAME(grouping, SCRIPTS), NULL, NULL);
    turn->loads = turn->scripts == NULL
                      ? NULL
                      : read_member(connection, GNAME(grouping, LOADS), is_dict, "a dict");
    return turn->loads == NULL ? -1 : 0;
}

/* The rest it reads once it joins something. 0, or -1. */
static int
turn_read_more(grouping_object *grouping, PyObject *connection, turn_state *turn)
{
    turn->pending = read_member(connection, GNAME(grouping, PENDING), NULL, NULL);
    turn->loaded = turn->pending == NULL ? NULL
                                         : read_member(connection, GNAME(grouping, LOADED_FORMS),
                                                       is_set, "a set");
    turn->future_type = turn->loaded == NULL
                            ? NULL
                            : read_member(connection, GNAME(grouping, FUTURE_TYPE), NULL, NULL);
    turn->loop = turn->future_type == NULL
                     ? NULL
                     : read_member(connection, GNAME(grouping, LOOP_ATTRIBUTE), NULL, NULL);
    return turn->loop == NULL ? -1 : 0;
}

/* grouping._join(connection, _SINGLE_SERVER). 0, or -1 with an error set. */
static int
join(grouping_object *grouping, PyObject *connection)
{
    turn_state turn = {0};
    PyObject *records = NULL;
    command_info *infos = NULL;
    Py_ssize_t *stops = NULL;
    int result = -1;
    if (turn_read(grouping, connection, &turn) < 0) {
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(turn.buffer) - turn.first;
    records = turn_records(&turn);
    if (records == NULL) {
        goto done;
    }
    if (PyList_GET_SIZE(records) < 2) {
        result = 0;
        goto done;
    }
    int loaded = loaded_this_turn(&turn);
    if (loaded != 0 || count <= 0) {
        result = loaded < 0 ? -1 : 0;
        goto done;
    }
    infos = PyMem_Calloc((size_t)count, sizeof(command_info));
    stops = PyMem_Calloc((size_t)count, sizeof(Py_ssize_t));
    if (infos == NULL || stops == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (collect_turn(&turn, records, infos, count) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (run_key(grouping, &infos[i], i > 0 ? &infos[i - 1] : NULL) < 0) {
            goto done;
        }
    }
    Py_ssize_t runs;
    if (find_runs(grouping, &turn, infos, count, stops, &runs) < 0) {
        goto done;
    }
    if (runs == count) {
        result = 0; /* nothing to join */
        goto done;
    }
    if (turn_read_more(grouping, connection, &turn) < 0) {
        goto done;
    }
    result = rebuild(grouping, &turn, infos, count, PyList_GET_SIZE(records), stops, runs);
done:
    PyMem_Free(infos);
    PyMem_Free(stops);
    Py_XDECREF(records);
    turn_release(&turn);
    return result;
}

static PyObject *
grouping_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *connection;
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) ||
        !PyArg_ParseTuple(args, "O:Grouping", &connection)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Grouping(connection) takes no keywords");
        }
        return NULL;
    }
    if (join((grouping_object *)self, connection) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
grouping_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"forms", "parts", "max_policies", "max_bytes", "retrieve",
                               "copy", "connection_error", "reply_error", NULL};
    PyObject *forms, *parts, *retrieve, *copy, *connection_error, *reply_error;
    Py_ssize_t max_policies, max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!nnOOOO:Grouping", keywords,
                                     &PyDict_Type, &forms, &PyDict_Type, &parts, &max_policies,
                                     &max_bytes, &retrieve, &copy, &connection_error,
                                     &reply_error)) {
        return NULL;
    }
    accel_state *state = accel_state_of_type(type);
    if (state == NULL) {
        return NULL;
    }
    grouping_object *grouping = PyObject_GC_New(grouping_object, type);
    if (grouping == NULL) {
        return NULL;
    }
    Py_INCREF(type);
    grouping->forms = Py_NewRef(forms);
    grouping->parts = Py_NewRef(parts);
    grouping->retrieve = Py_NewRef(retrieve);
    grouping->copy = Py_NewRef(copy);
    grouping->connection_error = Py_NewRef(connection_error);
    grouping->reply_error = Py_NewRef(reply_error);
    grouping->max_policies = max_policies;
    grouping->max_bytes = max_bytes;
    grouping->state = state;
    PyObject_GC_Track(grouping);
    return (PyObject *)grouping;
}

PyDoc_STRVAR(grouping_doc,
"Grouping(forms, parts, max_policies, max_bytes, retrieve, copy, connection_error,\n"
"reply_error): grouping.group_checks' steps in C for one server's connections;\n"
"called with a connection, it joins that connection's turn.");

ACCEL_GC_TYPE(grouping, "moderato._accel.Grouping", grouping_object, grouping_doc,
              ACCEL_TPFLAGS_IMMUTABLE, {Py_tp_new, grouping_new}, {Py_tp_call, grouping_call});

int
grouping_add_to_module(PyObject *module)
{
    accel_state *state = PyModule_GetState(module);
    if (accel_add_type(module, &grouping_spec, "Grouping", NULL) < 0) {
        return -1;
    }
    return accel_add_type(module, &reply_spec, "BatchedReply", &state->batched_reply_type);
}
