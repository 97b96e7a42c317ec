/* A policy's keys in one memory:// call: derived from its base key into the
 * call's key space, looked up in the table, and the entries the writes go
 * to. store_keys.c. */
#ifndef MODERATO_STORE_KEYS_H
#define MODERATO_STORE_KEYS_H

#include "store_validate.h"

/* Room for keys_per_base keys of each base (base + a suffix of at most
 * MAX_SUFFIX_BYTES): 0, or -1 with MemoryError. */
int reserve_key_space(memory_call *call, size_t keys_per_base, const Py_ssize_t *base_sizes,
                      int bases);
void release_key_space(memory_call *call);
/* base + suffix in the call's key space. */
unsigned char *derive_key(memory_call *call, const char *base, Py_ssize_t base_size,
                          const char *suffix, size_t suffix_size, size_t *key_size);
/* ":<index>" as the scripts write it (base .. ':' .. index: an integer, in full). */
size_t index_suffix(int64_t index, char *out);
/* Derive the policy's next target key (base + suffix) and look it up. */
memory_target *add_target(MemoryStore *store, memory_call *call, memory_policy *policy,
                          const char *suffix, size_t suffix_size, int create_kind);
memory_target *add_index_target(MemoryStore *store, memory_call *call, memory_policy *policy,
                                int64_t index, int create_kind);
/* The entry a write goes to; cannot fail once prepared. */
memory_entry *target_entry(MemoryStore *store, memory_target *target, int64_t now_ms);

#endif /* MODERATO_STORE_KEYS_H */
