/* The decision step of memory:// over the table (store_table.h): the types
 * one decide() call works with, what every algorithm file gets from the
 * shared files, and the algorithms themselves, one registry entry each.
 *
 *   store_validate.c   the scripts' argument checks and refusal texts, and
 *                      the typed reads of stored state (MODERATO_ARG/STATE)
 *   store_decide.c     one decision: keys, evaluate every policy, the
 *                      shared verdict -> reply step, the writes
 *   store_bucket.c     refill math shared by token_bucket and leaky_bucket
 *   store_<algorithm>.c  one algorithm over its typed per-key state
 *   store_glob.c       delete_matching(): Redis's glob rules
 *   store_debug.c      dump() and load(), for tests
 *   memory.c           the MemoryStore type: methods, reset, sweep
 */
#ifndef MODERATO_STORE_H
#define MODERATO_STORE_H

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

/* ---- one decision ------------------------------------------------------------ */

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
    int64_t capacity_scaled;
    int64_t window_s;
    int64_t window_ms;
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

/* An algorithm: one entry, defined in its own store_<name>.c. */
typedef struct memory_algorithm {
    const char *name;
    int extra_fields; /* per-policy ARGV fields after capacity_scaled and window_s */
    int (*parse_extra)(memory_call *call, memory_policy *policy, Py_ssize_t argv_index);
    /* Reads the state, decides, plans the writes; changes nothing. */
    int (*evaluate)(MemoryStore *store, memory_call *call, memory_policy *policy);
    /* Optional: allocates what the writes need beyond new entries. */
    int (*prepare)(MemoryStore *store, memory_call *call, memory_policy *policy);
    /* Writes; cannot fail. */
    void (*apply)(MemoryStore *store, memory_call *call, memory_policy *policy);
} memory_algorithm;

/* Every algorithm, in MEMORY_ALGORITHMS' order: X(name) once each. The one
 * list the declarations below and store_decide.c's table are built from. */
#define STORE_ALGORITHM_NAMES(X)                                                       \
    X(fixed_window) X(token_bucket) X(sliding_window) X(gcra) X(sliding_log) X(leaky_bucket)

#define STORE_ALGORITHM_DECLARE(algo) extern const memory_algorithm store_##algo;
STORE_ALGORITHM_NAMES(STORE_ALGORITHM_DECLARE)
#undef STORE_ALGORITHM_DECLARE

/* An algorithm's registry entry, the last line of its store_<algo>.c: the
 * name is the registry's in_process name, and <algo>_evaluate and
 * <algo>_apply are the steps every algorithm has. parse_extra and prepare
 * are optional (NULL). */
#define STORE_ALGORITHM(algo, extra_fields_, parse_extra_, prepare_)                   \
    const memory_algorithm store_##algo = {                                            \
        .name = #algo,                                                                 \
        .extra_fields = (extra_fields_),                                               \
        .parse_extra = (parse_extra_),                                                 \
        .evaluate = algo##_evaluate,                                                   \
        .prepare = (prepare_),                                                         \
        .apply = algo##_apply,                                                         \
    }

/* A call's keys and its other sequence (reset's windows_s, decide's args)
 * as PySequence_Fast: both and 0, or neither and -1 (the TypeError of the
 * first that is not a sequence). */
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

/* Every algorithm, in STORE_ALGORITHM_NAMES' order (store_decide.c). */
extern const memory_algorithm *const store_algorithms[];
extern const int store_algorithm_count;

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

/* ---- store_validate.c: arguments and refusals, as the scripts word them ------- */

/* One ARGV element as the scripts see it: the text Redis would receive. An
 * int is kept as a number (its text is made only for an error message). */
typedef struct {
    PyObject *object;
    const char *data; /* str (UTF-8) or bytes */
    Py_ssize_t size;
    int is_int;
    int int_sign; /* -1 negative, 0 fits in long long, 1 too large */
    long long value;
} arg_view;

/* The field names of a hash kind, as HMGET reads them. */
typedef struct {
    int kind;
    int field_count;
    const char *const *names;
} hash_layout;

extern const hash_layout store_hash_layouts[];
extern const int store_hash_layout_count;
/* 0..2^53 tokens, 0..2^52 ms base, 0..2^53 credited (or level, base, drained). */
extern const long long bucket_highs[3];

/* Raise ValueError("<kind> <message>"). Always returns -1. */
int refuse(const char *kind, const char *format, ...);
/* MODERATO_STATE with format's one %U the shown key. Always returns -1. */
int refuse_key_state(const unsigned char *key, size_t key_size, const char *format);
int refuse_wrong_type(const memory_target *target);
PyObject *shown_bytes(const char *data, Py_ssize_t size, Py_ssize_t max_bytes);
PyObject *shown_target(const memory_target *target);
int view_arg(const char *function, const char *what, Py_ssize_t position, PyObject *object,
             arg_view *view);
int view_key(const char *function, const char *what, Py_ssize_t position, PyObject *object,
             const char **data, Py_ssize_t *size);
