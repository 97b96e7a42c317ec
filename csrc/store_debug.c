/* dump() and load(): the store's keys as Redis would show them, and a key
 * stored as given. For tests (and debugging): the differential tests load
 * states no history of decisions produces -- wrong types, values out of
 * range, non-canonical log members -- to check that the store refuses them
 * exactly as the scripts refuse them in Redis. */
#include <stdlib.h>
#include <string.h>

#include "store_decide.h"

/* A log as a list of (member, score). The members are copied first: building
 * the list may run a garbage collection, hence code that changes the log. */
static PyObject *
log_object(const log_value *log)
{
    size_t count = log->count, text_bytes = 0;
    for (size_t i = 0; i < count; i++) {
        char buffer[LOG_TEXT_BYTES];
        size_t size;
        log_member_text(log_at(log, i), buffer, &size);
        text_bytes += size;
    }
    int64_t *scores = PyMem_Malloc((count + 1) * sizeof(int64_t));
    size_t *sizes = PyMem_Malloc((count + 1) * sizeof(size_t));
    char *texts = PyMem_Malloc(text_bytes + 1);
    PyObject *members = NULL;
    if (scores == NULL || sizes == NULL || texts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0, at = 0; i < count; i++) {
        char buffer[LOG_TEXT_BYTES];
        const char *text = log_member_text(log_at(log, i), buffer, &sizes[i]);
        memcpy(texts + at, text, sizes[i]);
        at += sizes[i];
        scores[i] = log_at(log, i)->at_ms;
    }
    members = PyList_New((Py_ssize_t)count);
    for (size_t i = 0, at = 0; members != NULL && i < count; at += sizes[i], i++) {
        PyObject *pair = Py_BuildValue(
            "(NL)", PyUnicode_DecodeUTF8(texts + at, (Py_ssize_t)sizes[i], "surrogateescape"),
            (long long)scores[i]);
        if (pair == NULL) {
            Py_CLEAR(members);
            break;
        }
        PyList_SET_ITEM(members, (Py_ssize_t)i, pair);
    }
done:
    PyMem_Free(texts);
    PyMem_Free(sizes);
    PyMem_Free(scores);
    return members;
}

static PyObject *
entry_value_object(const memory_entry *entry)
{
    if (entry->kind == KIND_COUNTER) {
        return PyLong_FromLongLong(entry->value.counter);
    }
    if (entry->kind == KIND_LOG) {
        return log_object(&entry->value.log);
    }
    /* Copied first, for the same reason as a log's members. */
    const hash_layout *layout = layout_of(entry->kind);
    int64_t values[3];
    memcpy(values, hash_fields(entry), (size_t)layout->field_count * sizeof(int64_t));
    PyObject *fields = PyDict_New();
    for (int i = 0; fields != NULL && i < layout->field_count; i++) {
        PyObject *value = PyLong_FromLongLong(values[i]);
        if (value == NULL || PyDict_SetItemString(fields, layout->names[i], value) < 0) {
            Py_CLEAR(fields);
        }
        Py_XDECREF(value);
    }
    return fields;
}

PyObject *
store_dump(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    int64_t now_ms;
    if (accel_check_arity("MemoryStore.dump", "now_ms", 1, 1, nargs) < 0) {
        return NULL;
    }
    if (parse_now("dump", args[0], &now_ms) < 0) {
        return NULL;
    }
    PyObject *result = PyDict_New();
    unsigned long long version = store->version;
    for (memory_entry *entry = store->newest; result != NULL && entry != NULL;) {
        if (entry_expired(entry, now_ms)) {
            entry = entry->older;
            continue;
        }
        /* Building objects may run a garbage collection, hence any code. */
        PyObject *key = PyBytes_FromStringAndSize((const char *)entry_key(entry),
                                                  (Py_ssize_t)entry->key_size);
        PyObject *pair = NULL;
        if (key != NULL && store->version == version) {
            pair = Py_BuildValue("(NL)", entry_value_object(entry),
                                 (long long)entry->expire_at_ms);
        }
        if (pair != NULL && store->version == version &&
            PyDict_SetItem(result, key, pair) == 0 && store->version == version) {
            entry = entry->older;
        }
        else {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_RuntimeError, "MemoryStore changed during dump()");
            }
            Py_CLEAR(result);
        }
        Py_XDECREF(pair);
        Py_XDECREF(key);
    }
    return result;
}

/* The hash kind whose fields are exactly the dict's keys, each an int. */
static int
load_hash(PyObject *fields, int64_t *values)
{
    for (int i = 0; i < store_hash_layout_count; i++) {
        const hash_layout *layout = &store_hash_layouts[i];
        if (PyDict_GET_SIZE(fields) != layout->field_count) {
            continue;
        }
        int matched = 1;
        for (int j = 0; matched && j < layout->field_count; j++) {
            PyObject *item = PyDict_GetItemString(fields, layout->names[j]);
            if (item == NULL || !PyLong_Check(item) || PyBool_Check(item)) {
                matched = 0;
                continue;
            }
            values[j] = PyLong_AsLongLong(item);
            if (values[j] == -1 && PyErr_Occurred()) {
                return -1;
            }
        }
        if (matched) {
            return layout->kind;
        }
    }
    PyErr_SetString(PyExc_ValueError,
                    "MemoryStore.load() a hash must hold exactly the int fields tokens, base "
                    "and credited, or tat and frac, or level, base and drained");
    return -1;
}

