/* moderato._accel.MemoryStore: the decision scripts of moderato/lua/ run in process.
 *
 * The store holds the very keys the scripts keep in Redis -- <base>:<index>
 * counters, <base>:bucket:v2 buckets -- with the same values and absolute
 * expiries, and decide() reads and writes them exactly as the scripts do:
 * the same validation and refusals (MODERATO_ARG / MODERATO_STATE, same
 * messages), the same integer math, the same floating point where the
 * scripts use it (custom token refill rates), the same reply. A key whose
 * expiry has passed (now > expiry, as in Redis) reads as absent.
 *
 * Table: open addressing with linear probing over a power-of-two array of
 * entry pointers, at most half full; deletion shifts the following entries
 * back, so there are no tombstones. Keys are hashed with SipHash-1-3 under a
 * random per-store key, so chosen identities cannot force collisions. Every
 * entry is also on an intrusive doubly linked list in order of use; past
 * max_entries the least recently used entries are evicted, O(1) each.
 * sweep() walks the slots from a cursor and drops expired entries and token
 * buckets that have refilled completely (a full bucket decides exactly as a
 * missing one under the same policy).
 *
 * Concurrency: every method runs start to finish holding the GIL and never
 * releases it, and none calls back into Python code while the table is
 * being read or changed, so each call is atomic with respect to every other
 * thread and event loop of the interpreter.
 *
 * Atomicity of a decision: policies are evaluated on the state as read, with
 * no writes; only if every one admits and the call charges, everything the
 * writes need (entries, table room) is allocated first, then the writes are
 * applied, none of which can fail.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "contract.h"
#include "memory.h"

#define MAX_SAFE_INTEGER ACCEL_MAX_SCALED                   /* 2^53 */
#define MAX_CAPACITY_SCALED (ACCEL_MAX_LIMIT * 1000LL)      /* 9007199254000 */
#define MAX_STATE_TIME_MS 4503599627370496LL                /* 2^52 */
/* The year 2255: now in microseconds, plus two GCRA windows, stays below 2^53. */
#define MAX_NOW_MS 9000000000000LL
/* The long-window path's bounds (prelude.lua, gcra.lua; docs/internals.md, "Long windows"). */
#define ACCRUAL_EXACT_WINDOW_MS 94906266LL
#define MAX_GCRA_WINDOW_S 3599627LL
#define EXPIRY_MARGIN_MS 60000LL
#define DRAINED_EXPIRY_MARGIN_MS 1000LL  /* GCRA, log, leaky: past reading as empty */
#define US_PER_MS 1000LL
#define LOG_TOTAL_DIGITS 16
#define MAX_RESET_KEYS 256
#define MAX_SEARCH_STEPS 1000
#define NO_EXPIRY (-1LL)

#define MIN_SLOTS 16
#define MAX_TARGETS 2            /* keys one policy of one decision reads or writes */
#define MAX_SUFFIX_BYTES 24      /* ":" and a 64-bit index, or ":bucket:v2" */
#define INLINE_KEY_BYTES 2048
#define SHOWN_ARG_BYTES 40
#define SHOWN_KEY_BYTES 1024

static const char wrongtype_error[] =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/* ---- keyed hash: SipHash-1-3 ------------------------------------------- */

#define ROTATE_LEFT(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

#define SIP_ROUND(v0, v1, v2, v3) \
    do {                          \
        v0 += v1;                 \
        v1 = ROTATE_LEFT(v1, 13); \
        v1 ^= v0;                 \
        v0 = ROTATE_LEFT(v0, 32); \
        v2 += v3;                 \
        v3 = ROTATE_LEFT(v3, 16); \
        v3 ^= v2;                 \
        v0 += v3;                 \
        v3 = ROTATE_LEFT(v3, 21); \
        v3 ^= v0;                 \
        v2 += v1;                 \
        v1 = ROTATE_LEFT(v1, 17); \
        v1 ^= v2;                 \
        v2 = ROTATE_LEFT(v2, 32); \
    } while (0)

static uint64_t
load_le64(const unsigned char *bytes)
{
    uint64_t word = 0;
    for (int i = 7; i >= 0; i--) {
        word = (word << 8) | bytes[i];
    }
    return word;
}

static uint64_t
siphash13(const uint64_t key[2], const unsigned char *data, size_t size)
{
    uint64_t v0 = 0x736f6d6570736575ULL ^ key[0];
    uint64_t v1 = 0x646f72616e646f6dULL ^ key[1];
    uint64_t v2 = 0x6c7967656e657261ULL ^ key[0];
    uint64_t v3 = 0x7465646279746573ULL ^ key[1];
    size_t whole = size - size % 8;
    for (size_t offset = 0; offset < whole; offset += 8) {
        uint64_t word = load_le64(data + offset);
        v3 ^= word;
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= word;
    }
    uint64_t last = (uint64_t)size << 56;
    for (size_t i = 0; i < size % 8; i++) {
        last |= (uint64_t)data[whole + i] << (8 * i);
    }
    v3 ^= last;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xff;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- entries --------------------------------------------------------------- */

/* What a key holds: a Redis string holding a decimal integer (a window
 * counter), one of three hashes of integer fields, or the sliding log's
 * sorted set. */
enum { KIND_COUNTER = 1, KIND_BUCKET, KIND_GCRA, KIND_LEAKY, KIND_LOG };

/* The hashes' fields, in the order of the field arrays below. */
enum { BUCKET_TOKENS, BUCKET_BASE, BUCKET_CREDITED };
enum { GCRA_TAT, GCRA_FRAC };
enum { LEAKY_LEVEL, LEAKY_BASE, LEAKY_DRAINED };

typedef struct {
    int64_t field[3]; /* tokens, base, credited */
    /* The policy of the last write, which only the sweep reads (is the
     * bucket full by now?); capacity 0 for a bucket of unknown policy. */
    int64_t capacity_scaled;
    int64_t window_ms;
    double refill_scaled_per_s; /* 0: the public rule */
} bucket_value;

typedef struct {
    int64_t field[2]; /* tat (whole us), frac (1/capacity of a us) */
} gcra_value;

typedef struct {
    int64_t field[3]; /* level, base, drained */
} leaky_value;

/* One member of a sliding log: "<16-digit total>:<cost>" scored at_ms. A
 * member loaded with any other text keeps it (length-prefixed) in text. */
typedef struct {
    int64_t at_ms;
    int64_t total_scaled;
    int64_t cost_scaled;
    char *text;
} log_item;

/* The members in Redis's order (score, then member bytes): items[start]
 * up to items[start + count - 1]. regular: every member canonical, running
 * totals strictly rising, so a new larger total is simply appended. */
typedef struct {
    log_item *items;
    size_t start;
    size_t count;
    size_t capacity;
    int regular;
} log_value;

typedef union {
    int64_t counter;
    bucket_value bucket;
    gcra_value gcra;
    leaky_value leaky;
    log_value log;
} entry_value;

typedef struct memory_entry {
    struct memory_entry *newer; /* toward the most recently used */
    struct memory_entry *older;
    int64_t expire_at_ms;       /* absolute, or NO_EXPIRY */
    uint64_t hash;
    uint32_t key_size;
    uint8_t kind;
    /* Only the kind's part of the value is allocated; the key follows it. */
    entry_value value;
} memory_entry;

static size_t
value_size(int kind)
{
    switch (kind) {
    case KIND_BUCKET:
        return sizeof(bucket_value);
    case KIND_GCRA:
        return sizeof(gcra_value);
    case KIND_LEAKY:
        return sizeof(leaky_value);
    case KIND_LOG:
        return sizeof(log_value);
    default:
        return sizeof(int64_t);
    }
}

static unsigned char *
entry_key(const memory_entry *entry)
{
    return (unsigned char *)&entry->value + value_size(entry->kind);
}

static void
log_release_items(log_value *log, size_t from, size_t count)
{
    for (size_t i = from; i < from + count; i++) {
        PyMem_Free(log->items[i].text);
        log->items[i].text = NULL;
    }
}

static void
entry_free(memory_entry *entry)
{
    if (entry->kind == KIND_LOG) {
        log_value *log = &entry->value.log;
        log_release_items(log, log->start, log->count);
        PyMem_Free(log->items);
    }
    PyMem_Free(entry);
}

static int
entry_expired(const memory_entry *entry, int64_t now_ms)
{
    return entry->expire_at_ms != NO_EXPIRY && now_ms > entry->expire_at_ms;
}

static memory_entry *
entry_new(int kind, const unsigned char *key, size_t key_size, uint64_t hash)
{
    if (key_size > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "MemoryStore: a key is longer than 4 GiB");
        return NULL;
    }
    memory_entry *entry =
        PyMem_Malloc(offsetof(memory_entry, value) + value_size(kind) + key_size);
    if (entry == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    entry->newer = entry->older = NULL;
    entry->expire_at_ms = NO_EXPIRY;
    entry->hash = hash;
    entry->key_size = (uint32_t)key_size;
    entry->kind = (uint8_t)kind;
    memset(&entry->value, 0, value_size(kind));
    if (key_size > 0) {
        memcpy(entry_key(entry), key, key_size);
    }
    return entry;
}

/* ---- the store: hash table and LRU list ----------------------------------- */

typedef struct {
    PyObject_HEAD
    memory_entry **slots;
    size_t slot_count;   /* a power of two, at least MIN_SLOTS */
    size_t entry_count;
    size_t max_entries;
    size_t sweep_cursor;
    memory_entry *newest;
    memory_entry *oldest;
    uint64_t hash_key[2];
    unsigned long long evictions;
    unsigned long long version; /* changes with every call that may change the table */
} MemoryStore;

static uint64_t
store_hash(const MemoryStore *store, const unsigned char *key, size_t key_size)
{
    return siphash13(store->hash_key, key, key_size);
}

static void
lru_unlink(MemoryStore *store, memory_entry *entry)
{
    if (entry->newer != NULL) {
        entry->newer->older = entry->older;
    }
    else {
        store->newest = entry->older;
    }
    if (entry->older != NULL) {
        entry->older->newer = entry->newer;
    }
    else {
        store->oldest = entry->newer;
    }
    entry->newer = entry->older = NULL;
}

static void
lru_push_newest(MemoryStore *store, memory_entry *entry)
{
    entry->newer = NULL;
    entry->older = store->newest;
    if (store->newest != NULL) {
        store->newest->newer = entry;
    }
    else {
        store->oldest = entry;
    }
    store->newest = entry;
}

static void
lru_touch(MemoryStore *store, memory_entry *entry)
{
    if (store->newest != entry) {
        lru_unlink(store, entry);
        lru_push_newest(store, entry);
    }
}

/* The entry holding this key, expired or not, or NULL. */
static memory_entry *
table_find(const MemoryStore *store, const unsigned char *key, size_t key_size, uint64_t hash)
{
    size_t mask = store->slot_count - 1;
    for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
        memory_entry *entry = store->slots[i];
        if (entry == NULL) {
            return NULL;
        }
        if (entry->hash == hash && entry->key_size == key_size &&
            memcmp(entry_key(entry), key, key_size) == 0) {
            return entry;
        }
    }
}

static size_t
table_slot_of(const MemoryStore *store, const memory_entry *entry)
{
    size_t mask = store->slot_count - 1;
    size_t i = (size_t)entry->hash & mask;
    while (store->slots[i] != entry) {
        i = (i + 1) & mask;
    }
    return i;
}

/* Place an entry whose key is absent; the table has room (table_reserve). */
static void
table_place(memory_entry **slots, size_t slot_count, memory_entry *entry)
{
    size_t mask = slot_count - 1;
    size_t i = (size_t)entry->hash & mask;
    while (slots[i] != NULL) {
        i = (i + 1) & mask;
    }
    slots[i] = entry;
}

/* Empty slot i, shifting back the entries after it whose probe sequence
 * passes through it, so that every entry stays reachable from its home. */
static void
table_clear_slot(MemoryStore *store, size_t i)
{
    size_t mask = store->slot_count - 1;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        memory_entry *entry = store->slots[j];
        if (entry == NULL) {
            break;
        }
        size_t home = (size_t)entry->hash & mask;
        /* The entry stays put iff its home lies cyclically in (i, j]. */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            store->slots[i] = entry;
            i = j;
        }
    }
    store->slots[i] = NULL;
}

static int
table_resize(MemoryStore *store, size_t slot_count)
{
    memory_entry **slots = PyMem_Calloc(slot_count, sizeof(memory_entry *));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (memory_entry *entry = store->newest; entry != NULL; entry = entry->older) {
        table_place(slots, slot_count, entry);
    }
    PyMem_Free(store->slots);
    store->slots = slots;
    store->slot_count = slot_count;
    store->sweep_cursor = 0;
    return 0;
}

/* Room for extra more entries, at most half full. */
static int
table_reserve(MemoryStore *store, size_t extra)
{
    size_t needed = store->entry_count + extra;
    if (needed <= store->slot_count / 2) {
        return 0;
    }
    size_t slot_count = store->slot_count;
    while (needed > slot_count / 2) {
        if (slot_count > (SIZE_MAX / sizeof(memory_entry *)) / 4) {
            PyErr_NoMemory();
            return -1;
        }
        slot_count *= 2;
    }
    return table_resize(store, slot_count);
}

/* Shrink a table less than an eighth full to about a quarter; a failed
 * allocation just keeps the larger table. */
