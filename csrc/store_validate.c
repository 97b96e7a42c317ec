/* Everything memory:// refuses, worded as the decision scripts word it: the
 * argument checks of decide() and reset() (MODERATO_ARG ...) and the typed
 * reads of stored state (MODERATO_STATE ...), in one place so that the texts
 * stay next to each other and to lua/prelude.lua's. An algorithm's own
 * fields are checked in its store_<algorithm>.c, with refuse_arg(). */
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "store_validate.h"

static const char wrongtype_error[] =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/* ---- messages, as the scripts word them ---------------------------------- */

/* Lua's %w, %p and the space: what the scripts' shown() keeps. */
static int
is_shown_byte(unsigned char c)
{
    return c >= 0x20 && c <= 0x7e;
}

/* The scripts' shown(): quoted, cut to max_bytes and marked with "...",
 * every byte but letters, digits, punctuation and space replaced by "?". */
static PyObject *
shown_bytes(const char *data, Py_ssize_t size, Py_ssize_t max_bytes)
{
    int truncated = size > max_bytes;
    Py_ssize_t kept = truncated ? max_bytes : size;
    PyObject *text = PyUnicode_New(kept + 2 + (truncated ? 3 : 0), 127);
    if (text == NULL) {
        return NULL;
    }
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t at = 0;
    out[at++] = '"';
    for (Py_ssize_t i = 0; i < kept; i++) {
        unsigned char c = (unsigned char)data[i];
        out[at++] = is_shown_byte(c) ? c : '?';
    }
    if (truncated) {
        out[at++] = '.';
        out[at++] = '.';
        out[at++] = '.';
    }
    out[at++] = '"';
    return text;
}

/* Every refusal: ValueError("<kind> <message>", and ", got <shown>" unless
 * shown is NULL). Always returns -1. */
static int
refuse_formatted(const char *kind, PyObject *shown, const char *format, va_list vargs)
{
    PyObject *message = PyUnicode_FromFormatV(format, vargs);
    if (message == NULL) {
        return -1;
    }
    if (shown == NULL) {
        PyErr_Format(PyExc_ValueError, "%s %U", kind, message);
    }
    else {
        PyErr_Format(PyExc_ValueError, "%s %U, got %U", kind, message, shown);
    }
    Py_DECREF(message);
    return -1;
}

int
refuse(const char *kind, const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    refuse_formatted(kind, NULL, format, vargs);
    va_end(vargs);
    return -1;
}

/* ---- arguments ------------------------------------------------------------- */

int
view_arg(const char *function, const char *what, Py_ssize_t position, PyObject *object,
         arg_view *view)
{
    view->object = object;
    view->is_int = 0;
    if (PyLong_Check(object) && !PyBool_Check(object)) {
        int overflow;
        view->is_int = 1;
        view->value = PyLong_AsLongLongAndOverflow(object, &overflow);
        if (view->value == -1 && PyErr_Occurred()) {
            return -1;
        }
        view->int_sign = overflow != 0 ? overflow : (view->value < 0 ? -1 : 0);
        return 0;
    }
    if (PyBytes_Check(object)) {
        view->data = PyBytes_AS_STRING(object);
        view->size = PyBytes_GET_SIZE(object);
        return 0;
    }
    if (PyUnicode_Check(object)) {
        view->data = PyUnicode_AsUTF8AndSize(object, &view->size);
        return view->data == NULL ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "MemoryStore.%s() %s[%zd] must be int, str or bytes, not %.100s",
                 function, what, position, Py_TYPE(object)->tp_name);
    return -1;
}

/* shown() of an argument's text. */
static PyObject *
shown_arg(const arg_view *view)
{
    if (!view->is_int) {
        return shown_bytes(view->data, view->size, SHOWN_ARG_BYTES);
    }
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(view->object, &overflow);
    if (!overflow) {
        char digits[32];
        PyOS_snprintf(digits, sizeof(digits), "%lld", value);
        return shown_bytes(digits, (Py_ssize_t)strlen(digits), SHOWN_ARG_BYTES);
    }
    /* int's own repr, never a subclass's __str__ (which could run any code). */
    Py_INCREF(view->object);
    PyObject *text = PyLong_Type.tp_repr(view->object);
    Py_DECREF(view->object);
    if (text == NULL) {
        /* Past int_max_str_digits: its first digits are all one could see. */
        PyErr_Clear();
        return PyUnicode_FromString("\"(an int too large to print)\"");
    }
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(text, &size);
    PyObject *shown = data == NULL ? NULL : shown_bytes(data, size, SHOWN_ARG_BYTES);
    Py_DECREF(text);
    return shown;
}

