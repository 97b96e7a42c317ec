/* The headers middleware's send wrapper in C.
 *
 * RateLimitHeadersMiddleware and RateLimitMiddleware wrap the application's
 * `send` on every HTTP request, to add the request's decision headers to its
 * response start. In Python that wrapper was a slotted object made per
 * request and called for every message, and its headers the legacy style's
 * one-decision shortcut (web/headers.py's legacy_for_one): on the commonest
 * response, three calls and some two hundred bytecodes.
 *
 * HeaderSenders(headers_done=, decisions=, fallback=) holds what the
 * middlewares' module gives once: the scope's two keys (whether the headers
 * were claimed, the request's decisions) and fallback(decisions, style),
 * the Python headers of the decisions (middleware.py's _decision_headers).
 * Called as senders(scope, send, style), it makes a HeaderSender, whose
 * call with a message does what the Python wrapper did
 * (tests/http/header_sender_reference.py, the reference its tests hold it
 * to):
 *
 *   on "http.response.start": started = True; unless the scope's headers
 *   were claimed, claim them and, when the scope holds decisions, add their
 *   headers the response does not set itself (the names compared
 *   lower-cased, the application's own values win) to a copy of the
 *   message; then send(message), returned as it is (the application awaits
 *   it).
 *
 * The headers of one admitted decision in the legacy style are built here,
 * as legacy_for_one builds them, when the decision is a CheckResult whose
 * fields C can read as legacy_for_one would (its ints and reset instant
 * plain ints and floats); any other case is fallback()'s.
 */
#include "fast_route.h"

#include <math.h>
#include <structmember.h>

#include "heap_type.h"

#define ROUTE_NAME_ENUM(name, text, is_bytes) RNAME_ROUTE_##name,
enum { ROUTE_NAMES(ROUTE_NAME_ENUM) ROUTE_NAME_END };
#undef ROUTE_NAME_ENUM

#define ROUTE_NAME(state, name) ((state)->route_names[RNAME_ROUTE_##name])

/* ---- HeaderSenders: what every sender reads --------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *headers_done; /* the scope's key: the headers were claimed */
    PyObject *decisions;    /* the scope's key: the request's decisions (a list) */
    PyObject *fallback;     /* fallback(decisions, style) -> the headers to add */
    vectorcallfunc vectorcall;
} senders_object;

#define SENDERS_MEMBERS(X) X(headers_done) X(decisions) X(fallback)
ACCEL_GC_FUNCTIONS(senders, senders_object, SENDERS_MEMBERS)

/* ---- HeaderSender: one request's send ----------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *senders; /* the HeaderSenders that made it */
    PyObject *scope;
    PyObject *send;
    PyObject *style;
    char started; /* the response start went through it */
    vectorcallfunc vectorcall;
} sender_object;

#define SENDER_MEMBERS(X) X(senders) X(scope) X(send) X(style)
ACCEL_GC_FUNCTIONS(sender, sender_object, SENDER_MEMBERS)

/* mapping.get(key, default): a new reference, or NULL with an exception set.
 * A dict's own lookup; any other mapping's get method. */
