/* A C object awaited as a coroutine: fast_check.c's ReadyCheck (a check
 * decided when it was called) and fast_aredis.c's PendingCheck (a check sent
 * when it was called, awaiting its reply). Each is one step function; its
 * send(), throw(), close(), __await__ and iterator slots are written once
 * here, around that step.
 */
#ifndef MODERATO_COROUTINE_H
#define MODERATO_COROUTINE_H

#include "heap_type.h"

/* What a step did: yielded *out (to the event loop), returned *out (the
 * coroutine's result), or raised (an exception set, *out NULL). */
enum { STEP_YIELD, STEP_RETURN, STEP_ERROR };

/* A step's outcome as an iterator's: the value yielded, or NULL with
 * StopIteration(result) or the error set. */
static inline PyObject *
coroutine_iterator_step(int stepped, PyObject *out)
{
    if (stepped == STEP_YIELD) {
        return out;
    }
    if (stepped == STEP_RETURN) {
        /* StopIteration(result), its value taken as given even if it is a tuple. */
        PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, out);
        Py_DECREF(out);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
    }
    return NULL;
}

/* throw(type[, value[, traceback]])'s exception, as a coroutine takes it: a
 * new reference (an instance), or NULL with a TypeError set. */
static inline PyObject *
coroutine_thrown(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected 1 to 3 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *thrown = args[0];
    if (PyExceptionInstance_Check(thrown)) {
        PyErr_SetObject((PyObject *)Py_TYPE(thrown), thrown);
    }
    else if (PyExceptionClass_Check(thrown)) {
        PyErr_SetObject(thrown, nargs >= 2 ? args[1] : Py_None);
    }
    else {
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
        return NULL;
    }
    return accel_take_exception();
}

/* _asyncio_future_blocking, None: asyncio.isfuture(obj) is
 * hasattr(type(obj), "_asyncio_future_blocking") and that attribute of obj not
 * None. A coroutine has no such attribute, and the failed hasattr() on its type
 * formats an AttributeError's message to drop it: some 2,000 instructions of
 * the 66,000 the client spent on a check handed to asyncio.gather
 * (benchmarks/batch_client_instructions.py; ensure_future and wait_for ask it
 * too). With it, the answer is the same (not a future) without the error. (A Task awaiting the check never reads it: it reads it of what
 * the check yields, the connection's future.) */
static inline PyObject *
coroutine_not_a_future(PyObject *Py_UNUSED(self), void *Py_UNUSED(closure))
{
    Py_RETURN_NONE;
}

#if PY_VERSION_HEX >= 0x030A0000
#define ACCEL_COROUTINE_AM_SEND(prefix, object_type)                                     \
    static PySendResult prefix##_am_send(PyObject *self, PyObject *value, PyObject **out)  \
    {                                                                                    \
        int stepped = prefix##_step((object_type *)self, value, NULL, out);              \
        return stepped == STEP_YIELD    ? PYGEN_NEXT                                     \
               : stepped == STEP_RETURN ? PYGEN_RETURN                                   \
                                        : PYGEN_ERROR;                                   \
    }
#define ACCEL_COROUTINE_AM_SEND_SLOT(prefix) {Py_am_send, prefix##_am_send},
#else
#define ACCEL_COROUTINE_AM_SEND(prefix, object_type)
#define ACCEL_COROUTINE_AM_SEND_SLOT(prefix)
#endif

/* The slots (<prefix>_slots, for ACCEL_TYPE_SPEC) of a coroutine-like type
 * <prefix> of object_type, a garbage-collected type (ACCEL_GC_FUNCTIONS) with
 * an int member `done`, whose one step is
 *
 *   static int <prefix>_step(object_type *self, PyObject *value,
 *                            PyObject *thrown, PyObject **out)
 *
 * value: what was sent (None when iterated); thrown: what throw() raises
 * into it, an exception instance given over, or NULL. It returns STEP_*.
 * close() marks it done and lets go of all it holds (<prefix>_clear); the
 * extra slots given (each followed by a comma) come before the shared ones.
 * Only the C makes its instances: calling the type is refused
 * (accel_refuse_new), never a coroutine with its fields unset. */
#define ACCEL_COROUTINE_SLOTS(prefix, object_type, doc, ...)                             \
    static PyObject *prefix##_iternext(PyObject *self)                                   \
    {                                                                                    \
        PyObject *out;                                                                   \
        int stepped = prefix##_step((object_type *)self, Py_None, NULL, &out);           \
        return coroutine_iterator_step(stepped, out);                                    \
    }                                                                                    \
    static PyObject *prefix##_send(PyObject *self, PyObject *value)                      \
    {                                                                                    \
        PyObject *out;                                                                   \
        int stepped = prefix##_step((object_type *)self, value, NULL, &out);             \
        return coroutine_iterator_step(stepped, out);                                    \
    }                                                                                    \
    ACCEL_COROUTINE_AM_SEND(prefix, object_type)                                         \
    static PyObject *prefix##_await(PyObject *self)                                      \
    {                                                                                    \
        return Py_NewRef(self);                                                          \
    }                                                                                    \
    static PyObject *prefix##_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs) \
    {                                                                                    \
        PyObject *thrown = coroutine_thrown(args, nargs), *out;                          \
        if (thrown == NULL) {                                                            \
            return NULL;                                                                 \
        }                                                                                \
        int stepped = prefix##_step((object_type *)self, Py_None, thrown, &out);         \
        return coroutine_iterator_step(stepped, out);                                    \
    }                                                                                    \
    static PyObject *prefix##_close(PyObject *self, PyObject *Py_UNUSED(ignored))        \
    {                                                                                    \
        ((object_type *)self)->done = 1;                                                 \
        (void)prefix##_clear(self);                                                      \
        Py_RETURN_NONE;                                                                  \
    }                                                                                    \
    static PyMethodDef prefix##_methods[] = {                                            \
        {"send", prefix##_send, METH_O,                                                  \
         "Step the check: yield what it awaits, or end with its result or error."},      \
        {"throw", (PyCFunction)(void (*)(void))prefix##_throw, METH_FASTCALL,            \
         "Raise the exception where the check is, as into a coroutine."},                \
        {"close", prefix##_close, METH_NOARGS, "Drop the check."},                       \
        {NULL, NULL, 0, NULL},                                                           \
    };                                                                                   \
    static PyGetSetDef prefix##_getset[] = {                                             \
        {"_asyncio_future_blocking", coroutine_not_a_future, NULL,                       \
         "None: not a future (asyncio.isfuture's test, as ensure_future,\n"               \
         "gather and wait_for ask it of what they are given).",                          \
         NULL},                                                                          \
        {NULL, NULL, NULL, NULL, NULL},                                                  \
    };                                                                                   \
    static PyType_Slot prefix##_slots[] = {                                              \
        __VA_ARGS__ ACCEL_GC_SLOTS(prefix, doc),                                         \
        {Py_tp_new, accel_refuse_new},                                                   \
        {Py_tp_iternext, prefix##_iternext},                                             \
        {Py_tp_methods, prefix##_methods},                                               \
        {Py_tp_getset, prefix##_getset},                                                 \
        {Py_am_await, prefix##_await},                                                   \
        ACCEL_COROUTINE_AM_SEND_SLOT(prefix){0, NULL},                                   \
    }

#endif /* MODERATO_COROUTINE_H */
