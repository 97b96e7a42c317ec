/* sliding_window over its typed state (counters at <base>:<index> and
 * <base>:<index - 1>): the previous window weighted by what is left of it. */
#include "store_algorithms.h"

static int64_t
previous_weight_permille(int64_t window_s, int64_t elapsed_s)
{
    return floor_div((window_s - elapsed_s) * 1000, window_s);
}

/* floor(count * weight / 1000), exactly, for any count up to 2^53. */
static int64_t
weighted_scaled(int64_t count_scaled, int64_t weight_permille)
{
    int64_t thousands = floor_div(count_scaled, 1000);
    int64_t rest = count_scaled - thousands * 1000;
    return thousands * weight_permille + floor_div(rest * weight_permille, 1000);
}

/* The smallest second in [first_s, last_s] at which previous_scaled,
 * weighted for it, stays within budget_scaled; -1 if none. */
static int64_t
first_fitting_second(int64_t previous_scaled, int64_t budget_scaled, int64_t window_s,
                     int64_t first_s, int64_t last_s)
{
#define FITS_AT(second) \
    (weighted_scaled(previous_scaled, previous_weight_permille(window_s, (second))) <= budget_scaled)
    if (budget_scaled < 0 || first_s > last_s || !FITS_AT(last_s)) {
        return -1;
    }
    while (first_s < last_s) {
        int64_t middle_s = floor_div(first_s + last_s, 2);
        if (FITS_AT(middle_s)) {
            last_s = middle_s;
        }
        else {
            first_s = middle_s + 1;
        }
    }
    return first_s;
#undef FITS_AT
}

static int64_t
sliding_retry_at_ms(const memory_policy *policy, int64_t cost_scaled, int64_t window_index,
                    int64_t elapsed_s, int64_t previous_scaled, int64_t current_scaled)
{
    int64_t window_s = policy->window_s, window_ms = policy->window_ms;
    int64_t window_start_ms = window_index * window_ms;
    int64_t budget_scaled = policy->capacity_scaled - cost_scaled;
    int64_t second = first_fitting_second(previous_scaled, budget_scaled - current_scaled,
                                          window_s, elapsed_s + 1, window_s - 1);
    if (second >= 0) {
        return window_start_ms + second * 1000;
    }
    second = first_fitting_second(current_scaled, budget_scaled, window_s, 0, window_s - 1);
    if (second >= 0) {
        return window_start_ms + window_ms + second * 1000;
    }
    return window_start_ms + 2 * window_ms;
}

static int
sliding_window_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t window_s = policy->window_s, window_ms = policy->window_ms;
    int64_t window_index = floor_div(now_ms, window_ms);
    int64_t window_start_ms = window_index * window_ms;
    int64_t elapsed_s = floor_div(now_ms - window_start_ms, 1000);
    memory_target *current =
        add_index_target(store, call, policy, window_index, KIND_COUNTER);
    memory_target *previous = add_index_target(store, call, policy, window_index - 1, 0);
    int64_t current_scaled, previous_scaled;
    if (read_counter(current, &current_scaled) < 0 ||
        read_counter(previous, &previous_scaled) < 0) {
        return -1;
    }
    int64_t weighted_previous_scaled =
        weighted_scaled(previous_scaled, previous_weight_permille(window_s, elapsed_s));
    int64_t headroom_scaled = (policy->capacity_scaled - current_scaled) - weighted_previous_scaled;
    int64_t window_end_ms = window_start_ms + window_ms;
    memory_verdict *verdict = &policy->verdict;
    headroom_verdict(verdict, policy->capacity_scaled, cost_scaled, headroom_scaled);
    verdict->reset_charged_ms = window_end_ms;
    verdict->reset_uncharged_ms = window_end_ms;
    if (!verdict->fits && !verdict->permanent) {
        verdict->reset_denied_ms = sliding_retry_at_ms(policy, cost_scaled, window_index,
                                                       elapsed_s, previous_scaled, current_scaled);
        verdict->retry_ms = verdict->reset_denied_ms - now_ms;
    }
    /* A created counter is read as the previous one until the end of the
     * next window. */
    policy->write_expire_at_ms = window_end_ms + window_ms;
    return 0;
}

static void
sliding_window_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    charge_counter(store, call, policy);
}

STORE_ALGORITHM(sliding_window, 0, 0, NULL, NULL);