static PyObject *
mapping_get(accel_state *state, PyObject *mapping, PyObject *key, PyObject *default_value)
{
    if (PyDict_CheckExact(mapping)) {
        PyObject *value = PyDict_GetItemWithError(mapping, key);
        if (value == NULL) {
            return PyErr_Occurred() ? NULL : Py_NewRef(default_value);
        }
        return Py_NewRef(value);
    }
    /* mapping.get(key) when the default is None, as the Python wrapper calls it. */
    PyObject *args[3] = {mapping, key, default_value};
    size_t count = default_value == Py_None ? 2 : 3;
    return PyObject_VectorcallMethod(ROUTE_NAME(state, GET), args,
                                     count | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* b"%d" % number, written from the right (snprintf costs several times as
 * much as the rest of a header). */
static PyObject *
integer_bytes(long long number)
{
    char text[24];
    char *start = text + sizeof(text);
    /* The magnitude as unsigned: -LLONG_MIN does not fit a long long. */
    unsigned long long magnitude = number < 0 ? 0ULL - (unsigned long long)number
                                              : (unsigned long long)number;
    do {
        *--start = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    if (number < 0) {
        *--start = '-';
    }
    return PyBytes_FromStringAndSize(start, text + sizeof(text) - start);
}

/* b"%d" % value for a plain int that fits in a long long: a new reference;
 * NULL with no exception when C cannot tell (the fallback's), or with one. */
static PyObject *
decimal_bytes(PyObject *value)
{
    if (!PyLong_CheckExact(value)) {
        return NULL;
    }
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return NULL;
    }
    return integer_bytes(number);
}

/* b"%d" % math.ceil(reset_at), for a plain float or int. */
static PyObject *
ceiling_bytes(PyObject *reset_at)
{
    if (!PyFloat_CheckExact(reset_at)) {
        return decimal_bytes(reset_at);
    }
    double ceiling = ceil(PyFloat_AS_DOUBLE(reset_at));
    /* Finite and well inside a long long: an exact integer. */
    if (!(ceiling > -9.0e15 && ceiling < 9.0e15)) {
        return NULL;
    }
    return integer_bytes((long long)ceiling);
}

/* A (name, value) pair, value a new reference consumed; NULL if it is. */
static PyObject *
header_pair(PyObject *name, PyObject *value)
{
    if (value == NULL) {
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, name, value);
    Py_DECREF(value);
    return pair;
}

/* web/headers.py's legacy_for_one(result) for a CheckResult: the list of
 * headers (a new reference), Py_None (a new reference: legacy_for_one's
 * None), or NULL: with no exception when C cannot tell, else with it. */
static PyObject *
legacy_for_one(accel_state *state, PyObject *result)
{
    if (Py_TYPE(result) != state->check_result_type) {
        return NULL;
    }
    PyObject *remaining = results_field(result, 2);
    int allowed = PyObject_IsTrue(results_field(result, 0));
    int bypassed = allowed <= 0 ? 0 : PyObject_IsTrue(results_field(result, 9));
    if (allowed < 0 || bypassed < 0) {
        return NULL;
    }
    if (!allowed || bypassed || remaining == Py_None) {
        return Py_NewRef(Py_None);
    }
    PyObject *limit = results_field(result, 1), *reset_at = results_field(result, 4);
    PyObject *policies = results_field(result, 8);
    if (!PyTuple_CheckExact(policies)) {
        return NULL;
    }
    /* The first policy with the fewest left, as report() picks. */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(policies); i++) {
        PyObject *policy = PyTuple_GET_ITEM(policies, i);
        if (Py_TYPE(policy) != state->policy_state_type) {
            return NULL;
        }
        PyObject *policy_remaining = results_field(policy, 2);
        if (policy_remaining == Py_None) {
            return Py_NewRef(Py_None);
        }
        int fewer = policy == PyTuple_GET_ITEM(policies, 0)
                        ? 1
                        : PyObject_RichCompareBool(policy_remaining, remaining, Py_LT);
        if (fewer < 0) {
            return NULL;
        }
        if (fewer) {
            limit = results_field(policy, 0);
            remaining = policy_remaining;
            reset_at = results_field(policy, 4);
        }
    }
    PyObject *headers = PyList_New(reset_at == Py_None ? 2 : 3);
    if (headers == NULL) {
        return NULL;
    }
    PyObject *pairs[3] = {header_pair(ROUTE_NAME(state, X_LIMIT), decimal_bytes(limit)),
                          header_pair(ROUTE_NAME(state, X_REMAINING), decimal_bytes(remaining)),
                          NULL};
    if (reset_at != Py_None) {
        pairs[2] = header_pair(ROUTE_NAME(state, X_RESET), ceiling_bytes(reset_at));
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        if (pairs[i] == NULL) {
            for (Py_ssize_t j = 0; j < 3; j++) {
                Py_XDECREF(pairs[j]);
            }
            Py_DECREF(headers); /* its items are still NULL */
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyList_SET_ITEM(headers, i, pairs[i]);
    }
    return headers;
}

/* The headers the decisions add (a new reference), or NULL with an exception
 * set: one admitted legacy decision's here, anything else fallback()'s. */
static PyObject *
decision_headers(accel_state *state, sender_object *sender, PyObject *decisions)
{
    int legacy = PyObject_RichCompareBool(sender->style, ROUTE_NAME(state, LEGACY), Py_EQ);
    if (legacy < 0) {
        return NULL;
    }
    if (legacy) {
        Py_ssize_t count = PyObject_Length(decisions);
        if (count < 0) {
            return NULL;
        }
        if (count == 1) {
            PyObject *first = PySequence_GetItem(decisions, 0);
            if (first == NULL) {
                return NULL;
            }
            PyObject *headers = legacy_for_one(state, first);
            Py_DECREF(first);
            if (headers != NULL && headers != Py_None) {
                return headers;
            }
            Py_XDECREF(headers);
            if (PyErr_Occurred()) {
                return NULL;
            }
        }
    }
    PyObject *args[2] = {decisions, sender->style};
    return PyObject_Vectorcall(((senders_object *)sender->senders)->fallback, args, 2, NULL);
}

/* `name, _ = item`, as a for loop unpacks it: name borrowed from *held (a new
 * reference to release), or NULL with the unpacking's error set. */
static PyObject *
first_of_two(PyObject *item, PyObject **held)
{
    *held = NULL;
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
        return PyTuple_GET_ITEM(item, 0);
    }
    PyObject *items = PySequence_Fast(item, "");
    if (items == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "cannot unpack non-iterable %.200s object",
                     Py_TYPE(item)->tp_name);
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(items);
    if (size != 2) {
        if (size < 2) {
            PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %zd)",
                         size);
        }
        else {
            PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        }
        Py_DECREF(items);
        return NULL;
    }
    *held = items;
    return PySequence_Fast_GET_ITEM(items, 0);
}

