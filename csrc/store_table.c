/* The table under memory:// (store_table.h): SipHash-1-3, open addressing,
 * the LRU list and its bound, and the incremental sweep. It knows what an
 * entry holds only to size and free it. */
#include <string.h>

#include "store_table.h"

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

uint64_t
load_le64(const unsigned char *bytes)
{
    uint64_t word = 0;
    for (int i = 7; i >= 0; i--) {
        word = (word << 8) | bytes[i];
    }
    return word;
}

uint64_t
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

unsigned char *
entry_key(const memory_entry *entry)
{
    return (unsigned char *)&entry->value + value_size(entry->kind);
}

void
log_release_items(log_value *log, size_t from, size_t count)
{
    for (size_t i = from; i < from + count; i++) {
        PyMem_Free(log->items[i].text);
        log->items[i].text = NULL;
    }
}

void
entry_free(memory_entry *entry)
{
    if (entry->kind == KIND_LOG) {
        log_value *log = &entry->value.log;
        log_release_items(log, log->start, log->count);
        PyMem_Free(log->items);
    }
    PyMem_Free(entry);
}

int
entry_expired(const memory_entry *entry, int64_t now_ms)
{
    return entry->expire_at_ms != NO_EXPIRY && now_ms > entry->expire_at_ms;
}

memory_entry *
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

uint64_t
store_hash(const MemoryStore *store, const unsigned char *key, size_t key_size)
{
    return siphash13(store->hash_key, key, key_size);
}

void
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

void
lru_touch(MemoryStore *store, memory_entry *entry)
{
    if (store->newest != entry) {
        lru_unlink(store, entry);
        lru_push_newest(store, entry);
    }
}

/* The entry holding this key, expired or not, or NULL. */
memory_entry *
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
int
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
void
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

void
table_insert(MemoryStore *store, memory_entry *entry)
{
    table_place(store->slots, store->slot_count, entry);
    lru_push_newest(store, entry);
    store->entry_count++;
}

void
table_remove(MemoryStore *store, memory_entry *entry)
{
    table_clear_slot(store, table_slot_of(store, entry));
    lru_unlink(store, entry);
    store->entry_count--;
    entry_free(entry);
}

void
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

void
evict_beyond_cap(MemoryStore *store)
{
    while (store->entry_count > store->max_entries && store->oldest != NULL) {
        table_remove(store, store->oldest);
        store->evictions++;
    }
}


long long
table_sweep(MemoryStore *store, size_t budget,
            int (*idle)(const memory_entry *entry, int64_t now_ms), int64_t now_ms)
{
    if (budget > store->slot_count) {
        budget = store->slot_count;
    }
    size_t i = store->sweep_cursor & (store->slot_count - 1);
    long long dropped = 0;
    /* A removal shifts a later entry into slot i: look at slot i again. */
    for (size_t visited = 0; visited < budget;) {
        memory_entry *entry = store->slots[i];
        if (entry != NULL && (entry_expired(entry, now_ms) || idle(entry, now_ms))) {
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
    return dropped;
}