static void
table_maybe_shrink(MemoryStore *store)
{
    if (store->slot_count <= MIN_SLOTS || store->entry_count * 8 >= store->slot_count) {
        return;
    }
    size_t slot_count = MIN_SLOTS;
    while (slot_count < store->entry_count * 4) {
        slot_count *= 2;
    }
    if (slot_count < store->slot_count && table_resize(store, slot_count) < 0) {
        PyErr_Clear();
    }
}

static void
table_insert(MemoryStore *store, memory_entry *entry)
{
    table_place(store->slots, store->slot_count, entry);
    lru_push_newest(store, entry);
    store->entry_count++;
}

static void
table_remove(MemoryStore *store, memory_entry *entry)
{
    table_clear_slot(store, table_slot_of(store, entry));
    lru_unlink(store, entry);
    store->entry_count--;
    entry_free(entry);
}

static void
table_clear(MemoryStore *store)
{
    memory_entry *entry = store->newest;
    while (entry != NULL) {
        memory_entry *older = entry->older;
        entry_free(entry);
        entry = older;
    }
    store->newest = store->oldest = NULL;
    store->entry_count = 0;
    if (store->slots != NULL) {
        memset(store->slots, 0, store->slot_count * sizeof(memory_entry *));
    }
    store->sweep_cursor = 0;
}

static void
evict_beyond_cap(MemoryStore *store)
{
    while (store->entry_count > store->max_entries && store->oldest != NULL) {
        table_remove(store, store->oldest);
        store->evictions++;
    }
}

/* ---- messages, as the scripts word them ---------------------------------- */

/* Lua's %w, %p and the space: what the scripts' shown() keeps. */
static int
is_shown_byte(unsigned char c)
{
    return c >= 0x20 && c <= 0x7e;
}

/* The scripts' shown(): quoted, cut to max_bytes and marked with "...",
 * every byte but letters, digits, punctuation and space replaced by "?". */
static PyObject *
shown_bytes(const char *data, Py_ssize_t size, Py_ssize_t max_bytes)
{
    int truncated = size > max_bytes;
    Py_ssize_t kept = truncated ? max_bytes : size;
    PyObject *text = PyUnicode_New(kept + 2 + (truncated ? 3 : 0), 127);
    if (text == NULL) {
        return NULL;
    }
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t at = 0;
    out[at++] = '"';
    for (Py_ssize_t i = 0; i < kept; i++) {
        unsigned char c = (unsigned char)data[i];
        out[at++] = is_shown_byte(c) ? c : '?';
    }
    if (truncated) {
        out[at++] = '.';
        out[at++] = '.';
        out[at++] = '.';
    }
    out[at++] = '"';
    return text;
}

/* Raise ValueError("<kind> <message>"). Always returns -1. */
static int
refuse(const char *kind, const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    PyObject *message = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (message != NULL) {
        PyErr_Format(PyExc_ValueError, "%s %U", kind, message);
        Py_DECREF(message);
    }
    return -1;
}

/* ---- arguments ------------------------------------------------------------- */

/* One ARGV element as the scripts see it: the text Redis would receive. An
 * int is kept as a number (its text is made only for an error message). */
typedef struct {
    PyObject *object;
    const char *data;   /* str (UTF-8) or bytes */
    Py_ssize_t size;
    int is_int;
    int int_sign;       /* -1 negative, 0 fits in long long, 1 too large */
    long long value;
} arg_view;

static int
view_arg(const char *function, const char *what, Py_ssize_t position, PyObject *object,
         arg_view *view)
{
    view->object = object;
    view->is_int = 0;
    if (PyLong_Check(object) && !PyBool_Check(object)) {
        int overflow;
        view->is_int = 1;
        view->value = PyLong_AsLongLongAndOverflow(object, &overflow);
        if (view->value == -1 && PyErr_Occurred()) {
            return -1;
        }
        view->int_sign = overflow != 0 ? overflow : (view->value < 0 ? -1 : 0);
        return 0;
    }
    if (PyBytes_Check(object)) {
        view->data = PyBytes_AS_STRING(object);
        view->size = PyBytes_GET_SIZE(object);
        return 0;
    }
    if (PyUnicode_Check(object)) {
        view->data = PyUnicode_AsUTF8AndSize(object, &view->size);
        return view->data == NULL ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "MemoryStore.%s() %s[%zd] must be int, str or bytes, not %.100s",
                 function, what, position, Py_TYPE(object)->tp_name);
    return -1;
}

/* shown() of an argument's text. */
static PyObject *
shown_arg(const arg_view *view)
{
    if (!view->is_int) {
        return shown_bytes(view->data, view->size, SHOWN_ARG_BYTES);
    }
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(view->object, &overflow);
    if (!overflow) {
        char digits[32];
        PyOS_snprintf(digits, sizeof(digits), "%lld", value);
        return shown_bytes(digits, (Py_ssize_t)strlen(digits), SHOWN_ARG_BYTES);
    }
    /* int's own repr, never a subclass's __str__ (which could run any code). */
    Py_INCREF(view->object);
    PyObject *text = PyLong_Type.tp_repr(view->object);
    Py_DECREF(view->object);
    if (text == NULL) {
        /* Past int_max_str_digits: its first digits are all one could see. */
        PyErr_Clear();
        return PyUnicode_FromString("\"(an int too large to print)\"");
    }
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(text, &size);
    PyObject *shown = data == NULL ? NULL : shown_bytes(data, size, SHOWN_ARG_BYTES);
    Py_DECREF(text);
    return shown;
}

/* The number of significant digits of a decimal text (leading zeros skipped),
 * or -1 if it is empty or holds anything but ASCII digits; *start is set to
 * the first significant digit. */
static Py_ssize_t
significant_digits(const arg_view *view, Py_ssize_t *start)
{
    if (view->size == 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < view->size; i++) {
        if (view->data[i] < '0' || view->data[i] > '9') {
            return -1;
        }
    }
    Py_ssize_t first = 0;
    while (first < view->size && view->data[first] == '0') {
        first++;
    }
    *start = first;
    return view->size - first;
}

/* The scripts' parse_integer: the value of a decimal integer text (digits
 * only, leading zeros allowed, at most 2^53) within [low, high]. */
static int
parse_integer(const arg_view *view, long long low, long long high, long long *value)
{
    long long number;
    if (view->is_int) {
        if (view->int_sign != 0) {
            return 0;
        }
        number = view->value;
    }
    else {
        Py_ssize_t start = 0;
        Py_ssize_t digits = significant_digits(view, &start);
        if (digits < 0 || digits > 16 ||
            (digits == 16 && memcmp(view->data + start, "9007199254740992", 16) > 0)) {
            return 0;
        }
        number = 0;
        for (Py_ssize_t i = start; i < view->size; i++) {
            number = number * 10 + (view->data[i] - '0');
        }
    }
    if (number > MAX_SAFE_INTEGER || number < low || number > high) {
        return 0;
    }
    *value = number;
    return 1;
}

/* The scripts' parse_refill_rate: "" (-> 0, the public rule) or a plain or
 * exponent decimal, read as a double exactly as Lua's tonumber reads it.
 * Returns 1 and sets rate (0 for ""), or 0 when it is not such a text. */
static int
parse_rate_text(const arg_view *view, double *rate)
{
    if (view->is_int) {
        if (view->int_sign < 0) {
            return 0;
        }
        /* Correctly rounded, as strtod reads the same digits. */
        *rate = view->int_sign > 0 ? HUGE_VAL : (double)view->value;
        return 1;
    }
    const char *text = view->data;
    Py_ssize_t size = view->size, at = 0;
    if (size == 0) {
        *rate = 0.0;
        return 1;
    }
    /* ^%d+%.?%d* then nothing or [eE][+-]?%d+ to the end */
    while (at < size && text[at] >= '0' && text[at] <= '9') {
        at++;
    }
    if (at == 0) {
        return 0;
    }
    if (at < size && text[at] == '.') {
        at++;
    }
    while (at < size && text[at] >= '0' && text[at] <= '9') {
        at++;
    }
    if (at < size) {
        if (text[at] != 'e' && text[at] != 'E') {
            return 0;
        }
        at++;
        if (at < size && (text[at] == '+' || text[at] == '-')) {
            at++;
        }
        Py_ssize_t digits_start = at;
        while (at < size && text[at] >= '0' && text[at] <= '9') {
            at++;
        }
        if (at == digits_start || at < size) {
            return 0;
        }
    }
    char *copy = PyMem_Malloc((size_t)size + 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, text, (size_t)size);
    copy[size] = '\0';
    char *end;
    /* Locale-independent and correctly rounded; an overflow gives HUGE_VAL. */
    double value = PyOS_string_to_double(copy, &end, NULL);
    PyMem_Free(copy);
    if (value == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    *rate = value;
    return 1;
}

/* A key (or pattern, or member): str (as UTF-8) or bytes. position >= 0
 * names the item of the keys list, else what names the argument. */
static int
view_key(const char *function, const char *what, Py_ssize_t position, PyObject *object,
         const char **data, Py_ssize_t *size)
{
    if (PyBytes_Check(object)) {
        *data = PyBytes_AS_STRING(object);
        *size = PyBytes_GET_SIZE(object);
        return 0;
    }
    if (PyUnicode_Check(object)) {
        *data = PyUnicode_AsUTF8AndSize(object, size);
        return *data == NULL ? -1 : 0;
    }
    if (position >= 0) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.%s() keys[%zd] must be bytes or str, not %.100s",
                     function, position, Py_TYPE(object)->tp_name);
    }
    else {
        PyErr_Format(PyExc_TypeError, "MemoryStore.%s() %s must be bytes or str, not %.100s",
                     function, what, Py_TYPE(object)->tp_name);
    }
    return -1;
}

static int
parse_now(const char *function, PyObject *object, int64_t *now_ms)
{
    int overflow;
    if (!PyLong_Check(object) || PyBool_Check(object)) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.%s() now_ms must be int, not %.100s", function,
                     Py_TYPE(object)->tp_name);
        return -1;
    }
    long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow != 0 || value < 0 || value > MAX_NOW_MS) {
        PyErr_Format(PyExc_ValueError,
                     "MemoryStore.%s() now_ms must be a Unix time in milliseconds, "
                     "0..%lld, got %R",
                     function, MAX_NOW_MS, object);
        return -1;
    }
    *now_ms = value;
    return 0;
}

/* ---- one decision ---------------------------------------------------------- */

typedef struct {
    int fits;
    int permanent;
    int64_t remaining_uncharged;
    int64_t remaining_charged;
    int64_t reset_charged_ms;
    int64_t reset_uncharged_ms;
    int64_t retry_ms;
    int64_t reset_denied_ms;
} memory_verdict;

/* A key a policy reads, and perhaps writes. */
typedef struct {
    unsigned char *key;
    size_t key_size;
    uint64_t hash;
    memory_entry *entry;   /* the live entry as read, or NULL */
    memory_entry *fresh;   /* allocated before the writes, for a key they create */
    int create_kind;       /* what a write creates when the key is missing; 0: never */
} memory_target;

typedef struct {
    int number;            /* 1-based, as the scripts' messages count */
    const char *base;
    Py_ssize_t base_size;
    int64_t capacity_scaled;
    int64_t window_s;
    int64_t window_ms;
    /* token bucket */
    int custom_rate;
    double refill_scaled_per_s;
    int64_t per_ms_whole;
    int64_t per_ms_rest;
    memory_verdict verdict;
    memory_target targets[MAX_TARGETS];
    int target_count;
    /* what apply() writes, computed by evaluate() */
    int64_t write_value[6];
    int64_t write_expire_at_ms;
} memory_policy;

struct memory_algorithm;

typedef struct {
    const struct memory_algorithm *algorithm;
    PyObject *const *argv;
    Py_ssize_t argc;
    int64_t cost_scaled;
    int apply;
    int64_t now_ms;
    int policy_count;
    memory_policy policies[ACCEL_MAX_POLICIES];
    unsigned char *key_space;
    size_t key_space_used;
    size_t key_space_size;
    unsigned char inline_keys[INLINE_KEY_BYTES];
} memory_call;

typedef struct memory_algorithm {
    const char *name;
    int extra_fields;  /* per-policy ARGV fields after capacity_scaled and window_s */
    int (*parse_extra)(memory_call *call, memory_policy *policy, Py_ssize_t argv_index);
    /* Reads the state, decides, plans the writes; changes nothing. */
    int (*evaluate)(MemoryStore *store, memory_call *call, memory_policy *policy);
    /* Optional: allocates what the writes need beyond new entries. */
    int (*prepare)(MemoryStore *store, memory_call *call, memory_policy *policy);
    /* Writes; cannot fail. */
    void (*apply)(MemoryStore *store, memory_call *call, memory_policy *policy);
} memory_algorithm;

