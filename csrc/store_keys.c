/* A policy's keys in one memory:// call: each derived from its base key
 * into the call's key space (inline for the usual few, else allocated), looked
 * up in the table (a read counts as a use), and the entry each write goes to. */
#include <string.h>

#include "store_keys.h"

int
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

void
release_key_space(memory_call *call)
{
    if (call->key_space != NULL && call->key_space != call->inline_keys) {
        PyMem_Free(call->key_space);
    }
    call->key_space = NULL;
}

/* base + suffix in the call's key space. */
unsigned char *
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

/* ":<index>" as the scripts write it (base .. ':' .. index: an integer, in full). */
size_t
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
memory_target *
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

memory_target *
add_index_target(MemoryStore *store, memory_call *call, memory_policy *policy, int64_t index,
                 int create_kind)
{
    char suffix[MAX_SUFFIX_BYTES];
    size_t suffix_size = index_suffix(index, suffix);
    return add_target(store, call, policy, suffix, suffix_size, create_kind);
}

/* The entry a write goes to: the live one, else the fresh one inserted in
 * place of any expired entry of the key. Cannot fail: prepare_writes()
 * allocated the entry and the table room. */
memory_entry *
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
