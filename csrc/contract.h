/* The numbers Lua, C and Python share (docs/internals.md), defined here
 * once. module.c exports each as moderato._accel.<NAME> (Python reads them
 * from there); the scripts name each copy they hold, and
 * tests/unit/test_algorithms.py checks every copy against this file.
 *
 * Each is written as plain digits, so that ACCEL_TEXT() can put it into a
 * message at compile time; C gives it the smallest type that holds it (the
 * large ones a 64-bit type), so pass one to a %lld format cast. */
#ifndef MODERATO_CONTRACT_H
#define MODERATO_CONTRACT_H

/* Capacities and costs travel scaled by this factor (1/1000 of a request). */
#define ACCEL_SCALE 1000

/* Policies in one rate string, keys in one decision. */
#define ACCEL_MAX_POLICIES 16

/* Longest window of the direct backend contract, in seconds: one day. */
#define ACCEL_MAX_WINDOW_S 86400

/* Longest window a rate string may name: ten 360-day years. Windows above a
 * day are the long-window path: each algorithm admits the (limit, window)
 * pairs its arithmetic keeps exact (docs/internals.md, "Long windows"). */
#define ACCEL_MAX_LONG_WINDOW_S 311040000

/* Largest limit of a policy: its capacity_scaled (limit * ACCEL_SCALE)
 * times a permille weight stays within 2^53, so Lua's doubles hold it. */
#define ACCEL_MAX_LIMIT 9007199254

/* ACCEL_MAX_LIMIT * ACCEL_SCALE: the largest capacity_scaled argument. */
#define ACCEL_MAX_CAPACITY_SCALED 9007199254000

/* 2^53: every integer up to here is exact in a Lua number (a double); the
 * largest integer that crosses a boundary (arguments, state, replies). */
#define ACCEL_MAX_SAFE_INTEGER 9007199254740992

/* 2^52 ms (~142,000 years): the latest time stored state may hold, leaving
 * room to add waits to it and stay within 2^53. */
#define ACCEL_MAX_STATE_TIME_MS 4503599627370496

/* The latest clock reading decided exactly (the year 2255): now in
 * microseconds plus two GCRA windows stays within 2^53. */
#define ACCEL_MAX_NOW_MS 9000000000000

/* The buckets' exact range: up to this window_ms, window_ms * (window_ms - 1)
 * <= 2^53, so the accrual elapsed_ms * (capacity mod window) is exact for any
 * capacity; a longer window takes capacity_scaled <= 2^53 / window_ms. */
#define ACCEL_ACCRUAL_EXACT_WINDOW_MS 94906266

/* GCRA's longest window: now_us + 2 * window_us + 1 <= 2^53 up to
 * ACCEL_MAX_NOW_MS. */
#define ACCEL_GCRA_MAX_WINDOW_S 3599627

/* Base keys one reset takes: 16 policies of up to 16 algorithms at once. */
#define ACCEL_MAX_RESET_KEYS 256

/* Past a full refill, twice, a token bucket's key lives this much longer. */
#define ACCEL_BUCKET_EXPIRY_MARGIN_MS 60000

/* GCRA, the sliding log and the leaky bucket: a key lives this much past
 * the instant it reads as empty. */
#define ACCEL_DRAINED_EXPIRY_MARGIN_MS 1000

/* A sliding log member's running total: this many decimal digits. */
#define ACCEL_LOG_TOTAL_DIGITS 16

/* Every number above, X(NAME) once each: module.c exports them from it. */
#define ACCEL_CONTRACT_NUMBERS(X)                                                      \
    X(SCALE)                                                                           \
    X(MAX_POLICIES)                                                                    \
    X(MAX_WINDOW_S)                                                                    \
    X(MAX_LONG_WINDOW_S)                                                               \
    X(MAX_LIMIT)                                                                       \
    X(MAX_CAPACITY_SCALED)                                                             \
    X(MAX_SAFE_INTEGER)                                                                \
    X(MAX_STATE_TIME_MS)                                                               \
    X(MAX_NOW_MS)                                                                      \
    X(ACCRUAL_EXACT_WINDOW_MS)                                                         \
    X(GCRA_MAX_WINDOW_S)                                                               \
    X(MAX_RESET_KEYS)                                                                  \
    X(BUCKET_EXPIRY_MARGIN_MS)                                                         \
    X(DRAINED_EXPIRY_MARGIN_MS)                                                        \
    X(LOG_TOTAL_DIGITS)

/* A number's digits as a string literal: "1.." ACCEL_TEXT(ACCEL_MAX_LIMIT). */
#define ACCEL_TEXT(number) ACCEL_TEXT_DIGITS(number)
#define ACCEL_TEXT_DIGITS(digits) #digits

#endif /* MODERATO_CONTRACT_H */
