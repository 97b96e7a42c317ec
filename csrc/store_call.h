/* memory:// (the MemoryStore, memory.c), the bottom of its decision step:
 * the types one decide() call works with. Its headers go one way, each
 * including the one before it:
 *
 *   store_table.h       the table of keys and their typed state
 *   store_call.h        one call: policies, targets, verdicts, the
 *                       algorithm entry's shape
 *   store_validate.h    arguments and refusals, as the scripts word them,
 *                       and typed reads of stored state (store_validate.c)
 *   store_keys.h        a policy's keys: derived, looked up, written
 *                       (store_keys.c)
 *   store_bucket.h      the refill both buckets share (store_bucket.c)
 *   store_algorithms.h  the algorithms, one store_<algorithm>.c each: its
 *                       argument parsing, evaluate and apply steps, and its
 *                       entry
 *   store_decide.h      the top: decide() (store_decide.c), and the other
 *                       methods memory.c's type lists (store_glob.c,
 *                       store_debug.c)
 */
#ifndef MODERATO_STORE_CALL_H
#define MODERATO_STORE_CALL_H

#include <stdint.h>

#include "contract.h"
#include "errors.h"
#include "store_table.h"

#define US_PER_MS 1000LL
#define LOG_TEXT_BYTES 48 /* 16 digits, ":", a 64-bit cost */
#define MAX_SEARCH_STEPS 1000

#define MAX_TARGETS 2       /* keys one policy of one decision reads or writes */
#define MAX_SUFFIX_BYTES 32 /* a state suffix: ":" and up to 31 bytes; ":" and a 64-bit index */
#define INLINE_KEY_BYTES 2048
#define SHOWN_ARG_BYTES 40
#define SHOWN_KEY_BYTES 1024

/* What one policy would answer, charged or not: conclude() picks from it. */
typedef struct {
    int fits;
    int permanent;
    int64_t remaining_uncharged;
    int64_t remaining_charged;
    int64_t reset_charged_ms;
    int64_t reset_uncharged_ms;
    int64_t retry_ms;
    int64_t reset_denied_ms;
} memory_verdict;

/* A key a policy reads, and perhaps writes. */
typedef struct {
    unsigned char *key;
    size_t key_size;
    uint64_t hash;
    memory_entry *entry; /* the live entry as read, or NULL */
    memory_entry *fresh; /* allocated before the writes, for a key they create */
    int create_kind;     /* what a write creates when the key is missing; 0: never */
} memory_target;

typedef struct {
    int number; /* 1-based, as the scripts' messages count */
    const char *base;
    Py_ssize_t base_size;
    int64_t capacity_scaled; /* what refills per window (and, without a burst, the bucket) */
    int64_t window_s;
    int64_t window_ms;
    /* what the bucket holds (the buckets and gcra): burst_scaled, else capacity_scaled */
    int64_t burst_scaled;
    /* token bucket */
    int custom_rate;
    double refill_scaled_per_s;
    int64_t per_ms_whole;
    int64_t per_ms_rest;
    memory_verdict verdict;
    memory_target targets[MAX_TARGETS];
    int target_count;
    /* what apply() writes, computed by evaluate() */
    int64_t write_value[6];
    int64_t write_expire_at_ms;
} memory_policy;

struct memory_algorithm;

typedef struct {
    const struct memory_algorithm *algorithm;
    PyObject *const *argv;
    Py_ssize_t argc;
    int64_t cost_scaled;
    int apply;
    int64_t now_ms;
    int policy_count;
    memory_policy policies[ACCEL_MAX_POLICIES];
    unsigned char *key_space;
    size_t key_space_used;
    size_t key_space_size;
    unsigned char inline_keys[INLINE_KEY_BYTES];
} memory_call;

/* An algorithm: one entry, defined in its own store_<name>.c
 * (store_algorithms.h's STORE_ALGORITHM). */
