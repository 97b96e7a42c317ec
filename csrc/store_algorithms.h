/* memory://'s algorithms: one store_<algorithm>.c each, holding its
 * argument parsing, its evaluate and apply steps over its typed per-key
 * state, and, on its last line, its entry. */
#ifndef MODERATO_STORE_ALGORITHMS_H
#define MODERATO_STORE_ALGORITHMS_H

#include "store_bucket.h"

/* Every algorithm, in the registry's order (moderato/algorithms/, and
 * MEMORY_ALGORITHMS): X(name) once each. The one list the declarations
 * below and store_decide.c's table are built from. */
#define STORE_ALGORITHM_NAMES(X)                                                       \
    X(fixed_window) X(token_bucket) X(sliding_window) X(gcra) X(sliding_log) X(leaky_bucket)

#define STORE_ALGORITHM_DECLARE(algo) extern const memory_algorithm store_##algo;
STORE_ALGORITHM_NAMES(STORE_ALGORITHM_DECLARE)
#undef STORE_ALGORITHM_DECLARE

/* An algorithm's entry, the last line of its store_<algo>.c: the name is
 * the registry's, and <algo>_evaluate and <algo>_apply are the steps every
 * algorithm has. parse_extra and prepare are optional (NULL); burst_bound_s
 * is 0 for an algorithm that takes no burst. */
#define STORE_ALGORITHM(algo, extra_fields_, burst_bound_s_, parse_extra_, prepare_)   \
    const memory_algorithm store_##algo = {                                            \
        .name = #algo,                                                                 \
        .extra_fields = (extra_fields_),                                               \
        .burst_bound_s = (burst_bound_s_),                                             \
        .parse_extra = (parse_extra_),                                                 \
        .evaluate = algo##_evaluate,                                                   \
        .prepare = (prepare_),                                                         \
        .apply = algo##_apply,                                                         \
    }

/* The apply step of the two counters (fixed and sliding window): INCRBY of
 * the cost on the policy's first target; PEXPIREAT write_expire_at_ms only
 * on a counter found at 0 (created): later admissions keep its expiry. */
static inline void
charge_counter(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    if (entry->value.counter == 0) {
        entry->expire_at_ms = policy->write_expire_at_ms;
    }
    entry->value.counter += call->cost_scaled;
}

/* The sliding log's sorted set (store_sliding_log.c), which dump() and
 * load() read and write too. */
log_item *log_at(const log_value *log, size_t rank);
const char *log_member_text(const log_item *item, char *buffer, size_t *size);
int log_compare_items(const void *a, const void *b);
int log_same_member(const log_item *a, const log_item *b);
int log_is_regular(const log_value *log);

#endif /* MODERATO_STORE_ALGORITHMS_H */