/* Room for every key the policies derive: the base plus a suffix each. */
static int
reserve_key_space(memory_call *call, size_t keys_per_base, const Py_ssize_t *base_sizes,
                  int bases)
{
    size_t needed = 0;
    for (int i = 0; i < bases; i++) {
        needed += keys_per_base * ((size_t)base_sizes[i] + MAX_SUFFIX_BYTES);
    }
    call->key_space_used = 0;
    if (needed <= sizeof(call->inline_keys)) {
        call->key_space = call->inline_keys;
        call->key_space_size = sizeof(call->inline_keys);
        return 0;
    }
    call->key_space = PyMem_Malloc(needed);
    if (call->key_space == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    call->key_space_size = needed;
    return 0;
}

static void
release_key_space(memory_call *call)
{
    if (call->key_space != NULL && call->key_space != call->inline_keys) {
        PyMem_Free(call->key_space);
    }
    call->key_space = NULL;
}

/* base + suffix in the call's key space. */
static unsigned char *
derive_key(memory_call *call, const char *base, Py_ssize_t base_size, const char *suffix,
           size_t suffix_size, size_t *key_size)
{
    unsigned char *key = call->key_space + call->key_space_used;
    memcpy(key, base, (size_t)base_size);
    memcpy(key + base_size, suffix, suffix_size);
    *key_size = (size_t)base_size + suffix_size;
    call->key_space_used += *key_size;
    return key;
}

/* ":<index>" as the scripts' decimal() writes it. */
static size_t
index_suffix(int64_t index, char *out)
{
    char digits[24];
    size_t count = 0;
    uint64_t magnitude = index < 0 ? (uint64_t)0 - (uint64_t)index : (uint64_t)index;
    do {
        digits[count++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    size_t at = 0;
    out[at++] = ':';
    if (index < 0) {
        out[at++] = '-';
    }
    while (count > 0) {
        out[at++] = digits[--count];
    }
    return at;
}

/* The live entry of a key, or NULL; a read counts as a use. */
static memory_entry *
find_live(MemoryStore *store, const unsigned char *key, size_t key_size, uint64_t hash,
          int64_t now_ms)
{
    memory_entry *entry = table_find(store, key, key_size, hash);
    if (entry == NULL || entry_expired(entry, now_ms)) {
        return NULL;
    }
    lru_touch(store, entry);
    return entry;
}

/* Derive the policy's next target key and look it up. */
static memory_target *
add_target(MemoryStore *store, memory_call *call, memory_policy *policy, const char *suffix,
           size_t suffix_size, int create_kind)
{
    memory_target *target = &policy->targets[policy->target_count++];
    target->key = derive_key(call, policy->base, policy->base_size, suffix, suffix_size,
                             &target->key_size);
    target->hash = store_hash(store, target->key, target->key_size);
    target->entry = find_live(store, target->key, target->key_size, target->hash, call->now_ms);
    target->fresh = NULL;
    target->create_kind = create_kind;
    return target;
}

static memory_target *
add_index_target(MemoryStore *store, memory_call *call, memory_policy *policy, int64_t index,
                 int create_kind)
{
    char suffix[MAX_SUFFIX_BYTES];
    size_t suffix_size = index_suffix(index, suffix);
    return add_target(store, call, policy, suffix, suffix_size, create_kind);
}

static PyObject *
shown_target(const memory_target *target)
{
    return shown_bytes((const char *)target->key, (Py_ssize_t)target->key_size,
                       SHOWN_KEY_BYTES);
}

static int
refuse_wrong_type(const memory_target *target)
{
    PyObject *key = shown_target(target);
    if (key == NULL) {
        return -1;
    }
    refuse("MODERATO_STATE", "key %U cannot be read: %s", key, wrongtype_error);
    Py_DECREF(key);
    return -1;
}

/* A window counter: 0 when missing; MODERATO_STATE unless 0..2^53. */
static int
read_counter(const memory_target *target, int64_t *value)
{
    const memory_entry *entry = target->entry;
    if (entry == NULL) {
        *value = 0;
        return 0;
    }
    if (entry->kind != KIND_COUNTER) {
        return refuse_wrong_type(target);
    }
    if (entry->value.counter < 0 || entry->value.counter > MAX_SAFE_INTEGER) {
        PyObject *key = shown_target(target);
        if (key == NULL) {
            return -1;
        }
        char stored[32];
        PyOS_snprintf(stored, sizeof(stored), "%lld", (long long)entry->value.counter);
        PyObject *value_shown = shown_bytes(stored, (Py_ssize_t)strlen(stored), SHOWN_ARG_BYTES);
        if (value_shown != NULL) {
            refuse("MODERATO_STATE", "key %U holds %U, not a decimal integer 0..9007199254740992",
                   key, value_shown);
            Py_DECREF(value_shown);
        }
        Py_DECREF(key);
        return -1;
    }
    *value = entry->value.counter;
    return 0;
}

/* The scripts' floor_div for numerator >= 0, denominator >= 1. */
static int64_t
floor_div(int64_t numerator, int64_t denominator)
{
    return numerator / denominator;
}

/* What Redis replies for a Lua number: truncated to a long long (x86-64
 * gives LLONG_MIN for anything out of range; so does this). */
static int64_t
lua_integer(double value)
{
    if (value >= -9223372036854775808.0 && value < 9223372036854775808.0) {
        return (int64_t)value;
    }
    return LLONG_MIN;
}

/* ---- fixed_window ----------------------------------------------------------- */

static int
fixed_window_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t window_index = floor_div(now_ms, policy->window_ms);
    int64_t window_end_ms = (window_index + 1) * policy->window_ms;
    memory_target *target = add_index_target(store, call, policy, window_index, KIND_COUNTER);
    int64_t used_scaled;
    if (read_counter(target, &used_scaled) < 0) {
        return -1;
    }
    /* A lowered capacity can leave more used than the capacity. */
    int64_t headroom_scaled = policy->capacity_scaled - used_scaled;
    memory_verdict *verdict = &policy->verdict;
    verdict->fits = cost_scaled <= headroom_scaled;
    verdict->permanent = cost_scaled > policy->capacity_scaled;
    verdict->remaining_uncharged = headroom_scaled > 0 ? headroom_scaled : 0;
    verdict->remaining_charged =
        headroom_scaled - cost_scaled > 0 ? headroom_scaled - cost_scaled : 0;
    verdict->reset_charged_ms = window_end_ms;
    verdict->reset_uncharged_ms = window_end_ms;
    verdict->retry_ms = window_end_ms - now_ms;
    verdict->reset_denied_ms = window_end_ms;
    policy->write_expire_at_ms = window_end_ms;
    return 0;
}

static memory_entry *target_entry(MemoryStore *store, memory_target *target, int64_t now_ms);

static void
fixed_window_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    /* INCRBY, then PEXPIREAT (which also repairs a lost expiry). */
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    entry->value.counter += call->cost_scaled;
    entry->expire_at_ms = policy->write_expire_at_ms;
}

/* ---- token_bucket ----------------------------------------------------------- */

static const char bucket_suffix[] = ":bucket:v2";

typedef struct {
    int64_t tokens_scaled;
    int64_t base_ms;
    int64_t credited_scaled;
    int64_t elapsed_ms;
} refilled_bucket;

/* prelude.lua's split_per_ms check: above 26 h a capacity of at most 2^53 / window keeps
 * elapsed * per_ms_rest within 2^53. capacity_argv is 1-based. */
static int
check_exact_accrual(const memory_policy *policy, Py_ssize_t capacity_argv)
{
    int64_t largest_scaled = floor_div(MAX_SAFE_INTEGER, policy->window_ms);
    if (policy->window_ms > ACCRUAL_EXACT_WINDOW_MS && policy->capacity_scaled > largest_scaled) {
        refuse("MODERATO_ARG",
               "ARGV[%zd] (capacity_scaled of policy %d) must be at most %lld for a window of "
               "%lld s (accrual stays below 2^53), got %lld",
               capacity_argv, policy->number, (long long)largest_scaled,
               (long long)policy->window_s, (long long)policy->capacity_scaled);
        return -1;
    }
    return 0;
}

static int
token_bucket_parse_extra(memory_call *call, memory_policy *policy, Py_ssize_t argv_index)
{
    arg_view view;
    double rate = 0.0;
    if (view_arg("decide", "args", argv_index, call->argv[argv_index], &view) < 0) {
        return -1;
    }
    int parsed = parse_rate_text(&view, &rate);
    if (parsed < 0) {
        return -1;
    }
    int empty = !view.is_int && view.size == 0;
    if (!empty) {
        /* The lower bound keeps a full refill within one day. */
        double lowest = (double)policy->capacity_scaled / (double)ACCEL_MAX_WINDOW_S;
        if (!parsed || rate != rate || rate >= HUGE_VAL || rate < lowest ||
            rate > (double)MAX_CAPACITY_SCALED) {
            PyObject *shown = shown_arg(&view);
            if (shown != NULL) {
                refuse("MODERATO_ARG",
                       "ARGV[%zd] (refill_scaled_per_s of policy %d) must be \"\" or a finite "
                       "number from capacity_scaled / 86400 to 9007199254000, got %U",
                       argv_index + 1, policy->number, shown);
                Py_DECREF(shown);
            }
            return -1;
        }
        policy->custom_rate = 1;
        policy->refill_scaled_per_s = rate;
    }
    if (check_exact_accrual(policy, argv_index - 1) < 0) {
        return -1;
    }
    policy->per_ms_whole = floor_div(policy->capacity_scaled, policy->window_ms);
    policy->per_ms_rest = policy->capacity_scaled - policy->per_ms_whole * policy->window_ms;
    return 0;
}

/* Exactly floor(elapsed_ms * capacity / window) for 0 <= elapsed_ms <= window:
 * capacity = per_ms_whole * window + per_ms_rest keeps both products small. */
static int64_t
public_credit_scaled(const memory_policy *policy, int64_t elapsed_ms)
{
    return elapsed_ms * policy->per_ms_whole +
           floor_div(elapsed_ms * policy->per_ms_rest, policy->window_ms);
}

/* The smallest elapsed_ms in [0, window] crediting at least target_scaled. */
static int64_t
public_elapsed_for_credit_ms(const memory_policy *policy, int64_t target_scaled)
{
    int64_t window_ms = policy->window_ms;
    double estimate =
        ceil((double)target_scaled / (double)policy->capacity_scaled * (double)window_ms);
    int64_t elapsed_ms = estimate > 0.0 ? (estimate < (double)window_ms ? (int64_t)estimate
                                                                         : window_ms)
                                        : 0;
    while (elapsed_ms < window_ms && public_credit_scaled(policy, elapsed_ms) < target_scaled) {
        elapsed_ms++;
    }
    while (elapsed_ms > 0 && public_credit_scaled(policy, elapsed_ms - 1) >= target_scaled) {
        elapsed_ms--;
    }
    return elapsed_ms;
}

/* Floating point by design, the script's operations in the script's order. */
static double
custom_credit_scaled(const memory_policy *policy, double elapsed_ms)
{
    return floor(elapsed_ms * policy->refill_scaled_per_s / 1000.0);
}

static int
refuse_bucket_state(const unsigned char *key, size_t key_size, const char *format)
{
    PyObject *shown = shown_bytes((const char *)key, (Py_ssize_t)key_size, SHOWN_KEY_BYTES);
    if (shown != NULL) {
        refuse("MODERATO_STATE", format, shown);
        Py_DECREF(shown);
    }
    return -1;
}

/* A bucket as stored: tokens (or capacity - level), base, credited (or drained). */
typedef struct {
    int64_t tokens_scaled;
    int64_t base_ms;
    int64_t credited_scaled;
} stored_bucket;

/* The stored bucket brought up to now (the scripts' refill()). bucket is
 * NULL for a missing one; key names the bucket in an error. */
static int
refill(const memory_policy *policy, const stored_bucket *bucket, int64_t now_ms,
       const unsigned char *key, size_t key_size, refilled_bucket *out)
{
    int64_t capacity_scaled = policy->capacity_scaled;
    if (bucket == NULL) {
        *out = (refilled_bucket){capacity_scaled, now_ms, 0, 0};
        return 0;
    }
    /* A base ahead of the clock means no time has passed yet. */
    int64_t now_eff_ms = now_ms > bucket->base_ms ? now_ms : bucket->base_ms;
    int64_t base_ms = bucket->base_ms;
    int64_t elapsed_ms = now_eff_ms - base_ms;
    int64_t tokens_scaled =
        bucket->tokens_scaled < capacity_scaled ? bucket->tokens_scaled : capacity_scaled;
    int64_t credited_scaled = bucket->credited_scaled;
    int full;

    if (policy->custom_rate) {
        double due_scaled = custom_credit_scaled(policy, (double)elapsed_ms);
        if (due_scaled < (double)credited_scaled) {
            base_ms = now_eff_ms;
            credited_scaled = 0;
            elapsed_ms = 0;
            full = tokens_scaled >= capacity_scaled;
        }
        else {
            full = due_scaled - (double)credited_scaled >= (double)(capacity_scaled - tokens_scaled);
            if (!full) {
                if (due_scaled > (double)MAX_SAFE_INTEGER) {
                    return refuse_bucket_state(
                        key, key_size,
                        "custom refill accrual of %U passed 2^53 scaled units without the "
                        "bucket filling up; reset the key");
                }
                tokens_scaled += (int64_t)due_scaled - credited_scaled;
                credited_scaled = (int64_t)due_scaled;
            }
        }
    }
    else {
        int64_t window_ms = policy->window_ms;
        int64_t whole_windows = floor_div(elapsed_ms, window_ms);
        int64_t due_scaled = whole_windows == 0 ? public_credit_scaled(policy, elapsed_ms) : 0;
        if (credited_scaled >= capacity_scaled ||
            (whole_windows == 0 && due_scaled < credited_scaled)) {
            /* Written under another capacity, or the clock stepped back. */
            base_ms = now_eff_ms;
            credited_scaled = 0;
            elapsed_ms = 0;
            full = tokens_scaled >= capacity_scaled;
        }
        else if (whole_windows >= 2) {
            full = 1;
        }
        else if (whole_windows == 1) {
            int64_t credit_in_window_scaled = public_credit_scaled(policy, elapsed_ms - window_ms);
            full = tokens_scaled >= credited_scaled - credit_in_window_scaled;
            if (!full) {
                tokens_scaled += credit_in_window_scaled + (capacity_scaled - credited_scaled);
                base_ms += window_ms;
                elapsed_ms -= window_ms;
                credited_scaled = credit_in_window_scaled;
            }
        }
        else {
            full = due_scaled - credited_scaled >= capacity_scaled - tokens_scaled;
            if (!full) {
                tokens_scaled += due_scaled - credited_scaled;
                credited_scaled = due_scaled;
            }
        }
    }
    if (full) {
        /* A full bucket discards idle credit, fractions too. */
        *out = (refilled_bucket){capacity_scaled, now_eff_ms, 0, 0};
        return 0;
    }
    *out = (refilled_bucket){tokens_scaled, base_ms, credited_scaled, elapsed_ms};
    return 0;
}

/* When (a Unix time in ms, as the script's number) need_scaled more units
 * have been credited. */
static int
bucket_reset_at(const memory_policy *policy, const refilled_bucket *bucket, int64_t need_scaled,
                const memory_target *target, double *reset_at_ms)
{
    int64_t capacity_scaled = policy->capacity_scaled;
    if (!policy->custom_rate) {
        int64_t left_in_window_scaled = capacity_scaled - bucket->credited_scaled;
        int64_t wait_ms =
            need_scaled <= left_in_window_scaled
                ? public_elapsed_for_credit_ms(policy, bucket->credited_scaled + need_scaled)
                : policy->window_ms +
                      public_elapsed_for_credit_ms(policy, need_scaled - left_in_window_scaled);
        *reset_at_ms = (double)(bucket->base_ms + wait_ms);
        return 0;
    }
    double target_scaled = (double)bucket->credited_scaled + (double)need_scaled;
    double elapsed_ms = (double)bucket->elapsed_ms;
    double estimate_ms = ceil(target_scaled * 1000.0 / policy->refill_scaled_per_s);
    double wait_end_ms = estimate_ms > elapsed_ms ? estimate_ms : elapsed_ms;
    int steps = 0;
    while (custom_credit_scaled(policy, wait_end_ms) < target_scaled) {
        if (++steps > MAX_SEARCH_STEPS) {
            goto diverged;
        }
        wait_end_ms = wait_end_ms + 1.0;
    }
    while (wait_end_ms > elapsed_ms &&
           custom_credit_scaled(policy, wait_end_ms - 1.0) >= target_scaled) {
        if (++steps > MAX_SEARCH_STEPS) {
            goto diverged;
        }
        wait_end_ms = wait_end_ms - 1.0;
    }
    *reset_at_ms = (double)bucket->base_ms + wait_end_ms;
    return 0;
diverged:
    return refuse_bucket_state(target->key, target->key_size,
                               "custom refill wait did not converge for %U");
}

/* Twice the longer of the window and a full refill, plus a margin. */
static double
bucket_ttl_ms(const memory_policy *policy)
{
    double full_refill_ms = (double)policy->window_ms;
    if (policy->custom_rate) {
        double refill_ms =
            ceil((double)policy->capacity_scaled * 1000.0 / policy->refill_scaled_per_s);
        full_refill_ms = refill_ms > full_refill_ms ? refill_ms : full_refill_ms;
    }
    return 2.0 * full_refill_ms + (double)EXPIRY_MARGIN_MS;
}

/* ---- the hashes, read as HMGET reads them ---------------------------------- */

typedef struct {
    int kind;
    int field_count;
    const char *const *names;
    const char *listed; /* "a, b and c", for a hash holding none of them */
} hash_layout;

static const char *const bucket_names[] = {"tokens", "base", "credited"};
static const char *const gcra_names[] = {"tat", "frac"};
static const char *const leaky_names[] = {"level", "base", "drained"};

static const hash_layout hash_layouts[] = {
    {KIND_BUCKET, 3, bucket_names, "tokens, base and credited"},
    {KIND_GCRA, 2, gcra_names, "tat and frac"},
    {KIND_LEAKY, 3, leaky_names, "level, base and drained"},
};

#define HASH_LAYOUT_COUNT ((int)(sizeof(hash_layouts) / sizeof(hash_layouts[0])))

static const hash_layout *
layout_of(int kind)
{
    for (int i = 0; i < HASH_LAYOUT_COUNT; i++) {
        if (hash_layouts[i].kind == kind) {
            return &hash_layouts[i];
        }
    }
    return NULL;
}

static const int64_t *
hash_fields(const memory_entry *entry)
{
    switch (entry->kind) {
    case KIND_BUCKET:
        return entry->value.bucket.field;
    case KIND_GCRA:
        return entry->value.gcra.field;
    default:
        return entry->value.leaky.field;
    }
}

/* The field of that name of a hash entry, as HMGET finds it; 0 if absent. */
static int
hash_get(const memory_entry *entry, const char *name, int64_t *value)
{
    const hash_layout *layout = layout_of(entry->kind);
    for (int i = 0; i < layout->field_count; i++) {
        if (strcmp(layout->names[i], name) == 0) {
            *value = hash_fields(entry)[i];
            return 1;
        }
    }
    return 0;
}

/* The scripts' hash reads: HMGET of the kind's fields, each an integer
 * 0..highs[i]; *present = 0 for a missing key. MODERATO_STATE for a key of
 * another type, a hash holding none of the fields, or a bad field. */
static int
read_hash(const memory_target *target, int kind, const long long *highs, int64_t *values,
          int *present)
{
    const memory_entry *entry = target->entry;
    const hash_layout *layout = layout_of(kind);
    *present = 0;
    if (entry == NULL) {
        return 0;
    }
    if (layout_of(entry->kind) == NULL) {
        return refuse_wrong_type(target);
    }
    int found[3], any = 0;
    for (int i = 0; i < layout->field_count; i++) {
        found[i] = hash_get(entry, layout->names[i], &values[i]);
        any |= found[i];
    }
    if (!any) {
        return refuse_bucket_state(target->key, target->key_size, layout->kind == KIND_BUCKET
                                       ? "key %U holds a hash without tokens, base and credited"
                                   : layout->kind == KIND_GCRA
                                       ? "key %U holds a hash without tat and frac"
                                       : "key %U holds a hash without level, base and drained");
    }
    for (int i = 0; i < layout->field_count; i++) {
        if (found[i] && values[i] >= 0 && values[i] <= highs[i]) {
            continue;
        }
        PyObject *key = shown_target(target), *value = NULL;
        if (key != NULL && found[i]) {
            char stored[32];
            PyOS_snprintf(stored, sizeof(stored), "%lld", (long long)values[i]);
            value = shown_bytes(stored, (Py_ssize_t)strlen(stored), SHOWN_ARG_BYTES);
        }
        else if (key != NULL) {
            value = PyUnicode_FromString("missing");
        }
        if (value != NULL) {
            refuse("MODERATO_STATE", "field %s of key %U is %U, not a decimal integer 0..%lld",
                   layout->names[i], key, value, highs[i]);
        }
        Py_XDECREF(value);
        Py_XDECREF(key);
        return -1;
    }
    *present = 1;
    return 0;
}

/* ---- the token bucket's verdict (token_bucket, leaky_bucket) ---------------- */

/* The verdict of a bucket; the refilled bucket, for the write. */
static int
bucket_verdict(memory_call *call, memory_policy *policy, const memory_target *target,
               const stored_bucket *stored, refilled_bucket *bucket)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t capacity_scaled = policy->capacity_scaled;
    if (refill(policy, stored, now_ms, target->key, target->key_size, bucket) < 0) {
        return -1;
    }
    memory_verdict *verdict = &policy->verdict;
    int64_t tokens_scaled = bucket->tokens_scaled;
    verdict->fits = cost_scaled <= tokens_scaled;
    verdict->permanent = cost_scaled > capacity_scaled;
    verdict->remaining_uncharged = tokens_scaled;
    double reset_ms;
    if (verdict->fits) {
        /* Allowed: reset is the full-refill time, with or without this charge. */
        verdict->remaining_charged = tokens_scaled - cost_scaled;
        if (bucket_reset_at(policy, bucket, capacity_scaled - tokens_scaled + cost_scaled, target,
                            &reset_ms) < 0) {
            return -1;
        }
        verdict->reset_charged_ms = lua_integer(reset_ms);
        if (bucket_reset_at(policy, bucket, capacity_scaled - tokens_scaled, target, &reset_ms) <
            0) {
            return -1;
        }
        verdict->reset_uncharged_ms = lua_integer(reset_ms);
    }
    else if (!verdict->permanent) {
        /* Denied: reset is when this cost fits, assuming no other traffic. */
        if (bucket_reset_at(policy, bucket, cost_scaled - tokens_scaled, target, &reset_ms) < 0) {
            return -1;
        }
        verdict->reset_denied_ms = lua_integer(reset_ms);
        verdict->retry_ms = lua_integer(reset_ms - (double)now_ms);
    }
    return 0;
}

