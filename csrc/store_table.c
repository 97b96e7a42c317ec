/* The table under memory:// (store_table.h): SipHash-1-3, open addressing
 * with incremental resizes, the LRU list and its bound, the identity index,
 * and the incremental sweep. It knows what an entry holds only to size and
 * free it. */
#include <assert.h>
#include <string.h>

#include "store_table.h"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#if defined(MAP_ANONYMOUS) && defined(MADV_DONTNEED)
#define STORE_MAPPED_ARRAYS 1
#endif
#endif

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
    entry->same_identity_next = entry->same_identity_prev = NULL;
    entry->expire_at_ms = NO_EXPIRY;
    entry->hash = hash;
    entry->identity_hash = 0;
    entry->indexed = 0;
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


/* ---- the LRU list ------------------------------------------------------------- */

void
lru_unlink(MemoryStore *store, memory_entry *entry)
{
    if (store->sweep_next == entry) {
        /* The sweep goes on from the next newer entry; past the newest, its
         * pass is over. */
        store->sweep_next = entry->newer;
        store->sweep_passes += entry->newer == NULL;
    }
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

/* ---- slot arrays ---------------------------------------------------------------- */

/* Large slot arrays come straight from the kernel: their pages are zeroed
 * when first touched, not all at once as calloc would (from the heap, which
 * is where glibc serves a block the size of one recently freed), and a
 * resize gives the emptied part of the old array back a chunk at a time,
 * so that neither its start nor its end is a pass over a whole array. */
#define MAPPED_ARRAY_BYTES (256 * 1024)
#define RELEASE_CHUNK_SLOTS ((size_t)(256 * 1024) / sizeof(memory_entry *))

static int
is_mapped(size_t slot_count)
{
#ifdef STORE_MAPPED_ARRAYS
    return slot_count * sizeof(memory_entry *) >= MAPPED_ARRAY_BYTES;
#else
    (void)slot_count;
    return 0;
#endif
}

/* slot_count empty slots, or NULL (no exception set). */
static memory_entry **
slots_alloc(size_t slot_count)
{
#ifdef STORE_MAPPED_ARRAYS
    if (is_mapped(slot_count)) {
        void *memory = mmap(NULL, slot_count * sizeof(memory_entry *), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return memory == MAP_FAILED ? NULL : (memory_entry **)memory;
    }
#endif
    return PyMem_Calloc(slot_count, sizeof(memory_entry *));
}

static void
slots_free(memory_entry **slots, size_t slot_count)
{
    if (slots == NULL) {
        return;
    }
#ifdef STORE_MAPPED_ARRAYS
    if (is_mapped(slot_count)) {
        munmap(slots, slot_count * sizeof(memory_entry *));
        return;
    }
#endif
    PyMem_Free(slots);
}

/* Give back the pages of slots[from, to), which hold only NULLs and are
 * never written again: they read as zeros (NULL) afterwards. */
static void
slots_release(memory_entry **slots, size_t slot_count, size_t from, size_t to)
{
#ifdef STORE_MAPPED_ARRAYS
    long page_bytes = sysconf(_SC_PAGESIZE);
    char *start = (char *)(slots + from);
    if (is_mapped(slot_count) && page_bytes > 0 && to > from &&
        (uintptr_t)start % (uintptr_t)page_bytes == 0 &&
        (to - from) * sizeof(memory_entry *) % (size_t)page_bytes == 0) {
        (void)madvise(start, (to - from) * sizeof(memory_entry *), MADV_DONTNEED);
    }
#else
    (void)slots;
    (void)slot_count;
    (void)from;
    (void)to;
#endif
}

/* The hash an array files an entry under (its key's, or its identity's). */
static inline uint64_t
hash_in(const slot_array *array, const memory_entry *entry)
{
    return *(const uint64_t *)((const char *)entry + array->hash_offset);
}

/* Place an entry absent from slots, which has room. */
static void
place(const slot_array *array, memory_entry **slots, size_t slot_count, memory_entry *entry)
{
    size_t mask = slot_count - 1;
    size_t i = (size_t)hash_in(array, entry) & mask;
    while (slots[i] != NULL) {
        i = (i + 1) & mask;
    }
    slots[i] = entry;
}

/* Empty slot i, shifting back the entries after it whose probe sequence
 * passes through it, so that every entry stays reachable from its home. */
static void
clear_slot(const slot_array *array, memory_entry **slots, size_t slot_count, size_t i)
{
    size_t mask = slot_count - 1;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        memory_entry *entry = slots[j];
        if (entry == NULL) {
            break;
        }
        size_t home = (size_t)hash_in(array, entry) & mask;
        /* The entry stays put iff its home lies cyclically in (i, j]. */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            slots[i] = entry;
            i = j;
        }
    }
    slots[i] = NULL;
}

