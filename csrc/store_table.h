/* The table under memory://: keys hashed with SipHash-1-3 under a random
 * per-store key, open addressing with linear probing over a power-of-two
 * array of entry pointers (at most half full; deletion shifts entries back,
 * so there are no tombstones), every entry also on an intrusive list in
 * order of use for the LRU bound. A second array indexes the entries by the
 * tenant and identity of their hash tag, so that forgetting an identity
 * touches that identity's entries only. Both arrays are resized
 * incrementally: the old array is emptied into the new one a bounded number
 * of slots per call. What an entry holds is typed per kind (the
 * algorithms' per-key state); the table only allocates, finds, orders and
 * frees entries. store_table.c. */
#ifndef MODERATO_STORE_TABLE_H
#define MODERATO_STORE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"

#define NO_EXPIRY (-1LL)
#define MIN_SLOTS 16
/* A resize moves at least this many old slots per call that makes room, on
 * top of its pace per entry added (slot_array.slots_per_added). */
#define RESIZE_STEP_SLOTS 64
/* An array of at most this many slots is resized in one go (a few us), and
 * one that holds no entry, of at most FREE_AT_ONCE_SLOTS (256 KiB to free). */
#define WHOLE_RESIZE_SLOTS 4096
#define FREE_AT_ONCE_SLOTS 32768
/* A shrink divides the slot count by at most this (which bounds its pace). */
#define MAX_SHRINK_FACTOR 8

/* What a key holds: a Redis string holding a decimal integer (a window
 * counter), one of three hashes of integer fields, or the sliding log's
 * sorted set. */
enum { KIND_COUNTER = 1, KIND_BUCKET, KIND_GCRA, KIND_LEAKY, KIND_LOG };

/* The hashes' fields, in the order of the field arrays of store_validate.c. */
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
    int64_t burst_scaled;       /* what the bucket holds; 0: the capacity */
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
    /* The other entries of the same tenant and identity (the identity
     * index), or of the unindexed list when indexed is 0. */
    struct memory_entry *same_identity_next;
    struct memory_entry *same_identity_prev;
    int64_t expire_at_ms;       /* absolute, or NO_EXPIRY */
    uint64_t hash;
    uint64_t identity_hash;     /* when indexed */
    uint32_t key_size;
    uint8_t kind;
    uint8_t indexed;
    /* Only the kind's part of the value is allocated; the key follows it. */
    entry_value value;
} memory_entry;

/* An open-addressing array of entry pointers, resized incrementally: while
 * old_slots is set, every entry is in exactly one of the two arrays, new
 * ones go to slots, and old_slots[0, old_cursor) are empty. */
typedef struct {
    memory_entry **slots;
    size_t slot_count;   /* a power of two, at least MIN_SLOTS */
    size_t used;         /* entries held, in both arrays */
    memory_entry **old_slots; /* NULL: no resize in progress */
    size_t old_slot_count;
    size_t old_cursor;
    size_t old_released; /* old_slots[0, old_released) given back to the system */
    /* Old slots to walk per entry added, so that the resize ends before
     * slots is half full. */
    size_t slots_per_added;
    size_t hash_offset;  /* offsetof(memory_entry, the hash this array uses) */
} slot_array;

/* How much work the table did in one go: tests hold it to its bounds. */
typedef struct {
    size_t longest_resize_step;     /* the most slots one resize step walked */
    unsigned long long whole_resizes; /* resizes of a large array finished in one call */
    size_t last_match_examined;     /* entries delete_matching() looked at last */
} table_work;

