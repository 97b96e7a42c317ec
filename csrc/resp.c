/* RESP2 encoding of Redis commands.
 *
 * A command is an array of bulk strings: "*<n>\r\n", then "$<size>\r\n<data>\r\n"
 * per argument. Each argument is first resolved to a (data, size) pair that
 * stays valid until the write: the encoder holds a reference to every
 * argument, a buffer export on bytearrays and memoryviews (so nothing can
 * resize them, even code run by the garbage collector) and the decimal text
 * of big ints. Only then is the exact size known, the bytes object allocated
 * once and the command written in one pass.
 */
#include <string.h>

#include "errors.h"
#include "resp.h"

/* Room for a long long in decimal: 19 digits and a sign. */
#define RESP_INT_DIGITS 20

/* Commands with at most this many arguments need no heap array of bulks. */
#define RESP_STACK_BULKS 16

#define RESP_ACCEPTED "bytes, bytearray, memoryview, str or int"

#define RESP_SHA_DIGITS 40

/* One bulk string to write, and what keeps its bytes alive until then. */
typedef struct {
    const char *data;
    Py_ssize_t size;
    PyObject *owner;    /* a strong reference, or NULL */
    Py_buffer view;     /* exported while view.obj != NULL */
    char digits[RESP_INT_DIGITS];
} resp_bulk;

/* The bulks of one command: on the stack when few, else on the heap. */
typedef struct {
    resp_bulk *bulks;
    Py_ssize_t count;   /* resolved so far: these need releasing */
    resp_bulk stack[RESP_STACK_BULKS];
} resp_command;

/* Where an argument came from, to name it in an error message: positional
 * argument `index` of `function` (counted from 1 in the message), or
 * `sequence[index]`. */
typedef struct {
    const char *function;
    const char *sequence;
    Py_ssize_t index;
} resp_origin;