/* name.lower(): the name itself when it is bytes with no ASCII capital
 * (lower() would make an equal copy, and hashing the copy costs as much
 * again), else what lower() returns. A new reference, or NULL. */
static PyObject *
lowered_name(accel_state *state, PyObject *name)
{
    if (PyBytes_CheckExact(name)) {
        const char *text = PyBytes_AS_STRING(name);
        Py_ssize_t size = PyBytes_GET_SIZE(name), i = 0;
        while (i < size && !(text[i] >= 'A' && text[i] <= 'Z')) {
            i++;
        }
        if (i == size) {
            return Py_NewRef(name);
        }
    }
    return PyObject_CallMethodNoArgs(name, ROUTE_NAME(state, LOWER));
}

/* The response's own header names, lower-cased: compared byte for byte
 * while they are a few bytes objects (a set costs more than the compares),
 * else in a set as the Python wrapper kept them. */
#define FEW_NAMES 16
typedef struct {
    PyObject *few[FEW_NAMES]; /* new references, while set is NULL */
    Py_ssize_t count;
    PyObject *set;
} header_names;

static void
names_release(header_names *names)
{
    for (Py_ssize_t i = 0; i < names->count; i++) {
        Py_DECREF(names->few[i]);
    }
    names->count = 0;
    Py_CLEAR(names->set);
}

