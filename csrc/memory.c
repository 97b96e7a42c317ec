/* moderato._accel.MemoryStore: the decision scripts of lua/ run in process.
 *
 * The store holds the very keys the scripts keep in Redis -- <base>:<index>
 * counters, <base>:bucket:v2 buckets -- with the same values and absolute
 * expiries, and decide() reads and writes them exactly as the scripts do:
 * the same validation and refusals (MODERATO_ARG / MODERATO_STATE, same
 * messages), the same integer math, the same floating point where the
 * scripts use it (custom token refill rates), the same reply. A key whose
 * expiry has passed (now > expiry, as in Redis) reads as absent.
 *
 * This file is the type and its small methods (reset, sweep, clear);
 * store_call.h maps the rest: the table (store_table.c), the refusals
 * (store_validate.c), keys (store_keys.c), the buckets' refill
 * (store_bucket.c), one file per algorithm, one decision (store_decide.c),
 * glob deletion (store_glob.c), and the test-only dump/load (store_debug.c).
 *
 * sweep() walks the entries from the least recently used on, from where the
 * last sweep stopped, and drops expired entries and token buckets that have
 * refilled completely (a full bucket decides exactly as a missing one under
 * the same policy). No call walks the whole table unless
 * asked to (sweep() without max_slots, clear()): the table grows and
 * shrinks a bounded step per call, and delete_matching() finds an
 * identity's keys through the identity index (store_table.h).
 *
 * Concurrency: every method runs start to finish holding the GIL and never
 * releases it, and none calls back into Python code while the table is
 * being read or changed, so each call is atomic with respect to every other
 * thread and event loop of the interpreter.
 */
#include <string.h>

#include "heap_type.h"
#include "memory.h"
#include "store_decide.h"

/* Delete the key if present; 1 if it was live. */
static int
delete_key(MemoryStore *store, const unsigned char *key, size_t key_size, int64_t now_ms)
{
    memory_entry *entry = table_find(store, key, key_size, store_hash(store, key, key_size));
    if (entry == NULL) {
        return 0;
    }
    int live = !entry_expired(entry, now_ms);
    table_remove(store, entry);
    return live;
}

static PyObject *
store_reset(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    PyObject *keys = NULL, *argv = NULL, *result = NULL;
    memory_call call_space;
    memory_call *call = &call_space;
    long long windows_s[ACCEL_MAX_RESET_KEYS];
    const char *bases[ACCEL_MAX_RESET_KEYS];
    Py_ssize_t base_sizes[ACCEL_MAX_RESET_KEYS];
    reset_suffix *suffixes = NULL;

    if (accel_check_arity("MemoryStore.reset", "keys, args, now_ms", 3, 3, nargs) < 0) {
        return NULL;
    }
    call->key_space = NULL;
    int64_t now_ms;
    if (STORE_CALL_ARGUMENTS(parse_now, "reset", args[2], &now_ms, args[0], &keys, args[1],
                             &argv) < 0) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
    Py_ssize_t argc = PySequence_Fast_GET_SIZE(argv);
    if (refuse_reset_counts(count, argc) < 0) {
        goto done;
    }
    Py_ssize_t suffix_count = argc - count;
    suffixes = PyMem_New(reset_suffix, (size_t)suffix_count);
    if (suffixes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (parse_reset_args(PySequence_Fast_ITEMS(argv), argc, count, windows_s, suffixes) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (view_key("reset", NULL, i, PySequence_Fast_GET_ITEM(keys, i), &bases[i], &base_sizes[i]) <
            0) {
            goto done;
        }
    }
    size_t keys_per_base = 1; /* the base itself */
    for (Py_ssize_t j = 0; j < suffix_count; j++) {
        keys_per_base += suffixes[j].window_index ? 2 : 1;
    }
    if (reserve_key_space(call, keys_per_base, base_sizes, (int)count) < 0) {
        goto done;
    }
    store->version++;
    long long deleted = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t window_index = floor_div(now_ms, windows_s[i] * 1000);
        char index_text[MAX_SUFFIX_BYTES];
        size_t key_size;
        unsigned char *key;
        for (Py_ssize_t j = 0; j < suffix_count; j++) {
            for (int back = 0; back <= (suffixes[j].window_index ? 1 : 0); back++) {
                const char *suffix = suffixes[j].data;
                size_t suffix_size = (size_t)suffixes[j].size;
                if (suffixes[j].window_index) {
                    suffix_size = index_suffix(window_index - back, index_text);
                    suffix = index_text;
                }
                key = derive_key(call, bases[i], base_sizes[i], suffix, suffix_size, &key_size);
                deleted += delete_key(store, key, key_size, now_ms);
            }
        }
        key = derive_key(call, bases[i], base_sizes[i], "", 0, &key_size);
        deleted += delete_key(store, key, key_size, now_ms);
    }
    table_maybe_shrink(store);
    result = PyLong_FromLongLong(deleted);
done:
    release_key_space(call);
    PyMem_Free(suffixes);
    Py_XDECREF(argv);
    Py_XDECREF(keys);
    return result;
}

