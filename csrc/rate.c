/* Parsing of rate strings, per the grammar in docs/internals.md:
 *
 *     rates    := rate ( ( ";" | "," | "|" ) rate )*
 *     rate     := ws* count ws* sep ws* [ multiple ws* ] unit ws*
 *     sep      := "/" | ws+ "per" ws+
 *
 * The units are limits' (second .. year, a month being 30 days and a year
 * 360) and throttled-py's abbreviations, so the strings users of those
 * libraries already write mean the same here.
 *
 * The parser reads the text once, left to right, and stops at the first
 * mistake with a message that says where it is and what was expected.
 */
#include <string.h>

#include "contract.h"
#include "errors.h"
#include "rate.h"
#include "sequence.h"

#define RATE_GRAMMAR                                                                 \
    "expected '<count>/<unit>', '<count> per <unit>' or '<count>/<n> <units>' with " \
    "unit second, minute, hour, day, week, month (30 days) or year (360 days) "     \
    "(singular or plural) or s, sec, m, min, h, hr, d, w, wk, several joined by "    \
    "';', ',' or '|'"

#define RATE_UNITS "second, minute, hour, day, week, month, year or an abbreviation"

#define RATE_SEPARATORS ";,|"

/* Longest unit name: "seconds" and "minutes". */
#define RATE_UNIT_CHARS 7

typedef struct {
    const char *name;
    long long unit_s;
} rate_unit;

#define RATE_DAY_S 86400LL

/* limits' names and lengths (a month is 30 days, a year 360), plus
 * throttled-py's abbreviations and the week they add. */
static const rate_unit rate_units[] = {
    {"second", 1},
    {"seconds", 1},
    {"s", 1},
    {"sec", 1},
    {"secs", 1},
    {"minute", 60},
    {"minutes", 60},
    {"m", 60},
    {"min", 60},
    {"mins", 60},
    {"hour", 3600},
    {"hours", 3600},
    {"h", 3600},
    {"hr", 3600},
    {"hrs", 3600},
    {"day", RATE_DAY_S},
    {"days", RATE_DAY_S},
    {"d", RATE_DAY_S},
    {"week", 7 * RATE_DAY_S},
    {"weeks", 7 * RATE_DAY_S},
    {"w", 7 * RATE_DAY_S},
    {"wk", 7 * RATE_DAY_S},
    {"wks", 7 * RATE_DAY_S},
    {"month", 30 * RATE_DAY_S},
    {"months", 30 * RATE_DAY_S},
    {"year", 360 * RATE_DAY_S},
    {"years", 360 * RATE_DAY_S},
};

typedef struct {
    long long limit;
    long long window_s;
} rate_policy;

typedef struct {
    PyObject *text;     /* the str being parsed, quoted in errors */
    const char *chars;  /* its characters, all ASCII */
    Py_ssize_t length;
    Py_ssize_t pos;
    int policy;         /* 1-based number of the policy being parsed */
    int several;        /* whether errors must say which policy is wrong */
} rate_parser;

/* Raise ValueError("invalid rate <text>: [policy <n>: ]<reason>; <grammar>").
 * Takes the reason's reference (NULL if building it failed); returns -1. */
static int
rate_error(const rate_parser *parser, int name_policy, PyObject *reason)
{
    if (reason == NULL) {
        return -1;
    }
    PyObject *quoted = accel_quote(parser->text);
    if (quoted != NULL) {
        if (name_policy && parser->several) {
            PyErr_Format(PyExc_ValueError, "invalid rate %U: policy %d: %U; " RATE_GRAMMAR,
                         quoted, parser->policy, reason);
        }
        else {
            PyErr_Format(PyExc_ValueError, "invalid rate %U: %U; " RATE_GRAMMAR, quoted, reason);
        }
        Py_DECREF(quoted);
    }
    Py_DECREF(reason);
    return -1;
}

/* The text from start to end, quoted. New reference or NULL. */
static PyObject *
quote_span(const rate_parser *parser, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *span = PyUnicode_Substring(parser->text, start, end);
    if (span == NULL) {
        return NULL;
    }
    PyObject *quoted = accel_quote(span);
    Py_DECREF(span);
    return quoted;
}

/* "<what> <quoted span><after>": a reason about one part of the text. */
static int
span_error(const rate_parser *parser, const char *what, Py_ssize_t start, Py_ssize_t end,
           const char *after)
{
    PyObject *quoted = quote_span(parser, start, end);
    if (quoted == NULL) {
        return -1;
    }
    int result = rate_error(parser, 1, PyUnicode_FromFormat("%s %U%s", what, quoted, after));
    Py_DECREF(quoted);
    return result;
}

