/* leaky_bucket over its typed state (a leaky_value at <base>:leaky):
 * the token bucket's dual, tokens = capacity - level, with the public
 * accrual (store_bucket.c). */
#include "store_algorithms.h"

static const char leaky_suffix[] = ":leaky";

static int
leaky_bucket_parse_extra(memory_call *Py_UNUSED(call), memory_policy *policy,
                         Py_ssize_t argv_index)
{
    return bucket_parse_policy(policy, argv_index);
}

static int
leaky_bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    refilled_bucket bucket;
    if (bucket_evaluate(store, call, policy, leaky_suffix, sizeof(leaky_suffix) - 1, KIND_LEAKY,
                        &bucket) < 0) {
        return -1;
    }
    policy->write_value[0] = policy->burst_scaled - bucket.tokens_scaled + call->cost_scaled;
    /* Allowed: reset_charged_ms is when the level has drained to zero. */
    policy->write_expire_at_ms = policy->verdict.reset_charged_ms + ACCEL_DRAINED_EXPIRY_MARGIN_MS;
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

STORE_ALGORITHM(leaky_bucket, 0, ACCEL_MAX_LONG_WINDOW_S, leaky_bucket_parse_extra, NULL);
