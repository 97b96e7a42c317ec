/* sliding_log over its typed state (a log_value at <base>:log): a sorted
 * set of admissions "<16-digit running total>:<cost>" scored with their
 * instant; usage is the newest total minus the total before the first entry
 * in the window. */
#include <math.h>
#include <string.h>

#include "store_algorithms.h"

static const char log_suffix[] = ":log";

typedef struct {
    int64_t at_ms;
    int64_t total_scaled;
    int64_t cost_scaled;
} log_entry;

enum { LOG_STAMP, LOG_TOTAL, LOG_RENUMBER, LOG_BASE_TOTAL, LOG_CUTOFF, LOG_KEPT };

/* write_expire_at_ms when the admission keeps the log's expiry (and trims nothing). */
#define LOG_KEEP_EXPIRY INT64_MIN

log_item *
log_at(const log_value *log, size_t rank)
{
    return &log->items[log->start + rank];
}

/* The member's text: the canonical one, written into buffer, or as loaded. */
const char *
log_member_text(const log_item *item, char *buffer, size_t *size)
{
    if (item->text != NULL) {
        memcpy(size, item->text, sizeof(size_t));
        return item->text + sizeof(size_t);
    }
    *size = (size_t)PyOS_snprintf(buffer, LOG_TEXT_BYTES, "%016lld:%lld",
                                  (long long)item->total_scaled, (long long)item->cost_scaled);
    return buffer;
}

/* Redis's order: by score, then by member bytes. */
static int
log_compare(const log_item *a, const log_item *b)
{
    if (a->at_ms != b->at_ms) {
        return a->at_ms < b->at_ms ? -1 : 1;
    }
    if (a->text == NULL && b->text == NULL && a->total_scaled != b->total_scaled) {
        return a->total_scaled < b->total_scaled ? -1 : 1; /* 16 digits each */
    }
    char a_buffer[LOG_TEXT_BYTES], b_buffer[LOG_TEXT_BYTES];
    size_t a_size, b_size;
    const char *a_text = log_member_text(a, a_buffer, &a_size);
    const char *b_text = log_member_text(b, b_buffer, &b_size);
    int order = memcmp(a_text, b_text, a_size < b_size ? a_size : b_size);
    if (order != 0) {
        return order < 0 ? -1 : 1;
    }
    return a_size < b_size ? -1 : (a_size > b_size ? 1 : 0);
}

int
log_compare_items(const void *a, const void *b)
{
    return log_compare((const log_item *)a, (const log_item *)b);
}

int
log_same_member(const log_item *a, const log_item *b)
{
    char a_buffer[LOG_TEXT_BYTES], b_buffer[LOG_TEXT_BYTES];
    size_t a_size, b_size;
    const char *a_text = log_member_text(a, a_buffer, &a_size);
    const char *b_text = log_member_text(b, b_buffer, &b_size);
    return a_size == b_size && memcmp(a_text, b_text, a_size) == 0;
}

int
log_is_regular(const log_value *log)
{
    for (size_t i = 0; i < log->count; i++) {
        const log_item *item = log_at(log, i);
        if (item->text != NULL ||
            (i > 0 && item->total_scaled <= log_at(log, i - 1)->total_scaled)) {
            return 0;
        }
    }
    return 1;
}

/* ZCOUNT key -inf cutoff: the members scored at or before it. */
static size_t
log_count_at_or_before(const log_value *log, int64_t cutoff_ms)
{
    size_t low = 0, high = log->count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (log_at(log, middle)->at_ms <= cutoff_ms) {
            low = middle + 1;
        }
        else {
            high = middle;
        }
    }
    return low;
}

/* The scripts' parse_entry: the member and score at a rank, validated. */
static int
log_parse(const memory_target *target, const log_item *item, log_entry *entry)
{
    /* A member the store wrote (no loaded text) is canonical by construction:
     * its numbers are what its text would read as, so check them without
     * formatting it (the hot path of every denial). */
    if (item->text == NULL && item->at_ms >= 0 && item->at_ms <= ACCEL_MAX_STATE_TIME_MS &&
        item->cost_scaled >= 1 && item->cost_scaled <= item->total_scaled &&
        item->total_scaled <= ACCEL_MAX_SAFE_INTEGER) {
        *entry = (log_entry){item->at_ms, item->total_scaled, item->cost_scaled};
        return 0;
    }
    char buffer[LOG_TEXT_BYTES];
    size_t size, colon = 0, end;
    const char *text = log_member_text(item, buffer, &size);
    while (colon < size && text[colon] >= '0' && text[colon] <= '9') {
        colon++;
    }
    for (end = colon + 1; end < size && text[end] >= '0' && text[end] <= '9'; end++) {
    }
    int matched = colon > 0 && colon < size && text[colon] == ':' && end > colon + 1 && end == size;
    arg_view score = {NULL, NULL, 0, 1, item->at_ms < 0 ? -1 : 0, item->at_ms};
    long long at_ms = 0, total = 0, cost = 0;
    int at_ok = parse_integer(&score, 0, ACCEL_MAX_STATE_TIME_MS, &at_ms);
    int total_ok = matched && colon == ACCEL_LOG_TOTAL_DIGITS &&
                   parse_digits(text, colon, 1, ACCEL_MAX_SAFE_INTEGER, &total);
    int cost_ok = matched &&
                  parse_digits(text + colon + 1, size - colon - 1, 1, ACCEL_MAX_SAFE_INTEGER, &cost);
    if (at_ok && total_ok && cost_ok && cost <= total) {
        *entry = (log_entry){at_ms, total, cost};
        return 0;
    }
    return refuse_log_member(target, text, size, item->at_ms);
}