int
refuse_arg(const arg_view *view, const char *format, ...)
{
    PyObject *shown = shown_arg(view);
    if (shown == NULL) {
        return -1;
    }
    va_list vargs;
    va_start(vargs, format);
    refuse_formatted("MODERATO_ARG", shown, format, vargs);
    va_end(vargs);
    Py_DECREF(shown);
    return -1;
}

/* The number of significant digits of a decimal text (leading zeros skipped),
 * or -1 if it is empty or holds anything but ASCII digits; *start is set to
 * the first significant digit. */
static Py_ssize_t
significant_digits(const arg_view *view, Py_ssize_t *start)
{
    if (view->size == 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < view->size; i++) {
        if (view->data[i] < '0' || view->data[i] > '9') {
            return -1;
        }
    }
    Py_ssize_t first = 0;
    while (first < view->size && view->data[first] == '0') {
        first++;
    }
    *start = first;
    return view->size - first;
}

/* The scripts' parse_integer: the value of a decimal integer text (digits
 * only, leading zeros allowed, at most 2^53) within [low, high]. */
int
parse_integer(const arg_view *view, long long low, long long high, long long *value)
{
    long long number;
    if (view->is_int) {
        if (view->int_sign != 0) {
            return 0;
        }
        number = view->value;
    }
    else {
        Py_ssize_t start = 0;
        Py_ssize_t digits = significant_digits(view, &start);
        if (digits < 0 || digits > 16 ||
            (digits == 16 &&
             memcmp(view->data + start, ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER), 16) > 0)) {
            return 0;
        }
        number = 0;
        for (Py_ssize_t i = start; i < view->size; i++) {
            number = number * 10 + (view->data[i] - '0');
        }
    }
    if (number > ACCEL_MAX_SAFE_INTEGER || number < low || number > high) {
        return 0;
    }
    *value = number;
    return 1;
}

/* A key (or pattern, or member): str (as UTF-8) or bytes. position >= 0
 * names the item of the keys list, else what names the argument. */
int
view_key(const char *function, const char *what, Py_ssize_t position, PyObject *object,
         const char **data, Py_ssize_t *size)
{
    if (PyBytes_Check(object)) {
        *data = PyBytes_AS_STRING(object);
        *size = PyBytes_GET_SIZE(object);
        return 0;
    }
    if (PyUnicode_Check(object)) {
        *data = PyUnicode_AsUTF8AndSize(object, size);
        return *data == NULL ? -1 : 0;
    }
    if (position >= 0) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.%s() keys[%zd] must be bytes or str, not %.100s",
                     function, position, Py_TYPE(object)->tp_name);
    }
    else {
        PyErr_Format(PyExc_TypeError, "MemoryStore.%s() %s must be bytes or str, not %.100s",
                     function, what, Py_TYPE(object)->tp_name);
    }
    return -1;
}

int
parse_now(const char *function, PyObject *object, int64_t *now_ms)
{
    int overflow;
    if (!PyLong_Check(object) || PyBool_Check(object)) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.%s() now_ms must be int, not %.100s", function,
                     Py_TYPE(object)->tp_name);
        return -1;
    }
    long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow != 0 || value < 0 || value > ACCEL_MAX_NOW_MS) {
        PyErr_Format(PyExc_ValueError,
                     "MemoryStore.%s() now_ms must be a Unix time in milliseconds, "
                     "0.." ACCEL_TEXT(ACCEL_MAX_NOW_MS) ", got %R",
                     function, object);
        return -1;
    }
    *now_ms = value;
    return 0;
}

int
parse_now_or_clock(const char *function, PyObject *object, int64_t *now_ms)
{
    if (object != Py_None) {
        return parse_now(function, object, now_ms);
    }
#ifdef CLOCK_REALTIME
    /* What time.time_ns() reads, without a call into Python per decision. */
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) == 0 && now.tv_sec >= 0) {
        *now_ms = (int64_t)now.tv_sec * 1000 + (int64_t)now.tv_nsec / 1000000;
        return 0;
    }
#endif
    PyObject *time = PyImport_ImportModule("time");
    PyObject *ns = time == NULL ? NULL : PyObject_CallMethod(time, "time_ns", NULL);
    Py_XDECREF(time);
    if (ns == NULL) {
        return -1;
    }
    long long value = PyLong_AsLongLong(ns);
    Py_DECREF(ns);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    *now_ms = value / 1000000;
    return 0;
}

