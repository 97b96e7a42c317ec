/* delete_matching(): every key matching a Redis glob pattern, Redis's rules
 * ("*", "?", "[...]" with "^" and ranges, "\\" escapes). Reset of an
 * identity across scopes, rates and algorithms goes through it with the
 * patterns _accel.key_pattern() builds; those name a tenant and an identity,
 * so only that identity's entries (and the few unindexed ones) are looked
 * at, through the identity index, not the whole table. */
#include <stdint.h>
#include <string.h>

#include "store_decide.h"

/* Whether the pattern item at *at ("?", "[...]", "\x" or a byte) matches c;
 * moves *at past the item. */
static int
glob_item_matches(const unsigned char *pattern, size_t size, size_t *at, unsigned char c)
{
    size_t i = *at;
    if (pattern[i] == '?') {
        *at = i + 1;
        return 1;
    }
    if (pattern[i] == '[') {
        int negate = 0, matched = 0;
        i++;
        if (i < size && pattern[i] == '^') {
            negate = 1;
            i++;
        }
        /* An unterminated set ends with the pattern. */
        while (i < size && pattern[i] != ']') {
            if (pattern[i] == '\\' && i + 1 < size) {
                matched |= pattern[i + 1] == c;
                i += 2;
            }
            else if (i + 2 < size && pattern[i + 1] == '-') {
                unsigned char low = pattern[i], high = pattern[i + 2];
                if (low > high) {
                    unsigned char swap = low;
                    low = high;
                    high = swap;
                }
                matched |= c >= low && c <= high;
                i += 3;
            }
            else {
                matched |= pattern[i] == c;
                i++;
            }
        }
        *at = i < size ? i + 1 : size;
        return negate ? !matched : matched;
    }
    if (pattern[i] == '\\' && i + 1 < size) {
        i++;
    }
    *at = i + 1;
    return pattern[i] == c;
}

/* Redis's glob: "*", "?", "[...]" (with "^" and ranges), "\" escapes. */
static int
glob_matches(const unsigned char *pattern, size_t pattern_size, const unsigned char *text,
             size_t text_size)
{
    size_t p = 0, t = 0;
    size_t star_p = SIZE_MAX, star_t = 0;
    if (text_size == 0) {
        /* Redis skips trailing stars only after matching a byte, and lets the
         * pattern "*" alone match every key: so an empty key matches "" and
         * "*" but not "**". */
        return pattern_size == 0 || (pattern_size == 1 && pattern[0] == '*');
    }
    while (t < text_size) {
        if (p < pattern_size && pattern[p] == '*') {
            while (p < pattern_size && pattern[p] == '*') {
                p++;
            }
            star_p = p;
            star_t = t;
            continue;
        }
        size_t next = p;
        if (p < pattern_size && glob_item_matches(pattern, pattern_size, &next, text[t])) {
            p = next;
            t++;
            continue;
        }
        if (star_p == SIZE_MAX) {
            return 0;
        }
        /* Let the last star take one more byte, and retry after it. */
        p = star_p;
        t = ++star_t;
    }
    while (p < pattern_size && pattern[p] == '*') {
        p++;
    }
    return p == pattern_size;
}

/* The tenant and identity every indexed key matching the pattern has, when
 * the pattern pins them: no "[" nor "\\", one "{" and one "}" after it,
 * and between them "<tenant>:...:<identity>" with neither part holding "*"
 * or "?". A key with one brace of each kind must match the pattern's
 * literal braces with its own, so an indexed key (exactly two colons
 * between them) that matches has this tenant and identity. */
static int
pattern_identity(const unsigned char *pattern, size_t size, identity_span *span)
{
    if (memchr(pattern, '[', size) != NULL || memchr(pattern, '\\', size) != NULL) {
        return 0;
    }
    const unsigned char *close;
    const unsigned char *inside = hash_tag_inside(pattern, size, &close);
    if (inside == NULL) {
        return 0;
    }
    const unsigned char *first = memchr(inside, ':', (size_t)(close - inside));
    const unsigned char *last = close;
    while (last > inside && last[-1] != ':') {
        last--;
    }
    if (first == NULL || last - 1 <= first) {
        return 0; /* fewer than two colons */
    }
    span->tenant = inside;
    span->tenant_size = (size_t)(first - inside);
    span->identity = last;
    span->identity_size = (size_t)(close - last);
    for (const unsigned char *at = span->tenant; at < first; at++) {
        if (*at == '*' || *at == '?') {
            return 0;
        }
    }
    for (const unsigned char *at = span->identity; at < close; at++) {
        if (*at == '*' || *at == '?') {
            return 0;
        }
    }
    return 1;
}

/* Delete the entries of a list linked by same_identity_next that match. */
static long long
delete_listed(MemoryStore *store, memory_entry *entry, const unsigned char *pattern,
              size_t pattern_size, int64_t now_ms)
{
    long long deleted = 0;
    while (entry != NULL) {
        memory_entry *next = entry->same_identity_next;
        store->work.last_match_examined++;
        if (glob_matches(pattern, pattern_size, entry_key(entry), entry->key_size)) {
            deleted += now_ms < 0 || !entry_expired(entry, now_ms);
            table_remove(store, entry);
        }
        entry = next;
    }
    return deleted;
}

PyObject *
store_delete_matching(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    const char *pattern;
    Py_ssize_t pattern_size;
    int64_t now_ms = -1;
    if (accel_check_arity("MemoryStore.delete_matching", "pattern, now_ms", 1, 2, nargs) < 0) {
        return NULL;
    }
    if (view_key("delete_matching", "pattern", -1, args[0], &pattern, &pattern_size) < 0) {
        return NULL;
    }
    if (nargs == 2 && args[1] != Py_None && parse_now("delete_matching", args[1], &now_ms) < 0) {
        return NULL;
    }
    store->version++;
    store->work.last_match_examined = 0;
    long long deleted = 0;
    const unsigned char *glob = (const unsigned char *)pattern;
    identity_span span;
    if (pattern_identity(glob, (size_t)pattern_size, &span)) {
        memory_entry *first = identity_first(store, &span, identity_hash(store, &span));
        deleted += delete_listed(store, first, glob, (size_t)pattern_size, now_ms);
        deleted += delete_listed(store, store->unindexed, glob, (size_t)pattern_size, now_ms);
        table_maybe_shrink(store);
        return PyLong_FromLongLong(deleted);
    }
    /* Any other pattern: every entry. */
    memory_entry *entry = store->oldest;
    while (entry != NULL) {
        memory_entry *newer = entry->newer;
        store->work.last_match_examined++;
        if (glob_matches(glob, (size_t)pattern_size, entry_key(entry), entry->key_size)) {
            deleted += now_ms < 0 || !entry_expired(entry, now_ms);
            table_remove(store, entry);
        }
        entry = newer;
    }
    table_maybe_shrink(store);
    return PyLong_FromLongLong(deleted);
}

