/* gcra over its typed state (a gcra_value at <base>:gcra): the theoretical
 * arrival time (TAT) in whole us plus frac / capacity of a us. With a burst
 * the TAT may run burst * W / capacity ahead of now (the tolerance), W
 * without one. */
#include "store_algorithms.h"

static const char gcra_suffix[] = ":gcra";

/* gcra.lua's window bound: a TAT reaches now + 2 windows in us, below 2^53 until
 * ACCEL_MAX_NOW_MS. */
static int
gcra_parse_extra(memory_call *Py_UNUSED(call), memory_policy *policy, Py_ssize_t argv_index)
{
    if (policy->window_s > ACCEL_GCRA_MAX_WINDOW_S) {
        refuse("MODERATO_ARG",
               "ARGV[%zd] (window_s of policy %d) must be at most " ACCEL_TEXT(
                   ACCEL_GCRA_MAX_WINDOW_S) " for gcra (its microsecond times stay below 2^53), "
                                            "got %lld",
               argv_index, policy->number, (long long)policy->window_s);
        return -1;
    }
    return 0;
}

/* floor(a * b / m) and (a * b) mod m, exactly, for 0 <= a, m < 2^44 and
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

static int
gcra_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    static const long long highs[2] = {ACCEL_MAX_SAFE_INTEGER, ACCEL_MAX_SAFE_INTEGER};
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t capacity_scaled = policy->capacity_scaled; /* refilled per window */
    int64_t burst_scaled = policy->burst_scaled;       /* what the bucket holds */
    int64_t window_us = policy->window_ms * US_PER_MS;
    int64_t now_us = now_ms * US_PER_MS;
    /* The tolerance, burst * W / C us exactly (W itself without a burst). */
    int64_t tolerance_us, tolerance_frac;
    mul_div_mod(burst_scaled, window_us, capacity_scaled, &tolerance_us, &tolerance_frac);
    memory_target *target =
        add_target(store, call, policy, gcra_suffix, sizeof(gcra_suffix) - 1, KIND_GCRA);
    int64_t fields[2];
    int present;
    if (read_hash(target, KIND_GCRA, highs, fields, &present) < 0) {
        return -1;
    }
    /* start = max(TAT, now), at most now + the tolerance. */
    int64_t start_us = now_us, start_frac = 0;
    if (present) {
        int64_t tat_us = fields[GCRA_TAT], tat_frac = fields[GCRA_FRAC];
        if (tat_frac >= capacity_scaled) {
            tat_us += 1; /* a capacity lowered since: one whole us */
            tat_frac = 0;
        }
        int64_t full_us = now_us + tolerance_us;
        if (tat_us > full_us || (tat_us == full_us && tat_frac >= tolerance_frac)) {
            /* more than a full bucket: the clock stepped back */
            start_us = full_us;
            start_frac = tolerance_frac;
        }
        else if (tat_us >= now_us) {
            start_us = tat_us;
            start_frac = tat_frac;
        }
    }
    /* Scaled units in the bucket, rounded up: ceil(((start - now) * C + frac) / W). */
    int64_t backlog_quotient, backlog_remainder;
    mul_div_mod(start_us - now_us, capacity_scaled, window_us, &backlog_quotient,
                &backlog_remainder);
    int64_t level_scaled =
        backlog_quotient + (backlog_remainder + start_frac + window_us - 1) / window_us;
    int64_t remaining_scaled = burst_scaled - level_scaled;
    memory_verdict *verdict = &policy->verdict;
    verdict->fits = cost_scaled <= remaining_scaled;
    verdict->permanent = cost_scaled > burst_scaled;
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
        policy->write_expire_at_ms = verdict->reset_charged_ms + ACCEL_DRAINED_EXPIRY_MARGIN_MS;
    }
    else {
        /* The cost fits once the new TAT is no more than the tolerance ahead. */
        int64_t ahead_us = new_us - tolerance_us, ahead_frac = new_frac - tolerance_frac;
        if (ahead_frac < 0) {
            ahead_us -= 1;
            ahead_frac += capacity_scaled;
        }
        verdict->reset_denied_ms = ceil_ms(ahead_us, ahead_frac);
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

STORE_ALGORITHM(gcra, 0, ACCEL_GCRA_MAX_WINDOW_S, gcra_parse_extra, NULL);