static PyObject *
shown_target(const memory_target *target)
{
    return shown_bytes((const char *)target->key, (Py_ssize_t)target->key_size,
                       SHOWN_KEY_BYTES);
}

int
refuse_wrong_type(const memory_target *target)
{
    PyObject *key = shown_target(target);
    if (key == NULL) {
        return -1;
    }
    refuse("MODERATO_STATE", "key %U cannot be read: %s", key, wrongtype_error);
    Py_DECREF(key);
    return -1;
}

/* A window counter: 0 when missing; MODERATO_STATE unless 0..2^53. */
int
read_counter(const memory_target *target, int64_t *value)
{
    const memory_entry *entry = target->entry;
    if (entry == NULL) {
        *value = 0;
        return 0;
    }
    if (entry->kind != KIND_COUNTER) {
        return refuse_wrong_type(target);
    }
    if (entry->value.counter < 0 || entry->value.counter > ACCEL_MAX_SAFE_INTEGER) {
        PyObject *key = shown_target(target);
        if (key == NULL) {
            return -1;
        }
        char stored[32];
        PyOS_snprintf(stored, sizeof(stored), "%lld", (long long)entry->value.counter);
        PyObject *value_shown = shown_bytes(stored, (Py_ssize_t)strlen(stored), SHOWN_ARG_BYTES);
        if (value_shown != NULL) {
            refuse("MODERATO_STATE",
                   "key %U holds %U, not a decimal integer 0.." ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER),
                   key, value_shown);
            Py_DECREF(value_shown);
        }
        Py_DECREF(key);
        return -1;
    }
    *value = entry->value.counter;
    return 0;
}

/* ---- the hashes, read as HMGET reads them ---------------------------------- */

static const char *const bucket_names[] = {"tokens", "base", "credited"};
static const char *const gcra_names[] = {"tat", "frac"};
static const char *const leaky_names[] = {"level", "base", "drained"};

const hash_layout store_hash_layouts[] = {
    {KIND_BUCKET, 3, bucket_names},
    {KIND_GCRA, 2, gcra_names},
    {KIND_LEAKY, 3, leaky_names},
};

const int store_hash_layout_count =
    (int)(sizeof(store_hash_layouts) / sizeof(store_hash_layouts[0]));

const long long bucket_highs[3] = {ACCEL_MAX_SAFE_INTEGER, ACCEL_MAX_STATE_TIME_MS, ACCEL_MAX_SAFE_INTEGER};

const hash_layout *
layout_of(int kind)
{
    for (int i = 0; i < store_hash_layout_count; i++) {
        if (store_hash_layouts[i].kind == kind) {
            return &store_hash_layouts[i];
        }
    }
    return NULL;
}

const int64_t *
hash_fields(const memory_entry *entry)
{
    switch (entry->kind) {
    case KIND_BUCKET:
        return entry->value.bucket.field;
    case KIND_GCRA:
        return entry->value.gcra.field;
    default:
        return entry->value.leaky.field;
    }
}

/* The field of that name of a hash entry, as HMGET finds it; 0 if absent. */
static int
hash_get(const memory_entry *entry, const char *name, int64_t *value)
{
    const hash_layout *layout = layout_of(entry->kind);
    for (int i = 0; i < layout->field_count; i++) {
        if (strcmp(layout->names[i], name) == 0) {
            *value = hash_fields(entry)[i];
            return 1;
        }
    }
    return 0;
}

/* The scripts' hash reads: HMGET of the kind's fields, each an integer
 * 0..highs[i]; *present = 0 for a missing key. MODERATO_STATE for a key of
 * another type, a hash holding none of the fields, or a bad field. */