/* "expected <what> at offset <pos>, found <the character there>". */
static int
expected_error(const rate_parser *parser, const char *what)
{
    if (parser->pos == parser->length) {
        return rate_error(parser, 1,
                          PyUnicode_FromFormat("expected %s at offset %zd, found the end",
                                               what, parser->pos));
    }
    PyObject *found = quote_span(parser, parser->pos, parser->pos + 1);
    if (found == NULL) {
        return -1;
    }
    int result = rate_error(parser, 1,
                            PyUnicode_FromFormat("expected %s at offset %zd, found %U", what,
                                                 parser->pos, found));
    Py_DECREF(found);
    return result;
}

static int
at_blank(const rate_parser *parser)
{
    return parser->pos < parser->length &&
           (parser->chars[parser->pos] == ' ' || parser->chars[parser->pos] == '\t');
}

static int
at_char(const rate_parser *parser, char expected)
{
    return parser->pos < parser->length && parser->chars[parser->pos] == expected;
}

static int
at_separator(const rate_parser *parser)
{
    /* memchr, not strchr: strchr would find a NUL in the text at the literal's end. */
    return parser->pos < parser->length &&
           memchr(RATE_SEPARATORS, parser->chars[parser->pos], sizeof(RATE_SEPARATORS) - 1) !=
               NULL;
}

static int
at_digit(const rate_parser *parser)
{
    return parser->pos < parser->length && parser->chars[parser->pos] >= '0' &&
           parser->chars[parser->pos] <= '9';
}

static int
at_letter(const rate_parser *parser)
{
    char c = parser->pos < parser->length ? parser->chars[parser->pos] : '\0';
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* A lower-case word at the parser's position, in any case, like the unit names. */
static int
at_word(const rate_parser *parser, const char *word)
{
    Py_ssize_t length = (Py_ssize_t)strlen(word);
    if (parser->length - parser->pos < length) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        if ((parser->chars[parser->pos + i] | 0x20) != word[i]) {
            return 0;
        }
    }
    return 1;
}

/* Skip blanks; returns how many there were. */
static Py_ssize_t
skip_blanks(rate_parser *parser)
{
    Py_ssize_t start = parser->pos;
    while (at_blank(parser)) {
        parser->pos++;
    }
    return parser->pos - start;
}

/* Read a run of digits as a number, or as max + 1 if it exceeds max, which
 * keeps any run of digits, however long, from overflowing. */
static long long
scan_number(rate_parser *parser, long long max)
{
    long long value = 0;
    for (; at_digit(parser); parser->pos++) {
        if (value <= max) {
            value = value * 10 + (parser->chars[parser->pos] - '0');
        }
    }
    return value <= max ? value : max + 1;
}

/* Seconds of the unit spelled chars[0:length], case-insensitive, or 0. */
static long long
unit_seconds(const char *chars, Py_ssize_t length)
{
    char lowered[RATE_UNIT_CHARS + 1];
    if (length > RATE_UNIT_CHARS) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        char c = chars[i];
        lowered[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    lowered[length] = '\0';
    for (size_t i = 0; i < sizeof(rate_units) / sizeof(rate_units[0]); i++) {
        if (strcmp(lowered, rate_units[i].name) == 0) {
            return rate_units[i].unit_s;
        }
    }
    return 0;
}

/* The separator between count and window: "/" or blanks, "per", blanks. */
static int
parse_separator(rate_parser *parser)
{
    Py_ssize_t blanks_before = skip_blanks(parser);
    if (at_char(parser, '/')) {
        parser->pos++;
        return 0;
    }
    if (at_word(parser, "per")) {
        parser->pos += 3;
        if (blanks_before > 0 && at_blank(parser)) {
            return 0;
        }
        parser->pos -= 3;
        return rate_error(parser, 1,
                          PyUnicode_FromFormat("'per' at offset %zd needs a blank on both sides",
                                               parser->pos));
    }
    return expected_error(parser, "'/' or ' per ' after the count");
}

/* One policy, from the parser's position to the next separator or the end. */
static int
parse_policy(rate_parser *parser, rate_policy *policy)
{
    skip_blanks(parser);
    Py_ssize_t count_start = parser->pos;
    policy->limit = scan_number(parser, ACCEL_MAX_LIMIT);
    if (parser->pos == count_start) {
        if (parser->pos == parser->length || at_separator(parser)) {
            return rate_error(parser, 1, PyUnicode_FromString("no rate given"));
        }
        return expected_error(parser, "a count");
    }
    if (policy->limit < 1 || policy->limit > ACCEL_MAX_LIMIT) {
        return span_error(parser, "count", count_start, parser->pos,
                          " is out of range 1.." ACCEL_TEXT(ACCEL_MAX_LIMIT));
    }
    if (parse_separator(parser) < 0) {
        return -1;
    }
    skip_blanks(parser);

    Py_ssize_t window_start = parser->pos;
    long long multiple = 1;
    if (at_digit(parser)) {
        multiple = scan_number(parser, ACCEL_MAX_LONG_WINDOW_S);
        if (multiple < 1 || multiple > ACCEL_MAX_LONG_WINDOW_S) {
            return span_error(parser, "multiple", window_start, parser->pos,
                              " is out of range 1.." ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S));
        }
        skip_blanks(parser);
    }

    Py_ssize_t unit_start = parser->pos;
    while (at_letter(parser)) {
        parser->pos++;
    }
    if (parser->pos == unit_start) {
        return expected_error(parser, "a unit (" RATE_UNITS ")");
    }
    long long unit_s = unit_seconds(parser->chars + unit_start, parser->pos - unit_start);
    if (unit_s == 0) {
        return span_error(parser, "unknown unit", unit_start, parser->pos, "");
    }
    /* multiple <= ACCEL_MAX_LONG_WINDOW_S and unit_s <= 31104000 (a 360-day year):
     * the product fits a long long. */
    policy->window_s = multiple * unit_s;
    if (policy->window_s > ACCEL_MAX_LONG_WINDOW_S) {
        return span_error(parser, "window", window_start, parser->pos,
                          " is longer than 10 years (3600 days, " ACCEL_TEXT(
                              ACCEL_MAX_LONG_WINDOW_S) " seconds)");
    }

    skip_blanks(parser);
    if (parser->pos < parser->length && !at_separator(parser)) {
        if (at_word(parser, "burst")) {
            /* throttled-py's suffix: say why rather than only where. */
            return rate_error(parser, 1,
                              PyUnicode_FromFormat("'burst' at offset %zd is not part of a rate: "
                                                   "give it beside the rate, burst=<n> (the "
                                                   "token bucket, GCRA and leaky bucket take "
                                                   "one)",
                                                   parser->pos));
        }
        return expected_error(parser, "';', ',', '|' or the end after the unit");
    }
    return 0;
}