/* ---- sweeping ------------------------------------------------------------------------ */

static PyObject *
store_sweep(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    int64_t now_ms;
    Py_ssize_t max_entries = -1;
    if (accel_check_arity("MemoryStore.sweep", "now_ms, max_entries, from_oldest", 1, 3, nargs) <
        0) {
        return NULL;
    }
    if (parse_now("sweep", args[0], &now_ms) < 0) {
        return NULL;
    }
    if (nargs >= 2) {
        if (!PyLong_Check(args[1]) || PyBool_Check(args[1])) {
            PyErr_Format(PyExc_TypeError,
                         "MemoryStore.sweep() max_entries must be int, not %.100s",
                         Py_TYPE(args[1])->tp_name);
            return NULL;
        }
        max_entries = PyLong_AsSsize_t(args[1]);
        if (max_entries == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    if (nargs == 3 && !PyBool_Check(args[2])) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.sweep() from_oldest must be bool, not %.100s",
                     Py_TYPE(args[2])->tp_name);
        return NULL;
    }
    store->version++;
    if (max_entries < 0 || (nargs == 3 && args[2] == Py_True)) {
        table_sweep_from_oldest(store);
    }
    size_t budget = max_entries < 0 ? SIZE_MAX : (size_t)max_entries;
    return PyLong_FromLongLong(table_sweep(store, budget, store_entry_idle, now_ms));
}

PyDoc_STRVAR(reset_doc,
"reset($self, keys, args, now_ms, /)\n"
"--\n"
"\n"
"Run reset.lua at now_ms: args is its ARGV, the window_s of each base key\n"
"and then the state suffixes to delete under every base (the registry's\n"
"RESET_SUFFIXES; \":#\" stands for the window counters of now and the window\n"
"before). Deletes those keys and each base itself; returns how many existed.\n"
"A bad argument raises ValueError('MODERATO_ARG ...') and deletes nothing.");

PyDoc_STRVAR(sweep_doc,
"sweep($self, now_ms, max_entries=-1, from_oldest=False, /)\n"
"--\n"
"\n"
"Drop the entries expired at now_ms and the token buckets full by then\n"
"(both decide exactly as a missing key). Looks at up to max_entries entries\n"
"from the least recently used toward the most recently used, going on from\n"
"where the last sweep stopped (from the least recently used with\n"
"from_oldest), and stops at the most recently used: that ends a pass\n"
"(table_stats()['sweep_passes']). -1: one whole pass from the least recently\n"
"used, any resize in progress finished. Returns how many entries were dropped.");

PyDoc_STRVAR(decide_doc,
"decide($self, algorithm, keys, args, now_ms, /)\n"
"--\n"
"\n"
"Run the decision script of algorithm at now_ms (Unix ms; None: the wall\n"
"clock, as time.time_ns() // 10**6) in process.\n"
"\n"
"keys are the base keys (bytes or str), args the script's ARGV (int, str or\n"
"bytes): cost_scaled, apply, then the policies' fields. Returns the script's\n"
"reply, [allowed, deciding, remaining_scaled, retry_ms, reset_ms, ...]. A\n"
"refusal raises ValueError('MODERATO_ARG ...') or ValueError('MODERATO_STATE\n"
"...') with the script's message, and writes nothing.");

PyDoc_STRVAR(delete_matching_doc,
"delete_matching($self, pattern, now_ms=None, /)\n"
"--\n"
"\n"
"Delete every key matching a Redis glob pattern (*, ?, [...], \\ escapes);\n"
"returns how many were deleted, not counting keys already expired at now_ms.\n"
"A pattern that pins a tenant and an identity, as reset builds them\n"
"(\"...{<tenant>:...:<identity>}...\", no [ nor \\), looks at that identity's\n"
"entries only; any other, at every entry.");