/* From here on, a set: 0, or -1 with an exception set. */
static int
names_to_set(header_names *names)
{
    names->set = PySet_New(NULL);
    if (names->set == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < names->count; i++) {
        if (PySet_Add(names->set, names->few[i]) < 0) {
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < names->count; i++) {
        Py_DECREF(names->few[i]);
    }
    names->count = 0;
    return 0;
}

/* Add a name (a new reference, consumed): 0, or -1 with an exception set. */
static int
names_add(header_names *names, PyObject *name)
{
    if (names->set == NULL && PyBytes_CheckExact(name) && names->count < FEW_NAMES) {
        names->few[names->count++] = name;
        return 0;
    }
    int added = names->set != NULL || names_to_set(names) == 0 ? PySet_Add(names->set, name) : -1;
    Py_DECREF(name);
    return added;
}

/* `name in names`: 1, 0, or -1 with an exception set. */
static int
names_contain(header_names *names, PyObject *name)
{
    if (names->set == NULL && PyBytes_CheckExact(name)) {
        Py_ssize_t size = PyBytes_GET_SIZE(name);
        for (Py_ssize_t i = 0; i < names->count; i++) {
            PyObject *known = names->few[i];
            if (known == name || (PyBytes_GET_SIZE(known) == size &&
                                  memcmp(PyBytes_AS_STRING(known), PyBytes_AS_STRING(name),
                                         (size_t)size) == 0)) {
                return 1;
            }
        }
        return 0;
    }
    if (names->set == NULL && names_to_set(names) < 0) {
        return -1;
    }
    return PySet_Contains(names->set, name);
}

/* The message with the headers added that it does not set itself: a new
 * reference, or NULL with an exception set. */
static PyObject *
with_headers(accel_state *state, PyObject *message, PyObject *extra)
{
    PyObject *given = mapping_get(state, message, ROUTE_NAME(state, HEADERS), state->empty_tuple);
    PyObject *headers = given == NULL ? NULL : PySequence_List(given);
    Py_XDECREF(given);
    header_names present = {{NULL}, 0, NULL};
    PyObject *merged = NULL, *iterator = NULL, *pair = NULL;
    if (headers == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(headers, i)), *held;
        PyObject *name = first_of_two(item, &held);
        PyObject *lowered = name == NULL ? NULL : lowered_name(state, name);
        Py_XDECREF(held);
        Py_DECREF(item);
        if (lowered == NULL || names_add(&present, lowered) < 0) {
            goto done;
        }
    }
    /* The application's own values win (its handler's Retry-After). */
    iterator = PyObject_GetIter(extra);
    if (iterator == NULL) {
        goto done;
    }
    while ((pair = PyIter_Next(iterator)) != NULL) {
        PyObject *name = PySequence_GetItem(pair, 0);
        int seen = name == NULL ? -1 : names_contain(&present, name);
        Py_XDECREF(name);
        if (seen < 0 || (!seen && PyList_Append(headers, pair) < 0)) {
            goto done;
        }
        Py_CLEAR(pair);
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    /* {**message, "headers": headers} */
    merged = PyDict_New();
    if (merged != NULL &&
        (PyDict_Update(merged, message) < 0 ||
         PyDict_SetItem(merged, ROUTE_NAME(state, HEADERS), headers) < 0)) {
        Py_CLEAR(merged);
    }
done:
    Py_XDECREF(pair);
    Py_XDECREF(iterator);
    names_release(&present);
    Py_XDECREF(headers);
    return merged;
}

/* The response start's message, its headers added when this request's
 * decisions are to be reported: a new reference, or NULL with an exception
 * set. */
static PyObject *
started_message(accel_state *state, sender_object *sender, PyObject *message)
{
    senders_object *senders = (senders_object *)sender->senders;
    PyObject *scope = sender->scope;
    PyObject *done = mapping_get(state, scope, senders->headers_done, Py_None);
    int claimed = done == NULL ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (claimed != 0) {
        return claimed < 0 ? NULL : Py_NewRef(message);
    }
    if (PyObject_SetItem(scope, senders->headers_done, Py_True) < 0) {
        return NULL;
    }
    PyObject *decisions = mapping_get(state, scope, senders->decisions, Py_None);
    int any = decisions == NULL ? -1 : PyObject_IsTrue(decisions);
    PyObject *extra = any <= 0 ? NULL : decision_headers(state, sender, decisions);
    Py_XDECREF(decisions);
    if (any <= 0) {
        return any < 0 ? NULL : Py_NewRef(message);
    }
    int adds = extra == NULL ? -1 : PyObject_IsTrue(extra);
    PyObject *sent = adds <= 0 ? (adds < 0 ? NULL : Py_NewRef(message))
                               : with_headers(state, message, extra);
    Py_XDECREF(extra);
    return sent;
}

static PyObject *
sender_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    sender_object *sender = (sender_object *)callable;
    accel_state *state =
        accel_positional_call(callable, nargsf, kwnames, 1, "HeaderSender takes one message");
    if (state == NULL) {
        return NULL;
    }
    PyObject *message = args[0];
    PyObject *kind;
    if (PyDict_CheckExact(message)) { /* message["type"], as a dict answers it */
        kind = PyDict_GetItemWithError(message, ROUTE_NAME(state, TYPE));
        if (kind == NULL && !PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, ROUTE_NAME(state, TYPE));
        }
        Py_XINCREF(kind);
    }
    else {
        kind = PyObject_GetItem(message, ROUTE_NAME(state, TYPE));
    }
    int starts = kind == NULL ? -1 : PyObject_RichCompareBool(kind, ROUTE_NAME(state, START), Py_EQ);
    Py_XDECREF(kind);
    if (starts < 0) {
        return NULL;
    }
    if (!starts) {
        return PyObject_Vectorcall(sender->send, args, 1, NULL);
    }
    sender->started = 1;
    PyObject *sent = started_message(state, sender, message);
    if (sent == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(sender->send, &sent, 1, NULL);
    Py_DECREF(sent);
    return result;
}