static int
sliding_log_evaluate(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    int64_t now_ms = call->now_ms, cost_scaled = call->cost_scaled;
    int64_t capacity_scaled = policy->capacity_scaled, window_ms = policy->window_ms;
    int64_t cutoff_ms = now_ms - window_ms; /* entries at or before it have left the window */
    memory_target *target =
        add_target(store, call, policy, log_suffix, sizeof(log_suffix) - 1, KIND_LOG);
    const log_value *log = NULL;
    if (target->entry != NULL) {
        if (target->entry->kind != KIND_LOG) {
            return refuse_wrong_type(target);
        }
        log = &target->entry->value.log;
    }
    size_t count = log != NULL ? log->count : 0;
    log_entry newest = {0, 0, 0}, first = {0, 0, 0};
    int have_first = 0;
    size_t first_rank = 0;
    int64_t base_total_scaled = 0, usage_scaled = 0;
    if (count > 0 && log_parse(target, log_at(log, count - 1), &newest) < 0) {
        return -1;
    }
    if (count > 0 && newest.at_ms > cutoff_ms) {
        first_rank = log_count_at_or_before(log, cutoff_ms);
        if (log_parse(target, log_at(log, first_rank), &first) < 0) {
            return -1;
        }
        have_first = 1;
        /* Everything up to the first entry in the window, in running-total terms. */
        base_total_scaled = first.total_scaled - first.cost_scaled;
        if (newest.total_scaled < first.total_scaled) {
            return refuse_log_totals(target, newest.total_scaled, first.total_scaled);
        }
        usage_scaled = newest.total_scaled - base_total_scaled;
    }
    /* A clock that stepped back never reorders the log. */
    int64_t stamp_ms = count > 0 && newest.at_ms > now_ms ? newest.at_ms : now_ms;
    int64_t headroom_scaled = capacity_scaled - usage_scaled;
    memory_verdict *verdict = &policy->verdict;
    headroom_verdict(verdict, policy->capacity_scaled, cost_scaled, headroom_scaled);
    verdict->reset_uncharged_ms = have_first ? newest.at_ms + window_ms : now_ms;
    /* Allowed: full recovery once the newest entry has left the window (a usage
     * read, of cost 0, adds none). */
    verdict->reset_charged_ms =
        cost_scaled > 0 ? stamp_ms + window_ms : verdict->reset_uncharged_ms;

    if (!verdict->fits && !verdict->permanent) {
        /* The first entry (by rank) whose leaving frees need: totals rise with rank. */
        int64_t need_scaled = cost_scaled - headroom_scaled;
        size_t newest_rank = count - 1, low = first_rank, high = newest_rank;
        while (low < high) {
            size_t middle = (low + high) / 2;
            log_entry entry;
            if (log_parse(target, log_at(log, middle), &entry) < 0) {
                return -1;
            }
            if (entry.total_scaled - base_total_scaled >= need_scaled) {
                high = middle;
            }
            else {
                low = middle + 1;
            }
        }
        log_entry leaving = newest;
        if (low != newest_rank && log_parse(target, log_at(log, low), &leaving) < 0) {
            return -1;
        }
        verdict->reset_denied_ms = leaving.at_ms + window_ms;
        verdict->retry_ms = verdict->reset_denied_ms - now_ms;
        return 0;
    }
    if (!verdict->fits) {
        return 0;
    }
    int64_t total_scaled = have_first ? newest.total_scaled + cost_scaled : cost_scaled;
    int renumber = have_first && cost_scaled > ACCEL_MAX_SAFE_INTEGER - newest.total_scaled;
    if (renumber) {
        /* The running total would pass 2^53: renumber the window's entries from zero. */
        for (size_t rank = first_rank; rank < count; rank++) {
            log_entry entry;
            if (log_parse(target, log_at(log, rank), &entry) < 0) {
                return -1;
            }
            if (entry.total_scaled - entry.cost_scaled < base_total_scaled) {
                return refuse_key_state(target->key, target->key_size,
                                           "log %U: running totals do not rise");
            }
        }
        total_scaled = usage_scaled + cost_scaled;
    }
    /* Trim and expiry once per second of the stamp: the log was empty or its newest
     * entry is from an earlier second (or it is renumbered). Otherwise the newest
     * entry is in the window, and nothing is trimmed. */
    int64_t stamp_second_ms = stamp_ms - stamp_ms % 1000;
    int renew = count == 0 || newest.at_ms < stamp_second_ms || renumber;
    policy->write_value[LOG_STAMP] = stamp_ms;
    policy->write_value[LOG_TOTAL] = total_scaled;
    policy->write_value[LOG_RENUMBER] = renumber;
    policy->write_value[LOG_BASE_TOTAL] = base_total_scaled;
    policy->write_value[LOG_CUTOFF] = renew ? cutoff_ms : INT64_MIN;
    policy->write_value[LOG_KEPT] =
        !renew ? (int64_t)count : (have_first ? (int64_t)(count - first_rank) : 0);
    policy->write_expire_at_ms = renew ? stamp_second_ms + 2000 + window_ms : LOG_KEEP_EXPIRY;
    return 0;
}