static const long long bucket_highs[3] = {MAX_SAFE_INTEGER, MAX_STATE_TIME_MS, MAX_SAFE_INTEGER};

static int
token_bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    memory_target *target =
        add_target(store, call, policy, bucket_suffix, sizeof(bucket_suffix) - 1, KIND_BUCKET);
    int64_t fields[3];
    int present;
    refilled_bucket bucket;
    if (read_hash(target, KIND_BUCKET, bucket_highs, fields, &present) < 0) {
        return -1;
    }
    stored_bucket stored = {fields[BUCKET_TOKENS], fields[BUCKET_BASE], fields[BUCKET_CREDITED]};
    if (bucket_verdict(call, policy, target, present ? &stored : NULL, &bucket) < 0) {
        return -1;
    }
    policy->write_value[0] = bucket.tokens_scaled - call->cost_scaled;
    policy->write_value[1] = bucket.base_ms;
    policy->write_value[2] = bucket.credited_scaled;
    policy->write_expire_at_ms = lua_integer((double)call->now_ms + bucket_ttl_ms(policy));
    return 0;
}

static void
token_bucket_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    /* HSET tokens base credited, then PEXPIREAT now + ttl. */
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    bucket_value *bucket = &entry->value.bucket;
    for (int i = 0; i < 3; i++) {
        bucket->field[i] = policy->write_value[i];
    }
    bucket->capacity_scaled = policy->capacity_scaled;
    bucket->window_ms = policy->window_ms;
    bucket->refill_scaled_per_s = policy->custom_rate ? policy->refill_scaled_per_s : 0.0;
    entry->expire_at_ms = policy->write_expire_at_ms;
}

/* Whether the bucket decides exactly as a missing one would under the
 * policy it was last written with: full by now, its base not ahead. */
static int
bucket_idle_full(const memory_entry *entry, int64_t now_ms)
{
    const bucket_value *bucket = &entry->value.bucket;
    memory_policy policy;
    refilled_bucket refilled;
    for (int i = 0; i < 3; i++) {
        if (bucket->field[i] < 0 || bucket->field[i] > bucket_highs[i]) {
            return 0; /* a bucket the scripts refuse is kept for them to refuse */
        }
    }
    if (bucket->capacity_scaled <= 0 || bucket->window_ms <= 0) {
        return 0;
    }
    memset(&policy, 0, sizeof(policy));
    policy.capacity_scaled = bucket->capacity_scaled;
    policy.window_ms = bucket->window_ms;
    policy.custom_rate = bucket->refill_scaled_per_s > 0.0;
    policy.refill_scaled_per_s = bucket->refill_scaled_per_s;
    policy.per_ms_whole = floor_div(policy.capacity_scaled, policy.window_ms);
    policy.per_ms_rest = policy.capacity_scaled - policy.per_ms_whole * policy.window_ms;
    stored_bucket stored = {bucket->field[BUCKET_TOKENS], bucket->field[BUCKET_BASE],
                            bucket->field[BUCKET_CREDITED]};
    if (refill(&policy, &stored, now_ms, entry_key(entry), entry->key_size, &refilled) < 0) {
        PyErr_Clear();
        return 0;
    }
    return refilled.tokens_scaled == policy.capacity_scaled && refilled.base_ms == now_ms &&
           refilled.credited_scaled == 0;
}

/* ---- leaky_bucket ------------------------------------------------------------- */
/* The token bucket's dual, tokens = capacity - level, with the public accrual. */

static const char leaky_suffix[] = ":leaky";

static int
leaky_bucket_parse_extra(memory_call *Py_UNUSED(call), memory_policy *policy,
                         Py_ssize_t argv_index)
{
    if (check_exact_accrual(policy, argv_index - 1) < 0) {
        return -1;
    }
    policy->per_ms_whole = floor_div(policy->capacity_scaled, policy->window_ms);
    policy->per_ms_rest = policy->capacity_scaled - policy->per_ms_whole * policy->window_ms;
    return 0;
}

static int
leaky_bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t capacity_scaled = policy->capacity_scaled;
    memory_target *target =
        add_target(store, call, policy, leaky_suffix, sizeof(leaky_suffix) - 1, KIND_LEAKY);
    int64_t fields[3];
    int present;
    refilled_bucket bucket;
    if (read_hash(target, KIND_LEAKY, bucket_highs, fields, &present) < 0) {
        return -1;
    }
    /* A level above capacity (capacity lowered on a live key) reads as full. */
    int64_t level_scaled =
        fields[LEAKY_LEVEL] < capacity_scaled ? fields[LEAKY_LEVEL] : capacity_scaled;
    stored_bucket stored = {capacity_scaled - level_scaled, fields[LEAKY_BASE],
                            fields[LEAKY_DRAINED]};
    if (bucket_verdict(call, policy, target, present ? &stored : NULL, &bucket) < 0) {
        return -1;
    }
    policy->write_value[0] = capacity_scaled - bucket.tokens_scaled + call->cost_scaled;
    policy->write_value[1] = bucket.base_ms;
    policy->write_value[2] = bucket.credited_scaled;
    /* Allowed: reset_charged_ms is when the level has drained to zero. */
    policy->write_expire_at_ms = policy->verdict.reset_charged_ms + DRAINED_EXPIRY_MARGIN_MS;
    return 0;
}

