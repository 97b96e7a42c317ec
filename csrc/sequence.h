/* Building a list or tuple item by item: the one loop, with its cleanup,
 * shared by the functions that return several values (keys, policies,
 * replies, states). */
#ifndef MODERATO_SEQUENCE_H
#define MODERATO_SEQUENCE_H

#include "compat.h"

/* Item i of the sequence, a new reference, from the caller's context; or
 * NULL with an exception set. */
typedef PyObject *(*accel_item_maker)(void *context, Py_ssize_t i);

/* A new tuple (as_tuple) or list of `size` items made by `make`, or NULL.
 * Inline, so that a constant `make` is called directly on the hot paths. */
static inline PyObject *
accel_build_sequence(int as_tuple, Py_ssize_t size, accel_item_maker make, void *context)
{
    PyObject *sequence = as_tuple ? PyTuple_New(size) : PyList_New(size);
    if (sequence == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = make(context, i);
        if (item == NULL) {
            Py_DECREF(sequence);
            return NULL;
        }
        if (as_tuple) {
            PyTuple_SET_ITEM(sequence, i, item);
        }
        else {
            PyList_SET_ITEM(sequence, i, item);
        }
    }
    return sequence;
}

#endif /* MODERATO_SEQUENCE_H */