/* Room for the kept members and the new one, before any write. */
static int
sliding_log_prepare(MemoryStore *Py_UNUSED(store), memory_call *Py_UNUSED(call),
                    memory_policy *policy)
{
    memory_target *target = &policy->targets[0];
    memory_entry *entry = target->entry != NULL ? target->entry : target->fresh;
    log_value *log = &entry->value.log;
    size_t needed = (size_t)policy->write_value[LOG_KEPT] + 1;
    if (log->capacity >= needed) {
        return 0;
    }
    size_t capacity = (needed > log->count ? needed : log->count) * 2 + 4;
    log_item *items = PyMem_Malloc(capacity * sizeof(log_item));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (log->count > 0) {
        memcpy(items, log_at(log, 0), log->count * sizeof(log_item));
    }
    PyMem_Free(log->items);
    log->items = items;
    log->start = 0;
    log->capacity = capacity;
    return 0;
}

/* ZADD: a member already there only moves to its new score. Cannot fail:
 * there is room for one more member. */
static void
log_add(log_value *log, const log_item *item)
{
    if (log->start + log->count == log->capacity) {
        memmove(log->items, log_at(log, 0), log->count * sizeof(log_item));
        log->start = 0;
    }
    if (log->count == 0 ||
        (log->regular && item->text == NULL &&
         item->total_scaled > log_at(log, log->count - 1)->total_scaled &&
         item->at_ms >= log_at(log, log->count - 1)->at_ms)) {
        *log_at(log, log->count) = *item;
        log->count++;
        log->regular = log->count == 1 ? item->text == NULL : log->regular;
        return;
    }
    for (size_t i = 0; i < log->count; i++) {
        if (log_same_member(log_at(log, i), item)) {
            PyMem_Free(log_at(log, i)->text);
            memmove(log_at(log, i), log_at(log, i + 1), (log->count - i - 1) * sizeof(log_item));
            log->count--;
            break;
        }
    }
    size_t position = log->count;
    while (position > 0 && log_compare(log_at(log, position - 1), item) > 0) {
        position--;
    }
    memmove(log_at(log, position + 1), log_at(log, position),
            (log->count - position) * sizeof(log_item));
    *log_at(log, position) = *item;
    log->count++;
    log->regular = log_is_regular(log);
}

static void
sliding_log_apply(MemoryStore *store, memory_call *call, memory_policy *policy)
{
    memory_entry *entry = target_entry(store, &policy->targets[0], call->now_ms);
    log_value *log = &entry->value.log;
    /* ZREMRANGEBYSCORE -inf cutoff (renumbering keeps just the window too); a cutoff of
     * INT64_MIN (no trim due) drops nothing. */
    size_t dropped = log_count_at_or_before(log, policy->write_value[LOG_CUTOFF]);
    log_release_items(log, log->start, dropped);
    log->start += dropped;
    log->count -= dropped;
    if (log->capacity > 64 && log->capacity > 4 * (log->count + 1)) {
        /* Mostly trimmed: give memory back (keeping the larger array on failure). */
        memmove(log->items, log_at(log, 0), log->count * sizeof(log_item));
        log->start = 0;
        size_t capacity = 2 * (log->count + 1);
        log_item *items = PyMem_Realloc(log->items, capacity * sizeof(log_item));
        if (items != NULL) {
            log->items = items;
            log->capacity = capacity;
        }
    }
    if (policy->write_value[LOG_RENUMBER]) {
        for (size_t i = 0; i < log->count; i++) {
            log_item *item = log_at(log, i);
            item->total_scaled -= policy->write_value[LOG_BASE_TOTAL];
            PyMem_Free(item->text);
            item->text = NULL;
        }
        qsort(log_at(log, 0), log->count, sizeof(log_item), log_compare_items);
        log->regular = log_is_regular(log);
    }
    log_item item = {policy->write_value[LOG_STAMP], policy->write_value[LOG_TOTAL],
                     call->cost_scaled, NULL};
    log_add(log, &item);
    if (policy->write_expire_at_ms != LOG_KEEP_EXPIRY) {
        entry->expire_at_ms = policy->write_expire_at_ms;
    }
}

STORE_ALGORITHM(sliding_log, 0, 0, NULL, sliding_log_prepare);
