/* Redis keys of a decision, the SCAN pattern of an identity's keys, and
 * the Redis Cluster slot of a key.
 *
 *     <prefix>:<algorithm>:{<tenant>:<scope>:<identity>}:<window_s>
 *     <prefix>:<algorithm>:{<tenant>:<scope>:<identity>}:<window_s>b<burst>
 *     <prefix>:??:{<tenant>:<scope>:<identity>}:*
 *
 * A policy with a burst keeps its own keys: "b" and the burst after the
 * window, so it never shares state with the policy of the same rate without
 * one (nor with another burst), and a SCAN of one window's keys
 * ("...:<window_s>" and "...:<window_s>:*") reaches neither.
 *
 * Tenant, scope and identity are each encoded on their own: safe bytes are
 * kept and the others percent-encoded, or, past 64 bytes, the whole
 * component becomes "~" and half a SHA-256 in hex; with a secret the
 * identity is always "!" and half an HMAC-SHA256. Neither "~", "!", "%", ":",
 * "{" nor "}" survives in a kept component, so the encoding is injective and
 * every key of one call shares the hash tag, hence the cluster slot. Nor does
 * any glob metacharacter ("*?[]\\"), so the pattern matches exactly these keys.
 */
#include <string.h>

#include "contract.h"
#include "errors.h"
#include "keys.h"
#include "sequence.h"
#include "sha256.h"

#define KEYS_PREFIX_ALPHABET "A-Z a-z 0-9 _ . : -"
#define KEYS_ALGORITHM_ALPHABET "a-z 0-9 _"

/* Redis Cluster's number of hash slots. */
#define KEYS_CLUSTER_SLOTS 16384

static const char hex_digits[] = "0123456789abcdef";
static const char upper_hex_digits[] = "0123456789ABCDEF";

static int
is_prefix_byte(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == ':' || c == '-';
}

static int
is_algorithm_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* Bytes a component keeps as they are: none of "~!%:{}". */
static int
is_kept_byte(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '/' || c == '@' || c == '+' || c == '=' || c == ',' ||
           c == '-';
}

/* A str or bytes argument as bytes: a str is encoded as UTF-8. quote_value
 * says whether an error may repeat the value (not a secret-protected
 * identity). Returns NULL with an error set. */
static const unsigned char *
text_bytes(const char *function, const char *name, PyObject *value, int quote_value,
           Py_ssize_t *size)
{
    if (PyBytes_Check(value)) {
        *size = PyBytes_GET_SIZE(value);
        return (const unsigned char *)PyBytes_AS_STRING(value);
    }
    if (PyUnicode_Check(value)) {
        const char *data = PyUnicode_AsUTF8AndSize(value, size);
        if (data == NULL) {
            accel_value_error_from_current(quote_value ? value : NULL,
                                           "%s() %s is a str that cannot be encoded as UTF-8",
                                           function, name);
        }
        return (const unsigned char *)data;
    }
    PyErr_Format(PyExc_TypeError, "%s() %s must be str or bytes, not %.100s", function, name,
                 Py_TYPE(value)->tp_name);
    return NULL;
}

/* prefix or algorithm: 1..max_size bytes, each one that is_allowed. */
static const unsigned char *
token_bytes(const char *function, const char *name, PyObject *value, Py_ssize_t max_size,
            int (*is_allowed)(unsigned char), const char *alphabet, Py_ssize_t *size)
{
    const unsigned char *data = text_bytes(function, name, value, 1, size);
    if (data == NULL) {
        return NULL;
    }
    Py_ssize_t offset = 0;
    while (offset < *size && is_allowed(data[offset])) {
        offset++;
    }
    if (offset == *size && *size >= 1 && *size <= max_size) {
        return data;
    }
    PyObject *quoted = accel_quote(value);
    if (quoted == NULL) {
        return NULL;
    }
    if (offset < *size) {
        PyErr_Format(PyExc_ValueError,
                     "%s() %s may only hold %s, got %U (byte %zd is not allowed)", function,
                     name, alphabet, quoted, offset);
    }
    else {
        PyErr_Format(PyExc_ValueError, "%s() %s must be 1 to %zd bytes of %s, got %U (%zd bytes)",
                     function, name, max_size, alphabet, quoted, *size);
    }
    Py_DECREF(quoted);
    return NULL;
}