static int
command_init(resp_command *command, Py_ssize_t capacity)
{
    command->count = 0;
    if (capacity <= RESP_STACK_BULKS) {
        command->bulks = command->stack;
        return 0;
    }
    command->bulks = PyMem_New(resp_bulk, capacity);
    if (command->bulks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
command_release(resp_command *command)
{
    for (Py_ssize_t i = 0; i < command->count; i++) {
        resp_bulk *bulk = &command->bulks[i];
        Py_XDECREF(bulk->owner);
        if (bulk->view.obj != NULL) {
            PyBuffer_Release(&bulk->view);
        }
    }
    if (command->bulks != command->stack) {
        PyMem_Free(command->bulks);
    }
}

/* The next bulk, emptied; its slot counts as resolved from now on. */
static resp_bulk *
command_next(resp_command *command)
{
    resp_bulk *bulk = &command->bulks[command->count++];
    bulk->data = NULL;
    bulk->size = 0;
    bulk->owner = NULL;
    bulk->view.obj = NULL;
    return bulk;
}

static void
add_static(resp_command *command, const char *data, Py_ssize_t size)
{
    resp_bulk *bulk = command_next(command);
    bulk->data = data;
    bulk->size = size;
}

/* Decimal text of value into digits; returns its length. */
static Py_ssize_t
format_long_long(char *digits, long long value)
{
    char reversed[RESP_INT_DIGITS];
    Py_ssize_t length = 0, size = 0;
    /* Negate in unsigned arithmetic: -LLONG_MIN does not fit a long long. */
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value
                                             : (unsigned long long)value;
    do {
        reversed[length++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    if (value < 0) {
        digits[size++] = '-';
    }
    while (length > 0) {
        digits[size++] = reversed[--length];
    }
    return size;
}

static void
add_count(resp_command *command, Py_ssize_t count)
{
    resp_bulk *bulk = command_next(command);
    bulk->size = format_long_long(bulk->digits, (long long)count);
    bulk->data = bulk->digits;
}

static PyObject *
origin_name(const resp_origin *origin)
{
    if (origin->sequence == NULL) {
        return PyUnicode_FromFormat("%s() argument %zd", origin->function, origin->index + 1);
    }
    return PyUnicode_FromFormat("%s() %s[%zd]", origin->function, origin->sequence,
                                origin->index);
}

/* Turn the error being raised about value into a ValueError that names the
 * argument; returns -1. */
static int
argument_value_error(const resp_origin *origin, PyObject *value, const char *problem)
{
    if (origin->sequence == NULL) {
        accel_value_error_from_current(value, "%s() argument %zd %s", origin->function,
                                       origin->index + 1, problem);
    }
    else {
        accel_value_error_from_current(value, "%s() %s[%zd] %s", origin->function,
                                       origin->sequence, origin->index, problem);
    }
    return -1;
}

/* An item's bytes as every encoding here writes them, when they are at hand with no
 * error possible and no Python code run: a bytes' own, an ASCII str's (its UTF-8 is its
 * data), an int's (not a bool) that fits a long long, written in decimal into digits.
 * Returns their size, *data set; -1 for any other item (nothing set, no error), which
 * add_argument resolves by its kind. The one place that knows these kinds: add_argument
 * and evalsha_size's count (plain_items_size) both ask it. */
static Py_ssize_t
plain_item(PyObject *value, char *digits, const char **data)
{
    if (PyBytes_Check(value)) {
        *data = PyBytes_AS_STRING(value);
        return PyBytes_GET_SIZE(value);
    }
    if (PyUnicode_Check(value)) {
        if (!PyUnicode_IS_COMPACT_ASCII(value)) {
            return -1;
        }
        /* What PyUnicode_AsUTF8AndSize returns for a compact ASCII str: its own data. */
        *data = (const char *)PyUnicode_DATA(value);
        return PyUnicode_GET_LENGTH(value);
    }
    if (PyLong_Check(value) && !PyBool_Check(value)) {
        int overflow;
        /* Cannot fail: value is an int, which needs no __index__ call. */
        long long small = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow) {
            assert(!PyErr_Occurred());
            *data = digits;
            return format_long_long(digits, small);
        }
    }
    return -1;
}

/* An item plain_item leaves: a str that is not compact ASCII, an int beyond a long
 * long, a bytearray or memoryview, or a refusal. */
static int
resolve_other(resp_bulk *bulk, PyObject *value, const resp_origin *origin)
{
    if (PyUnicode_Check(value)) {
        bulk->data = PyUnicode_AsUTF8AndSize(value, &bulk->size);
        if (bulk->data == NULL) {
            return argument_value_error(origin, value,
                                        "is a str that cannot be encoded as UTF-8");
        }
        bulk->owner = Py_NewRef(value);
        return 0;
    }
    if (PyLong_Check(value) && !PyBool_Check(value)) {
        /* int's own formatting: a subclass's __str__ or __repr__ is not asked. */
        bulk->owner = PyNumber_ToBase(value, 10);
        if (bulk->owner == NULL) {
            return argument_value_error(origin, value,
                                        "is an int too large to write in decimal");
        }
        bulk->data = PyUnicode_AsUTF8AndSize(bulk->owner, &bulk->size);
        return bulk->data == NULL ? -1 : 0;
    }
    if (PyByteArray_Check(value) || PyMemoryView_Check(value)) {
        if (PyObject_GetBuffer(value, &bulk->view, PyBUF_SIMPLE) < 0) {
            bulk->view.obj = NULL;
            /* A non-contiguous or released memoryview. */
            return argument_value_error(origin, value, "cannot be read as contiguous bytes");
        }
        bulk->data = bulk->view.buf;
        bulk->size = bulk->view.len;
        return 0;
    }
    PyObject *name = origin_name(origin);
    if (name != NULL) {
        PyErr_Format(PyExc_TypeError, "%U must be " RESP_ACCEPTED ", not %.100s", name,
                     Py_TYPE(value)->tp_name);
        Py_DECREF(name);
    }
    return -1;
}

static int
add_argument(resp_command *command, PyObject *value, const resp_origin *origin)
{
    resp_bulk *bulk = command_next(command);
    Py_ssize_t size = plain_item(value, bulk->digits, &bulk->data);
    if (size < 0) {
        return resolve_other(bulk, value, origin);
    }
    bulk->size = size;
    if (bulk->data != bulk->digits) {
        bulk->owner = Py_NewRef(value);
    }
    return 0;
}

static Py_ssize_t
decimal_width(Py_ssize_t value)
{
    Py_ssize_t width = 1;
    while (value >= 10) {
        value /= 10;
        width++;
    }
    return width;
}

static char *
write_header(char *out, char kind, Py_ssize_t value)
{
    *out++ = kind;
    out += format_long_long(out, (long long)value);
    *out++ = '\r';
    *out++ = '\n';
    return out;
}

/* "$<size>\r\n<data>\r\n": a bulk of size bytes, framed. */
#define BULK_FRAMED(size) (1 + decimal_width(size) + 2 + (size) + 2)

/* The size of the RESP array of the resolved bulks; -1 with MemoryError. */
static Py_ssize_t
command_size(const resp_command *command)
{
    /* "*<count>\r\n", then per bulk "$<size>\r\n<data>\r\n" */
    Py_ssize_t total_size = 1 + decimal_width(command->count) + 2;
    for (Py_ssize_t i = 0; i < command->count; i++) {
        Py_ssize_t size = command->bulks[i].size;
        Py_ssize_t framing = 1 + decimal_width(size) + 2 + 2;
        if (size > PY_SSIZE_T_MAX - framing - total_size) {
            PyErr_NoMemory();
            return -1;
        }
        total_size += framing + size;
    }
    return total_size;
}

/* The RESP array of the resolved bulks, sized exactly and written once. */
static PyObject *
command_encode(const resp_command *command)
{
    Py_ssize_t total_size = command_size(command);
    if (total_size < 0) {
        return NULL;
    }
    PyObject *encoded = PyBytes_FromStringAndSize(NULL, total_size);
    if (encoded == NULL) {
        return NULL;
    }
    char *out = write_header(PyBytes_AS_STRING(encoded), '*', command->count);
    for (Py_ssize_t i = 0; i < command->count; i++) {
        const resp_bulk *bulk = &command->bulks[i];
        out = write_header(out, '$', bulk->size);
        if (bulk->size > 0) {
            memcpy(out, bulk->data, (size_t)bulk->size);
            out += bulk->size;
        }
        *out++ = '\r';
        *out++ = '\n';
    }
    assert(out == PyBytes_AS_STRING(encoded) + total_size);
    return encoded;
}

PyObject *
resp_encode_command(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    resp_command command;
    PyObject *encoded = NULL;

    /* Redis answers nothing to an empty array, which would leave a pipelined
     * client waiting for a reply that never comes. */
    if (nargs == 0) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_command() takes at least 1 argument (0 given)");
        return NULL;
    }
    if (command_init(&command, nargs) < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        resp_origin origin = {"encode_command", NULL, i};
        if (add_argument(&command, args[i], &origin) < 0) {
            goto done;
        }
    }
    encoded = command_encode(&command);
done:
    command_release(&command);
    return encoded;
}

/* The sha as (data, size) if it is 40 hex digits, else NULL with an error. */
static const char *
checked_sha(PyObject *sha, Py_ssize_t *size)
{
    const char *data;
    if (PyUnicode_Check(sha)) {
        /* Only ASCII text can be hex digits; this also keeps any text with
         * lone surrogates away from the UTF-8 encoder. */
        data = PyUnicode_IS_ASCII(sha) ? PyUnicode_AsUTF8AndSize(sha, size) : NULL;
    }
    else if (PyBytes_Check(sha)) {
        data = PyBytes_AS_STRING(sha);
        *size = PyBytes_GET_SIZE(sha);
    }
    else {
        PyErr_Format(PyExc_TypeError, "encode_evalsha() sha must be str or bytes, not %.100s",
                     Py_TYPE(sha)->tp_name);
        return NULL;
    }
    int valid = data != NULL && *size == RESP_SHA_DIGITS;
    for (Py_ssize_t i = 0; valid && i < RESP_SHA_DIGITS; i++) {
        char digit = data[i];
        valid = (digit >= '0' && digit <= '9') || (digit >= 'a' && digit <= 'f') ||
                (digit >= 'A' && digit <= 'F');
    }
    if (valid) {
        return data;
    }
    PyObject *quoted = accel_quote(sha);
    if (quoted != NULL) {
        PyErr_Format(PyExc_ValueError,
                     "encode_evalsha() sha must be the 40 hexadecimal digits of a SHA-1, got %U",
                     quoted);
        Py_DECREF(quoted);
    }
    return NULL;
}

/* keys or args as a tuple: a list is copied, so that nothing can change its
 * length while it is read. New reference, or NULL with a TypeError. */
static PyObject *
items_snapshot(PyObject *items, const char *name)
{
    if (PyTuple_Check(items)) {
        return Py_NewRef(items);
    }
    if (PyList_Check(items)) {
        return PyList_AsTuple(items);
    }
    PyErr_Format(PyExc_TypeError, "encode_evalsha() %s must be a tuple or list, not %.100s",
                 name, Py_TYPE(items)->tp_name);
    return NULL;
}

static int
add_items(resp_command *command, PyObject *items, const char *name)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); i++) {
        resp_origin origin = {"encode_evalsha", name, i};
        if (add_argument(command, PyTuple_GET_ITEM(items, i), &origin) < 0) {
            return -1;
        }
    }
    return 0;
}