/* Where an entry sits. */
typedef struct {
    memory_entry **slots;
    size_t slot_count;
    size_t index;
} slot_ref;

static int
probe_for(const slot_array *array, memory_entry **slots, size_t slot_count,
          const memory_entry *entry, slot_ref *ref)
{
    size_t mask = slot_count - 1;
    for (size_t i = (size_t)hash_in(array, entry) & mask; slots[i] != NULL; i = (i + 1) & mask) {
        if (slots[i] == entry) {
            ref->slots = slots;
            ref->slot_count = slot_count;
            ref->index = i;
            return 1;
        }
    }
    return 0;
}

/* The slot of an entry the array holds, in whichever of its arrays. The old
 * array first, here and in every lookup: a new array's pages are mapped on
 * first touch, and a lookup that reads one only to miss costs a page fault. */
static slot_ref
locate(const slot_array *array, const memory_entry *entry)
{
    slot_ref ref = {NULL, 0, 0};
    if (array->old_slots == NULL ||
        !probe_for(array, array->old_slots, array->old_slot_count, entry, &ref)) {
        int found = probe_for(array, array->slots, array->slot_count, entry, &ref);
        assert(found);
        (void)found;
    }
    return ref;
}

static void
remove_at(slot_array *array, slot_ref ref)
{
    clear_slot(array, ref.slots, ref.slot_count, ref.index);
    array->used--;
}

static void
end_resize(slot_array *array)
{
    slots_free(array->old_slots, array->old_slot_count);
    array->old_slots = NULL;
    array->old_slot_count = array->old_cursor = array->old_released = 0;
    array->slots_per_added = 0;
}

/* Forget every entry the array holds; keep it small if that can be had. */
static void
array_empty(slot_array *array)
{
    end_resize(array);
    array->used = 0;
    memory_entry **slots = array->slot_count > MIN_SLOTS ? slots_alloc(MIN_SLOTS) : NULL;
    if (slots != NULL) {
        slots_free(array->slots, array->slot_count);
        array->slots = slots;
        array->slot_count = MIN_SLOTS;
    }
    else {
        memset(array->slots, 0, array->slot_count * sizeof(memory_entry *));
    }
}

/* ---- the identity index ------------------------------------------------------------ */

const unsigned char *
hash_tag_inside(const unsigned char *text, size_t size, const unsigned char **close)
{
    const unsigned char *end = text + size;
    const unsigned char *open = memchr(text, '{', size);
    if (open == NULL) {
        return NULL;
    }
    const unsigned char *inside = open + 1;
    const unsigned char *closing = memchr(inside, '}', (size_t)(end - inside));
    if (closing == NULL || memchr(text, '}', (size_t)(open - text)) != NULL ||
        memchr(inside, '{', (size_t)(closing - inside)) != NULL ||
        memchr(closing + 1, '{', (size_t)(end - closing - 1)) != NULL ||
        memchr(closing + 1, '}', (size_t)(end - closing - 1)) != NULL) {
        return NULL;
    }
    *close = closing;
    return inside;
}

int
key_identity(const unsigned char *key, size_t key_size, identity_span *span)
{
    const unsigned char *close;
    const unsigned char *inside = hash_tag_inside(key, key_size, &close);
    if (inside == NULL) {
        return 0;
    }
    const unsigned char *first = memchr(inside, ':', (size_t)(close - inside));
    if (first == NULL) {
        return 0;
    }
    const unsigned char *second = memchr(first + 1, ':', (size_t)(close - first - 1));
    if (second == NULL || memchr(second + 1, ':', (size_t)(close - second - 1)) != NULL) {
        return 0;
    }
    span->tenant = inside;
    span->tenant_size = (size_t)(first - inside);
    span->identity = second + 1;
    span->identity_size = (size_t)(close - second - 1);
    return 1;
}

uint64_t
identity_hash(const MemoryStore *store, const identity_span *span)
{
    /* The tenant's hash keys the identity's: one hash of the two parts, which
     * are not adjacent in the key. Most keys have no tenant: one hash then. */
    uint64_t tenant_hash =
        span->tenant_size > 0 ? siphash13(store->hash_key, span->tenant, span->tenant_size) : 0;
    const uint64_t key[2] = {store->hash_key[0] ^ tenant_hash, store->hash_key[1]};
    return siphash13(key, span->identity, span->identity_size);
}