/* windows_s into windows_s_out; returns how many there are, or -1. */
static Py_ssize_t
parse_windows(PyObject *windows, long long windows_s_out[ACCEL_MAX_POLICIES])
{
    if (!PyTuple_Check(windows) && !PyList_Check(windows)) {
        PyErr_Format(PyExc_TypeError,
                     "build_keys() windows_s must be a tuple or list of ints, not %.100s",
                     Py_TYPE(windows)->tp_name);
        return -1;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(windows);
    if (count < 1 || count > ACCEL_MAX_POLICIES) {
        PyErr_Format(PyExc_ValueError,
                     "build_keys() windows_s must hold 1 to " ACCEL_TEXT(
                         ACCEL_MAX_POLICIES) " windows, got %zd",
                     count);
        return -1;
    }
    /* Nothing below runs Python code until an error, so the list cannot
     * change under the loop. */
    PyObject **items = PySequence_Fast_ITEMS(windows);
    for (Py_ssize_t i = 0; i < count; i++) {
        int overflow;
        if (!PyLong_Check(items[i]) || PyBool_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "build_keys() windows_s[%zd] must be int, not %.100s",
                         i, Py_TYPE(items[i])->tp_name);
            return -1;
        }
        long long window_s = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || window_s < 1 || window_s > ACCEL_MAX_LONG_WINDOW_S) {
            PyObject *quoted = accel_quote(items[i]);
            if (quoted != NULL) {
                PyErr_Format(PyExc_ValueError,
                             "build_keys() windows_s[%zd] must be "
                             "1.." ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S) " seconds, got %U",
                             i, quoted);
                Py_DECREF(quoted);
            }
            return -1;
        }
        windows_s_out[i] = window_s;
    }
    return count;
}

/* The secret argument, given after `positional` others or by keyword, as
 * bytes to check or NULL for none, and (when burst is not NULL) the
 * keyword-only burst, NULL for none; a TypeError for a call with the wrong
 * arguments. */
static int
find_secret(const char *function, Py_ssize_t positional, PyObject *const *args,
            Py_ssize_t nargs, PyObject *kwnames, PyObject **secret, PyObject **burst)
{
    if (accel_check_arity(function, NULL, positional, positional + 1, nargs) < 0) {
        return -1;
    }
    *secret = nargs > positional ? args[positional] : NULL;
    Py_ssize_t keyword_count = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < keyword_count; i++) {
        PyObject *keyword = PyTuple_GET_ITEM(kwnames, i);
        if (burst != NULL && PyUnicode_CompareWithASCIIString(keyword, "burst") == 0) {
            *burst = args[nargs + i] == Py_None ? NULL : args[nargs + i];
            continue;
        }
        if (PyUnicode_CompareWithASCIIString(keyword, "secret") != 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", function,
                         keyword);
            return -1;
        }
        if (*secret != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument 'secret'",
                         function);
            return -1;
        }
        *secret = args[nargs + i];
    }
    if (*secret == Py_None) {
        *secret = NULL;
    }
    return 0;
}

static int
check_secret(const char *function, PyObject *secret)
{
    if (!PyBytes_Check(secret)) {
        PyErr_Format(PyExc_TypeError, "%s() secret must be bytes or None, not %.100s", function,
                     Py_TYPE(secret)->tp_name);
        return -1;
    }
    /* The message never shows the secret itself. */
    if (PyBytes_GET_SIZE(secret) < KEYS_MIN_SECRET_BYTES) {
        PyErr_Format(PyExc_ValueError,
                     "%s() secret must be at least 16 bytes long, got %zd bytes", function,
                     PyBytes_GET_SIZE(secret));
        return -1;
    }
    return 0;
}