int parse_integer(const arg_view *view, long long low, long long high, long long *value);
/* A text slice as the scripts' parse_integer reads it. */
int parse_digits(const char *data, size_t size, long long low, long long high, long long *value);
int parse_now(const char *function, PyObject *object, int64_t *now_ms);
/* decide()'s now_ms: an int as parse_now() reads it, or None for the wall
 * clock (Unix ms, as time.time_ns() // 10**6). */
int parse_now_or_clock(const char *function, PyObject *object, int64_t *now_ms);
/* decide()'s KEYS and ARGV, checked in the scripts' order. */
int parse_call(memory_call *call, PyObject *const *keys, Py_ssize_t key_count);
/* token_bucket's refill_scaled_per_s. */
int token_bucket_parse_extra(memory_call *call, memory_policy *policy, Py_ssize_t argv_index);
/* prelude.lua's split_per_ms check (token and leaky buckets); capacity_argv is 1-based. */
int check_exact_accrual(const memory_policy *policy, Py_ssize_t capacity_argv);
/* gcra.lua's window bound. */
int gcra_parse_extra(memory_call *call, memory_policy *policy, Py_ssize_t argv_index);
/* One of reset()'s state suffixes: a window index (":#": <base>:<index> and
 * <base>:<index - 1>) or the text to append to each base key. */
typedef struct {
    const char *data;
    Py_ssize_t size;
    int window_index;
} reset_suffix;

/* reset.lua's checks of its counts: 1..ACCEL_MAX_RESET_KEYS keys, and more
 * arguments than keys. */
int refuse_reset_counts(Py_ssize_t key_count, Py_ssize_t argc);
/* reset()'s args as reset.lua's ARGV: window_s of each key (1..
 * ACCEL_MAX_LONG_WINDOW_S), then argc - key_count state suffixes. */
int parse_reset_args(PyObject *const *args, Py_ssize_t argc, Py_ssize_t key_count,
                     long long *windows_s, reset_suffix *suffixes);

/* Typed reads of the state as the scripts read it, refusing what they refuse. */
const hash_layout *layout_of(int kind);
const int64_t *hash_fields(const memory_entry *entry);
int read_counter(const memory_target *target, int64_t *value);
int read_hash(const memory_target *target, int kind, const long long *highs, int64_t *values,
              int *present);
int refuse_log_member(const memory_target *target, const char *text, size_t size,
                      int64_t at_ms);
int refuse_log_totals(const memory_target *target, int64_t newest_total, int64_t first_total);

/* ---- store_decide.c: keys and the writes -------------------------------------- */

int reserve_key_space(memory_call *call, size_t keys_per_base, const Py_ssize_t *base_sizes,
                      int bases);
void release_key_space(memory_call *call);
unsigned char *derive_key(memory_call *call, const char *base, Py_ssize_t base_size,
                          const char *suffix, size_t suffix_size, size_t *key_size);
/* ":<index>" as the scripts' decimal() writes it. */
size_t index_suffix(int64_t index, char *out);
/* The live entry of a key, or NULL; a read counts as a use. */
memory_entry *find_live(MemoryStore *store, const unsigned char *key, size_t key_size,
                        uint64_t hash, int64_t now_ms);
/* Derive the policy's next target key (base + suffix) and look it up. */
memory_target *add_target(MemoryStore *store, memory_call *call, memory_policy *policy,
                          const char *suffix, size_t suffix_size, int create_kind);
memory_target *add_index_target(MemoryStore *store, memory_call *call, memory_policy *policy,
                                int64_t index, int create_kind);
/* The entry a write goes to; cannot fail once prepared. */
memory_entry *target_entry(MemoryStore *store, memory_target *target, int64_t now_ms);
/* The verdict of a counter-like policy: headroom against the cost. */
void headroom_verdict(memory_verdict *verdict, int64_t capacity_scaled, int64_t cost_scaled,
                      int64_t headroom_scaled);

/* ---- store_bucket.c: the token bucket's refill (token_bucket, leaky_bucket) ---- */

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

void bucket_public_rate(memory_policy *policy);
double bucket_ttl_ms(const memory_policy *policy);
/* A bucket's evaluate step, up to the level or tokens written: its key
 * (base + suffix, of kind KIND_BUCKET or KIND_LEAKY) read as tokens (the leaky
 * bucket's level as capacity - level), the verdict, the refilled bucket, and
 * the writes of its base (write_value[1]) and credit (write_value[2]). */
int bucket_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy,
                    const char *suffix, size_t suffix_size, int kind, refilled_bucket *bucket);
int bucket_idle_full(const memory_entry *entry, int64_t now_ms);

/* ---- store_sliding_log.c: the log as a sorted set ------------------------------- */

log_item *log_at(const log_value *log, size_t rank);
const char *log_member_text(const log_item *item, char *buffer, size_t *size);
int log_compare_items(const void *a, const void *b);
int log_same_member(const log_item *a, const log_item *b);
int log_is_regular(const log_value *log);

/* ---- memory.c -------------------------------------------------------------------- */

/* Whether a live entry decides exactly as a missing key would (sweepable). */
int store_entry_idle(const memory_entry *entry, int64_t now_ms);

/* ---- the MemoryStore methods defined outside memory.c --------------------------- */

PyObject *store_decide(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *store_delete_matching(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *store_dump(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *store_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_STORE_H */
