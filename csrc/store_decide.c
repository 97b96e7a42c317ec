/* One decide() call: validate (store_validate.c), derive and look up each
 * policy's keys, let the algorithm evaluate every policy on the state as
 * read, conclude the reply from the verdicts (as prelude.lua's
 * decide_valid() does after its evaluate() calls), and
 * only then, if everything admits and the call charges, allocate what the
 * writes need and apply them -- none of which can fail.
 *
 * Every method runs start to finish holding the GIL and never calls back
 * into Python code while the table is read or changed, so a decision is
 * atomic with respect to every other thread and event loop. */
#include <string.h>

#include "sequence.h"
#include "store_decide.h"

/* ---- the algorithms --------------------------------------------------------- */

#define STORE_ALGORITHM_ADDRESS(algo) &store_##algo,
const memory_algorithm *const store_algorithms[] = {STORE_ALGORITHM_NAMES(STORE_ALGORITHM_ADDRESS)};
#undef STORE_ALGORITHM_ADDRESS

const int store_algorithm_count =
    (int)(sizeof(store_algorithms) / sizeof(store_algorithms[0]));

static const memory_algorithm *
find_algorithm(PyObject *name)
{
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "MemoryStore.decide() algorithm must be str, not %.100s",
                     Py_TYPE(name)->tp_name);
        return NULL;
    }
    const char *text = PyUnicode_AsUTF8(name);
    if (text == NULL) {
        return NULL;
    }
    for (int i = 0; i < store_algorithm_count; i++) {
        if (strcmp(store_algorithms[i]->name, text) == 0) {
            return store_algorithms[i];
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "MemoryStore.decide() has no algorithm %R (see MEMORY_ALGORITHMS)", name);
    return NULL;
}

/* ---- concluding, and the writes ------------------------------------------------- */

/* The reply from the verdicts, as prelude.lua's decide_valid() builds it:
 * into values (2 + 3 per policy). */
static int
conclude(const memory_call *call, long long *values)
{
    int allowed = 1;
    for (int i = 0; i < call->policy_count; i++) {
        if (!call->policies[i].verdict.fits) {
            allowed = 0;
        }
    }
    int deciding = 0, have_deciding = 0;
    long long deciding_remaining = 0, deciding_retry = 0;
    for (int i = 0; i < call->policy_count; i++) {
        const memory_verdict *verdict = &call->policies[i].verdict;
        long long remaining_scaled, retry_ms, reset_ms;
        if (verdict->permanent) {
            remaining_scaled = verdict->remaining_uncharged;
            retry_ms = reset_ms = -1;
        }
        else if (allowed) {
            remaining_scaled = verdict->remaining_charged;
            retry_ms = 0;
            reset_ms = verdict->reset_charged_ms;
        }
        else if (verdict->fits) {
            remaining_scaled = verdict->remaining_uncharged;
            retry_ms = 0;
            reset_ms = verdict->reset_uncharged_ms;
        }
        else {
            remaining_scaled = verdict->remaining_uncharged;
            retry_ms = verdict->retry_ms;
            reset_ms = verdict->reset_denied_ms;
        }
        values[2 + 3 * i] = remaining_scaled;
        values[3 + 3 * i] = retry_ms;
        values[4 + 3 * i] = reset_ms;
        /* Admission: the fewest remaining. Denial: the longest wait, a
         * permanent one counting as infinite. Ties: the lowest index. */
        if (allowed) {
            if (!have_deciding || remaining_scaled < deciding_remaining) {
                deciding = i;
                deciding_remaining = remaining_scaled;
                have_deciding = 1;
            }
        }
        else if (!have_deciding || (deciding_retry != -1 &&
                                    (retry_ms == -1 || retry_ms > deciding_retry))) {
            deciding = i;
            deciding_retry = retry_ms;
            have_deciding = 1;
        }
    }
    values[0] = allowed;
    values[1] = deciding;
    return allowed;
}

static void
release_fresh(memory_call *call)
{
    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        for (int j = 0; j < policy->target_count; j++) {
            if (policy->targets[j].fresh != NULL) {
                entry_free(policy->targets[j].fresh);
                policy->targets[j].fresh = NULL;
            }
        }
    }
}

