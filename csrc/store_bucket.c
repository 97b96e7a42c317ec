/* The token bucket's refill, shared by token_bucket (tokens) and
 * leaky_bucket (its dual, tokens = capacity - level): the public accrual
 * (exact integers, capacity per window) and the custom one (the script's
 * floating point), the reset instants, and the verdict. The bucket holds
 * burst_scaled: the capacity, or a burst apart from what refills. */
#include <math.h>
#include <string.h>

#include "store_bucket.h"

static void
bucket_public_rate(memory_policy *policy)
{
    policy->per_ms_whole = floor_div(policy->capacity_scaled, policy->window_ms);
    policy->per_ms_rest = policy->capacity_scaled - policy->per_ms_whole * policy->window_ms;
}


/* Above ACCEL_ACCRUAL_EXACT_WINDOW_MS (26 h) a capacity of at most 2^53 / window keeps
 * elapsed * per_ms_rest within 2^53 (prelude.lua's exact_accrual); then the public
 * rate, split for the accrual. */
int
bucket_parse_policy(memory_policy *policy, Py_ssize_t argv_index)
{
    int64_t largest_scaled = floor_div(ACCEL_MAX_SAFE_INTEGER, policy->window_ms);
    if (policy->window_ms > ACCEL_ACCRUAL_EXACT_WINDOW_MS && policy->capacity_scaled > largest_scaled) {
        /* ARGV[argv_index - 1], 1-based: capacity_scaled */
        refuse("MODERATO_ARG",
               "ARGV[%zd] (capacity_scaled of policy %d) must be at most %lld for a window of "
               "%lld s (accrual stays below 2^53), got %lld",
               argv_index - 1, policy->number, (long long)largest_scaled,
               (long long)policy->window_s, (long long)policy->capacity_scaled);
        return -1;
    }
    bucket_public_rate(policy);
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

/* The smallest elapsed_ms in [0, window] crediting at least target_scaled
 * (0 <= target_scaled <= capacity). */
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


/* The stored bucket brought up to now (the scripts' refill()). bucket is
 * NULL for a missing one; key names the bucket in an error. */
static int
refill(const memory_policy *policy, const stored_bucket *bucket, int64_t now_ms,
       const unsigned char *key, size_t key_size, refilled_bucket *out)
{
    int64_t capacity_scaled = policy->capacity_scaled; /* credited per window */
    int64_t burst_scaled = policy->burst_scaled;       /* what the bucket holds */
    if (bucket == NULL) {
        *out = (refilled_bucket){burst_scaled, now_ms, 0, 0};
        return 0;
    }
    /* A base ahead of the clock means no time has passed yet. */
    int64_t now_eff_ms = now_ms > bucket->base_ms ? now_ms : bucket->base_ms;
    int64_t base_ms = bucket->base_ms;
    int64_t elapsed_ms = now_eff_ms - base_ms;
    int64_t tokens_scaled =
        bucket->tokens_scaled < burst_scaled ? bucket->tokens_scaled : burst_scaled;
    int64_t credited_scaled = bucket->credited_scaled;
    int full;

    if (policy->custom_rate) {
        double due_scaled = custom_credit_scaled(policy, (double)elapsed_ms);
        if (due_scaled < (double)credited_scaled) {
            base_ms = now_eff_ms;
            credited_scaled = 0;
            elapsed_ms = 0;
            full = tokens_scaled >= burst_scaled;
        }
        else {
            full = due_scaled - (double)credited_scaled >= (double)(burst_scaled - tokens_scaled);
            if (!full) {
                if (due_scaled > (double)ACCEL_MAX_SAFE_INTEGER) {
                    return refuse_key_state(
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
            full = tokens_scaled >= burst_scaled;
        }
        else if (whole_windows >= 2 &&
                 (whole_windows - 1 > burst_scaled / capacity_scaled ||
                  (whole_windows - 1) * capacity_scaled >= burst_scaled)) {
            /* k windows credit more than (k - 1) * capacity: full once that
             * reaches the burst (the first test keeps the product in range). */
            full = 1;
        }
        else if (whole_windows >= 1) {
            /* Due since base = k * capacity + credit(elapsed - k windows);
             * rebase by k whole windows. */
            int64_t credit_in_window_scaled =
                public_credit_scaled(policy, elapsed_ms - whole_windows * window_ms);
            int64_t gain_scaled =
                whole_windows * capacity_scaled - credited_scaled + credit_in_window_scaled;
            full = gain_scaled >= burst_scaled - tokens_scaled;
            if (!full) {
                tokens_scaled += gain_scaled;
                base_ms += whole_windows * window_ms;
                elapsed_ms -= whole_windows * window_ms;
                credited_scaled = credit_in_window_scaled;
            }
        }
        else {
            full = due_scaled - credited_scaled >= burst_scaled - tokens_scaled;
            if (!full) {
                tokens_scaled += due_scaled - credited_scaled;
                credited_scaled = due_scaled;
            }
        }
    }
    if (full) {
        /* A full bucket discards idle credit, fractions too. */
        *out = (refilled_bucket){burst_scaled, now_eff_ms, 0, 0};
        return 0;
    }
    *out = (refilled_bucket){tokens_scaled, base_ms, credited_scaled, elapsed_ms};
    return 0;
}

/* When (a Unix time in ms, as the script's number) need_scaled more units
 * have been credited (need_scaled <= burst: with a burst, several windows). */
static int
bucket_reset_at(const memory_policy *policy, const refilled_bucket *bucket, int64_t need_scaled,
                const memory_target *target, double *reset_at_ms)
{
    int64_t capacity_scaled = policy->capacity_scaled;
    if (!policy->custom_rate) {
        int64_t left_in_window_scaled = capacity_scaled - bucket->credited_scaled;
        int64_t wait_ms;
        if (need_scaled <= left_in_window_scaled) {
            wait_ms = public_elapsed_for_credit_ms(policy, bucket->credited_scaled + need_scaled);
        }
        else {
            /* Whole windows past this one, then the rest (1..capacity) in the last. */
            int64_t beyond_scaled = need_scaled - left_in_window_scaled;
            int64_t more_windows = (beyond_scaled - 1) / capacity_scaled;
            wait_ms = (1 + more_windows) * policy->window_ms +
                      public_elapsed_for_credit_ms(policy,
                                                   beyond_scaled - more_windows * capacity_scaled);
        }
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
    return refuse_key_state(target->key, target->key_size,
                               "custom refill wait did not converge for %U");
}

/* Twice the longer of the window and a full refill (a burst's in whole
 * windows), plus a margin. */
double
bucket_ttl_ms(const memory_policy *policy)
{
    double full_refill_ms = (double)policy->window_ms;
    if (policy->burst_scaled > policy->capacity_scaled) {
        int64_t whole_windows =
            (policy->burst_scaled + policy->capacity_scaled - 1) / policy->capacity_scaled;
        full_refill_ms = (double)(whole_windows * policy->window_ms);
    }
    if (policy->custom_rate) {
        double refill_ms =
            ceil((double)policy->capacity_scaled * 1000.0 / policy->refill_scaled_per_s);
        full_refill_ms = refill_ms > full_refill_ms ? refill_ms : full_refill_ms;
    }
    return 2.0 * full_refill_ms + (double)ACCEL_BUCKET_EXPIRY_MARGIN_MS;
}

/* ---- the token bucket's verdict (token_bucket, leaky_bucket) ---------------- */

/* The verdict of a bucket; the refilled bucket, for the write. */
static int
bucket_verdict(memory_call *call, memory_policy *policy, const memory_target *target,
               const stored_bucket *stored, refilled_bucket *bucket)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t burst_scaled = policy->burst_scaled; /* what the bucket holds */
    if (refill(policy, stored, now_ms, target->key, target->key_size, bucket) < 0) {
        return -1;
    }
    memory_verdict *verdict = &policy->verdict;
    int64_t tokens_scaled = bucket->tokens_scaled;
    verdict->fits = cost_scaled <= tokens_scaled;
    verdict->permanent = cost_scaled > burst_scaled;
    verdict->remaining_uncharged = tokens_scaled;
    double reset_ms;
    if (verdict->fits) {
        /* Allowed: reset is the full-refill time, with or without this charge. */
        verdict->remaining_charged = tokens_scaled - cost_scaled;
        if (bucket_reset_at(policy, bucket, burst_scaled - tokens_scaled + cost_scaled, target,
                            &reset_ms) < 0) {
            return -1;
        }
        verdict->reset_charged_ms = lua_integer(reset_ms);
        if (bucket_reset_at(policy, bucket, burst_scaled - tokens_scaled, target, &reset_ms) <
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

int
bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy,
                const char *suffix, size_t suffix_size, int kind, refilled_bucket *bucket)
{
    memory_target *target = add_target(store, call, policy, suffix, suffix_size, kind);
    int64_t fields[3];
    int present;
    if (read_hash(target, kind, bucket_highs, fields, &present) < 0) {
        return -1;
    }
    /* Both layouts: tokens (level), base, credited (drained), in that order. */
    stored_bucket stored = {fields[BUCKET_TOKENS], fields[BUCKET_BASE], fields[BUCKET_CREDITED]};
    if (kind == KIND_LEAKY) {
        /* tokens = burst - level; a level above it (capacity lowered on a
         * live key) reads as full. */
        int64_t burst_scaled = policy->burst_scaled;
        int64_t level_scaled =
            fields[LEAKY_LEVEL] < burst_scaled ? fields[LEAKY_LEVEL] : burst_scaled;
        stored.tokens_scaled = burst_scaled - level_scaled;
    }
    if (bucket_verdict(call, policy, target, present ? &stored : NULL, bucket) < 0) {
        return -1;
    }
    policy->write_value[1] = bucket->base_ms;
    policy->write_value[2] = bucket->credited_scaled;
    return 0;
}

/* Whether the bucket decides exactly as a missing one would under the
 * policy it was last written with: full by now, its base not ahead. */
static int
bucket_idle_full(const memory_entry *entry, int64_t now_ms)
{
    const bucket_value *bucket = &entry->value.bucket;
    memory_policy policy;
    refilled_bucket refilled = {0, 0, 0, 0};
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
    policy.burst_scaled = bucket->burst_scaled > 0 ? bucket->burst_scaled : bucket->capacity_scaled;
    policy.window_ms = bucket->window_ms;
    policy.custom_rate = bucket->refill_scaled_per_s > 0.0;
    policy.refill_scaled_per_s = bucket->refill_scaled_per_s;
    bucket_public_rate(&policy);
    stored_bucket stored = {bucket->field[BUCKET_TOKENS], bucket->field[BUCKET_BASE],
                            bucket->field[BUCKET_CREDITED]};
    if (refill(&policy, &stored, now_ms, entry_key(entry), entry->key_size, &refilled) < 0) {
        PyErr_Clear();
        return 0;
    }
    return refilled.tokens_scaled == policy.burst_scaled && refilled.base_ms == now_ms &&
           refilled.credited_scaled == 0;
}

int
store_entry_idle(const memory_entry *entry, int64_t now_ms)
{
    return entry->kind == KIND_BUCKET && bucket_idle_full(entry, now_ms);
}