static void
leaky_bucket_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    for (int i = 0; i < 3; i++) {
        entry->value.leaky.field[i] = policy->write_value[i];
    }
    entry->expire_at_ms = policy->write_expire_at_ms;
}

/* ---- gcra ------------------------------------------------------------------------ */
/* The theoretical arrival time (TAT) in whole us plus frac / capacity of a us. */

static const char gcra_suffix[] = ":gcra";

/* floor(a * b / m) and (a * b) mod m, exactly, for 0 <= a <= m < 2^44 and
 * 0 <= b < 2^53: b in base-256 digits keeps every partial below 2^53. */
static void
mul_div_mod(int64_t a, int64_t b, int64_t m, int64_t *quotient, int64_t *remainder)
{
    if (a == m) {
        *quotient = b;
        *remainder = 0;
        return;
    }
    unsigned int digits[8];
    int count = 0;
    for (uint64_t rest = (uint64_t)b; rest > 0; rest /= 256) {
        digits[count++] = (unsigned int)(rest % 256);
    }
    uint64_t q = 0, r = 0;
    for (int i = count - 1; i >= 0; i--) {
        uint64_t partial = r * 256 + (uint64_t)a * digits[i];
        r = partial % (uint64_t)m;
        q = q * 256 + partial / (uint64_t)m;
    }
    *quotient = (int64_t)q;
    *remainder = (int64_t)r;
}

/* The first whole millisecond at or after us + frac / capacity. */
static int64_t
ceil_ms(int64_t us, int64_t frac)
{
    return (us + (frac > 0 ? 1 : 0) + US_PER_MS - 1) / US_PER_MS;
}

/* gcra.lua's window bound: a TAT reaches now + 2 windows in µs, below 2^53 until MAX_NOW_MS. */
static int
gcra_parse_extra(memory_call *Py_UNUSED(call), memory_policy *policy, Py_ssize_t argv_index)
{
    if (policy->window_s > MAX_GCRA_WINDOW_S) {
        refuse("MODERATO_ARG",
               "ARGV[%zd] (window_s of policy %d) must be at most %lld for gcra (its microsecond "
               "times stay below 2^53), got %lld",
               argv_index, policy->number, MAX_GCRA_WINDOW_S, (long long)policy->window_s);
        return -1;
    }
    return 0;
}

static int
gcra_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    static const long long highs[2] = {MAX_SAFE_INTEGER, MAX_SAFE_INTEGER};
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t capacity_scaled = policy->capacity_scaled;
    int64_t window_us = policy->window_ms * US_PER_MS;
    int64_t now_us = now_ms * US_PER_MS;
    memory_target *target =
        add_target(store, call, policy, gcra_suffix, sizeof(gcra_suffix) - 1, KIND_GCRA);
    int64_t fields[2];
    int present;
    if (read_hash(target, KIND_GCRA, highs, fields, &present) < 0) {
        return -1;
    }
    /* start = max(TAT, now), at most now + W. */
    int64_t start_us = now_us, start_frac = 0;
    if (present) {
        int64_t tat_us = fields[GCRA_TAT], tat_frac = fields[GCRA_FRAC];
        if (tat_us >= now_us + window_us) {
            start_us = now_us + window_us; /* more than a full bucket: the clock stepped back */
        }
        else {
            if (tat_frac >= capacity_scaled) {
                tat_us += 1;
                tat_frac = 0;
            }
            if (tat_us >= now_us) {
                start_us = tat_us;
                start_frac = tat_frac;
            }
        }
    }
    /* Scaled units in the bucket, rounded up: ceil(((start - now) * C + frac) / W). */
    int64_t backlog_quotient, backlog_remainder;
    mul_div_mod(start_us - now_us, capacity_scaled, window_us, &backlog_quotient,
                &backlog_remainder);
    int64_t level_scaled =
        backlog_quotient + (backlog_remainder + start_frac + window_us - 1) / window_us;
    int64_t remaining_scaled = capacity_scaled - level_scaled;
    memory_verdict *verdict = &policy->verdict;
    verdict->fits = cost_scaled <= remaining_scaled;
    verdict->permanent = cost_scaled > capacity_scaled;
    verdict->remaining_uncharged = remaining_scaled;
    verdict->reset_uncharged_ms = ceil_ms(start_us, start_frac);
    if (verdict->permanent) {
        return 0;
    }
    /* new TAT = start + c * W / C, exactly. */
    int64_t step_us, step_frac;
    mul_div_mod(cost_scaled, window_us, capacity_scaled, &step_us, &step_frac);
    int64_t new_us = start_us + step_us, new_frac = start_frac + step_frac;
    if (new_frac >= capacity_scaled) {
        new_us += 1;
        new_frac -= capacity_scaled;
    }
    if (verdict->fits) {
        verdict->remaining_charged = remaining_scaled - cost_scaled;
        verdict->reset_charged_ms = ceil_ms(new_us, new_frac);
        policy->write_value[GCRA_TAT] = new_us;
        policy->write_value[GCRA_FRAC] = new_frac;
        policy->write_expire_at_ms = verdict->reset_charged_ms + DRAINED_EXPIRY_MARGIN_MS;
    }
    else {
        /* The cost fits once the new TAT is no more than a window ahead. */
        verdict->reset_denied_ms = ceil_ms(new_us - window_us, new_frac);
        verdict->retry_ms = verdict->reset_denied_ms - now_ms;
    }
    return 0;
}

static void
gcra_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    entry->value.gcra.field[GCRA_TAT] = policy->write_value[GCRA_TAT];
    entry->value.gcra.field[GCRA_FRAC] = policy->write_value[GCRA_FRAC];
    entry->expire_at_ms = policy->write_expire_at_ms;
}

/* ---- sliding_window --------------------------------------------------------- */

static int64_t
previous_weight_permille(int64_t window_s, int64_t elapsed_s)
{
    return floor_div((window_s - elapsed_s) * 1000, window_s);
}

/* floor(count * weight / 1000), exactly, for any count up to 2^53. */
static int64_t
weighted_scaled(int64_t count_scaled, int64_t weight_permille)
{
    int64_t thousands = floor_div(count_scaled, 1000);
    int64_t rest = count_scaled - thousands * 1000;
    return thousands * weight_permille + floor_div(rest * weight_permille, 1000);
}

/* The smallest second in [first_s, last_s] at which previous_scaled,
 * weighted for it, stays within budget_scaled; -1 if none. */
static int64_t
first_fitting_second(int64_t previous_scaled, int64_t budget_scaled, int64_t window_s,
                     int64_t first_s, int64_t last_s)
{
#define FITS_AT(second) \
    (weighted_scaled(previous_scaled, previous_weight_permille(window_s, (second))) <= budget_scaled)
    if (budget_scaled < 0 || first_s > last_s || !FITS_AT(last_s)) {
        return -1;
    }
    while (first_s < last_s) {
        int64_t middle_s = floor_div(first_s + last_s, 2);
        if (FITS_AT(middle_s)) {
            last_s = middle_s;
        }
        else {
            first_s = middle_s + 1;
        }
    }
    return first_s;
#undef FITS_AT
}

static int64_t
sliding_retry_at_ms(const memory_policy *policy, int64_t cost_scaled, int64_t window_index,
                    int64_t elapsed_s, int64_t previous_scaled, int64_t current_scaled)
{
    int64_t window_s = policy->window_s, window_ms = policy->window_ms;
    int64_t window_start_ms = window_index * window_ms;
    int64_t budget_scaled = policy->capacity_scaled - cost_scaled;
    int64_t second = first_fitting_second(previous_scaled, budget_scaled - current_scaled,
                                          window_s, elapsed_s + 1, window_s - 1);
    if (second >= 0) {
        return window_start_ms + second * 1000;
    }
    second = first_fitting_second(current_scaled, budget_scaled, window_s, 0, window_s - 1);
    if (second >= 0) {
        return window_start_ms + window_ms + second * 1000;
    }
    return window_start_ms + 2 * window_ms;
}

static int
sliding_window_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t window_s = policy->window_s, window_ms = policy->window_ms;
    int64_t window_index = floor_div(now_ms, window_ms);
    int64_t window_start_ms = window_index * window_ms;
    int64_t elapsed_s = floor_div(now_ms - window_start_ms, 1000);
    memory_target *current =
        add_index_target(store, call, policy, window_index, KIND_COUNTER);
    memory_target *previous = add_index_target(store, call, policy, window_index - 1, 0);
    int64_t current_scaled, previous_scaled;
    if (read_counter(current, &current_scaled) < 0 ||
        read_counter(previous, &previous_scaled) < 0) {
        return -1;
    }
    int64_t weighted_previous_scaled =
        weighted_scaled(previous_scaled, previous_weight_permille(window_s, elapsed_s));
    int64_t headroom_scaled = (policy->capacity_scaled - current_scaled) - weighted_previous_scaled;
    int64_t window_end_ms = window_start_ms + window_ms;
    memory_verdict *verdict = &policy->verdict;
    verdict->fits = cost_scaled <= headroom_scaled;
    verdict->permanent = cost_scaled > policy->capacity_scaled;
    verdict->remaining_uncharged = headroom_scaled > 0 ? headroom_scaled : 0;
    verdict->remaining_charged =
        headroom_scaled - cost_scaled > 0 ? headroom_scaled - cost_scaled : 0;
    verdict->reset_charged_ms = window_end_ms;
    verdict->reset_uncharged_ms = window_end_ms;
    if (!verdict->fits && !verdict->permanent) {
        verdict->reset_denied_ms = sliding_retry_at_ms(policy, cost_scaled, window_index,
                                                       elapsed_s, previous_scaled, current_scaled);
        verdict->retry_ms = verdict->reset_denied_ms - now_ms;
    }
    policy->write_expire_at_ms = window_end_ms;
    return 0;
}

static void
sliding_window_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t window_end_ms = policy->write_expire_at_ms;
    memory_entry *current = target_entry(store, &policy->targets[0], call->now_ms);
    current->value.counter += call->cost_scaled;
    /* Read as the previous counter until the end of the next window. */
    current->expire_at_ms = window_end_ms + policy->window_ms;
    memory_target *previous = &policy->targets[1];
    memory_entry *entry =
        find_live(store, previous->key, previous->key_size, previous->hash, call->now_ms);
    if (entry != NULL && entry->expire_at_ms == NO_EXPIRY) {
        entry->expire_at_ms = window_end_ms;
    }
}

/* ---- sliding_log -------------------------------------------------------------- */
/* A sorted set of admissions "<16-digit running total>:<cost>" scored with
 * their instant; usage is the newest total minus the total before the
 * first entry in the window. */

static const char log_suffix[] = ":log";

#define LOG_TEXT_BYTES 48 /* 16 digits, ":", a 64-bit cost */

typedef struct {
    int64_t at_ms;
    int64_t total_scaled;
    int64_t cost_scaled;
} log_entry;

enum { LOG_STAMP, LOG_TOTAL, LOG_RENUMBER, LOG_BASE_TOTAL, LOG_CUTOFF, LOG_KEPT };

static log_item *
log_at(const log_value *log, size_t rank)
{
    return &log->items[log->start + rank];
}

/* The member's text: the canonical one, written into buffer, or as loaded. */
static const char *
log_member_text(const log_item *item, char *buffer, size_t *size)
{
    if (item->text != NULL) {
        memcpy(size, item->text, sizeof(size_t));
        return item->text + sizeof(size_t);
    }
    *size = (size_t)PyOS_snprintf(buffer, LOG_TEXT_BYTES, "%016lld:%lld",
                                  (long long)item->total_scaled, (long long)item->cost_scaled);
    return buffer;
}

/* Redis's order: by score, then by member bytes. */
static int
log_compare(const log_item *a, const log_item *b)
{
    if (a->at_ms != b->at_ms) {
        return a->at_ms < b->at_ms ? -1 : 1;
    }
    if (a->text == NULL && b->text == NULL && a->total_scaled != b->total_scaled) {
        return a->total_scaled < b->total_scaled ? -1 : 1; /* 16 digits each */
    }
    char a_buffer[LOG_TEXT_BYTES], b_buffer[LOG_TEXT_BYTES];
    size_t a_size, b_size;
    const char *a_text = log_member_text(a, a_buffer, &a_size);
    const char *b_text = log_member_text(b, b_buffer, &b_size);
    int order = memcmp(a_text, b_text, a_size < b_size ? a_size : b_size);
    if (order != 0) {
        return order < 0 ? -1 : 1;
    }
    return a_size < b_size ? -1 : (a_size > b_size ? 1 : 0);
}

static int
log_compare_items(const void *a, const void *b)
{
    return log_compare((const log_item *)a, (const log_item *)b);
}

static int
log_same_member(const log_item *a, const log_item *b)
{
    char a_buffer[LOG_TEXT_BYTES], b_buffer[LOG_TEXT_BYTES];
    size_t a_size, b_size;
    const char *a_text = log_member_text(a, a_buffer, &a_size);
    const char *b_text = log_member_text(b, b_buffer, &b_size);
    return a_size == b_size && memcmp(a_text, b_text, a_size) == 0;
}