typedef struct memory_algorithm {
    const char *name;
    int extra_fields; /* per-policy ARGV fields after capacity_scaled and window_s */
    /* 0, or it takes a burst_scaled after a policy's fields, refilled within this
     * many seconds in whole windows (prelude.lua's check_burst) */
    long long burst_bound_s;
    int (*parse_extra)(memory_call *call, memory_policy *policy, Py_ssize_t argv_index);
    /* Reads the state, decides, plans the writes; changes nothing. */
    int (*evaluate)(MemoryStore *store, memory_call *call, memory_policy *policy);
    /* Optional: allocates what the writes need beyond new entries. */
    int (*prepare)(MemoryStore *store, memory_call *call, memory_policy *policy);
    /* Writes; cannot fail. */
    void (*apply)(MemoryStore *store, memory_call *call, memory_policy *policy);
} memory_algorithm;

/* A call's keys and its other sequence (reset's and decide's args) as
 * PySequence_Fast: both and 0, or neither and -1 (the TypeError of the first
 * that is not a sequence). */
static inline int
fast_sequences(PyObject *keys_arg, const char *keys_message, PyObject **keys,
               PyObject *other_arg, const char *other_message, PyObject **other)
{
    *keys = PySequence_Fast(keys_arg, keys_message);
    if (*keys == NULL) {
        return -1;
    }
    *other = PySequence_Fast(other_arg, other_message);
    if (*other == NULL) {
        Py_CLEAR(*keys);
        return -1;
    }
    return 0;
}

/* The arguments reset() and decide() share, in this order: now_ms as
 * read_now reads it (parse_now, or decide's parse_now_or_clock), then the
 * keys and the args (fast_sequences). All three and 0, or no sequence and
 * -1 (the error of the first that is wrong). function is the method's name,
 * a literal (STORE_CALL_ARGUMENTS words the messages). */
static inline int
call_arguments(int (*read_now)(const char *, PyObject *, int64_t *), const char *function,
               PyObject *now_arg, int64_t *now_ms, PyObject *keys_arg, const char *keys_message,
               PyObject **keys, PyObject *args_arg, const char *args_message, PyObject **args)
{
    if (read_now(function, now_arg, now_ms) < 0) {
        return -1;
    }
    return fast_sequences(keys_arg, keys_message, keys, args_arg, args_message, args);
}
#define STORE_CALL_ARGUMENTS(read_now, function, now_arg, now_ms, keys_arg, keys, args_arg,    \
                             args)                                                             \
    call_arguments((read_now), function, (now_arg), (now_ms), (keys_arg),                      \
                   "MemoryStore." function "() keys must be a sequence", (keys), (args_arg),   \
                   "MemoryStore." function "() args must be a sequence", (args))

/* The scripts' floor_div for numerator >= 0, denominator >= 1. */
static inline int64_t
floor_div(int64_t numerator, int64_t denominator)
{
    return numerator / denominator;
}

/* What Redis replies for a Lua number: truncated to a long long (x86-64
 * gives LLONG_MIN for anything out of range; so does this). */
static inline int64_t
lua_integer(double value)
{
    if (value >= -9223372036854775808.0 && value < 9223372036854775808.0) {
        return (int64_t)value;
    }
    return INT64_MIN;
}

/* The verdict of a counter-like policy (fixed and sliding window, sliding
 * log): headroom against the cost. */
static inline void
headroom_verdict(memory_verdict *verdict, int64_t capacity_scaled, int64_t cost_scaled,
                 int64_t headroom_scaled)
{
    /* A lowered capacity can leave less than nothing: remaining stays 0. */
    verdict->fits = cost_scaled <= headroom_scaled;
    verdict->permanent = cost_scaled > capacity_scaled;
    verdict->remaining_uncharged = headroom_scaled > 0 ? headroom_scaled : 0;
    verdict->remaining_charged =
        headroom_scaled - cost_scaled > 0 ? headroom_scaled - cost_scaled : 0;
}

#endif /* MODERATO_STORE_CALL_H */
