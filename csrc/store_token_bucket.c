/* token_bucket over its typed state (a bucket_value at <base>:bucket:v2):
 * token_bucket.lua's math, in process. The refill is store_bucket.c's. */
#include "store.h"

static const char bucket_suffix[] = ":bucket:v2";

static int
token_bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    refilled_bucket bucket;
    if (bucket_evaluate(store, call, policy, bucket_suffix, sizeof(bucket_suffix) - 1,
                        KIND_BUCKET, &bucket) < 0) {
        return -1;
    }
    policy->write_value[0] = bucket.tokens_scaled - call->cost_scaled;
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

STORE_ALGORITHM(token_bucket, 1, token_bucket_parse_extra, NULL);
