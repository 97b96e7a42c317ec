/* Everything memory:// refuses, worded as the decision scripts word it: the
 * argument checks of decide() and reset() (MODERATO_ARG ...) and the typed
 * reads of stored state (MODERATO_STATE ...). store_validate.c; an
 * algorithm's own argument checks are in its store_<algorithm>.c. */
#ifndef MODERATO_STORE_VALIDATE_H
#define MODERATO_STORE_VALIDATE_H

#include "store_call.h"

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

/* ---- messages ------------------------------------------------------------------ */

/* Raise ValueError("<kind> <message>"). Always returns -1. */
int refuse(const char *kind, const char *format, ...);
/* MODERATO_ARG "<what> must be <expected>, got <shown argument>": format
 * names the argument and what it must be. Always returns -1. */
int refuse_arg(const arg_view *view, const char *format, ...);
/* MODERATO_STATE with format's one %U the shown key. Always returns -1. */
int refuse_key_state(const unsigned char *key, size_t key_size, const char *format);
int refuse_wrong_type(const memory_target *target);

/* ---- arguments ----------------------------------------------------------------- */

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
/* decide()'s KEYS and ARGV, checked in the scripts' order; an algorithm's
 * own fields by its parse_extra. */
int parse_call(memory_call *call, PyObject *const *keys, Py_ssize_t key_count);

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

/* ---- stored state, read as the scripts read it, refusing what they refuse ------- */

const hash_layout *layout_of(int kind);
const int64_t *hash_fields(const memory_entry *entry);
int read_counter(const memory_target *target, int64_t *value);
int read_hash(const memory_target *target, int kind, const long long *highs, int64_t *values,
              int *present);
int refuse_log_member(const memory_target *target, const char *text, size_t size,
                      int64_t at_ms);
int refuse_log_totals(const memory_target *target, int64_t newest_total, int64_t first_total);

#endif /* MODERATO_STORE_VALIDATE_H */