PyObject *
resp_encode_evalsha(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char evalsha[] = "EVALSHA";
    resp_command command;
    PyObject *keys = NULL, *script_args = NULL, *encoded = NULL;
    Py_ssize_t sha_size;

    if (accel_check_arity("encode_evalsha", "sha, keys, args", 3, 3, nargs) < 0) {
        return NULL;
    }
    const char *sha = checked_sha(args[0], &sha_size);
    if (sha == NULL) {
        return NULL;
    }
    keys = items_snapshot(args[1], "keys");
    if (keys == NULL) {
        return NULL;
    }
    script_args = items_snapshot(args[2], "args");
    if (script_args == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    Py_ssize_t key_count = PyTuple_GET_SIZE(keys);
    if (command_init(&command, 3 + key_count + PyTuple_GET_SIZE(script_args)) < 0) {
        goto done_items;
    }
    add_static(&command, evalsha, (Py_ssize_t)(sizeof(evalsha) - 1));
    /* args[0] outlives the call, and a bytes or ASCII str keeps its data. */
    add_static(&command, sha, sha_size);
    add_count(&command, key_count);
    if (add_items(&command, keys, "keys") == 0 &&
        add_items(&command, script_args, "args") == 0) {
        encoded = command_encode(&command);
    }
    command_release(&command);
done_items:
    Py_DECREF(script_args);
    Py_DECREF(keys);
    return encoded;
}

/* The framed size of a sequence's items when all are plain; -1 if one is not. */
static Py_ssize_t
plain_items_size(PyObject *items)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
        char digits[RESP_INT_DIGITS];
        const char *data;
        Py_ssize_t size = plain_item(PySequence_Fast_GET_ITEM(items, i), digits, &data);
        if (size < 0 || size > PY_SSIZE_T_MAX / 2 - total) {
            return -1;
        }
        total += BULK_FRAMED(size);
    }
    return total;
}