static int
log_is_regular(const log_value *log)
{
    for (size_t i = 0; i < log->count; i++) {
        const log_item *item = log_at(log, i);
        if (item->text != NULL ||
            (i > 0 && item->total_scaled <= log_at(log, i - 1)->total_scaled)) {
            return 0;
        }
    }
    return 1;
}

/* ZCOUNT key -inf cutoff: the members scored at or before it. */
static size_t
log_count_at_or_before(const log_value *log, int64_t cutoff_ms)
{
    size_t low = 0, high = log->count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (log_at(log, middle)->at_ms <= cutoff_ms) {
            low = middle + 1;
        }
        else {
            high = middle;
        }
    }
    return low;
}

/* A text slice as the scripts' parse_integer reads it. */
static int
parse_digits(const char *data, size_t size, long long low, long long high, long long *value)
{
    arg_view view = {NULL, data, (Py_ssize_t)size, 0, 0, 0};
    return parse_integer(&view, low, high, value);
}

/* The scripts' parse_entry: the member and score at a rank, validated. */
static int
log_parse(const memory_target *target, const log_item *item, log_entry *entry)
{
    char buffer[LOG_TEXT_BYTES];
    size_t size, colon = 0, end;
    const char *text = log_member_text(item, buffer, &size);
    while (colon < size && text[colon] >= '0' && text[colon] <= '9') {
        colon++;
    }
    for (end = colon + 1; end < size && text[end] >= '0' && text[end] <= '9'; end++) {
    }
    int matched = colon > 0 && colon < size && text[colon] == ':' && end > colon + 1 && end == size;
    arg_view score = {NULL, NULL, 0, 1, item->at_ms < 0 ? -1 : 0, item->at_ms};
    long long at_ms = 0, total = 0, cost = 0;
    int at_ok = parse_integer(&score, 0, MAX_STATE_TIME_MS, &at_ms);
    int total_ok = matched && colon == LOG_TOTAL_DIGITS &&
                   parse_digits(text, colon, 1, MAX_SAFE_INTEGER, &total);
    int cost_ok = matched &&
                  parse_digits(text + colon + 1, size - colon - 1, 1, MAX_SAFE_INTEGER, &cost);
    if (at_ok && total_ok && cost_ok && cost <= total) {
        *entry = (log_entry){at_ms, total, cost};
        return 0;
    }
    char score_text[32];
    PyOS_snprintf(score_text, sizeof(score_text), "%lld", (long long)item->at_ms);
    PyObject *key = shown_target(target);
    PyObject *member = key == NULL ? NULL : shown_bytes(text, (Py_ssize_t)size, SHOWN_ARG_BYTES);
    PyObject *at = member == NULL ? NULL
                                  : shown_bytes(score_text, (Py_ssize_t)strlen(score_text),
                                                SHOWN_ARG_BYTES);
    if (at != NULL) {
        refuse("MODERATO_STATE",
               "log %U holds member %U at %U, not \"<16-digit total>:<cost>\" "
               "(1 <= cost <= total <= 2^53) at an integer ms 0..%lld",
               key, member, at, MAX_STATE_TIME_MS);
    }
    Py_XDECREF(at);
    Py_XDECREF(member);
    Py_XDECREF(key);
    return -1;
}

static int
sliding_log_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t capacity_scaled = policy->capacity_scaled, window_ms = policy->window_ms;
    int64_t cutoff_ms = now_ms - window_ms; /* entries at or before it have left the window */
    memory_target *target =
        add_target(store, call, policy, log_suffix, sizeof(log_suffix) - 1, KIND_LOG);
    const log_value *log = NULL;
    if (target->entry != NULL) {
        if (target->entry->kind != KIND_LOG) {
            return refuse_wrong_type(target);
        }
        log = &target->entry->value.log;
    }
    size_t count = log != NULL ? log->count : 0;
    log_entry newest = {0, 0, 0}, first = {0, 0, 0};
    int have_first = 0;
    size_t first_rank = 0;
    int64_t base_total_scaled = 0, usage_scaled = 0;
    if (count > 0 && log_parse(target, log_at(log, count - 1), &newest) < 0) {
        return -1;
    }
    if (count > 0 && newest.at_ms > cutoff_ms) {
        first_rank = log_count_at_or_before(log, cutoff_ms);
        if (log_parse(target, log_at(log, first_rank), &first) < 0) {
            return -1;
        }
        have_first = 1;
        /* Everything up to the first entry in the window, in running-total terms. */
        base_total_scaled = first.total_scaled - first.cost_scaled;
        if (newest.total_scaled < first.total_scaled) {
            PyObject *key = shown_target(target);
            if (key != NULL) {
                refuse("MODERATO_STATE",
                       "log %U: the newest running total %lld is below the oldest in the "
                       "window, %lld",
                       key, (long long)newest.total_scaled, (long long)first.total_scaled);
                Py_DECREF(key);
            }
            return -1;
        }
        usage_scaled = newest.total_scaled - base_total_scaled;
    }
    /* A clock that stepped back never reorders the log. */
    int64_t stamp_ms = count > 0 && newest.at_ms > now_ms ? newest.at_ms : now_ms;
    int64_t headroom_scaled = capacity_scaled - usage_scaled;
    memory_verdict *verdict = &policy->verdict;
    verdict->fits = cost_scaled <= headroom_scaled;
    verdict->permanent = cost_scaled > capacity_scaled;
    verdict->remaining_uncharged = headroom_scaled > 0 ? headroom_scaled : 0;
    verdict->remaining_charged =
        headroom_scaled - cost_scaled > 0 ? headroom_scaled - cost_scaled : 0;
    verdict->reset_uncharged_ms = have_first ? newest.at_ms + window_ms : now_ms;
    /* Allowed: full recovery once the newest entry has left the window (a usage
     * read, of cost 0, adds none). */
    verdict->reset_charged_ms =
        cost_scaled > 0 ? stamp_ms + window_ms : verdict->reset_uncharged_ms;

    if (!verdict->fits && !verdict->permanent) {
        /* The first entry (by rank) whose leaving frees need: totals rise with rank. */
        int64_t need_scaled = cost_scaled - headroom_scaled;
        size_t newest_rank = count - 1, low = first_rank, high = newest_rank;
        while (low < high) {
            size_t middle = (low + high) / 2;
            log_entry entry;
            if (log_parse(target, log_at(log, middle), &entry) < 0) {
                return -1;
            }
            if (entry.total_scaled - base_total_scaled >= need_scaled) {
                high = middle;
            }
            else {
                low = middle + 1;
            }
        }
        log_entry leaving = newest;
        if (low != newest_rank && log_parse(target, log_at(log, low), &leaving) < 0) {
            return -1;
        }
        verdict->reset_denied_ms = leaving.at_ms + window_ms;
        verdict->retry_ms = verdict->reset_denied_ms - now_ms;
        return 0;
    }
    if (!verdict->fits) {
        return 0;
    }
    int64_t total_scaled = have_first ? newest.total_scaled + cost_scaled : cost_scaled;
    int renumber = have_first && cost_scaled > MAX_SAFE_INTEGER - newest.total_scaled;
    if (renumber) {
        /* The running total would pass 2^53: renumber the window's entries from zero. */
        for (size_t rank = first_rank; rank < count; rank++) {
            log_entry entry;
            if (log_parse(target, log_at(log, rank), &entry) < 0) {
                return -1;
            }
            if (entry.total_scaled - entry.cost_scaled < base_total_scaled) {
                return refuse_bucket_state(target->key, target->key_size,
                                           "log %U: running totals do not rise");
            }
        }
        total_scaled = usage_scaled + cost_scaled;
    }
    policy->write_value[LOG_STAMP] = stamp_ms;
    policy->write_value[LOG_TOTAL] = total_scaled;
    policy->write_value[LOG_RENUMBER] = renumber;
    policy->write_value[LOG_BASE_TOTAL] = base_total_scaled;
    policy->write_value[LOG_CUTOFF] = cutoff_ms;
    policy->write_value[LOG_KEPT] = have_first ? (int64_t)(count - first_rank) : 0;
    policy->write_expire_at_ms = stamp_ms + window_ms + DRAINED_EXPIRY_MARGIN_MS;
    return 0;
}

/* Room for the kept members and the new one, before any write. */
static int
sliding_log_prepare(MemoryStore *Py_UNUSED(store), memory_call *Py_UNUSED(call),
                    memory_policy *policy)
{
    memory_target *target = &policy->targets[0];
    memory_entry *entry = target->entry != NULL ? target->entry : target->fresh;
    log_value *log = &entry->value.log;
    size_t needed = (size_t)policy->write_value[LOG_KEPT] + 1;
    if (log->capacity >= needed) {
        return 0;
    }
    size_t capacity = (needed > log->count ? needed : log->count) * 2 + 4;
    log_item *items = PyMem_Malloc(capacity * sizeof(log_item));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (log->count > 0) {
        memcpy(items, log_at(log, 0), log->count * sizeof(log_item));
    }
    PyMem_Free(log->items);
    log->items = items;
    log->start = 0;
    log->capacity = capacity;
    return 0;
}

/* ZADD: a member already there only moves to its new score. Cannot fail:
 * there is room for one more member. */
static void
log_add(log_value *log, const log_item *item)
{
    if (log->start + log->count == log->capacity) {
        memmove(log->items, log_at(log, 0), log->count * sizeof(log_item));
        log->start = 0;
    }
    if (log->count == 0 ||
        (log->regular && item->text == NULL &&
         item->total_scaled > log_at(log, log->count - 1)->total_scaled &&
         item->at_ms >= log_at(log, log->count - 1)->at_ms)) {
        *log_at(log, log->count) = *item;
        log->count++;
        log->regular = log->count == 1 ? item->text == NULL : log->regular;
        return;
    }
    for (size_t i = 0; i < log->count; i++) {
        if (log_same_member(log_at(log, i), item)) {
            PyMem_Free(log_at(log, i)->text);
            memmove(log_at(log, i), log_at(log, i + 1), (log->count - i - 1) * sizeof(log_item));
            log->count--;
            break;
        }
    }
    size_t position = log->count;
    while (position > 0 && log_compare(log_at(log, position - 1), item) > 0) {
        position--;
    }
    memmove(log_at(log, position + 1), log_at(log, position),
            (log->count - position) * sizeof(log_item));
    *log_at(log, position) = *item;
    log->count++;
    log->regular = log_is_regular(log);
}

static void
sliding_log_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    log_value *log = &entry->value.log;
    /* ZREMRANGEBYSCORE -inf cutoff (renumbering keeps just the window too). */
    size_t dropped = log_count_at_or_before(log, policy->write_value[LOG_CUTOFF]);
    log_release_items(log, log->start, dropped);
    log->start += dropped;
    log->count -= dropped;
    if (log->capacity > 64 && log->capacity > 4 * (log->count + 1)) {
        /* Mostly trimmed: give memory back (keeping the larger array on failure). */
        memmove(log->items, log_at(log, 0), log->count * sizeof(log_item));
        log->start = 0;
        size_t capacity = 2 * (log->count + 1);
        log_item *items = PyMem_Realloc(log->items, capacity * sizeof(log_item));
        if (items != NULL) {
            log->items = items;
            log->capacity = capacity;
        }
    }
    if (policy->write_value[LOG_RENUMBER]) {
        for (size_t i = 0; i < log->count; i++) {
            log_item *item = log_at(log, i);
            item->total_scaled -= policy->write_value[LOG_BASE_TOTAL];
            PyMem_Free(item->text);
            item->text = NULL;
        }
        qsort(log_at(log, 0), log->count, sizeof(log_item), log_compare_items);
        log->regular = log_is_regular(log);
    }
    log_item item = {policy->write_value[LOG_STAMP], policy->write_value[LOG_TOTAL],
                     call->cost_scaled, NULL};
    log_add(log, &item);
    entry->expire_at_ms = policy->write_expire_at_ms;
}

/* ---- the algorithms --------------------------------------------------------- */

static const memory_algorithm algorithms[] = {
    {"fixed_window", 0, NULL, fixed_window_evaluate, NULL, fixed_window_apply},
    {"token_bucket", 1, token_bucket_parse_extra, token_bucket_evaluate, NULL,
     token_bucket_apply},
    {"sliding_window", 0, NULL, sliding_window_evaluate, NULL, sliding_window_apply},
    {"gcra", 0, gcra_parse_extra, gcra_evaluate, NULL, gcra_apply},
    {"sliding_log", 0, NULL, sliding_log_evaluate, sliding_log_prepare, sliding_log_apply},
    {"leaky_bucket", 0, leaky_bucket_parse_extra, leaky_bucket_evaluate, NULL,
     leaky_bucket_apply},
};

#define ALGORITHM_COUNT ((int)(sizeof(algorithms) / sizeof(algorithms[0])))

/* Suffixes reset.lua deletes under each base, besides <base>:<index> and
 * <base>:<index - 1> of the fixed and sliding windows. */
static const char *const reset_suffixes[] = {":bucket:v2", ":bucket", ":gcra", ":log",
                                             ":leaky",     ""};

#define RESET_SUFFIX_COUNT ((int)(sizeof(reset_suffixes) / sizeof(reset_suffixes[0])))