int
read_hash(const memory_target *target, int kind, const long long *highs, int64_t *values,
          int *present)
{
    const memory_entry *entry = target->entry;
    const hash_layout *layout = layout_of(kind);
    *present = 0;
    if (entry == NULL) {
        return 0;
    }
    if (layout_of(entry->kind) == NULL) {
        return refuse_wrong_type(target);
    }
    int found[3], any = 0;
    for (int i = 0; i < layout->field_count; i++) {
        found[i] = hash_get(entry, layout->names[i], &values[i]);
        any |= found[i];
    }
    if (!any) {
        return refuse_key_state(target->key, target->key_size, layout->kind == KIND_BUCKET
                                       ? "key %U holds a hash without tokens, base and credited"
                                   : layout->kind == KIND_GCRA
                                       ? "key %U holds a hash without tat and frac"
                                       : "key %U holds a hash without level, base and drained");
    }
    for (int i = 0; i < layout->field_count; i++) {
        if (found[i] && values[i] >= 0 && values[i] <= highs[i]) {
            continue;
        }
        PyObject *key = shown_target(target), *value = NULL;
        if (key != NULL && found[i]) {
            char stored[32];
            PyOS_snprintf(stored, sizeof(stored), "%lld", (long long)values[i]);
            value = shown_bytes(stored, (Py_ssize_t)strlen(stored), SHOWN_ARG_BYTES);
        }
        else if (key != NULL) {
            value = PyUnicode_FromString("missing");
        }
        if (value != NULL) {
            refuse("MODERATO_STATE", "field %s of key %U is %U, not a decimal integer 0..%lld",
                   layout->names[i], key, value, highs[i]);
        }
        Py_XDECREF(value);
        Py_XDECREF(key);
        return -1;
    }
    *present = 1;
    return 0;
}

/* ---- validation, in the scripts' order ------------------------------------------ */

/* args[index] (ARGV[index + 1]), a field of policy number: an integer 1..high
 * (high_text its digits), or the refusal naming it. */
static int
parse_policy_integer(const memory_call *call, Py_ssize_t index, const char *field, int number,
                     long long high, const char *high_text, long long *value)
{
    arg_view view;
    if (view_arg("decide", "args", index, call->argv[index], &view) < 0) {
        return -1;
    }
    if (!parse_integer(&view, 1, high, value)) {
        return refuse_arg(&view, "ARGV[%zd] (%s of policy %d) must be an integer 1..%s",
                          index + 1, field, number, high_text);
    }
    return 0;
}

/* args[burst_index], a policy's burst_scaled (prelude.lua's check_burst):
 * 1..ACCEL_MAX_CAPACITY_SCALED, the token bucket's refill rate "" beside it,
 * and refilled within bound_s in whole windows: burst <= floor(bound_s /
 * window_s) * capacity_scaled. */
static int
parse_burst(memory_call *call, memory_policy *policy, Py_ssize_t first, Py_ssize_t burst_index,
            long long bound_s)
{
    long long burst = 0;
    if (parse_policy_integer(call, burst_index, "burst_scaled", policy->number,
                             ACCEL_MAX_CAPACITY_SCALED, ACCEL_TEXT(ACCEL_MAX_CAPACITY_SCALED),
                             &burst) < 0) {
        return -1;
    }
    if (call->algorithm->extra_fields == 1) { /* the token bucket's refill rate */
        arg_view view;
        if (view_arg("decide", "args", first + 2, call->argv[first + 2], &view) < 0) {
            return -1;
        }
        if (view.is_int || view.size != 0) {
            return refuse_arg(&view,
                              "ARGV[%zd] (refill_scaled_per_s of policy %d) must be \"\" with a "
                              "burst_scaled (a burst refills at the exact public rate)",
                              first + 3, policy->number);
        }
    }
    long long whole_windows = bound_s / policy->window_s;
    long long largest = ACCEL_MAX_CAPACITY_SCALED;
    if (whole_windows <= ACCEL_MAX_CAPACITY_SCALED / policy->capacity_scaled) {
        largest = whole_windows * policy->capacity_scaled;
    }
    if (burst > largest) {
        return refuse("MODERATO_ARG",
                      "ARGV[%zd] (burst_scaled of policy %d) must be at most %lld for "
                      "capacity_scaled %lld per %lld s (a burst refills within %lld s), got %lld",
                      burst_index + 1, policy->number, largest,
                      (long long)policy->capacity_scaled, (long long)policy->window_s, bound_s,
                      burst);
    }
    policy->burst_scaled = burst;
    return 0;
}