PyDoc_STRVAR(dump_doc,
"dump($self, now_ms, /)\n"
"--\n"
"\n"
"The keys live at now_ms: {key: (value, expire_at_ms)}, the expiry -1 for\n"
"none; the value an int (a counter), a dict of int fields (a hash) or a\n"
"list of (member, score) in order (a sorted set). For tests and debugging.");

PyDoc_STRVAR(load_doc,
"load($self, key, value, expire_at_ms, /)\n"
"--\n"
"\n"
"Store one key as it is, replacing any: value as dump() gives it (an int,\n"
"a dict of int fields, or a list of (member, score)), expire_at_ms -1 for\n"
"none. For tests that start from a given state.");

PyDoc_STRVAR(clear_doc,
"clear($self, /)\n"
"--\n"
"\n"
"Drop every entry.");

static PyObject *
store_clear(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    MemoryStore *store = (MemoryStore *)self;
    store->version++;
    table_clear(store);
    table_maybe_shrink(store);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(table_stats_doc,
"table_stats($self, /)\n"
"--\n"
"\n"
"How the table is laid out and how much work it did in one go, for tests and\n"
"benchmarks: a dict of ints (docs/internals.md lists the fields).");

static PyObject *
store_table_stats(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    const MemoryStore *store = (const MemoryStore *)self;
    const struct {
        const char *name;
        unsigned long long value;
    } fields[] = {
        {"slot_count", store->keys.slot_count},
        {"resize_slots_left", table_resize_slots_left(store)},
        {"slots_per_added", store->keys.slots_per_added},
        {"identities", store->identities.used},
        {"identity_slot_count", store->identities.slot_count},
        {"unindexed", store->unindexed_count},
        {"longest_resize_step", store->work.longest_resize_step},
        {"whole_resizes", store->work.whole_resizes},
        {"last_match_examined", store->work.last_match_examined},
        {"sweep_passes", store->sweep_passes},
    };
    /* Plain names: PyDict_SetItemString would intern, then drop, nine
     * strings per call. */
    PyObject *stats = PyDict_New();
    for (size_t i = 0; stats != NULL && i < sizeof(fields) / sizeof(fields[0]); i++) {
        PyObject *name = PyUnicode_FromString(fields[i].name);
        PyObject *value = PyLong_FromUnsignedLongLong(fields[i].value);
        if (name == NULL || value == NULL || PyDict_SetItem(stats, name, value) < 0) {
            Py_CLEAR(stats);
        }
        Py_XDECREF(name);
        Py_XDECREF(value);
    }
    return stats;
}

static Py_ssize_t
store_length(PyObject *self)
{
    return (Py_ssize_t)((MemoryStore *)self)->keys.used;
}

static PyObject *
store_get_evictions(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(((MemoryStore *)self)->evictions);
}

/* A size_t field of the store; the closure is its offset (FIELD_AT). */
static PyObject *
store_get_size(PyObject *self, void *offset)
{
    return PyLong_FromSize_t(*(const size_t *)((const char *)self + (size_t)offset));
}

#define FIELD_AT(name) ((void *)offsetof(MemoryStore, name))

static PyObject *
store_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"max_entries", "sweep_every", "sweep_entries", NULL};
    Py_ssize_t max_entries, sweep_every = 0, sweep_entries = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|$nn:MemoryStore", keywords, &max_entries,
                                     &sweep_every, &sweep_entries)) {
        return NULL;
    }
    if (max_entries < 1) {
        PyErr_Format(PyExc_ValueError, "MemoryStore() max_entries must be at least 1, got %zd",
                     max_entries);
        return NULL;
    }
    if (sweep_every < 0 || sweep_entries < 0) {
        PyErr_Format(PyExc_ValueError,
                     "MemoryStore() sweep_every and sweep_entries must be 0 or more, got %zd "
                     "and %zd",
                     sweep_every, sweep_entries);
        return NULL;
    }
    /* A random hash key per store: identities cannot be chosen to collide. */
    PyObject *seed = NULL;
    PyObject *os = PyImport_ImportModule("os");
    if (os != NULL) {
        seed = PyObject_CallMethod(os, "urandom", "i", (int)sizeof(uint64_t[2]));
        Py_DECREF(os);
    }
    if (seed == NULL) {
        return NULL;
    }
    if (!PyBytes_Check(seed) || PyBytes_GET_SIZE(seed) != (Py_ssize_t)sizeof(uint64_t[2])) {
        Py_DECREF(seed);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom() returned an unexpected value");
        return NULL;
    }
    MemoryStore *store = (MemoryStore *)type->tp_alloc(type, 0);
    if (store == NULL) {
        Py_DECREF(seed);
        return NULL;
    }
    const unsigned char *seed_bytes = (const unsigned char *)PyBytes_AS_STRING(seed);
    store->hash_key[0] = load_le64(seed_bytes);
    store->hash_key[1] = load_le64(seed_bytes + 8);
    Py_DECREF(seed);
    store->max_entries = (size_t)max_entries;
    store->sweep_every = store->until_sweep = (size_t)sweep_every;
    store->sweep_entries = (size_t)sweep_entries;
    if (table_init(store) < 0) {
        Py_DECREF(store);
        return NULL;
    }
    return (PyObject *)store;
}