static const memory_algorithm *
find_algorithm(PyObject *name)
{
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.decide() algorithm must be str, not %.100s",
                     Py_TYPE(name)->tp_name);
        return NULL;
    }
    const char *text = PyUnicode_AsUTF8(name);
    if (text == NULL) {
        return NULL;
    }
    for (int i = 0; i < ALGORITHM_COUNT; i++) {
        if (strcmp(algorithms[i].name, text) == 0) {
            return &algorithms[i];
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "MemoryStore.decide() has no algorithm %R (see MEMORY_ALGORITHMS)", name);
    return NULL;
}

/* ---- validation, in the scripts' order ------------------------------------------ */

static int
parse_call(memory_call *call, PyObject *const *keys, Py_ssize_t key_count)
{
    const memory_algorithm *algorithm = call->algorithm;
    int fields_per_policy = 2 + algorithm->extra_fields;
    if (key_count < 1 || key_count > ACCEL_MAX_POLICIES) {
        return refuse("MODERATO_ARG", "expected 1..%d keys (one base key per policy), got %zd",
                      ACCEL_MAX_POLICIES, key_count);
    }
    Py_ssize_t expected_argc = 2 + fields_per_policy * key_count;
    if (call->argc != expected_argc) {
        return refuse("MODERATO_ARG",
                      "expected %zd arguments for %zd policies (cost_scaled, apply, then %d per "
                      "policy), got %zd",
                      expected_argc, key_count, fields_per_policy, call->argc);
    }
    for (int i = 0; i < (int)key_count; i++) {
        memset(&call->policies[i], 0, sizeof(memory_policy));
        call->policies[i].number = i + 1;
    }
    call->policy_count = (int)key_count;
    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        if (view_key("decide", NULL, i, keys[i], &policy->base, &policy->base_size) < 0) {
            return -1;
        }
        for (int j = 0; j < i; j++) {
            const memory_policy *earlier = &call->policies[j];
            if (earlier->base_size == policy->base_size &&
                memcmp(earlier->base, policy->base, (size_t)policy->base_size) == 0) {
                return refuse("MODERATO_ARG", "KEYS[%d] repeats KEYS[%d]: one policy per key",
                              i + 1, j + 1);
            }
        }
    }

    arg_view view;
    if (view_arg("decide", "args", 1, call->argv[1], &view) < 0) {
        return -1;
    }
    if (view.is_int ? (view.int_sign == 0 && (view.value == 0 || view.value == 1))
                    : (view.size == 1 && (view.data[0] == '0' || view.data[0] == '1'))) {
        call->apply = view.is_int ? (int)view.value : view.data[0] == '1';
    }
    else {
        PyObject *shown = shown_arg(&view);
        if (shown != NULL) {
            refuse("MODERATO_ARG",
                   "ARGV[2] (apply) must be \"1\" (decide and charge) or \"0\" (peek), got %U",
                   shown);
            Py_DECREF(shown);
        }
        return -1;
    }
    long long value;
    if (view_arg("decide", "args", 0, call->argv[0], &view) < 0) {
        return -1;
    }
    if (!parse_integer(&view, call->apply ? 1 : 0, MAX_SAFE_INTEGER, &value)) {
        PyObject *shown = shown_arg(&view);
        if (shown != NULL) {
            refuse("MODERATO_ARG", "ARGV[1] (cost_scaled) must be an integer %s..9007199254740992%s, got %U",
                   call->apply ? "1" : "0", call->apply ? " when charging" : "", shown);
            Py_DECREF(shown);
        }
        return -1;
    }
    call->cost_scaled = value;

    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        Py_ssize_t first = 2 + (Py_ssize_t)fields_per_policy * i; /* 0-based */
        if (view_arg("decide", "args", first, call->argv[first], &view) < 0) {
            return -1;
        }
        if (!parse_integer(&view, 1, MAX_CAPACITY_SCALED, &value)) {
            PyObject *shown = shown_arg(&view);
            if (shown != NULL) {
                refuse("MODERATO_ARG",
                       "ARGV[%zd] (capacity_scaled of policy %d) must be an integer "
                       "1..9007199254000, got %U",
                       first + 1, policy->number, shown);
                Py_DECREF(shown);
            }
            return -1;
        }
        policy->capacity_scaled = value;
        if (view_arg("decide", "args", first + 1, call->argv[first + 1], &view) < 0) {
            return -1;
        }
        if (!parse_integer(&view, 1, ACCEL_MAX_LONG_WINDOW_S, &value)) {
            PyObject *shown = shown_arg(&view);
            if (shown != NULL) {
                refuse("MODERATO_ARG",
                       "ARGV[%zd] (window_s of policy %d) must be an integer 1..%lld, got %U",
                       first + 2, policy->number, ACCEL_MAX_LONG_WINDOW_S, shown);
                Py_DECREF(shown);
            }
            return -1;
        }
        policy->window_s = value;
        policy->window_ms = value * 1000;
        if (algorithm->parse_extra != NULL &&
            algorithm->parse_extra(call, policy, first + 2) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- concluding, and the writes ------------------------------------------------- */

/* The scripts' conclude(): the reply, into values (2 + 3 per policy). */
static int
conclude(const memory_call *call, long long *values)
{
    int allowed = 1;
    for (int i = 0; i < call->policy_count; i++) {
        if (!call->policies[i].verdict.fits) {
            allowed = 0;
        }
    }
    int deciding = 0, have_deciding = 0;
    long long deciding_remaining = 0, deciding_retry = 0;
    for (int i = 0; i < call->policy_count; i++) {
        const memory_verdict *verdict = &call->policies[i].verdict;
        long long remaining_scaled, retry_ms, reset_ms;
        if (verdict->permanent) {
            remaining_scaled = verdict->remaining_uncharged;
            retry_ms = reset_ms = -1;
        }
        else if (allowed) {
            remaining_scaled = verdict->remaining_charged;
            retry_ms = 0;
            reset_ms = verdict->reset_charged_ms;
        }
        else if (verdict->fits) {
            remaining_scaled = verdict->remaining_uncharged;
            retry_ms = 0;
            reset_ms = verdict->reset_uncharged_ms;
        }
        else {
            remaining_scaled = verdict->remaining_uncharged;
            retry_ms = verdict->retry_ms;
            reset_ms = verdict->reset_denied_ms;
        }
        values[2 + 3 * i] = remaining_scaled;
        values[3 + 3 * i] = retry_ms;
        values[4 + 3 * i] = reset_ms;
        /* Admission: the fewest remaining. Denial: the longest wait, a
         * permanent one counting as infinite. Ties: the lowest index. */
        if (allowed) {
            if (!have_deciding || remaining_scaled < deciding_remaining) {
                deciding = i;
                deciding_remaining = remaining_scaled;
                have_deciding = 1;
            }
        }
        else if (!have_deciding || (deciding_retry != -1 &&
                                    (retry_ms == -1 || retry_ms > deciding_retry))) {
            deciding = i;
            deciding_retry = retry_ms;
            have_deciding = 1;
        }
    }
    values[0] = allowed;
    values[1] = deciding;
    return allowed;
}

/* The entry a write goes to: the live one, else the fresh one inserted in
 * place of any expired entry of the key. Cannot fail: prepare_writes()
 * allocated the entry and the table room. */
static memory_entry *
target_entry(MemoryStore *store, memory_target *target, int64_t now_ms)
{
    memory_entry *entry = table_find(store, target->key, target->key_size, target->hash);
    if (entry != NULL && !entry_expired(entry, now_ms)) {
        lru_touch(store, entry);
        return entry;
    }
    if (entry != NULL) {
        table_remove(store, entry);
    }
    entry = target->fresh;
    target->fresh = NULL;
    table_insert(store, entry);
    return entry;
}

static void
release_fresh(memory_call *call)
{
    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        for (int j = 0; j < policy->target_count; j++) {
            if (policy->targets[j].fresh != NULL) {
                entry_free(policy->targets[j].fresh);
                policy->targets[j].fresh = NULL;
            }
        }
    }
}

