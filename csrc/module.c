/* moderato._accel: the hot paths of moderato, in C.
 *
 * Each function lives in its own file (rate.c, keys.c, resp.c, decode.c, and
 * memory.c for the MemoryStore type); this one only declares the module.
 * Its only state is per module object (the interned field names of
 * check_result), so it is initialized in phases and safe to load in several
 * interpreters.
 */
#include "compat.h"
#include "connection_core.h"
#include "grouping.h"
#include "contract.h"
#include "decode.h"
#include "fast_aredis.h"
#include "fast_check.h"
#include "fast_redis.h"
#include "fast_route.h"
#include "keys.h"
#include "memory.h"
#include "rate.h"
#include "results.h"
#include "resp.h"

PyDoc_STRVAR(module_doc,
"C accelerator of moderato: rate parsing, Redis keys, RESP encoding and\n"
"decision decoding. The contract of each function is in docs/internals.md.");

PyDoc_STRVAR(parse_rate_doc,
"parse_rate($module, text, /)\n"
"--\n"
"\n"
"Parse a rate string into ((limit, window_s), ...), one pair per policy.\n"
"\n"
"Accepts '<count>/<unit>', '<count> per <unit>' and '<count>/<n> <units>',\n"
"unit second, minute, hour, day, week, month or year (singular, plural or\n"
"abbreviated, any case), up to " ACCEL_TEXT(ACCEL_MAX_POLICIES) " joined by ';', ',' or '|', each with a\n"
"different window of at most ten 360-day years (" ACCEL_TEXT(ACCEL_MAX_LONG_WINDOW_S) " s).");

PyDoc_STRVAR(build_keys_doc,
"build_keys($module, prefix, algorithm, tenant, scope, identity, windows_s, /,\n"
"           secret=None, *, burst=None)\n"
"--\n"
"\n"
"Build one Redis key per window:\n"
"'<prefix>:<algorithm>:{<tenant>:<scope>:<identity>}:<window_s>', as bytes;\n"
"with a burst (an int 1.." ACCEL_TEXT(ACCEL_MAX_LIMIT) "), '<window_s>b<burst>' ends each key.\n"
"\n"
"Tenant, scope and identity are percent-encoded, or hashed past 64 bytes;\n"
"with a secret (bytes, 16 or more) the identity is always replaced by a\n"
"keyed hash. Every key of one call has the same Redis Cluster slot.");

PyDoc_STRVAR(key_pattern_doc,
"key_pattern($module, prefix, tenant, scope, identity, /, secret=None)\n"
"--\n"
"\n"
"The SCAN glob matching every key build_keys makes for this tenant, scope\n"
"and identity, whatever the algorithm and window:\n"
"'<prefix>:??:{<tenant>:<scope>:<identity>}:*', as bytes.");

PyDoc_STRVAR(key_slot_doc,
"key_slot($module, key, /)\n"
"--\n"
"\n"
"Redis Cluster slot of a key (str or bytes): CRC16/XMODEM of its hash tag,\n"
"or of the whole key if it has none, modulo 16384.");

PyDoc_STRVAR(decode_decision_doc,
"decode_decision($module, reply, policies, /)\n"
"--\n"
"\n"
"Check and decode a decision script's reply, a list of 2 + 3 * policies ints,\n"
"into (allowed, deciding, ((remaining_scaled, retry_ms, reset_ms), ...)).\n"
"\n"
"Any departure from the contract in docs/internals.md raises ValueError.");

PyDoc_STRVAR(encode_command_doc,
"encode_command($module, /, *args)\n"
"--\n"
"\n"
"Encode a Redis command as a RESP array of bulk strings.\n"
"\n"
"Each argument is bytes, bytearray, a contiguous memoryview, str (written as\n"
"UTF-8) or int (written in decimal, any size); bool, float, None and other\n"
"types raise TypeError.");

PyDoc_STRVAR(encode_evalsha_doc,
"encode_evalsha($module, sha, keys, args, /)\n"
"--\n"
"\n"
"Encode EVALSHA <sha> <len(keys)> <keys...> <args...> in one exact-size buffer.\n"
"\n"
"sha is the 40 hexadecimal digits of a script's SHA-1 (str or bytes); keys\n"
"and args are tuples or lists of what encode_command accepts.");

PyDoc_STRVAR(evalsha_size_doc,
"evalsha_size($module, keys, args, /)\n"
"--\n"
"\n"
"len(encode_evalsha(sha, keys, args)) for any sha, without encoding it: what a\n"
"check queued unencoded takes in a batched call's bytes bound.");

PyDoc_STRVAR(check_result_doc,
"check_result($module, reply, plan, /)\n"
"--\n"
"\n"
"Check a decision script's reply as decode_decision does and build the\n"
"public result from it: plan is (CheckResult, PolicyState, rate text,\n"
"algorithm name, ((limit, window_s), ...)), one rate per policy; a rate\n"
"(limit, window_s, refill) is a burst's (limit: the burst).\n"
"\n"
"remaining is rounded down to whole requests, retry_after up to whole\n"
"seconds (None: never), reset_at is Unix seconds (None: none); the top-level\n"
"fields are the deciding policy's.");