/* A loaded member: canonical ones are kept as numbers, unreadable ones as
 * text; readable but non-canonical ones (a cost with leading zeros) are
 * refused, since a renumbering would merge them. */
static int
load_log_item(PyObject *pair, log_item *item)
{
    const char *text;
    Py_ssize_t size;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(pair, 1))) {
        PyErr_SetString(PyExc_TypeError,
                        "MemoryStore.load() a sorted set is a list of (member, int score)");
        return -1;
    }
    if (view_key("load", "a member", -1, PyTuple_GET_ITEM(pair, 0), &text, &size) < 0) {
        return -1;
    }
    item->at_ms = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
    if (item->at_ms == -1 && PyErr_Occurred()) {
        return -1;
    }
    item->text = NULL;
    Py_ssize_t colon = 0;
    while (colon < size && text[colon] >= '0' && text[colon] <= '9') {
        colon++;
    }
    long long total, cost;
    int readable = colon == ACCEL_LOG_TOTAL_DIGITS && colon + 1 < size && text[colon] == ':' &&
                   parse_digits(text, (size_t)colon, 1, ACCEL_MAX_SAFE_INTEGER, &total) &&
                   parse_digits(text + colon + 1, (size_t)(size - colon - 1), 1,
                                ACCEL_MAX_SAFE_INTEGER, &cost) &&
                   cost <= total;
    if (readable) {
        item->total_scaled = total;
        item->cost_scaled = cost;
        char buffer[LOG_TEXT_BYTES];
        size_t canonical_size;
        const char *canonical = log_member_text(item, buffer, &canonical_size);
        if (canonical_size != (size_t)size || memcmp(canonical, text, (size_t)size) != 0) {
            PyErr_Format(PyExc_ValueError,
                         "MemoryStore.load() member %R is readable but not canonical",
                         PyTuple_GET_ITEM(pair, 0));
            return -1;
        }
        return 0;
    }
    item->total_scaled = item->cost_scaled = 0;
    item->text = PyMem_Malloc(sizeof(size_t) + (size_t)size);
    if (item->text == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t text_size = (size_t)size;
    memcpy(item->text, &text_size, sizeof(size_t));
    memcpy(item->text + sizeof(size_t), text, (size_t)size);
    return 0;
}

static int
load_log(PyObject *members, log_value *log)
{
    Py_ssize_t count = PyList_GET_SIZE(members);
    log->items = PyMem_Calloc((size_t)count + 1, sizeof(log_item));
    if (log->items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    log->capacity = (size_t)count + 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (load_log_item(PyList_GET_ITEM(members, i), &log->items[i]) < 0) {
            return -1;
        }
        log->count++;
    }
    qsort(log->items, log->count, sizeof(log_item), log_compare_items);
    for (size_t i = 1; i < log->count; i++) {
        if (log_same_member(&log->items[i - 1], &log->items[i])) {
            PyErr_SetString(PyExc_ValueError, "MemoryStore.load() a member appears twice");
            return -1;
        }
    }
    log->regular = log_is_regular(log);
    return 0;
}

PyObject *
store_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    const char *key;
    Py_ssize_t key_size;
    if (accel_check_arity("MemoryStore.load", "key, value, expire_at_ms", 3, 3, nargs) < 0) {
        return NULL;
    }
    if (view_key("load", "key", -1, args[0], &key, &key_size) < 0) {
        return NULL;
    }
    long long expire_at_ms = PyLong_AsLongLong(args[2]);
    if (expire_at_ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (expire_at_ms < NO_EXPIRY) {
        PyErr_SetString(PyExc_ValueError, "MemoryStore.load() expire_at_ms must be -1 or >= 0");
        return NULL;
    }
    PyObject *value = args[1];
    int kind;
    int64_t fields[3] = {0, 0, 0};
    if (PyLong_Check(value) && !PyBool_Check(value)) {
        kind = KIND_COUNTER;
        fields[0] = PyLong_AsLongLong(value);
        if (fields[0] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    else if (PyDict_Check(value)) {
        kind = load_hash(value, fields);
        if (kind < 0) {
            return NULL;
        }
    }
    else if (PyList_Check(value)) {
        kind = KIND_LOG;
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.load() value must be int, dict or list, not %.100s",
                     Py_TYPE(value)->tp_name);
        return NULL;
    }
    uint64_t hash = store_hash(store, (const unsigned char *)key, (size_t)key_size);
    memory_entry *entry = entry_new(kind, (const unsigned char *)key, (size_t)key_size, hash);
    if (entry == NULL) {
        return NULL;
    }
    if ((kind == KIND_LOG && load_log(value, &entry->value.log) < 0) ||
        table_reserve(store, 1) < 0) {
        entry_free(entry);
        return NULL;
    }
    store->version++;
    memory_entry *old = table_find(store, (const unsigned char *)key, (size_t)key_size, hash);
    if (old != NULL) {
        table_remove(store, old);
    }
    entry->expire_at_ms = expire_at_ms;
    if (kind == KIND_COUNTER) {
        entry->value.counter = fields[0];
    }
    else if (kind != KIND_LOG) {
        int64_t *stored = (int64_t *)hash_fields(entry);
        for (int i = 0; i < layout_of(kind)->field_count; i++) {
            stored[i] = fields[i];
        }
    }
    table_insert(store, entry);
    evict_beyond_cap(store);
    Py_RETURN_NONE;
}