int
parse_call(memory_call *call, PyObject *const *keys, Py_ssize_t key_count)
{
    const memory_algorithm *algorithm = call->algorithm;
    int own_fields = 2 + algorithm->extra_fields;
    if (key_count < 1 || key_count > ACCEL_MAX_POLICIES) {
        return refuse("MODERATO_ARG", "expected 1..%d keys (one base key per policy), got %zd",
                      ACCEL_MAX_POLICIES, key_count);
    }
    Py_ssize_t expected_argc = 2 + own_fields * key_count;
    /* A burst: one more field per policy, when the algorithm takes one. */
    int bursting = algorithm->burst_bound_s > 0 && call->argc == expected_argc + key_count;
    int fields_per_policy = own_fields + bursting;
    if (call->argc != expected_argc && !bursting) {
        if (algorithm->burst_bound_s > 0) {
            return refuse("MODERATO_ARG",
                          "expected %zd arguments for %zd policies (cost_scaled, apply, then %d "
                          "per policy), or %zd with burst_scaled, got %zd",
                          expected_argc, key_count, own_fields, expected_argc + key_count,
                          call->argc);
        }
        return refuse("MODERATO_ARG",
                      "expected %zd arguments for %zd policies (cost_scaled, apply, then %d per "
                      "policy), got %zd",
                      expected_argc, key_count, own_fields, call->argc);
    }
    for (int i = 0; i < (int)key_count; i++) {
        memset(&call->policies[i], 0, sizeof(memory_policy));
        call->policies[i].number = i + 1;
    }
    call->policy_count = (int)key_count;
    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        if (view_key("decide", NULL, i, keys[i], &policy->base, &policy->base_size) < 0) {
            return -1;
        }
        for (int j = 0; j < i; j++) {
            const memory_policy *earlier = &call->policies[j];
            if (earlier->base_size == policy->base_size &&
                memcmp(earlier->base, policy->base, (size_t)policy->base_size) == 0) {
                return refuse("MODERATO_ARG", "KEYS[%d] repeats KEYS[%d]: one policy per key",
                              i + 1, j + 1);
            }
        }
    }

    arg_view view;
    if (view_arg("decide", "args", 1, call->argv[1], &view) < 0) {
        return -1;
    }
    if (view.is_int ? (view.int_sign == 0 && (view.value == 0 || view.value == 1))
                    : (view.size == 1 && (view.data[0] == '0' || view.data[0] == '1'))) {
        call->apply = view.is_int ? (int)view.value : view.data[0] == '1';
    }
    else {
        return refuse_arg(&view,
                          "ARGV[2] (apply) must be \"1\" (decide and charge) or \"0\" (peek)");
    }
    long long value;
    if (view_arg("decide", "args", 0, call->argv[0], &view) < 0) {
        return -1;
    }
    if (!parse_integer(&view, call->apply ? 1 : 0, ACCEL_MAX_SAFE_INTEGER, &value)) {
        return refuse_arg(&view,
                          "ARGV[1] (cost_scaled) must be an integer "
                          "%s.." ACCEL_TEXT(ACCEL_MAX_SAFE_INTEGER) "%s",
                          call->apply ? "1" : "0", call->apply ? " when charging" : "");
    }
    call->cost_scaled = value;

    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        Py_ssize_t first = 2 + (Py_ssize_t)fields_per_policy * i; /* 0-based */
        if (parse_policy_integer(call, first, "capacity_scaled", policy->number,
                                 ACCEL_MAX_CAPACITY_SCALED, ACCEL_TEXT(ACCEL_MAX_CAPACITY_SCALED),
                                 &value) < 0) {
            return -1;
        }
        policy->capacity_scaled = value;
        if (parse_policy_integer(call, first + 1, "window_s", policy->number,
                                 ACCEL_MAX_LONG_WINDOW_S, ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S),
                                 &value) < 0) {
            return -1;
        }
        policy->window_s = value;
        policy->window_ms = value * 1000;
        if (algorithm->parse_extra != NULL &&
            algorithm->parse_extra(call, policy, first + 2) < 0) {
            return -1;
        }
        policy->burst_scaled = policy->capacity_scaled;
        if (bursting && parse_burst(call, policy, first, first + own_fields,
                                    algorithm->burst_bound_s) < 0) {
            return -1;
        }
    }
    return 0;
}


/* ---- reset()'s arguments ---------------------------------------------------------- */

int
refuse_reset_counts(Py_ssize_t key_count, Py_ssize_t argc)
{
    if (key_count < 1 || key_count > ACCEL_MAX_RESET_KEYS) {
        return refuse("MODERATO_ARG", "expected 1..%d keys (one base key per policy), got %zd",
                      ACCEL_MAX_RESET_KEYS, key_count);
    }
    if (argc <= key_count) {
        return refuse("MODERATO_ARG",
                      "expected one window_s argument per key (%zd) and then at least one state "
                      "suffix, got %zd arguments",
                      key_count, argc);
    }
    return 0;
}