/* An EVALSHA's framed size but for its keys' and arguments' items: the array head,
 * the command's name, a 40-digit sha and the key count. */
static Py_ssize_t
evalsha_head_size(Py_ssize_t key_count, Py_ssize_t arg_count)
{
    static const char evalsha[] = "EVALSHA";
    Py_ssize_t count = 3 + key_count + arg_count;
    return 1 + decimal_width(count) + 2 + BULK_FRAMED((Py_ssize_t)sizeof(evalsha) - 1) +
           BULK_FRAMED(RESP_SHA_DIGITS) + BULK_FRAMED(decimal_width(key_count));
}

Py_ssize_t
resp_evalsha_size(PyObject *keys, PyObject *args)
{
    static const char evalsha[] = "EVALSHA";
    static const char sha[RESP_SHA_DIGITS] = {0}; /* its size is all that counts here */
    int sequences = (PyList_Check(keys) || PyTuple_Check(keys)) &&
                    (PyList_Check(args) || PyTuple_Check(args));
    if (sequences) {
        /* Nothing below runs Python code: the lists cannot change meanwhile. */
        Py_ssize_t keys_size = plain_items_size(keys);
        Py_ssize_t args_size = keys_size < 0 ? -1 : plain_items_size(args);
        if (args_size >= 0) {
            return evalsha_head_size(PySequence_Fast_GET_SIZE(keys),
                                     PySequence_Fast_GET_SIZE(args)) +
                   keys_size + args_size;
        }
    }
    /* Any other item, or an error to raise: encode_evalsha's own resolving. */
    PyObject *key_items = items_snapshot(keys, "keys");
    PyObject *arg_items = key_items == NULL ? NULL : items_snapshot(args, "args");
    Py_ssize_t total_size = -1;
    resp_command command;
    if (arg_items != NULL &&
        command_init(&command, 3 + PyTuple_GET_SIZE(key_items) + PyTuple_GET_SIZE(arg_items)) ==
            0) {
        add_static(&command, evalsha, (Py_ssize_t)(sizeof(evalsha) - 1));
        add_static(&command, sha, RESP_SHA_DIGITS);
        add_count(&command, PyTuple_GET_SIZE(key_items));
        if (add_items(&command, key_items, "keys") == 0 &&
            add_items(&command, arg_items, "args") == 0) {
            total_size = command_size(&command);
        }
        command_release(&command);
    }
    Py_XDECREF(key_items);
    Py_XDECREF(arg_items);
    return total_size;
}

Py_ssize_t
resp_evalsha_size_memo(PyObject *keys, PyObject *args, resp_size_memo *memo)
{
    /* An exact tuple's items cannot change, nor (plain) their bytes: the size
     * measured for the same tuple stands. */
    if (PyTuple_CheckExact(args) && (PyList_Check(keys) || PyTuple_Check(keys))) {
        Py_ssize_t args_size = args == memo->args ? memo->size : plain_items_size(args);
        Py_ssize_t keys_size = args_size < 0 ? -1 : plain_items_size(keys);
        if (keys_size >= 0) {
            memo->args = args;
            memo->size = args_size;
            return evalsha_head_size(PySequence_Fast_GET_SIZE(keys), PyTuple_GET_SIZE(args)) +
                   keys_size + args_size;
        }
    }
    return resp_evalsha_size(keys, args);
}

PyObject *
resp_evalsha_size_function(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (accel_check_arity("evalsha_size", "keys, args", 2, 2, nargs) < 0) {
        return NULL;
    }
    Py_ssize_t size = resp_evalsha_size(args[0], args[1]);
    return size < 0 ? NULL : PyLong_FromSsize_t(size);
}