/* Everything the writes need, before the first one. */
static int
prepare_writes(MemoryStore *store, memory_call *call)
{
    size_t creations = 0;
    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        for (int j = 0; j < policy->target_count; j++) {
            memory_target *target = &policy->targets[j];
            if (target->entry != NULL || target->create_kind == 0) {
                continue;
            }
            target->fresh =
                entry_new(target->create_kind, target->key, target->key_size, target->hash);
            if (target->fresh == NULL) {
                return -1;
            }
            creations++;
        }
    }
    if (table_reserve(store, creations) < 0) {
        return -1;
    }
    for (int i = 0; i < call->policy_count; i++) {
        if (call->algorithm->prepare != NULL &&
            call->algorithm->prepare(store, call, &call->policies[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- MemoryStore methods ---------------------------------------------------------- */

static PyObject *
build_reply(const long long *values, Py_ssize_t size)
{
    PyObject *reply = PyList_New(size);
    if (reply == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *number = PyLong_FromLongLong(values[i]);
        if (number == NULL) {
            Py_DECREF(reply);
            return NULL;
        }
        PyList_SET_ITEM(reply, i, number);
    }
    return reply;
}

PyDoc_STRVAR(decide_doc,
"decide($self, algorithm, keys, args, now_ms, /)\n"
"--\n"
"\n"
"Run the decision script of algorithm at now_ms (Unix ms) in process.\n"
"\n"
"keys are the base keys (bytes or str), args the script's ARGV (int, str or\n"
"bytes): cost_scaled, apply, then the policies' fields. Returns the script's\n"
"reply, [allowed, deciding, remaining_scaled, retry_ms, reset_ms, ...]. A\n"
"refusal raises ValueError('MODERATO_ARG ...') or ValueError('MODERATO_STATE\n"
"...') with the script's message, and writes nothing.");

static PyObject *
store_decide(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    long long values[2 + 3 * ACCEL_MAX_POLICIES];
    PyObject *keys = NULL, *argv = NULL, *reply = NULL;
    memory_call call_space;
    memory_call *call = &call_space;

    call->policy_count = 0;
    call->key_space = NULL;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.decide() takes exactly 4 arguments (algorithm, keys, args, "
                     "now_ms) (%zd given)",
                     nargs);
        return NULL;
    }
    const memory_algorithm *algorithm = find_algorithm(args[0]);
    if (algorithm == NULL) {
        return NULL;
    }
    int64_t now_ms;
    if (parse_now("decide", args[3], &now_ms) < 0) {
        return NULL;
    }
    keys = PySequence_Fast(args[1], "MemoryStore.decide() keys must be a sequence");
    if (keys == NULL) {
        return NULL;
    }
    argv = PySequence_Fast(args[2], "MemoryStore.decide() args must be a sequence");
    if (argv == NULL) {
        goto done;
    }
    call->algorithm = algorithm;
    call->argv = PySequence_Fast_ITEMS(argv);
    call->argc = PySequence_Fast_GET_SIZE(argv);
    call->now_ms = now_ms;
    if (parse_call(call, PySequence_Fast_ITEMS(keys), PySequence_Fast_GET_SIZE(keys)) < 0) {
        goto done;
    }
    Py_ssize_t base_sizes[ACCEL_MAX_POLICIES];
    for (int i = 0; i < call->policy_count; i++) {
        base_sizes[i] = call->policies[i].base_size;
    }
    if (reserve_key_space(call, MAX_TARGETS, base_sizes, call->policy_count) < 0) {
        goto done;
    }
    store->version++; /* even a read reorders the LRU list */
    for (int i = 0; i < call->policy_count; i++) {
        if (algorithm->evaluate(store, call, &call->policies[i]) < 0) {
            goto done;
        }
    }
    int allowed = conclude(call, values);
    if (allowed && call->apply) {
        if (prepare_writes(store, call) < 0) {
            goto done;
        }
        for (int i = 0; i < call->policy_count; i++) {
            algorithm->apply(store, call, &call->policies[i]);
        }
        evict_beyond_cap(store);
    }
    /* Nothing of the arguments or the table is used past this point: the
     * reply's allocation may run a garbage collection, hence any code. */
    release_fresh(call);
    release_key_space(call);
    reply = build_reply(values, 2 + 3 * (Py_ssize_t)call->policy_count);
done:
    release_fresh(call);
    release_key_space(call);
    Py_XDECREF(argv);
    Py_XDECREF(keys);
    return reply;
}

/* reset.lua's window_s: a decimal integer text of at most 9 digits after
 * leading zeros, 1..311040000. */
static int
parse_reset_window(const arg_view *view, long long *window_s)
{
    if (!view->is_int) {
        Py_ssize_t start = 0;
        Py_ssize_t digits = significant_digits(view, &start);
        if (digits < 0 || digits > 9) {
            return 0;
        }
    }
    return parse_integer(view, 1, ACCEL_MAX_LONG_WINDOW_S, window_s);
}

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

PyDoc_STRVAR(reset_doc,
"reset($self, keys, windows_s, now_ms, /)\n"
"--\n"
"\n"
"Run reset.lua at now_ms: delete every key the algorithms derive from each\n"
"base key (window counters of now and the window before, buckets, the base\n"
"itself); returns how many existed. A bad argument raises\n"
"ValueError('MODERATO_ARG ...') and deletes nothing.");

static PyObject *
store_reset(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    PyObject *keys = NULL, *windows = NULL, *result = NULL;
    memory_call call_space;
    memory_call *call = &call_space;
    long long windows_s[MAX_RESET_KEYS];
    const char *bases[MAX_RESET_KEYS];
    Py_ssize_t base_sizes[MAX_RESET_KEYS];

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.reset() takes exactly 3 arguments (keys, windows_s, now_ms) "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    call->key_space = NULL;
    int64_t now_ms;
    if (parse_now("reset", args[2], &now_ms) < 0) {
        return NULL;
    }
    keys = PySequence_Fast(args[0], "MemoryStore.reset() keys must be a sequence");
    if (keys == NULL) {
        return NULL;
    }
    windows = PySequence_Fast(args[1], "MemoryStore.reset() windows_s must be a sequence");
    if (windows == NULL) {
        goto done;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
    if (count < 1 || count > MAX_RESET_KEYS) {
        refuse("MODERATO_ARG", "expected 1..%d keys (one base key per policy), got %zd",
               MAX_RESET_KEYS, count);
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(windows) != count) {
        refuse("MODERATO_ARG", "expected one window_s argument per key (%zd), got %zd", count,
               PySequence_Fast_GET_SIZE(windows));
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        arg_view view;
        if (view_arg("reset", "windows_s", i, PySequence_Fast_GET_ITEM(windows, i), &view) < 0) {
            goto done;
        }
        if (!parse_reset_window(&view, &windows_s[i])) {
            PyObject *shown = shown_arg(&view);
            if (shown != NULL) {
                refuse("MODERATO_ARG",
                       "ARGV[%zd] (window_s of KEYS[%zd]) must be an integer 1..%lld, got %U",
                       i + 1, i + 1, ACCEL_MAX_LONG_WINDOW_S, shown);
                Py_DECREF(shown);
            }
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (view_key("reset", NULL, i, PySequence_Fast_GET_ITEM(keys, i), &bases[i], &base_sizes[i]) <
            0) {
            goto done;
        }
    }
    if (reserve_key_space(call, 2 + RESET_SUFFIX_COUNT, base_sizes, (int)count) < 0) {
        goto done;
    }
    store->version++;
    long long deleted = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t window_index = floor_div(now_ms, windows_s[i] * 1000);
        char suffix[MAX_SUFFIX_BYTES];
        size_t key_size, suffix_size;
        unsigned char *key;
        for (int back = 0; back <= 1; back++) {
            suffix_size = index_suffix(window_index - back, suffix);
            key = derive_key(call, bases[i], base_sizes[i], suffix, suffix_size, &key_size);
            deleted += delete_key(store, key, key_size, now_ms);
        }
        for (int j = 0; j < RESET_SUFFIX_COUNT; j++) {
            key = derive_key(call, bases[i], base_sizes[i], reset_suffixes[j],
                             strlen(reset_suffixes[j]), &key_size);
            deleted += delete_key(store, key, key_size, now_ms);
        }
    }
    table_maybe_shrink(store);
    result = PyLong_FromLongLong(deleted);
done:
    release_key_space(call);
    Py_XDECREF(windows);
    Py_XDECREF(keys);
    return result;
}

/* ---- glob matching, Redis's rules -------------------------------------------------- */

/* Whether the pattern item at *at ("?", "[...]", "\x" or a byte) matches c;
 * moves *at past the item. */
static int
glob_item_matches(const unsigned char *pattern, size_t size, size_t *at, unsigned char c)
{
    size_t i = *at;
    if (pattern[i] == '?') {
        *at = i + 1;
        return 1;
    }
    if (pattern[i] == '[') {
        int negate = 0, matched = 0;
        i++;
        if (i < size && pattern[i] == '^') {
            negate = 1;
            i++;
        }
        /* An unterminated set ends with the pattern. */
        while (i < size && pattern[i] != ']') {
            if (pattern[i] == '\\' && i + 1 < size) {
                matched |= pattern[i + 1] == c;
                i += 2;
            }
            else if (i + 2 < size && pattern[i + 1] == '-') {
                unsigned char low = pattern[i], high = pattern[i + 2];
                if (low > high) {
                    unsigned char swap = low;
                    low = high;
                    high = swap;
                }
                matched |= c >= low && c <= high;
                i += 3;
            }
            else {
                matched |= pattern[i] == c;
                i++;
            }
        }
        *at = i < size ? i + 1 : size;
        return negate ? !matched : matched;
    }
    if (pattern[i] == '\\' && i + 1 < size) {
        i++;
    }
    *at = i + 1;
    return pattern[i] == c;
}

/* Redis's glob: "*", "?", "[...]" (with "^" and ranges), "\" escapes. */
static int
glob_matches(const unsigned char *pattern, size_t pattern_size, const unsigned char *text,
             size_t text_size)
{
    size_t p = 0, t = 0;
    size_t star_p = SIZE_MAX, star_t = 0;
    if (text_size == 0) {
        /* Redis skips trailing stars only after matching a byte, and lets the
         * pattern "*" alone match every key: so an empty key matches "" and
         * "*" but not "**". */
        return pattern_size == 0 || (pattern_size == 1 && pattern[0] == '*');
    }
    while (t < text_size) {
        if (p < pattern_size && pattern[p] == '*') {
            while (p < pattern_size && pattern[p] == '*') {
                p++;
            }
            star_p = p;
            star_t = t;
            continue;
        }
        size_t next = p;
        if (p < pattern_size && glob_item_matches(pattern, pattern_size, &next, text[t])) {
            p = next;
            t++;
            continue;
        }
        if (star_p == SIZE_MAX) {
            return 0;
        }
        /* Let the last star take one more byte, and retry after it. */
        p = star_p;
        t = ++star_t;
    }
    while (p < pattern_size && pattern[p] == '*') {
        p++;
    }
    return p == pattern_size;
}

PyDoc_STRVAR(delete_matching_doc,
"delete_matching($self, pattern, now_ms=None, /)\n"
"--\n"
"\n"
"Delete every key matching a Redis glob pattern (*, ?, [...], \\ escapes);\n"
"returns how many were deleted, not counting keys already expired at now_ms.");

static PyObject *
store_delete_matching(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    const char *pattern;
    Py_ssize_t pattern_size;
    int64_t now_ms = -1;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.delete_matching() takes 1 or 2 arguments (pattern, now_ms) "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    if (view_key("delete_matching", "pattern", -1, args[0], &pattern, &pattern_size) < 0) {
        return NULL;
    }
    if (nargs == 2 && args[1] != Py_None && parse_now("delete_matching", args[1], &now_ms) < 0) {
        return NULL;
    }
    store->version++;
    long long deleted = 0;
    memory_entry *entry = store->oldest;
    while (entry != NULL) {
        memory_entry *newer = entry->newer;
        if (glob_matches((const unsigned char *)pattern, (size_t)pattern_size, entry_key(entry),
                         entry->key_size)) {
            deleted += now_ms < 0 || !entry_expired(entry, now_ms);
            table_remove(store, entry);
        }
        entry = newer;
    }
    table_maybe_shrink(store);
    return PyLong_FromLongLong(deleted);
}

/* ---- sweeping ------------------------------------------------------------------------ */

static int
entry_sweepable(const memory_entry *entry, int64_t now_ms)
{
    if (entry_expired(entry, now_ms)) {
        return 1;
    }
    return entry->kind == KIND_BUCKET && bucket_idle_full(entry, now_ms);
}

PyDoc_STRVAR(sweep_doc,
"sweep($self, now_ms, max_slots=-1, /)\n"
"--\n"
"\n"
"Drop the entries expired at now_ms and the token buckets full by then\n"
"(both decide exactly as a missing key). Walks at most max_slots slots of\n"
"the table from where the last sweep stopped (-1: all of them); returns how\n"
"many entries were dropped.");

static PyObject *
store_sweep(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    int64_t now_ms;
    Py_ssize_t max_slots = -1;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.sweep() takes 1 or 2 arguments (now_ms, max_slots) "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    if (parse_now("sweep", args[0], &now_ms) < 0) {
        return NULL;
    }
    if (nargs == 2) {
        if (!PyLong_Check(args[1]) || PyBool_Check(args[1])) {
            PyErr_Format(PyExc_TypeError, "MemoryStore.sweep() max_slots must be int, not %.100s",
                         Py_TYPE(args[1])->tp_name);
            return NULL;
        }
        max_slots = PyLong_AsSsize_t(args[1]);
        if (max_slots == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    store->version++;
    size_t budget = max_slots < 0 || (size_t)max_slots > store->slot_count
                        ? store->slot_count
                        : (size_t)max_slots;
    size_t i = store->sweep_cursor & (store->slot_count - 1);
    long long dropped = 0;
    /* A removal shifts a later entry into slot i: look at slot i again. */
    for (size_t visited = 0; visited < budget;) {
        memory_entry *entry = store->slots[i];
        if (entry != NULL && entry_sweepable(entry, now_ms)) {
            table_clear_slot(store, i);
            lru_unlink(store, entry);
            store->entry_count--;
            entry_free(entry);
            dropped++;
            continue;
        }
        visited++;
        i = (i + 1) & (store->slot_count - 1);
    }
    store->sweep_cursor = i;
    size_t slot_count = store->slot_count;
    table_maybe_shrink(store);
    if (store->slot_count != slot_count) {
        store->sweep_cursor = 0;
    }
    return PyLong_FromLongLong(dropped);
}

/* ---- introspection (tests, debugging) ------------------------------------------------- */

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

PyDoc_STRVAR(dump_doc,
"dump($self, now_ms, /)\n"
"--\n"
"\n"
"The keys live at now_ms: {key: (value, expire_at_ms)}, the expiry -1 for\n"
"none; the value an int (a counter), a dict of int fields (a hash) or a\n"
"list of (member, score) in order (a sorted set). For tests and debugging.");

static PyObject *
store_dump(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    int64_t now_ms;
    if (nargs != 1) {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.dump() takes exactly 1 argument (now_ms) (%zd given)", nargs);
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
    for (int i = 0; i < HASH_LAYOUT_COUNT; i++) {
        const hash_layout *layout = &hash_layouts[i];
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
    int readable = colon == LOG_TOTAL_DIGITS && colon + 1 < size && text[colon] == ':' &&
                   parse_digits(text, (size_t)colon, 1, MAX_SAFE_INTEGER, &total) &&
                   parse_digits(text + colon + 1, (size_t)(size - colon - 1), 1,
                                MAX_SAFE_INTEGER, &cost) &&
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

PyDoc_STRVAR(load_doc,
"load($self, key, value, expire_at_ms, /)\n"
"--\n"
"\n"
"Store one key as it is, replacing any: value as dump() gives it (an int,\n"
"a dict of int fields, or a list of (member, score)), expire_at_ms -1 for\n"
"none. For tests that start from a given state.");

static PyObject *
store_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    const char *key;
    Py_ssize_t key_size;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "MemoryStore.load() takes exactly 3 arguments (key, value, expire_at_ms) "
                     "(%zd given)",
                     nargs);
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

static Py_ssize_t
store_length(PyObject *self)
{
    return (Py_ssize_t)((MemoryStore *)self)->entry_count;
}

static PyObject *
store_get_max_entries(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(((MemoryStore *)self)->max_entries);
}

static PyObject *
store_get_evictions(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(((MemoryStore *)self)->evictions);
}

static PyObject *
store_get_slot_count(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(((MemoryStore *)self)->slot_count);
}

static PyObject *
store_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"max_entries", NULL};
    Py_ssize_t max_entries;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:MemoryStore", keywords, &max_entries)) {
        return NULL;
    }
    if (max_entries < 1) {
        PyErr_Format(PyExc_ValueError, "MemoryStore() max_entries must be at least 1, got %zd",
                     max_entries);
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
    store->slot_count = MIN_SLOTS;
    store->slots = PyMem_Calloc(MIN_SLOTS, sizeof(memory_entry *));
    if (store->slots == NULL) {
        Py_DECREF(store);
        return PyErr_NoMemory();
    }
    return (PyObject *)store;
}

static void
store_dealloc(PyObject *self)
{
    MemoryStore *store = (MemoryStore *)self;
    PyTypeObject *type = Py_TYPE(self);
    table_clear(store);
    PyMem_Free(store->slots);
    store->slots = NULL;
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
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"max_entries", store_get_max_entries, NULL, "The hard cap on entries.", NULL},
    {"evictions", store_get_evictions, NULL,
     "Entries evicted so far because the table was at its cap.", NULL},
    {"slot_count", store_get_slot_count, NULL, "Slots of the hash table (a power of two).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(store_doc,
"MemoryStore(max_entries)\n"
"--\n"
"\n"
"The state of memory://: the keys of the decision scripts, in process,\n"
"decided with the scripts' exact math. At most max_entries entries are kept\n"
"(the least recently used are evicted beyond); sweep() drops expired entries\n"
"and full token buckets. Every method holds the GIL throughout: calls from\n"
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

#if PY_VERSION_HEX >= 0x030A0000
#define STORE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define STORE_FLAGS Py_TPFLAGS_DEFAULT
#endif

static PyType_Spec store_spec = {
    .name = "moderato._accel.MemoryStore",
    .basicsize = sizeof(MemoryStore),
    .itemsize = 0,
    .flags = STORE_FLAGS,
    .slots = store_slots,
};

int
memory_add_to_module(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &store_spec, NULL);
    if (type == NULL) {
        return -1;
    }
    int result = PyModule_AddObjectRef(module, "MemoryStore", type);
    Py_DECREF(type);
    if (result < 0) {
        return -1;
    }
    PyObject *names = PyTuple_New(ALGORITHM_COUNT);
    if (names == NULL) {
        return -1;
    }
    for (int i = 0; i < ALGORITHM_COUNT; i++) {
        PyObject *name = PyUnicode_FromString(algorithms[i].name);
        if (name == NULL) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    result = PyModule_AddObjectRef(module, "MEMORY_ALGORITHMS", names);
    Py_DECREF(names);
    return result;
}