/* Only ASCII can be valid: name the first character that is not. */
static int
check_ascii(PyObject *text, rate_parser *parser)
{
    if (PyUnicode_IS_ASCII(text)) {
        return 0;
    }
    Py_ssize_t offset = 0;
    while (PyUnicode_READ_CHAR(text, offset) < 128) {
        offset++;
    }
    PyObject *found = quote_span(parser, offset, offset + 1);
    if (found == NULL) {
        return -1;
    }
    int result = rate_error(parser, 0,
                            PyUnicode_FromFormat("non-ASCII character %U at offset %zd", found,
                                                 offset));
    Py_DECREF(found);
    return result;
}

/* One policy as parse_rate returns it: (limit, window_s). */
static PyObject *
policy_pair(void *policies, Py_ssize_t i)
{
    const rate_policy *policy = (const rate_policy *)policies + i;
    return Py_BuildValue("(LL)", policy->limit, policy->window_s);
}

PyObject *
rate_parse(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    rate_policy policies[ACCEL_MAX_POLICIES];
    rate_parser parser = {0};

    if (accel_check_arity("parse_rate", NULL, 1, 1, nargs) < 0) {
        return NULL;
    }
    PyObject *text = args[0];
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError,
                     "parse_rate() text must be str such as '100/minute', not %.100s",
                     Py_TYPE(text)->tp_name);
        return NULL;
    }
    parser.text = text;
    parser.policy = 1;
    if (check_ascii(text, &parser) < 0) {
        return NULL;
    }
    /* ASCII text is its own UTF-8: this cannot fail or allocate. */
    parser.chars = PyUnicode_AsUTF8AndSize(text, &parser.length);
    assert(parser.chars != NULL);
    for (parser.pos = 0; parser.pos < parser.length && !parser.several; parser.pos++) {
        parser.several = at_separator(&parser);
    }
    parser.pos = 0;

    for (int count = 0;; count++) {
        if (count == ACCEL_MAX_POLICIES) {
            rate_error(&parser, 0,
                       PyUnicode_FromString("more than " ACCEL_TEXT(ACCEL_MAX_POLICIES) " policies"));
            return NULL;
        }
        rate_policy *policy = &policies[count];
        if (parse_policy(&parser, policy) < 0) {
            return NULL;
        }
        /* Same window twice: the larger limit would never decide, and both
         * policies would share one key. */
        for (int earlier = 0; earlier < count; earlier++) {
            if (policies[earlier].window_s == policy->window_s) {
                rate_error(&parser, 0,
                           PyUnicode_FromFormat("policies %d and %d both have a window of "
                                                "%lld seconds",
                                                earlier + 1, count + 1, policy->window_s));
                return NULL;
            }
        }
        if (parser.pos == parser.length) {
            return accel_build_sequence(1, count + 1, policy_pair, policies);
        }
        parser.pos++; /* the separator */
        parser.policy++;
    }
}