static int
same_identity(const memory_entry *entry, const identity_span *span)
{
    identity_span own;
    if (!key_identity(entry_key(entry), entry->key_size, &own)) {
        return 0;
    }
    return own.tenant_size == span->tenant_size && own.identity_size == span->identity_size &&
           memcmp(own.tenant, span->tenant, span->tenant_size) == 0 &&
           memcmp(own.identity, span->identity, span->identity_size) == 0;
}

static memory_entry **
probe_identity(memory_entry **slots, size_t slot_count, const identity_span *span,
               uint64_t hash)
{
    size_t mask = slot_count - 1;
    for (size_t i = (size_t)hash & mask; slots[i] != NULL; i = (i + 1) & mask) {
        if (slots[i]->identity_hash == hash && same_identity(slots[i], span)) {
            return &slots[i];
        }
    }
    return NULL;
}

static memory_entry **
identity_slot(const MemoryStore *store, const identity_span *span, uint64_t hash)
{
    const slot_array *array = &store->identities;
    memory_entry **slot = NULL;
    if (array->old_slots != NULL) {
        slot = probe_identity(array->old_slots, array->old_slot_count, span, hash);
    }
    return slot != NULL ? slot : probe_identity(array->slots, array->slot_count, span, hash);
}

memory_entry *
identity_first(const MemoryStore *store, const identity_span *span, uint64_t hash)
{
    memory_entry **slot = identity_slot(store, span, hash);
    return slot != NULL ? *slot : NULL;
}

/* Put a new entry on its identity's list (the first of an identity takes a
 * slot of the index; the rest follow it), or on the unindexed list. */
static void
index_link(MemoryStore *store, memory_entry *entry)
{
    identity_span span;
    entry->same_identity_prev = NULL;
    if (!key_identity(entry_key(entry), entry->key_size, &span)) {
        entry->indexed = 0;
        entry->same_identity_next = store->unindexed;
        if (store->unindexed != NULL) {
            store->unindexed->same_identity_prev = entry;
        }
        store->unindexed = entry;
        store->unindexed_count++;
        return;
    }
    entry->indexed = 1;
    entry->identity_hash = identity_hash(store, &span);
    memory_entry **slot = identity_slot(store, &span, entry->identity_hash);
    if (slot == NULL) {
        entry->same_identity_next = NULL;
        slot_array *array = &store->identities;
        place(array, array->slots, array->slot_count, entry);
        array->used++;
        return;
    }
    /* Second in line: the first keeps its slot. */
    memory_entry *first = *slot;
    entry->same_identity_prev = first;
    entry->same_identity_next = first->same_identity_next;
    if (first->same_identity_next != NULL) {
        first->same_identity_next->same_identity_prev = entry;
    }
    first->same_identity_next = entry;
}

static void
index_unlink(MemoryStore *store, memory_entry *entry)
{
    memory_entry *next = entry->same_identity_next, *prev = entry->same_identity_prev;
    if (next != NULL) {
        next->same_identity_prev = prev;
    }
    if (prev != NULL) {
        prev->same_identity_next = next;
    }
    else if (!entry->indexed) {
        store->unindexed = next;
    }
    else {
        /* The first of its identity: the next one (same hash) takes its slot. */
        slot_ref ref = locate(&store->identities, entry);
        if (next != NULL) {
            ref.slots[ref.index] = next;
        }
        else {
            remove_at(&store->identities, ref);
        }
    }
    if (!entry->indexed) {
        store->unindexed_count--;
    }
    entry->same_identity_next = entry->same_identity_prev = NULL;
}

/* ---- resizing -------------------------------------------------------------------- */

/* Empty at most budget old slots into the array's slots; end the resize when
 * the old array is empty. Returns the slots walked. */
static size_t
resize_step(slot_array *array, size_t budget)
{
    size_t walked = 0;
    while (array->old_slots != NULL && array->old_cursor < array->old_slot_count &&
           walked < budget) {
        memory_entry *entry = array->old_slots[array->old_cursor];
        walked++;
        if (entry == NULL) {
            array->old_cursor++;
            continue;
        }
        /* Slots below the cursor are empty, so the shift back stays at or
         * above it: the entry shifted into the cursor's slot is seen next. */
        clear_slot(array, array->old_slots, array->old_slot_count, array->old_cursor);
        place(array, array->slots, array->slot_count, entry);
    }
    if (array->old_slots == NULL) {
        return walked;
    }
    if (array->old_cursor == array->old_slot_count) {
        end_resize(array);
        return walked;
    }
    size_t releasable = array->old_cursor - array->old_cursor % RELEASE_CHUNK_SLOTS;
    if (releasable > array->old_released) {
        slots_release(array->old_slots, array->old_slot_count, array->old_released, releasable);
        array->old_released = releasable;
    }
    return walked;
}

