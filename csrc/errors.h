/* Error-message helpers shared by every function of moderato._accel. */
#ifndef MODERATO_ERRORS_H
#define MODERATO_ERRORS_H

#include "compat.h"

/* Quoted input is cut to this many characters, then marked with "...". */
#define ACCEL_QUOTE_CHARS 80

/* repr() of obj for an error message, cut to ACCEL_QUOTE_CHARS characters
 * (of the input for str and bytes, of the repr otherwise) so that a 1 MB
 * argument still gives a short message. New reference, or NULL on error. */
PyObject *accel_quote(PyObject *obj);

/* Replace the ValueError (a UnicodeEncodeError, say) or BufferError being
 * raised with a plain ValueError chained from it (as __cause__) whose message
 * is format (PyUnicode_FromFormat syntax), then ", got <quoted value>" unless
 * value is NULL, then ": <that exception>". Any other exception, such as a
 * MemoryError, is left as it is. Always returns NULL. */
PyObject *accel_value_error_from_current(PyObject *value, const char *format, ...);

/* Raise the TypeError of a call given `given` positional arguments that
 * takes `least` of them, or up to `most` (least + 1 at the most), named
 * `parameters` (NULL: not named): "f() takes exactly 3 arguments (a, b, c)
 * (2 given)", "f() takes 1 or 2 arguments (a, b) (3 given)". Returns -1. */
int accel_arity_error(const char *function, const char *parameters, Py_ssize_t least,
                      Py_ssize_t most, Py_ssize_t given);

/* 0 when least <= given <= most; else accel_arity_error's TypeError and -1.
 * Inline: every entry point calls it, the count check costs a comparison. */
static inline int
accel_check_arity(const char *function, const char *parameters, Py_ssize_t least,
                  Py_ssize_t most, Py_ssize_t given)
{
    if (given >= least && given <= most) {
        return 0;
    }
    return accel_arity_error(function, parameters, least, most, given);
}

#endif /* MODERATO_ERRORS_H */