static void
store_dealloc(PyObject *self)
{
    MemoryStore *store = (MemoryStore *)self;
    PyTypeObject *type = Py_TYPE(self);
    table_release(store);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef store_methods[] = {
    {"decide", (PyCFunction)(void (*)(void))store_decide, METH_FASTCALL, decide_doc},
    {"reset", (PyCFunction)(void (*)(void))store_reset, METH_FASTCALL, reset_doc},
    {"delete_matching", (PyCFunction)(void (*)(void))store_delete_matching, METH_FASTCALL,
     delete_matching_doc},
    {"sweep", (PyCFunction)(void (*)(void))store_sweep, METH_FASTCALL, sweep_doc},
    {"dump", (PyCFunction)(void (*)(void))store_dump, METH_FASTCALL, dump_doc},
    {"load", (PyCFunction)(void (*)(void))store_load, METH_FASTCALL, load_doc},
    {"clear", store_clear, METH_NOARGS, clear_doc},
    {"table_stats", store_table_stats, METH_NOARGS, table_stats_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"max_entries", store_get_size, NULL, "The hard cap on entries.", FIELD_AT(max_entries)},
    {"evictions", store_get_evictions, NULL,
     "Entries evicted so far because the table was at its cap.", NULL},
    {"sweep_every", store_get_size, NULL,
     "decide() sweeps every this many decisions (0: never).", FIELD_AT(sweep_every)},
    {"sweep_entries", store_get_size, NULL, "Entries each of decide()'s sweeps looks at.",
     FIELD_AT(sweep_entries)},
    {"slot_count", store_get_size, NULL,
     "Slots of the hash table (a power of two; during a resize, of the new array).",
     FIELD_AT(keys.slot_count)},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(store_doc,
"MemoryStore(max_entries, *, sweep_every=0, sweep_entries=0)\n"
"--\n"
"\n"
"The state of memory://: the keys of the decision scripts, in process,\n"
"decided with the scripts' exact math. At most max_entries entries are kept\n"
"(the least recently used are evicted beyond); sweep() drops expired entries\n"
"and full token buckets, and decide() sweeps sweep_entries entries by itself\n"
"every sweep_every decisions (0: never). Every method holds the GIL throughout: calls from\n"
"several threads and event loops are atomic. docs/internals.md has the\n"
"contract.");

static PyType_Slot store_slots[] = {
    {Py_tp_doc, (void *)store_doc},
    {Py_tp_new, store_new},
    {Py_tp_dealloc, store_dealloc},
    {Py_tp_methods, store_methods},
    {Py_tp_getset, store_getset},
    {Py_mp_length, store_length},
    {0, NULL},
};

ACCEL_TYPE_SPEC(store_spec, "moderato._accel.MemoryStore", sizeof(MemoryStore),
                ACCEL_TPFLAGS_IMMUTABLE, store_slots);

int
memory_add_to_module(PyObject *module)
{
    if (accel_add_type(module, &store_spec, "MemoryStore", NULL) < 0) {
        return -1;
    }
    PyObject *names = PyTuple_New(store_algorithm_count);
    if (names == NULL) {
        return -1;
    }
    for (int i = 0; i < store_algorithm_count; i++) {
        PyObject *name = PyUnicode_FromString(store_algorithms[i]->name);
        if (name == NULL) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    int result = PyModule_AddObjectRef(module, "MEMORY_ALGORITHMS", names);
    Py_DECREF(names);
    return result;
}