static PyMemberDef sender_members[] = {
    {"started", T_BOOL, offsetof(sender_object, started), READONLY,
     "Whether the response start went through this sender."},
    ACCEL_VECTORCALL_OFFSET(sender_object),
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(sender_doc,
"One request's send, the decision headers added to its response start\n"
"(made by a HeaderSenders).");

ACCEL_GC_TYPE(sender, "moderato._accel.HeaderSender", sender_object, sender_doc,
              Py_TPFLAGS_HAVE_VECTORCALL | ACCEL_TPFLAGS_IMMUTABLE, {Py_tp_new, accel_refuse_new},
              {Py_tp_call, PyVectorcall_Call}, {Py_tp_members, sender_members});

/* senders(scope, send, style): a new HeaderSender. */
static PyObject *
senders_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    accel_state *state = accel_positional_call(callable, nargsf, kwnames, 3,
                                               "HeaderSenders takes scope, send and style");
    if (state == NULL) {
        return NULL;
    }
    sender_object *sender = PyObject_GC_New(sender_object, state->header_sender_type);
    if (sender == NULL) {
        return NULL;
    }
    sender->senders = Py_NewRef(callable);
    sender->scope = Py_NewRef(args[0]);
    sender->send = Py_NewRef(args[1]);
    sender->style = Py_NewRef(args[2]);
    sender->started = 0;
    sender->vectorcall = sender_vectorcall;
    PyObject_GC_Track(sender);
    return (PyObject *)sender;
}

static PyObject *
senders_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"headers_done", "decisions", "fallback", NULL};
    PyObject *headers_done, *decisions, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOO:HeaderSenders", keywords, &headers_done,
                                     &decisions, &fallback)) {
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "HeaderSenders() fallback must be callable");
        return NULL;
    }
    senders_object *senders = (senders_object *)type->tp_alloc(type, 0);
    if (senders == NULL) {
        return NULL;
    }
    senders->headers_done = Py_NewRef(headers_done);
    senders->decisions = Py_NewRef(decisions);
    senders->fallback = Py_NewRef(fallback);
    senders->vectorcall = senders_vectorcall;
    return (PyObject *)senders;
}

PyDoc_STRVAR(senders_doc,
"HeaderSenders(*, headers_done, decisions, fallback)\n"
"--\n"
"\n"
"Makes the headers middleware's send wrappers: senders(scope, send, style)\n"
"is one request's HeaderSender. headers_done and decisions are the scope's\n"
"keys; fallback(decisions, style) gives the headers C does not build.");

ACCEL_VECTORCALL_TYPE(senders, "moderato._accel.HeaderSenders", senders_object, senders_doc, 0,
                      {Py_tp_new, senders_new});

/* ---- RouteArguments: a one-limit route's check arguments ---------------------------- */

/* stack.alone_arguments(rule, scope) in one C call: what the route's first
 * request worked out (request_limits.RouteFacts, kept in the outermost
 * router's index, scope.INDEXES), then the rule's rate, cost, tenant and
 * key, the peer's canonical address for the default identity with no proxy
 * trusted and no API-key header. None whenever the Python function answers
 * None; it raises what that function raises (learn_route's errors). The
 * Python function is the reference (tests/route_arguments_reference.py). */

typedef struct {
    PyObject_HEAD
    PyObject *decided;          /* stack.DECIDED */
    PyObject *indexes;          /* scope.INDEXES: {id(router): (weakref, index)} */
    PyObject *learn_route;      /* request_limits.learn_route(scope) */
    PyObject *unknown;          /* a route not met yet */
    PyObject *default_identity; /* identity.DEFAULT_IDENTITY */
    PyObject *client_identity;  /* the ClientIdentity type */
    PyObject *parsed_peer;      /* web/addresses.parsed_peer(text) */
    PyObject *unknown_client;   /* UNKNOWN_CLIENT */
    vectorcallfunc vectorcall;
} route_arguments_object;

#define ROUTE_ARGUMENTS_MEMBERS(X)                                                       \
    X(decided) X(indexes) X(learn_route) X(unknown) X(default_identity)                  \
    X(client_identity) X(parsed_peer) X(unknown_client)
ACCEL_GC_FUNCTIONS(route_arguments, route_arguments_object, ROUTE_ARGUMENTS_MEMBERS)

/* The route's facts as its index keeps them (entry: the router's (weakref,
 * index)): a new reference, the unknown marker when the router is gone or
 * the root path no str, or NULL. */
