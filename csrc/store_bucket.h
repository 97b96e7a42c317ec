/* The refill the token bucket and the leaky bucket (its dual, tokens =
 * capacity - level) share: the exact accrual and its argument check, the
 * reset instants, the verdict, and when a bucket is idle. store_bucket.c. */
#ifndef MODERATO_STORE_BUCKET_H
#define MODERATO_STORE_BUCKET_H

#include "store_keys.h"

typedef struct {
    int64_t tokens_scaled;
    int64_t base_ms;
    int64_t credited_scaled;
    int64_t elapsed_ms;
} refilled_bucket;

/* A bucket as stored: tokens (or capacity - level), base, credited (or drained). */
typedef struct {
    int64_t tokens_scaled;
    int64_t base_ms;
    int64_t credited_scaled;
} stored_bucket;

/* What both buckets' parse_extra ends with (argv_index as it has it): the
 * exact-accrual rule of prelude.lua (above ACCEL_ACCRUAL_EXACT_WINDOW_MS,
 * capacity_scaled <= 2^53 / window_ms), then the public rate's split. */
int bucket_parse_policy(memory_policy *policy, Py_ssize_t argv_index);
double bucket_ttl_ms(const memory_policy *policy);
/* A bucket's evaluate step, up to the level or tokens written: its key
 * (base + suffix, of kind KIND_BUCKET or KIND_LEAKY) read as tokens (the leaky
 * bucket's level as capacity - level), the verdict, the refilled bucket, and
 * the writes of its base (write_value[1]) and credit (write_value[2]). */
int bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy,
                    const char *suffix, size_t suffix_size, int kind, refilled_bucket *bucket);
/* Whether a live entry decides exactly as a missing key would (the sweep
 * drops it): a token bucket full by now. */
int store_entry_idle(const memory_entry *entry, int64_t now_ms);

#endif /* MODERATO_STORE_BUCKET_H */