/* Give the array slot_count slots (no resize in progress). Small arrays, and
 * empty ones, move at once; larger ones start a resize that the calls adding
 * entries and the sweeps carry on. */
static int
resize(slot_array *array, size_t slot_count)
{
    memory_entry **slots = slots_alloc(slot_count);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memory_entry **old = array->slots;
    size_t old_count = array->slot_count;
    array->slots = slots;
    array->slot_count = slot_count;
    if (old_count <= WHOLE_RESIZE_SLOTS || (array->used == 0 && old_count <= FREE_AT_ONCE_SLOTS)) {
        for (size_t i = 0; array->used > 0 && i < old_count; i++) {
            if (old[i] != NULL) {
                place(array, slots, slot_count, old[i]);
            }
        }
        slots_free(old, old_count);
        return 0;
    }
    array->old_slots = old;
    array->old_slot_count = old_count;
    array->old_cursor = array->old_released = 0;
    /* Walk every old slot (and move every entry) before slots is half full. */
    size_t headroom = slot_count / 2 > array->used ? slot_count / 2 - array->used : 1;
    array->slots_per_added = (old_count + array->used + headroom - 1) / headroom;
    return 0;
}

/* An empty array of MIN_SLOTS slots: resized from none, as every later size
 * is made. */
static int
array_init(slot_array *array, size_t hash_offset)
{
    memset(array, 0, sizeof(*array));
    array->hash_offset = hash_offset;
    return resize(array, MIN_SLOTS);
}

/* Room for extra more entries in the array, at most half full, and this
 * call's step of a resize in progress. */
static int
array_reserve(MemoryStore *store, slot_array *array, size_t extra)
{
    /* Step first: a resize started earlier is paced to end by the time its
     * slots fill to half, counting this call's entries. */
    size_t step = RESIZE_STEP_SLOTS + extra * array->slots_per_added;
    size_t walked = resize_step(array, step);
    size_t needed = array->used + extra;
    if (needed > array->slot_count / 2) {
        if (array->old_slots != NULL) {
            /* Not reached while the pace holds; finishing is always correct. */
            walked += resize_step(array, SIZE_MAX);
            store->work.whole_resizes++;
        }
        size_t slot_count = array->slot_count;
        while (needed > slot_count / 2) {
            if (slot_count > (SIZE_MAX / sizeof(memory_entry *)) / 4) {
                PyErr_NoMemory();
                return -1;
            }
            slot_count *= 2;
        }
        if (resize(array, slot_count) < 0) {
            return -1;
        }
        step = RESIZE_STEP_SLOTS + extra * array->slots_per_added;
        walked += resize_step(array, step);
    }
    if (walked > store->work.longest_resize_step) {
        store->work.longest_resize_step = walked;
    }
    return 0;
}

/* Shrink an array less than an eighth full to about a quarter full (by at
 * most MAX_SHRINK_FACTOR, so the resize's pace stays bounded); a failed
 * allocation just keeps the larger array. */
static void
array_maybe_shrink(slot_array *array)
{
    if (array->slot_count <= MIN_SLOTS || array->used * 8 >= array->slot_count) {
        return;
    }
    if (array->used == 0 && array->slot_count + array->old_slot_count <= FREE_AT_ONCE_SLOTS) {
        /* Nothing to move, even mid-resize, and little to free: the
         * smallest array at once. */
        array_empty(array);
        return;
    }
    if (array->old_slots != NULL) {
        return; /* one resize at a time */
    }
    size_t slot_count = MIN_SLOTS;
    while (slot_count < array->used * 4) {
        slot_count *= 2;
    }
    if (slot_count < array->slot_count / MAX_SHRINK_FACTOR) {
        slot_count = array->slot_count / MAX_SHRINK_FACTOR;
    }
    if (slot_count < array->slot_count && resize(array, slot_count) < 0) {
        PyErr_Clear();
    }
}

/* ---- the table -------------------------------------------------------------------- */

int
table_init(MemoryStore *store)
{
    if (array_init(&store->keys, offsetof(memory_entry, hash)) < 0 ||
        array_init(&store->identities, offsetof(memory_entry, identity_hash)) < 0) {
        return -1;
    }
    return 0;
}