static PyObject *
indexed_facts(accel_state *state, route_arguments_object *self, PyObject *scope,
              PyObject *router, PyObject *root_path, PyObject *entry)
{
    PyObject *reference = PySequence_GetItem(entry, 0);
    PyObject *referent = reference == NULL ? NULL : PyObject_CallNoArgs(reference);
    Py_XDECREF(reference);
    if (referent == NULL) {
        return NULL;
    }
    int same = referent == router && PyUnicode_CheckExact(root_path);
    Py_DECREF(referent);
    if (!same) {
        return Py_NewRef(self->unknown);
    }
    PyObject *index = PySequence_GetItem(entry, 1);
    PyObject *routes = index == NULL ? NULL : PyObject_GetAttr(index, ROUTE_NAME(state, ROUTES));
    Py_XDECREF(index);
    PyObject *endpoint =
        routes == NULL ? NULL : mapping_get(state, scope, ROUTE_NAME(state, ENDPOINT), Py_None);
    PyObject *method =
        endpoint == NULL ? NULL : mapping_get(state, scope, ROUTE_NAME(state, METHOD), Py_None);
    PyObject *route_key = method == NULL ? NULL : PyTuple_Pack(3, endpoint, method, root_path);
    PyObject *found = route_key == NULL ? NULL : mapping_get(state, routes, route_key, self->unknown);
    Py_XDECREF(route_key);
    Py_XDECREF(method);
    Py_XDECREF(endpoint);
    Py_XDECREF(routes);
    return found;
}

/* The facts the route's first request worked out (a new reference: a
 * RouteFacts or None), learnt now if it is the first; or NULL. */
static PyObject *
route_facts(accel_state *state, route_arguments_object *self, PyObject *scope)
{
    PyObject *router = mapping_get(state, scope, ROUTE_NAME(state, ROUTER), Py_None);
    if (router == NULL) {
        return NULL;
    }
    PyObject *root_path = mapping_get(state, scope, ROUTE_NAME(state, APP_ROOT_PATH), Py_None);
    if (root_path == Py_None) {
        Py_DECREF(root_path);
        root_path = mapping_get(state, scope, ROUTE_NAME(state, ROOT_PATH), ROUTE_NAME(state, EMPTY));
    }
    PyObject *identity = root_path == NULL ? NULL : PyLong_FromVoidPtr(router);
    PyObject *entry = identity == NULL ? NULL : mapping_get(state, self->indexes, identity, Py_None);
    PyObject *known = NULL;
    if (entry != NULL) {
        known = entry == Py_None ? Py_NewRef(self->unknown)
                                 : indexed_facts(state, self, scope, router, root_path, entry);
    }
    Py_XDECREF(entry);
    Py_XDECREF(identity);
    Py_XDECREF(root_path);
    Py_DECREF(router);
    if (known == self->unknown) {
        Py_DECREF(known);
        known = PyObject_CallOneArg(self->learn_route, scope);
    }
    return known;
}

/* owner.<name> if it is not None, else fallback.<name>: a new reference. */
static PyObject *
own_or_default(PyObject *owner, PyObject *fallback, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == Py_None) {
        Py_DECREF(value);
        value = PyObject_GetAttr(fallback, name);
    }
    return value;
}

/* 1 when the exception set is an Exception (cleared: the caller answers
 * None), else 0 (left set: raised). */
