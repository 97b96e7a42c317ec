/* fixed_window over its typed state (a counter at <base>:<window index>):
 * fixed_window.lua's math, in process. */
#include "store_algorithms.h"

static int
fixed_window_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t window_index = floor_div(now_ms, policy->window_ms);
    int64_t window_end_ms = (window_index + 1) * policy->window_ms;
    memory_target *target = add_index_target(store, call, policy, window_index, KIND_COUNTER);
    int64_t used_scaled;
    if (read_counter(target, &used_scaled) < 0) {
        return -1;
    }
    /* A lowered capacity can leave more used than the capacity. */
    int64_t headroom_scaled = policy->capacity_scaled - used_scaled;
    memory_verdict *verdict = &policy->verdict;
    headroom_verdict(verdict, policy->capacity_scaled, cost_scaled, headroom_scaled);
    verdict->reset_charged_ms = window_end_ms;
    verdict->reset_uncharged_ms = window_end_ms;
    verdict->retry_ms = window_end_ms - now_ms;
    verdict->reset_denied_ms = window_end_ms;
    policy->write_expire_at_ms = window_end_ms;
    return 0;
}

static void
fixed_window_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    charge_counter(store, call, policy);
}

STORE_ALGORITHM(fixed_window, 0, 0, NULL, NULL);
