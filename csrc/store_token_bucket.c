/* token_bucket over its typed state (a bucket_value at <base>:bucket:v2):
 * token_bucket.lua's math, in process. The refill is store_bucket.c's. */
#include <math.h>
#include <string.h>

#include "store_algorithms.h"

static const char bucket_suffix[] = ":bucket:v2";

/* The scripts' parse_refill_rate: "" (-> 0, the public rule) or a plain or
 * exponent decimal, read as a double exactly as Lua's tonumber reads it.
 * Returns 1 and sets rate (0 for ""), or 0 when it is not such a text. */
static int
parse_rate_text(const arg_view *view, double *rate)
{
    if (view->is_int) {
        if (view->int_sign < 0) {
            return 0;
        }
        /* Correctly rounded, as strtod reads the same digits. */
        *rate = view->int_sign > 0 ? HUGE_VAL : (double)view->value;
        return 1;
    }
    const char *text = view->data;
    Py_ssize_t size = view->size, at = 0;
    if (size == 0) {
        *rate = 0.0;
        return 1;
    }
    /* ^%d+%.?%d* then nothing or [eE][+-]?%d+ to the end */
    while (at < size && text[at] >= '0' && text[at] <= '9') {
        at++;
    }
    if (at == 0) {
        return 0;
    }
    if (at < size && text[at] == '.') {
        at++;
    }
    while (at < size && text[at] >= '0' && text[at] <= '9') {
        at++;
    }
    if (at < size) {
        if (text[at] != 'e' && text[at] != 'E') {
            return 0;
        }
        at++;
        if (at < size && (text[at] == '+' || text[at] == '-')) {
            at++;
        }
        Py_ssize_t digits_start = at;
        while (at < size && text[at] >= '0' && text[at] <= '9') {
            at++;
        }
        if (at == digits_start || at < size) {
            return 0;
        }
    }
    char *copy = PyMem_Malloc((size_t)size + 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, text, (size_t)size);
    copy[size] = '\0';
    char *end;
    /* Locale-independent and correctly rounded; an overflow gives HUGE_VAL. */
    double value = PyOS_string_to_double(copy, &end, NULL);
    PyMem_Free(copy);
    if (value == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    *rate = value;
    return 1;
}

/* ARGV[3i + 2], refill_scaled_per_s: "" for the public rule, or a rate that
 * fills the bucket within a day; then both buckets' exact-range rule. */
static int
token_bucket_parse_extra(memory_call *call, memory_policy *policy, Py_ssize_t argv_index)
{
    arg_view view;
    double rate = 0.0;
    if (view_arg("decide", "args", argv_index, call->argv[argv_index], &view) < 0) {
        return -1;
    }
    int parsed = parse_rate_text(&view, &rate);
    if (parsed < 0) {
        return -1;
    }
    int empty = !view.is_int && view.size == 0;
    if (!empty) {
        /* The lower bound keeps a full refill within one day. */
        double lowest = (double)policy->capacity_scaled / (double)ACCEL_MAX_WINDOW_S;
        if (!parsed || rate != rate || rate >= HUGE_VAL || rate < lowest ||
            rate > (double)ACCEL_MAX_CAPACITY_SCALED) {
            return refuse_arg(&view,
                              "ARGV[%zd] (refill_scaled_per_s of policy %d) must be \"\" or a "
                              "finite number from capacity_scaled / " ACCEL_TEXT(
                                  ACCEL_MAX_WINDOW_S) " to " ACCEL_TEXT(ACCEL_MAX_CAPACITY_SCALED),
                              argv_index + 1, policy->number);
        }
        policy->custom_rate = 1;
        policy->refill_scaled_per_s = rate;
    }
    return bucket_parse_policy(policy, argv_index);
}

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
    bucket->burst_scaled = policy->burst_scaled;
    bucket->window_ms = policy->window_ms;
    bucket->refill_scaled_per_s = policy->custom_rate ? policy->refill_scaled_per_s : 0.0;
    entry->expire_at_ms = policy->write_expire_at_ms;
}

STORE_ALGORITHM(token_bucket, 1, ACCEL_MAX_LONG_WINDOW_S, token_bucket_parse_extra, NULL);