/* Tenant, scope and identity, as bytes. */
typedef struct {
    const unsigned char *data[3];
    Py_ssize_t size[3];
} keys_tag;

static int
parse_tag(const char *function, PyObject *const *parts, PyObject *secret, keys_tag *tag)
{
    static const char *const names[3] = {"tenant", "scope", "identity"};
    for (int i = 0; i < 3; i++) {
        /* With a secret, errors must not repeat the identity. */
        int quote_value = i < 2 || secret == NULL;
        tag->data[i] = text_bytes(function, names[i], parts[i], quote_value, &tag->size[i]);
        if (tag->data[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

static char *
write_hex(char *out, const unsigned char *digest, Py_ssize_t size)
{
    for (Py_ssize_t i = 0; i < size; i++) {
        *out++ = hex_digits[digest[i] >> 4];
        *out++ = hex_digits[digest[i] & 0x0F];
    }
    return out;
}

/* One of tenant, scope or identity, kept (percent-encoded) or hashed. */
static char *
write_component(char *out, const unsigned char *data, Py_ssize_t size)
{
    /* Count only up to the limit: a 1 MB component costs one hash, no more. */
    Py_ssize_t kept_size = 0;
    for (Py_ssize_t i = 0; i < size && kept_size <= KEYS_MAX_KEPT_BYTES; i++) {
        kept_size += is_kept_byte(data[i]) ? 1 : 3;
    }
    if (kept_size > KEYS_MAX_KEPT_BYTES) {
        unsigned char digest[SHA256_DIGEST_BYTES];
        sha256(data, (size_t)size, digest);
        *out++ = '~';
        return write_hex(out, digest, KEYS_DIGEST_SHOWN_BYTES);
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        if (is_kept_byte(data[i])) {
            *out++ = (char)data[i];
        }
        else {
            *out++ = '%';
            *out++ = upper_hex_digits[data[i] >> 4];
            *out++ = upper_hex_digits[data[i] & 0x0F];
        }
    }
    return out;
}

/* The identity under a secret: a keyed hash, so the raw identifier (an IP
 * address, a user name) never reaches Redis. */
static char *
write_keyed_identity(char *out, PyObject *secret, const unsigned char *data, Py_ssize_t size)
{
    unsigned char digest[SHA256_DIGEST_BYTES];
    hmac_sha256((const unsigned char *)PyBytes_AS_STRING(secret),
                (size_t)PyBytes_GET_SIZE(secret), data, (size_t)size, digest);
    *out++ = '!';
    return write_hex(out, digest, KEYS_DIGEST_SHOWN_BYTES);
}

/* "{<tenant>:<scope>:<identity>}", at most KEYS_MAX_TAG_BYTES. */
static char *
write_tag(char *out, const keys_tag *tag, PyObject *secret)
{
    Py_BUILD_ASSERT(KEYS_HASHED_BYTES <= KEYS_MAX_COMPONENT_BYTES);
    *out++ = '{';
    out = write_component(out, tag->data[0], tag->size[0]);
    *out++ = ':';
    out = write_component(out, tag->data[1], tag->size[1]);
    *out++ = ':';
    out = secret == NULL ? write_component(out, tag->data[2], tag->size[2])
                         : write_keyed_identity(out, secret, tag->data[2], tag->size[2]);
    *out++ = '}';
    return out;
}

static char *
write_bytes(char *out, const unsigned char *data, Py_ssize_t size)
{
    memcpy(out, data, (size_t)size);
    return out + size;
}

static char *
write_decimal(char *out, long long value)
{
    char reversed[KEYS_MAX_BURST_DIGITS > KEYS_MAX_WINDOW_DIGITS ? KEYS_MAX_BURST_DIGITS
                                                                 : KEYS_MAX_WINDOW_DIGITS];
    int length = 0;
    do {
        reversed[length++] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    while (length > 0) {
        *out++ = reversed[--length];
    }
    return out;
}

/* The keys of one check: a shared head, then each policy's window (and
 * the burst, if any). */
typedef struct {
    char *key;  /* the head, with room for a window's digits after it */
    char *tail; /* where a window's digits go */
    const long long *windows_s;
    long long burst; /* 0: none */
} window_keys;

static PyObject *
window_key(void *context, Py_ssize_t i)
{
    window_keys *keys = context;
    char *end = write_decimal(keys->tail, keys->windows_s[i]);
    if (keys->burst > 0) {
        *end++ = 'b';
        end = write_decimal(end, keys->burst);
    }
    return PyBytes_FromStringAndSize(keys->key, end - keys->key);
}

/* build_keys' burst: None (0) or an int 1..ACCEL_MAX_LIMIT. */
static int
parse_burst(PyObject *burst, long long *value)
{
    *value = 0;
    if (burst == NULL) {
        return 0;
    }
    if (!PyLong_Check(burst) || PyBool_Check(burst)) {
        PyErr_Format(PyExc_TypeError, "build_keys() burst must be int or None, not %.100s",
                     Py_TYPE(burst)->tp_name);
        return -1;
    }
    int overflow;
    *value = PyLong_AsLongLongAndOverflow(burst, &overflow);
    if (overflow || *value < 1 || *value > ACCEL_MAX_LIMIT) {
        PyObject *quoted = accel_quote(burst);
        if (quoted != NULL) {
            PyErr_Format(PyExc_ValueError,
                         "build_keys() burst must be 1.." ACCEL_TEXT(ACCEL_MAX_LIMIT) ", got %U",
                         quoted);
            Py_DECREF(quoted);
        }
        return -1;
    }
    return 0;
}

/* What build_keys and key_pattern check first (arguments are checked in
 * order, so the first bad one is reported): the call's arguments, secret and
 * burst (find_secret; burst NULL where none is taken), then the prefix,
 * args[0]. The prefix's bytes, or NULL. */
static const unsigned char *
secret_and_prefix(const char *function, Py_ssize_t positional, PyObject *const *args,
                  Py_ssize_t nargs, PyObject *kwnames, PyObject **secret, PyObject **burst,
                  Py_ssize_t *prefix_size)
{
    if (find_secret(function, positional, args, nargs, kwnames, secret, burst) < 0) {
        return NULL;
    }
    return token_bytes(function, "prefix", args[0], KEYS_MAX_PREFIX_BYTES, is_prefix_byte,
                       KEYS_PREFIX_ALPHABET, prefix_size);
}

/* The head of a decision's keys at out, its arguments checked in build_keys'
 * order but for the windows and the burst (checked between the tag and the
 * secret when windows_s is not NULL): its length, or -1. */
static Py_ssize_t
write_head(const char *function, PyObject *const *parts, PyObject *secret, PyObject *windows,
           long long *windows_s, Py_ssize_t *window_count, PyObject *burst, long long *burst_value,
           char *key)
{
    Py_ssize_t prefix_size, algorithm_size;
    keys_tag tag;
    const unsigned char *prefix =
        token_bytes(function, "prefix", parts[0], KEYS_MAX_PREFIX_BYTES, is_prefix_byte,
                    KEYS_PREFIX_ALPHABET, &prefix_size);
    if (prefix == NULL) {
        return -1;
    }
    const unsigned char *algorithm =
        token_bytes(function, "algorithm", parts[1], KEYS_MAX_ALGORITHM_BYTES, is_algorithm_byte,
                    KEYS_ALGORITHM_ALPHABET, &algorithm_size);
    if (algorithm == NULL || parse_tag(function, parts + 2, secret, &tag) < 0) {
        return -1;
    }
    if (windows != NULL && (*window_count = parse_windows(windows, windows_s)) < 0) {
        return -1;
    }
    if ((secret != NULL && check_secret(function, secret) < 0) ||
        (windows != NULL && parse_burst(burst, burst_value) < 0)) {
        return -1;
    }

    /* Everything up to the window is shared by all the keys. */
    char *out = write_bytes(key, prefix, prefix_size);
    *out++ = ':';
    out = write_bytes(out, algorithm, algorithm_size);
    *out++ = ':';
    out = write_tag(out, &tag, secret);
    *out++ = ':';
    assert(out - key <= KEYS_MAX_BYTES - KEYS_MAX_WINDOW_DIGITS - 1 - KEYS_MAX_BURST_DIGITS);
    return out - key;
}

PyObject *
keys_build(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
           PyObject *kwnames)
{
    static const char function[] = "build_keys";
    long long windows_s[ACCEL_MAX_POLICIES];
    char key[KEYS_MAX_BYTES];
    PyObject *secret, *burst = NULL;
    long long burst_value;
    Py_ssize_t window_count;

    if (find_secret(function, 6, args, nargs, kwnames, &secret, &burst) < 0) {
        return NULL;
    }
    Py_ssize_t head_size = write_head(function, args, secret, args[5], windows_s, &window_count,
                                      burst, &burst_value, key);
    if (head_size < 0) {
        return NULL;
    }
    window_keys keys = {key, key + head_size, windows_s, burst_value};
    return accel_build_sequence(0, window_count, window_key, &keys);
}

Py_ssize_t
keys_write_head(PyObject *const *parts, PyObject *secret, char *out)
{
    return write_head("build_keys", parts, secret, NULL, NULL, NULL, NULL, NULL, out);
}

char *
keys_write_window(char *out, long long window_s)
{
    return write_decimal(out, window_s);
}

PyObject *
keys_pattern(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    static const char function[] = "key_pattern";
    char pattern[KEYS_MAX_PATTERN_BYTES];
    Py_ssize_t prefix_size;
    PyObject *secret;
    keys_tag tag;

    const unsigned char *prefix =
        secret_and_prefix(function, 4, args, nargs, kwnames, &secret, NULL, &prefix_size);
    if (prefix == NULL || parse_tag(function, args + 1, secret, &tag) < 0 ||
        (secret != NULL && check_secret(function, secret) < 0)) {
        return NULL;
    }

    /* Any two-character algorithm tag (a longer prefix cannot fit there), then any
     * window or key derived from it. */
    char *out = write_bytes(pattern, prefix, prefix_size);
    memcpy(out, ":??:", 4);
    out = write_tag(out + 4, &tag, secret);
    memcpy(out, ":*", 2);
    out += 2;
    assert(out - pattern <= KEYS_MAX_PATTERN_BYTES);
    return PyBytes_FromStringAndSize(pattern, out - pattern);
}

/* CRC16/XMODEM (polynomial 0x1021, initial value 0, no reflection), as
 * Redis Cluster uses to map keys to slots. */
static unsigned
crc16_xmodem(const unsigned char *data, Py_ssize_t size)
{
    unsigned crc = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        crc ^= (unsigned)data[i] << 8;
        for (int bit = 0; bit < 8; bit++) {
            crc = (crc & 0x8000) ? ((crc << 1) ^ 0x1021) : (crc << 1);
        }
        crc &= 0xFFFF;
    }
    return crc;
}

PyObject *
keys_slot(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t size;
    if (accel_check_arity("key_slot", NULL, 1, 1, nargs) < 0) {
        return NULL;
    }
    const unsigned char *key = text_bytes("key_slot", "key", args[0], 1, &size);
    if (key == NULL) {
        return NULL;
    }
    /* Redis hashes only the text between the first "{" and the next "}",
     * if there is such text. */
    const unsigned char *open = memchr(key, '{', (size_t)size);
    if (open != NULL) {
        const unsigned char *tag = open + 1;
        Py_ssize_t after_open = size - (tag - key);
        const unsigned char *close = memchr(tag, '}', (size_t)after_open);
        if (close != NULL && close > tag) {
            key = tag;
            size = close - tag;
        }
    }
    return PyLong_FromUnsignedLong(crc16_xmodem(key, size) % KEYS_CLUSTER_SLOTS);
}