static int
cleared_exception(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* The peer's canonical address (ClientIdentity.client_ip with no proxy
 * trusted): a new reference; Py_None (a new reference) when reading it
 * raised an Exception (the Python path's callback error); or NULL. */
static PyObject *
peer_key(accel_state *state, route_arguments_object *self, PyObject *scope)
{
    PyObject *client = mapping_get(state, scope, ROUTE_NAME(state, CLIENT), Py_None);
    int any = client == NULL ? -1 : PyObject_IsTrue(client);
    PyObject *peer_text = NULL, *key = NULL;
    if (any > 0) {
        PyObject *zero = PyLong_FromLong(0);
        PyObject *host = zero == NULL ? NULL : PyObject_GetItem(client, zero);
        Py_XDECREF(zero);
        peer_text = host == NULL ? NULL : PyObject_Str(host);
        Py_XDECREF(host);
    }
    else if (any == 0) {
        peer_text = Py_NewRef(ROUTE_NAME(state, EMPTY));
    }
    Py_XDECREF(client);
    int has_text = peer_text == NULL ? -1 : PyObject_IsTrue(peer_text);
    if (has_text > 0) {
        PyObject *parsed = PyObject_CallOneArg(self->parsed_peer, peer_text);
        key = parsed == NULL ? NULL : PySequence_GetItem(parsed, 1);
        Py_XDECREF(parsed);
    }
    else if (has_text == 0) {
        key = Py_NewRef(self->unknown_client);
    }
    Py_XDECREF(peer_text);
    if (key == NULL && cleared_exception()) {
        return Py_NewRef(Py_None);
    }
    return key;
}

/* The rule's key for the request (a new reference), Py_None (a new reference)
 * when C cannot tell it without a callback, or NULL. */
static PyObject *
rule_key(accel_state *state, route_arguments_object *self, PyObject *scope, PyObject *key_spec)
{
    if (key_spec == Py_None) {
        key_spec = self->default_identity;
    }
    if (PyUnicode_Check(key_spec) || PyBytes_Check(key_spec)) {
        return Py_NewRef(key_spec);
    }
    if ((PyObject *)Py_TYPE(key_spec) != self->client_identity) {
        return Py_NewRef(Py_None);
    }
    PyObject *header = PyObject_GetAttr(key_spec, ROUTE_NAME(state, API_KEY_HEADER));
    if (header == NULL) {
        return NULL;
    }
    int no_header = header == Py_None;
    Py_DECREF(header);
    if (!no_header) {
        return Py_NewRef(Py_None);
    }
    PyObject *rules = PyObject_GetAttr(key_spec, ROUTE_NAME(state, RULES));
    PyObject *proxies = rules == NULL ? NULL : PyObject_GetAttr(rules, ROUTE_NAME(state, TRUSTED_PROXIES));
    Py_XDECREF(rules);
    int trusting = proxies == NULL ? -1 : PyObject_IsTrue(proxies);
    Py_XDECREF(proxies);
    if (trusting != 0) {
        return trusting < 0 ? NULL : Py_NewRef(Py_None);
    }
    return peer_key(state, self, scope);
}

/* The check's arguments from the rule and the route's facts: a new
 * reference (a tuple, or None), or NULL. */
static PyObject *
rule_arguments(accel_state *state, route_arguments_object *self, PyObject *rule, PyObject *scope,
               PyObject *route_scope)
{
    PyObject *limiter = PyObject_GetAttr(rule, ROUTE_NAME(state, LIMITER));
    PyObject *rate = limiter == NULL ? NULL : PyObject_GetAttr(rule, ROUTE_NAME(state, RATE));
    PyObject *key_spec = rate == NULL ? NULL : own_or_default(rule, limiter, ROUTE_NAME(state, KEY));
    PyObject *tenant = key_spec == NULL ? NULL : own_or_default(rule, limiter, ROUTE_NAME(state, TENANT));
    PyObject *cost = tenant == NULL ? NULL : own_or_default(rule, limiter, ROUTE_NAME(state, COST));
    PyObject *key = NULL, *bucket_scope = NULL, *arguments = NULL;
    if (cost == NULL) {
        goto done;
    }
    if (cost == Py_None) {
        Py_SETREF(cost, PyLong_FromLong(1));
        if (cost == NULL) {
            goto done;
        }
    }
    if (!PyUnicode_CheckExact(rate) || !PyLong_CheckExact(cost) ||
        (tenant != Py_None && !PyUnicode_CheckExact(tenant))) {
        arguments = Py_NewRef(Py_None);
        goto done;
    }
    key = rule_key(state, self, scope, key_spec);
    if (key == NULL || key == Py_None) {
        arguments = key; /* NULL, or None: C cannot tell */
        key = NULL;
        goto done;
    }
    bucket_scope = PyObject_GetAttr(rule, ROUTE_NAME(state, SCOPE));
    int named = bucket_scope == NULL ? -1 : PyObject_IsTrue(bucket_scope);
    if (named >= 0) {
        arguments = PyTuple_Pack(5, key, rate, cost, tenant, named ? bucket_scope : route_scope);
    }
done:
    Py_XDECREF(bucket_scope);
    Py_XDECREF(key);
    Py_XDECREF(cost);
    Py_XDECREF(tenant);
    Py_XDECREF(key_spec);
    Py_XDECREF(rate);
    Py_XDECREF(limiter);
    return arguments;
}

/* route_arguments(rule, scope): stack.alone_arguments(rule, scope). */
static PyObject *
route_arguments_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames)
{
    route_arguments_object *self = (route_arguments_object *)callable;
    accel_state *state =
        accel_positional_call(callable, nargsf, kwnames, 2, "RouteArguments takes rule and scope");
    if (state == NULL) {
        return NULL;
    }
    PyObject *rule = args[0], *scope = args[1];
    PyObject *exempt_when = PyObject_GetAttr(rule, ROUTE_NAME(state, EXEMPT_WHEN));
    if (exempt_when == NULL) {
        return NULL;
    }
    int exempting = exempt_when != Py_None;
    Py_DECREF(exempt_when);
    int decided = exempting ? 1 : PySequence_Contains(scope, self->decided);
    if (decided != 0) {
        return decided < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *facts = route_facts(state, self, scope);
    if (facts == NULL || facts == Py_None) {
        return facts;
    }
    /* alone, provider, route_scope = facts: a RouteFacts, a tuple's items
     * (PySequence_Fast would copy a tuple subclass's into a list) */
    PyObject *items = facts;
    if (!PyTuple_Check(facts) || Py_TYPE(facts)->tp_iter != PyTuple_Type.tp_iter) {
        items = PySequence_Fast(facts, "cannot unpack the route's facts");
        Py_DECREF(facts);
        if (items == NULL) {
            return NULL;
        }
    }
    if (PySequence_Fast_GET_SIZE(items) != 3) {
        PyErr_Format(PyExc_ValueError, "the route's facts have %zd items, not 3",
                     PySequence_Fast_GET_SIZE(items));
        Py_DECREF(items);
        return NULL;
    }
    PyObject *alone = PySequence_Fast_GET_ITEM(items, 0);
    PyObject *provider = PySequence_Fast_GET_ITEM(items, 1);
    PyObject *arguments = NULL;
    int overridden = 0;
    if (alone == rule && provider != Py_None) {
        PyObject *overrides = PyObject_GetAttr(provider, ROUTE_NAME(state, DEPENDENCY_OVERRIDES));
        if (overrides == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            overrides = Py_NewRef(Py_None);
        }
        overridden = overrides == NULL ? -1 : PyObject_IsTrue(overrides);
        Py_XDECREF(overrides);
    }
    if (overridden >= 0) {
        arguments = alone != rule || overridden
                        ? Py_NewRef(Py_None)
                        : rule_arguments(state, self, rule, scope, PySequence_Fast_GET_ITEM(items, 2));
    }
    Py_DECREF(items);
    return arguments;
}

static PyObject *
route_arguments_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"decided",         "indexes",     "learn_route",
                               "unknown",         "default_identity", "client_identity",
                               "parsed_peer",     "unknown_client", NULL};
    PyObject *values[8];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOOO:RouteArguments", keywords,
                                     &values[0], &values[1], &values[2], &values[3],
                                     &values[4], &values[5], &values[6], &values[7])) {
        return NULL;
    }
    route_arguments_object *self = (route_arguments_object *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    PyObject **value = values;
#define TAKE_ARGUMENT(member) self->member = Py_NewRef(*value++);
    ROUTE_ARGUMENTS_MEMBERS(TAKE_ARGUMENT)
#undef TAKE_ARGUMENT
    self->vectorcall = route_arguments_vectorcall;
    return (PyObject *)self;
}