/* reset.lua's window_s: a decimal integer text of at most 9 digits after
 * leading zeros, 1..ACCEL_MAX_LONG_WINDOW_S. */
static int
parse_reset_window(const arg_view *view, long long *window_s)
{
    if (!view->is_int) {
        Py_ssize_t start = 0;
        Py_ssize_t digits = significant_digits(view, &start);
        if (digits < 0 || digits > (Py_ssize_t)sizeof(ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S)) - 1) {
            return 0;
        }
    }
    return parse_integer(view, 1, ACCEL_MAX_LONG_WINDOW_S, window_s);
}

/* reset.lua's state suffix: ":#", or ":" and 1 to 31 of [A-Za-z0-9_:-]. */
static int
is_state_suffix(const arg_view *view)
{
    if (view->is_int || view->size < 2 || view->size > 32 || view->data[0] != ':') {
        return 0; /* an int's text never starts with ":" */
    }
    if (view->size == 2 && view->data[1] == '#') {
        return 1;
    }
    for (Py_ssize_t i = 1; i < view->size; i++) {
        char c = view->data[i];
        int allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == ':' || c == '-';
        if (!allowed) {
            return 0;
        }
    }
    return 1;
}

int
parse_reset_args(PyObject *const *args, Py_ssize_t argc, Py_ssize_t key_count,
                 long long *windows_s, reset_suffix *suffixes)
{
    for (Py_ssize_t i = 0; i < argc; i++) {
        arg_view view;
        if (view_arg("reset", "args", i, args[i], &view) < 0) {
            return -1;
        }
        if (i < key_count) {
            if (!parse_reset_window(&view, &windows_s[i])) {
                return refuse_arg(&view,
                                  "ARGV[%zd] (window_s of KEYS[%zd]) must be an integer "
                                  "1.." ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S),
                                  i + 1, i + 1);
            }
            continue;
        }
        if (!is_state_suffix(&view)) {
            return refuse_arg(&view,
                              "ARGV[%zd] (a state suffix) must be \":\" and up to 31 of "
                              "[A-Za-z0-9_:-], or \":#\"",
                              i + 1);
        }
        reset_suffix *suffix = &suffixes[i - key_count];
        suffix->data = view.data;
        suffix->size = view.size;
        suffix->window_index = view.size == 2 && view.data[1] == '#';
    }
    return 0;
}

/* ---- stored state the scripts refuse ------------------------------------------------ */

int
refuse_key_state(const unsigned char *key, size_t key_size, const char *format)
{
    PyObject *shown = shown_bytes((const char *)key, (Py_ssize_t)key_size, SHOWN_KEY_BYTES);
    if (shown != NULL) {
        refuse("MODERATO_STATE", format, shown);
        Py_DECREF(shown);
    }
    return -1;
}

int
parse_digits(const char *data, size_t size, long long low, long long high, long long *value)
{
    arg_view view = {NULL, data, (Py_ssize_t)size, 0, 0, 0};
    return parse_integer(&view, low, high, value);
}

int
refuse_log_member(const memory_target *target, const char *text, size_t size, int64_t at_ms)
{
    char score_text[32];
    PyOS_snprintf(score_text, sizeof(score_text), "%lld", (long long)at_ms);
    PyObject *key = shown_target(target);
    PyObject *member = key == NULL ? NULL : shown_bytes(text, (Py_ssize_t)size, SHOWN_ARG_BYTES);
    PyObject *at = member == NULL ? NULL
                                  : shown_bytes(score_text, (Py_ssize_t)strlen(score_text),
                                                SHOWN_ARG_BYTES);
    if (at != NULL) {
        refuse("MODERATO_STATE",
               "log %U holds member %U at %U, not \"<16-digit total>:<cost>\" "
               "(1 <= cost <= total <= 2^53) at an integer ms 0.." ACCEL_TEXT(
                   ACCEL_MAX_STATE_TIME_MS),
               key, member, at);
    }
    Py_XDECREF(at);
    Py_XDECREF(member);
    Py_XDECREF(key);
    return -1;
}

int
refuse_log_totals(const memory_target *target, int64_t newest_total, int64_t first_total)
{
    PyObject *key = shown_target(target);
    if (key != NULL) {
        refuse("MODERATO_STATE",
               "log %U: the newest running total %lld is below the oldest in the window, %lld",
               key, (long long)newest_total, (long long)first_total);
        Py_DECREF(key);
    }
    return -1;
}