static void
free_entries(MemoryStore *store)
{
    memory_entry *entry = store->newest;
    while (entry != NULL) {
        memory_entry *older = entry->older;
        entry_free(entry);
        entry = older;
    }
    store->newest = store->oldest = NULL;
    store->unindexed = NULL;
    store->unindexed_count = 0;
    store->sweep_next = NULL;
}

void
table_release(MemoryStore *store)
{
    free_entries(store);
    slot_array *arrays[2] = {&store->keys, &store->identities};
    for (int i = 0; i < 2; i++) {
        end_resize(arrays[i]);
        slots_free(arrays[i]->slots, arrays[i]->slot_count);
        arrays[i]->slots = NULL;
        arrays[i]->slot_count = arrays[i]->used = 0;
    }
}

static memory_entry *
probe_key(memory_entry **slots, size_t slot_count, const unsigned char *key, size_t key_size,
          uint64_t hash)
{
    size_t mask = slot_count - 1;
    for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
        memory_entry *entry = slots[i];
        if (entry == NULL) {
            return NULL;
        }
        if (entry->hash == hash && entry->key_size == key_size &&
            memcmp(entry_key(entry), key, key_size) == 0) {
            return entry;
        }
    }
}

/* The entry holding this key, expired or not, or NULL. */
memory_entry *
table_find(const MemoryStore *store, const unsigned char *key, size_t key_size, uint64_t hash)
{
    const slot_array *keys = &store->keys;
    memory_entry *entry = NULL;
    if (keys->old_slots != NULL) { /* first: see locate() */
        entry = probe_key(keys->old_slots, keys->old_slot_count, key, key_size, hash);
    }
    return entry != NULL ? entry : probe_key(keys->slots, keys->slot_count, key, key_size, hash);
}

/* Room for extra more entries: in the key slots, and in the index in case
 * each is the first of its identity. */
int
table_reserve(MemoryStore *store, size_t extra)
{
    if (array_reserve(store, &store->keys, extra) < 0 ||
        array_reserve(store, &store->identities, extra) < 0) {
        return -1;
    }
    return 0;
}

void
table_maybe_shrink(MemoryStore *store)
{
    array_maybe_shrink(&store->keys);
    array_maybe_shrink(&store->identities);
}

void
table_insert(MemoryStore *store, memory_entry *entry)
{
    slot_array *keys = &store->keys;
    place(keys, keys->slots, keys->slot_count, entry);
    keys->used++;
    lru_push_newest(store, entry);
    index_link(store, entry);
}

void
table_remove(MemoryStore *store, memory_entry *entry)
{
    remove_at(&store->keys, locate(&store->keys, entry));
    lru_unlink(store, entry);
    index_unlink(store, entry);
    entry_free(entry);
}

void
table_clear(MemoryStore *store)
{
    free_entries(store);
    array_empty(&store->keys);
    array_empty(&store->identities);
}

void
evict_beyond_cap(MemoryStore *store)
{
    while (store->keys.used > store->max_entries && store->oldest != NULL) {
        table_remove(store, store->oldest);
        store->evictions++;
    }
}

size_t
table_resize_slots_left(const MemoryStore *store)
{
    const slot_array *keys = &store->keys;
    return keys->old_slots != NULL ? keys->old_slot_count - keys->old_cursor : 0;
}

void
table_sweep_from_oldest(MemoryStore *store)
{
    store->sweep_next = NULL;
}

long long
table_sweep(MemoryStore *store, size_t budget,
            int (*idle)(const memory_entry *entry, int64_t now_ms), int64_t now_ms)
{
    resize_step(&store->keys, budget);
    resize_step(&store->identities, budget);
    /* From the least recently used entry toward the most: about the order
     * the entries were allocated in, so that a mass expiry gives the
     * allocator's arenas back one at a time, not all in the pass's last call. */
    memory_entry *entry = store->sweep_next != NULL ? store->sweep_next : store->oldest;
    store->sweep_next = NULL; /* set below: the removals here need not move it */
    long long dropped = 0;
    for (size_t examined = 0; entry != NULL && examined < budget; examined++) {
        memory_entry *newer = entry->newer;
        if (entry_expired(entry, now_ms) || idle(entry, now_ms)) {
            table_remove(store, entry);
            dropped++;
        }
        entry = newer;
    }
    store->sweep_next = entry;
    store->sweep_passes += entry == NULL;
    table_maybe_shrink(store);
    return dropped;
}
