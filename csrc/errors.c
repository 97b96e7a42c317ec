/* Error-message helpers shared by every function of moderato._accel. */
#include <stdarg.h>

#include "errors.h"

/* An exact str or bytes holding at most ACCEL_QUOTE_CHARS items of text,
 * whose repr() cannot run user code, unlike that of a subclass. */
static PyObject *
quote_head(PyObject *text, int *truncated)
{
    if (PyUnicode_Check(text)) {
        Py_ssize_t length = PyUnicode_GET_LENGTH(text);
        *truncated = length > ACCEL_QUOTE_CHARS;
        return PyUnicode_Substring(text, 0, *truncated ? ACCEL_QUOTE_CHARS : length);
    }
    Py_ssize_t size = PyBytes_GET_SIZE(text);
    *truncated = size > ACCEL_QUOTE_CHARS;
    return PyBytes_FromStringAndSize(PyBytes_AS_STRING(text),
                                     *truncated ? ACCEL_QUOTE_CHARS : size);
}

static PyObject *
quote_other(PyObject *obj, int *truncated)
{
    PyObject *repr = PyObject_Repr(obj);
    if (repr == NULL) {
        /* A huge int exceeds int_max_str_digits (3.11+); say what it is. */
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) {
            return NULL;
        }
        PyErr_Clear();
        *truncated = 0;
        return PyUnicode_FromFormat("<%.100s too large to print>", Py_TYPE(obj)->tp_name);
    }
    *truncated = PyUnicode_GET_LENGTH(repr) > ACCEL_QUOTE_CHARS;
    if (!*truncated) {
        return repr;
    }
    PyObject *head = PyUnicode_Substring(repr, 0, ACCEL_QUOTE_CHARS);
    Py_DECREF(repr);
    return head;
}

PyObject *
accel_quote(PyObject *obj)
{
    int truncated;
    PyObject *quoted;

    /* repr() of an arbitrary object may run code that drops the caller's
     * borrowed reference to it (say, by clearing the list it came from). */
    Py_INCREF(obj);
    if (PyUnicode_Check(obj) || PyBytes_Check(obj)) {
        PyObject *head = quote_head(obj, &truncated);
        quoted = head == NULL ? NULL : PyObject_Repr(head);
        Py_XDECREF(head);
    }
    else {
        quoted = quote_other(obj, &truncated);
    }
    Py_DECREF(obj);
    if (quoted == NULL || !truncated) {
        return quoted;
    }
    PyObject *marked = PyUnicode_FromFormat("%U...", quoted);
    Py_DECREF(quoted);
    return marked;
}

PyObject *
accel_value_error_from_current(PyObject *value, const char *format, ...)
{
    va_list vargs;
    PyObject *quoted = NULL, *context = NULL, *message = NULL, *error = NULL;

    /* Out of memory stays out of memory. */
    if (!PyErr_ExceptionMatches(PyExc_ValueError) &&
        !PyErr_ExceptionMatches(PyExc_BufferError)) {
        return NULL;
    }
    PyObject *cause = accel_take_exception();

    if (value != NULL && (quoted = accel_quote(value)) == NULL) {
        goto done;
    }
    va_start(vargs, format);
    context = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (context == NULL) {
        goto done;
    }
    message = quoted == NULL ? PyUnicode_FromFormat("%U: %S", context, cause)
                             : PyUnicode_FromFormat("%U, got %U: %S", context, quoted, cause);
    if (message == NULL) {
        goto done;
    }
    error = PyObject_CallOneArg(PyExc_ValueError, message);
    if (error != NULL) {
        PyException_SetCause(error, Py_NewRef(cause)); /* steals the new reference */
        PyErr_SetObject(PyExc_ValueError, error);
    }
done:
    Py_XDECREF(error);
    Py_XDECREF(message);
    Py_XDECREF(context);
    Py_XDECREF(quoted);
    Py_DECREF(cause);
    return NULL;
}

int
accel_arity_error(const char *function, const char *parameters, Py_ssize_t least,
                  Py_ssize_t most, Py_ssize_t given)
{
    const char *open = parameters == NULL ? "" : " (";
    const char *names = parameters == NULL ? "" : parameters;
    const char *close = parameters == NULL ? "" : ")";
    if (least == most) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd argument%s%s%s%s (%zd given)",
                     function, least, least == 1 ? "" : "s", open, names, close, given);
    }
    else {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd or %zd arguments%s%s%s (%zd given)",
                     function, least, most, open, names, close, given);
    }
    return -1;
}
