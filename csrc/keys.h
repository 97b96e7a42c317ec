/* Redis keys: building them from a decision's parts, the pattern matching an
 * identity's keys, and their cluster slot. */
#ifndef MODERATO_KEYS_H
#define MODERATO_KEYS_H

#include "compat.h"
#include "contract.h"

#define KEYS_MAX_PREFIX_BYTES 128
#define KEYS_MAX_ALGORITHM_BYTES 16
#define KEYS_MIN_SECRET_BYTES 16

/* Longest kept (percent-encoded) component; longer ones are hashed. */
#define KEYS_MAX_KEPT_BYTES 64
/* Digest bytes shown, as hex, in a hashed component: "~" or "!" and 32
 * hex digits, shorter than the longest kept component. */
#define KEYS_DIGEST_SHOWN_BYTES 16
#define KEYS_HASHED_BYTES (1 + 2 * KEYS_DIGEST_SHOWN_BYTES)
#define KEYS_MAX_COMPONENT_BYTES KEYS_MAX_KEPT_BYTES
#define KEYS_MAX_WINDOW_DIGITS ((int)sizeof(ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S)) - 1)
#define KEYS_MAX_BURST_DIGITS ((int)sizeof(ACCEL_TEXT(ACCEL_MAX_LIMIT)) - 1)

/* "{" tenant ":" scope ":" identity "}" */
#define KEYS_MAX_TAG_BYTES (1 + 3 * KEYS_MAX_COMPONENT_BYTES + 2 + 1)
/* prefix ":" algorithm ":" tag ":" window_s ["b" burst] */
#define KEYS_MAX_BYTES                                                              \
    (KEYS_MAX_PREFIX_BYTES + 1 + KEYS_MAX_ALGORITHM_BYTES + 1 + KEYS_MAX_TAG_BYTES + 1 + \
     KEYS_MAX_WINDOW_DIGITS + 1 + KEYS_MAX_BURST_DIGITS)
/* prefix ":??:" tag ":*" */
#define KEYS_MAX_PATTERN_BYTES (KEYS_MAX_PREFIX_BYTES + 4 + KEYS_MAX_TAG_BYTES + 2)

/* build_keys(prefix, algorithm, tenant, scope, identity, windows_s, /, secret=None)
 * -> list[bytes] */
PyObject *keys_build(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames);

/* What build_keys(prefix, algorithm, tenant, scope, identity, windows_s,
 * secret) checks but the windows (parts: prefix, algorithm, tenant, scope,
 * identity; secret: NULL for None), and the head its keys share written at
 * out (KEYS_MAX_BYTES): prefix ":" algorithm ":" tag ":". Its length, or -1
 * with the error build_keys raises for those arguments. */
Py_ssize_t keys_write_head(PyObject *const *parts, PyObject *secret, char *out);

/* A key's window (1..ACCEL_MAX_LONG_WINDOW_S) written at out, after its head, as
 * build_keys writes it without a burst; the end of the key. */
char *keys_write_window(char *out, long long window_s);

/* key_pattern(prefix, tenant, scope, identity, /, secret=None) -> bytes */
PyObject *keys_pattern(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames);

/* key_slot(key, /) -> int */
PyObject *keys_slot(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* MODERATO_KEYS_H */
