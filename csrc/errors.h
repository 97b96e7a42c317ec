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

#endif /* MODERATO_ERRORS_H */