/* Everything the writes need, before the first one. */
static int
prepare_writes(MemoryStore *store, memory_call *call)
{
    size_t creations = 0;
    for (int i = 0; i < call->policy_count; i++) {
        memory_policy *policy = &call->policies[i];
        for (int j = 0; j < policy->target_count; j++) {
            memory_target *target = &policy->targets[j];
            if (target->entry != NULL || target->create_kind == 0) {
                continue;
            }
            target->fresh =
                entry_new(target->create_kind, target->key, target->key_size, target->hash);
            if (target->fresh == NULL) {
                return -1;
            }
            creations++;
        }
    }
    if (table_reserve(store, creations) < 0) {
        return -1;
    }
    for (int i = 0; i < call->policy_count; i++) {
        if (call->algorithm->prepare != NULL &&
            call->algorithm->prepare(store, call, &call->policies[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- MemoryStore methods ---------------------------------------------------------- */

/* Item i of the reply, a flat list of integers as the scripts answer. */
static PyObject *
reply_integer(void *values, Py_ssize_t i)
{
    return PyLong_FromLongLong(((const long long *)values)[i]);
}

/* The decision of a parsed call whose policies' base keys are set, into
 * values (2 + 3 per policy, the reply's integers). 0, or -1 with an error
 * set. Runs no Python code until the key space is released. */
static int
decide_parsed(MemoryStore *store, memory_call *call, long long *values)
{
    Py_ssize_t base_sizes[ACCEL_MAX_POLICIES];
    for (int i = 0; i < call->policy_count; i++) {
        base_sizes[i] = call->policies[i].base_size;
    }
    if (reserve_key_space(call, MAX_TARGETS, base_sizes, call->policy_count) < 0) {
        return -1;
    }
    store->version++; /* even a read reorders the LRU list */
    const memory_algorithm *algorithm = call->algorithm;
    for (int i = 0; i < call->policy_count; i++) {
        if (algorithm->evaluate(store, call, &call->policies[i]) < 0) {
            goto failed;
        }
    }
    int allowed = conclude(call, values);
    if (allowed && call->apply) {
        if (prepare_writes(store, call) < 0) {
            goto failed;
        }
        for (int i = 0; i < call->policy_count; i++) {
            algorithm->apply(store, call, &call->policies[i]);
        }
        evict_beyond_cap(store);
    }
    if (store->sweep_every > 0 && --store->until_sweep == 0) {
        /* Expired entries go without a background task: a bounded slice of
         * the table every so many decisions. */
        store->until_sweep = store->sweep_every;
        table_sweep(store, store->sweep_entries, store_entry_idle, call->now_ms);
    }
    release_fresh(call);
    release_key_space(call);
    return 0;
failed:
    release_fresh(call);
    release_key_space(call);
    return -1;
}

PyObject *
store_decide(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MemoryStore *store = (MemoryStore *)self;
    long long values[2 + 3 * ACCEL_MAX_POLICIES];
    PyObject *keys = NULL, *argv = NULL, *reply = NULL;
    memory_call call_space;
    memory_call *call = &call_space;

    call->policy_count = 0;
    call->key_space = NULL;
    if (accel_check_arity("MemoryStore.decide", "algorithm, keys, args, now_ms", 4, 4, nargs) <
        0) {
        return NULL;
    }
    const memory_algorithm *algorithm = find_algorithm(args[0]);
    if (algorithm == NULL) {
        return NULL;
    }
    int64_t now_ms;
    if (STORE_CALL_ARGUMENTS(parse_now_or_clock, "decide", args[3], &now_ms, args[1], &keys,
                             args[2], &argv) < 0) {
        return NULL;
    }
    call->algorithm = algorithm;
    call->argv = PySequence_Fast_ITEMS(argv);
    call->argc = PySequence_Fast_GET_SIZE(argv);
    call->now_ms = now_ms;
    if (parse_call(call, PySequence_Fast_ITEMS(keys), PySequence_Fast_GET_SIZE(keys)) == 0 &&
        decide_parsed(store, call, values) == 0) {
        /* Nothing of the arguments or the table is used past this point: the
         * reply's allocation may run a garbage collection, hence any code. */
        reply = accel_build_sequence(0, 2 + 3 * (Py_ssize_t)call->policy_count, reply_integer,
                                     values);
    }
    Py_XDECREF(argv);
    Py_XDECREF(keys);
    return reply;
}

/* ---- decide() for a caller that repeats its arguments (fast_check.c) ------------- */

struct store_decision {
    memory_call call; /* parsed: algorithm, cost, apply, the policies' fields */
};

store_decision *
store_decision_new(PyObject *algorithm_name, PyObject *keys, PyObject *args)
{
    const memory_algorithm *algorithm = find_algorithm(algorithm_name);
    if (algorithm == NULL) {
        return NULL;
    }
    store_decision *decision = PyMem_Malloc(sizeof(store_decision));
    if (decision == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memory_call *call = &decision->call;
    PyObject *key_items = NULL, *argv = NULL;
    call->policy_count = 0;
    call->key_space = NULL;
    if (fast_sequences(keys, "MemoryStore.decide() keys must be a sequence", &key_items, args,
                       "MemoryStore.decide() args must be a sequence", &argv) < 0) {
        PyMem_Free(decision);
        return NULL;
    }
    call->algorithm = algorithm;
    call->argv = PySequence_Fast_ITEMS(argv);
    call->argc = PySequence_Fast_GET_SIZE(argv);
    call->now_ms = 0;
    int parsed =
        parse_call(call, PySequence_Fast_ITEMS(key_items), PySequence_Fast_GET_SIZE(key_items));
    Py_DECREF(argv);
    Py_DECREF(key_items);
    if (parsed < 0) {
        PyMem_Free(decision);
        return NULL;
    }
    /* Nothing of the arguments is kept: the keys are given per decision. */
    call->argv = NULL;
    call->argc = 0;
    for (int i = 0; i < call->policy_count; i++) {
        call->policies[i].base = NULL;
        call->policies[i].base_size = 0;
    }
    return decision;
}

void
store_decision_free(store_decision *decision)
{
    PyMem_Free(decision);
}

int
store_decision_policies(const store_decision *decision)
{
    return decision->call.policy_count;
}

int
store_decide_with(PyObject *store, const store_decision *decision, const char *const *bases,
                  const Py_ssize_t *base_sizes, int64_t now_ms, long long *values)
{
    memory_call call_space;
    memory_call *call = &call_space;
    const memory_call *parsed = &decision->call;
    call->algorithm = parsed->algorithm;
    call->argv = NULL;
    call->argc = 0;
    call->cost_scaled = parsed->cost_scaled;
    call->apply = parsed->apply;
    call->now_ms = now_ms;
    call->policy_count = parsed->policy_count;
    call->key_space = NULL;
    memcpy(call->policies, parsed->policies,
           sizeof(memory_policy) * (size_t)parsed->policy_count);
    for (int i = 0; i < call->policy_count; i++) {
        call->policies[i].base = bases[i];
        call->policies[i].base_size = base_sizes[i];
    }
    return decide_parsed((MemoryStore *)store, call, values);
}