PyDoc_STRVAR(route_arguments_doc,
"RouteArguments(*, decided, indexes, learn_route, unknown, default_identity,\n"
"               client_identity, parsed_peer, unknown_client)\n"
"--\n"
"\n"
"stack.alone_arguments in C: called with (rule, scope), the one-limit\n"
"route's check arguments (key, rate, cost, tenant, scope), or None.");

ACCEL_VECTORCALL_TYPE(route_arguments, "moderato._accel.RouteArguments", route_arguments_object,
                      route_arguments_doc, 0, {Py_tp_new, route_arguments_new});

/* ---- the module's part ---------------------------------------------------------------- */

int
fast_route_add_to_module(PyObject *module)
{
    Py_BUILD_ASSERT(ROUTE_NAME_END == ROUTE_NAME_COUNT);
    accel_state *state = PyModule_GetState(module);
    static const struct {
        const char *text;
        int is_bytes;
    } names[] = {
#define ROUTE_NAME_TEXT(name, text, is_bytes) {text, is_bytes},
        ROUTE_NAMES(ROUTE_NAME_TEXT)
#undef ROUTE_NAME_TEXT
    };
    for (int i = 0; i < ROUTE_NAME_COUNT; i++) {
        state->route_names[i] = names[i].is_bytes ? PyBytes_FromString(names[i].text)
                                                  : PyUnicode_InternFromString(names[i].text);
        if (state->route_names[i] == NULL) {
            return -1;
        }
    }
    state->empty_tuple = PyTuple_New(0);
    if (state->empty_tuple == NULL ||
        accel_add_type(module, &senders_spec, "HeaderSenders", &state->header_senders_type) < 0 ||
        accel_add_type(module, &sender_spec, "HeaderSender", &state->header_sender_type) < 0 ||
        accel_add_type(module, &route_arguments_spec, "RouteArguments",
                       &state->route_arguments_type) < 0) {
        return -1;
    }
    return 0;
}
