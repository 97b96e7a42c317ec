/* Shims for the C API functions moderato._accel uses that are newer than
 * Python 3.9, the oldest supported version. */
#ifndef MODERATO_COMPAT_H
#define MODERATO_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}

static inline int
PyModule_AddObjectRef(PyObject *module, const char *name, PyObject *value)
{
    int result = PyModule_AddObject(module, name, value);
    if (result == 0) {
        Py_INCREF(value); /* AddObject stole the reference on success */
    }
    return result;
}
#endif

/* Take the raised exception out of the error indicator (a new reference,
 * normalized), like PyErr_GetRaisedException() of 3.12. */
static inline PyObject *
accel_take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
#endif
}

#endif /* MODERATO_COMPAT_H */