static PyMethodDef accel_methods[] = {
    {"parse_rate", (PyCFunction)(void (*)(void))rate_parse, METH_FASTCALL, parse_rate_doc},
    {"build_keys", (PyCFunction)(void (*)(void))keys_build, METH_FASTCALL | METH_KEYWORDS,
     build_keys_doc},
    {"key_pattern", (PyCFunction)(void (*)(void))keys_pattern, METH_FASTCALL | METH_KEYWORDS,
     key_pattern_doc},
    {"key_slot", (PyCFunction)(void (*)(void))keys_slot, METH_FASTCALL, key_slot_doc},
    {"encode_command", (PyCFunction)(void (*)(void))resp_encode_command, METH_FASTCALL,
     encode_command_doc},
    {"encode_evalsha", (PyCFunction)(void (*)(void))resp_encode_evalsha, METH_FASTCALL,
     encode_evalsha_doc},
    {"evalsha_size", (PyCFunction)(void (*)(void))resp_evalsha_size_function, METH_FASTCALL,
     evalsha_size_doc},
    {"decode_decision", (PyCFunction)(void (*)(void))decode_decision, METH_FASTCALL,
     decode_decision_doc},
    {"check_result", (PyCFunction)(void (*)(void))decode_check_result, METH_FASTCALL,
     check_result_doc},
    {NULL, NULL, 0, NULL},
};

static int
add_long_long(PyObject *module, const char *name, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    int result = PyModule_AddObjectRef(module, name, number);
    Py_DECREF(number);
    return result;
}

static int
accel_exec(PyObject *module)
{
    /* CheckResult and PolicyState, types of this module object (results.c). */
    if (results_add_to_module(module) < 0) {
        return -1;
    }
    /* The contract's numbers, every one of contract.h's list. */
#define ACCEL_EXPORT_NUMBER(name)                                                      \
    if (add_long_long(module, #name, (long long)ACCEL_##name) < 0) {                   \
        return -1;                                                                     \
    }
    ACCEL_CONTRACT_NUMBERS(ACCEL_EXPORT_NUMBER)
#undef ACCEL_EXPORT_NUMBER
    /* memory://'s store, a type of this module object (memory.c). */
    if (memory_add_to_module(module) < 0) {
        return -1;
    }
    /* memory://'s commonest check in one call (fast_check.c), and the blocking
     * limiter's over one Redis server (fast_redis.c). */
    if (fast_check_add_to_module(module) < 0) {
        return -1;
    }
    if (fast_redis_add_to_module(module) < 0) {
        return -1;
    }
    /* The asyncio limiter's over one Redis server (fast_aredis.c). */
    if (fast_aredis_add_to_module(module) < 0) {
        return -1;
    }
    /* The headers middleware's send wrapper (fast_route.c). */
    if (fast_route_add_to_module(module) < 0) {
        return -1;
    }
    /* The asyncio Redis connection's per-command path (connection_core.c), and
     * a loop turn's checks joined into batched calls (grouping.c). */
    if (connection_core_add_to_module(module) < 0) {
        return -1;
    }
    return grouping_add_to_module(module);
}

/* Every reference the state holds, visited (visit given: the module's
 * traverse) or cleared (visit NULL: its clear). */
static int
each_reference(PyObject *module, visitproc visit, void *arg)
{
    accel_state *state = PyModule_GetState(module);
    if (state == NULL) {
        return 0;
    }
#define EACH(reference)                                                                \
    if (visit != NULL) {                                                               \
        Py_VISIT(state->reference);                                                    \
    }                                                                                  \
    else {                                                                             \
        Py_CLEAR(state->reference);                                                    \
    }
    ACCEL_STATE_REFERENCES(EACH)
    for (int i = 0; i < FAST_NAME_COUNT; i++) {
        EACH(names[i])
    }
    for (int i = 0; i < REDIS_NAME_COUNT; i++) {
        EACH(redis_names[i])
    }
    for (int i = 0; i < CORE_NAME_COUNT; i++) {
        EACH(core_names[i])
    }
    for (int i = 0; i < ROUTE_NAME_COUNT; i++) {
        EACH(route_names[i])
    }
#undef EACH
    return 0;
}

static int
accel_traverse(PyObject *module, visitproc visit, void *arg)
{
    return each_reference(module, visit, arg);
}

static int
accel_clear(PyObject *module)
{
    return each_reference(module, NULL, NULL);
}

static void
accel_free(void *module)
{
    accel_clear((PyObject *)module);
}

static PyModuleDef_Slot accel_slots[] = {
    {Py_mod_exec, (void *)accel_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "moderato._accel",
    .m_doc = module_doc,
    .m_size = sizeof(accel_state),
    .m_traverse = accel_traverse,
    .m_methods = accel_methods,
    .m_slots = accel_slots,
    .m_clear = accel_clear,
    .m_free = accel_free,
};

PyMODINIT_FUNC
PyInit__accel(void)
{
    return PyModuleDef_Init(&accel_module);
}