typedef struct {
    PyObject_HEAD
    slot_array keys;       /* every entry, by key */
    slot_array identities; /* the first entry of each indexed tenant and identity */
    memory_entry *unindexed; /* entries whose key has no "{tenant:scope:identity}" tag */
    size_t unindexed_count;
    size_t max_entries;
    memory_entry *newest;
    memory_entry *oldest;
    /* Where the sweep goes on (NULL: from the oldest entry), and how many
     * times it has walked up to the newest. */
    memory_entry *sweep_next;
    unsigned long long sweep_passes;
    uint64_t hash_key[2];
    unsigned long long evictions;
    /* decide() sweeps sweep_entries entries every sweep_every decisions (0: never). */
    size_t sweep_every;
    size_t sweep_entries;
    size_t until_sweep;
    unsigned long long version; /* changes with every call that may change the table */
    table_work work;
} MemoryStore;

/* The tenant and identity of a key's hash tag, or of a pattern's. */
typedef struct {
    const unsigned char *tenant;
    size_t tenant_size;
    const unsigned char *identity;
    size_t identity_size;
} identity_span;

/* SipHash-1-3 of data under key. */
uint64_t siphash13(const uint64_t key[2], const unsigned char *data, size_t size);
uint64_t load_le64(const unsigned char *bytes);

/* Entries: allocated with room for the kind's value and the key. */
memory_entry *entry_new(int kind, const unsigned char *key, size_t key_size, uint64_t hash);
void entry_free(memory_entry *entry);
unsigned char *entry_key(const memory_entry *entry);
int entry_expired(const memory_entry *entry, int64_t now_ms);
/* Frees the loaded texts of a log's members [from, from + count). */
void log_release_items(log_value *log, size_t from, size_t count);

uint64_t store_hash(const MemoryStore *store, const unsigned char *key, size_t key_size);
void lru_unlink(MemoryStore *store, memory_entry *entry);
void lru_touch(MemoryStore *store, memory_entry *entry);
/* An empty table (0, or -1 with MemoryError); table_release frees it all. */
int table_init(MemoryStore *store);
void table_release(MemoryStore *store);
/* The entry holding this key, expired or not, or NULL. */
memory_entry *table_find(const MemoryStore *store, const unsigned char *key, size_t key_size,
                         uint64_t hash);
/* Room for extra more entries (0, or -1 with MemoryError); moves a resize in
 * progress on by a bounded step. */
int table_reserve(MemoryStore *store, size_t extra);
void table_insert(MemoryStore *store, memory_entry *entry);
void table_remove(MemoryStore *store, memory_entry *entry);
void table_clear(MemoryStore *store);
void table_maybe_shrink(MemoryStore *store);
void evict_beyond_cap(MemoryStore *store);
/* Slots a resize in progress has yet to walk (0: none in progress). */
size_t table_resize_slots_left(const MemoryStore *store);
/* Look at up to budget entries, from the least recently used toward the most
 * recently used, going on from where the last sweep stopped (past the most
 * recently used, a pass is over: sweep_passes counts it, and the next starts
 * again from the least recently used); drop those expired at now_ms and those
 * idle() calls droppable. Returns how many were dropped. A resize in progress
 * moves on by budget slots per array first. */
void table_sweep_from_oldest(MemoryStore *store);
long long table_sweep(MemoryStore *store, size_t budget,
                      int (*idle)(const memory_entry *entry, int64_t now_ms), int64_t now_ms);

/* The inside of text's one hash tag: after its only "{", up to (*close) the
 * only "}", which follows it; NULL when text has another brace or none. */
const unsigned char *hash_tag_inside(const unsigned char *text, size_t size,
                                     const unsigned char **close);

/* The identity index. key_identity: a key of the shape
 * "...{<tenant>:<scope>:<identity>}..." with no other brace and no other
 * colon inside the braces, 1; any other key, 0 (such keys are on the
 * unindexed list). */
int key_identity(const unsigned char *key, size_t key_size, identity_span *span);
uint64_t identity_hash(const MemoryStore *store, const identity_span *span);
/* The first indexed entry of this tenant and identity (the rest follow by
 * same_identity_next), or NULL. */
memory_entry *identity_first(const MemoryStore *store, const identity_span *span,
                             uint64_t hash);

#endif /* MODERATO_STORE_TABLE_H */
