/* What every type of moderato._accel spells the same way, written once: its
 * spec, the slots and functions a garbage-collected object's references
 * need, and adding the type to the module object. A type is a heap type of
 * the module object that makes it (multi-phase init), never subclassed.
 */
#ifndef MODERATO_HEAP_TYPE_H
#define MODERATO_HEAP_TYPE_H

#include "compat.h"

/* Immutable where the version has the flag (3.10 on). */
#if PY_VERSION_HEX >= 0x030A0000
#define ACCEL_TPFLAGS_IMMUTABLE Py_TPFLAGS_IMMUTABLETYPE
#else
#define ACCEL_TPFLAGS_IMMUTABLE 0
#endif

/* The tp_new of a type whose instances only moderato._accel's C makes: calling
 * the type is a TypeError on every version (Py_TPFLAGS_DISALLOW_INSTANTIATION is
 * 3.10's; before it a type without tp_new took object's, and an instance with
 * its fields unset). Its slot: {Py_tp_new, accel_refuse_new}. */
static inline PyObject *
accel_refuse_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    PyErr_Format(PyExc_TypeError, "cannot create '%s' instances: moderato makes them",
                 type->tp_name);
    return NULL;
}

/* static PyType_Spec spec: a type named qualname whose instances are
 * size_ bytes (Py_TPFLAGS_DEFAULT and flags_), with slots_. */
#define ACCEL_TYPE_SPEC(spec, qualname, size_, flags_, slots_)                         \
    static PyType_Spec spec = {                                                        \
        .name = (qualname),                                                            \
        .basicsize = (int)(size_),                                                     \
        .itemsize = 0,                                                                 \
        .flags = Py_TPFLAGS_DEFAULT | (flags_),                                        \
        .slots = (slots_),                                                             \
    }

/* The slots of a garbage-collected type with a docstring: <prefix>_dealloc,
 * _traverse and _clear (ACCEL_GC_FUNCTIONS, or its own traverse and clear
 * with ACCEL_GC_DEALLOC). */
#define ACCEL_GC_SLOTS(prefix, doc)                                                    \
    {Py_tp_doc, (void *)(doc)}, {Py_tp_dealloc, prefix##_dealloc},                      \
        {Py_tp_traverse, prefix##_traverse}, {Py_tp_clear, prefix##_clear}

/* static void <prefix>_dealloc: untrack, <prefix>_clear, free, drop the
 * instance's reference to its heap type. The types are not subclassed, so
 * their tp_free is PyObject_GC_Del: called directly, every check frees a
 * record or two. */
#define ACCEL_GC_DEALLOC(prefix)                                                       \
    static void prefix##_dealloc(PyObject *self)                                       \
    {                                                                                  \
        PyTypeObject *type = Py_TYPE(self);                                            \
        PyObject_GC_UnTrack(self);                                                     \
        (void)prefix##_clear(self);                                                    \
        PyObject_GC_Del(self);                                                         \
        Py_DECREF(type);                                                               \
    }

/* static <prefix>_traverse, _clear and _dealloc of object_type, whose
 * object references are MEMBERS(X): X(member) for each (NULL allowed). */
#define ACCEL_VISIT_MEMBER(member) Py_VISIT(object->member);
#define ACCEL_CLEAR_MEMBER(member) Py_CLEAR(object->member);
#define ACCEL_GC_FUNCTIONS(prefix, object_type, MEMBERS)                               \
    ACCEL_GC_FUNCTIONS_WITH_ARRAYS(prefix, object_type, MEMBERS, ACCEL_NO_ARRAYS)

/* ACCEL_GC_FUNCTIONS of a type that also holds arrays of references:
 * ARRAYS(X) is X(member, count) for each array (an object_type member
 * PyObject *member[count], entries NULL allowed). Traverse and clear are
 * both made from the one pair of lists, so neither can leave a member out. */
#define ACCEL_NO_ARRAYS(X)
#define ACCEL_VISIT_ARRAY(member, count)                                               \
    for (size_t at_ = 0; at_ < (size_t)(count); at_++) {                               \
        Py_VISIT(object->member[at_]);                                                 \
    }
#define ACCEL_CLEAR_ARRAY(member, count)                                               \
    for (size_t at_ = 0; at_ < (size_t)(count); at_++) {                               \
        Py_CLEAR(object->member[at_]);                                                 \
    }
#define ACCEL_GC_FUNCTIONS_WITH_ARRAYS(prefix, object_type, MEMBERS, ARRAYS)           \
    static int prefix##_traverse(PyObject *self, visitproc visit, void *arg)           \
    {                                                                                  \
        object_type *object = (object_type *)self;                                     \
        MEMBERS(ACCEL_VISIT_MEMBER)                                                    \
        ARRAYS(ACCEL_VISIT_ARRAY)                                                      \
        Py_VISIT(Py_TYPE(self));                                                       \
        return 0;                                                                      \
    }                                                                                  \
    static int prefix##_clear(PyObject *self)                                          \
    {                                                                                  \
        object_type *object = (object_type *)self;                                     \
        MEMBERS(ACCEL_CLEAR_MEMBER)                                                    \
        ARRAYS(ACCEL_CLEAR_ARRAY)                                                      \
        return 0;                                                                      \
    }                                                                                  \
    ACCEL_GC_DEALLOC(prefix)

/* Make the type spec describes for this module object and add it as name;
 * *out keeps the reference (NULL: the module's is the only one). 0, or -1
 * with an exception set. */
static inline int
accel_add_type(PyObject *module, PyType_Spec *spec, const char *name, PyTypeObject **out)
{
    PyObject *type = PyType_FromModuleAndSpec(module, spec, NULL);
    if (type == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, name, type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    if (out == NULL) {
        Py_DECREF(type);
    }
    else {
        *out = (PyTypeObject *)type;
    }
    return 0;
}

/* The member that tells CPython where an instance's vectorcall function is
 * (a type calling with Py_TPFLAGS_HAVE_VECTORCALL): object_type has a
 * vectorcallfunc member named vectorcall. */
#define ACCEL_VECTORCALL_OFFSET(object_type)                                           \
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(object_type, vectorcall), READONLY, NULL}

/* A garbage-collected type from its own pieces: static PyType_Slot
 * <prefix>_slots (ACCEL_GC_SLOTS with doc, then the type's own slots, the
 * ... arguments) and static PyType_Spec <prefix>_spec, a type named qualname
 * whose instances are object_type (Py_TPFLAGS_HAVE_GC and flags_). */
#define ACCEL_GC_TYPE(prefix, qualname, object_type, doc, flags_, ...)                 \
    static PyType_Slot prefix##_slots[] = {                                            \
        ACCEL_GC_SLOTS(prefix, doc),                                                   \
        __VA_ARGS__,                                                                   \
        {0, NULL},                                                                     \
    };                                                                                 \
    ACCEL_TYPE_SPEC(prefix##_spec, qualname, sizeof(object_type),                      \
                    Py_TPFLAGS_HAVE_GC | (flags_), prefix##_slots)

/* An immutable ACCEL_GC_TYPE whose instances are called by vectorcall and
 * show no member but its offset (static PyMemberDef <prefix>_members):
 * object_type has a vectorcallfunc member named vectorcall. */
#define ACCEL_VECTORCALL_TYPE(prefix, qualname, object_type, doc, flags_, ...)         \
    static PyMemberDef prefix##_members[] = {                                          \
        ACCEL_VECTORCALL_OFFSET(object_type),                                          \
        {NULL, 0, 0, 0, NULL},                                                         \
    };                                                                                 \
    ACCEL_GC_TYPE(prefix, qualname, object_type, doc,                                  \
                  Py_TPFLAGS_HAVE_VECTORCALL | ACCEL_TPFLAGS_IMMUTABLE | (flags_),     \
                  {Py_tp_call, PyVectorcall_Call}, {Py_tp_members, prefix##_members},   \
                  __VA_ARGS__)

/* The names files read, listed once as LIST(X, prefix), each X(prefix, name,
 * "text"): ACCEL_NAME_ENUMS, an enum of prefix##name for each, then count (in the
 * header of the files that read them); ACCEL_NAME_TEXTS, static texts[], their
 * texts in that order (in the one file that interns them into the module state). */
#define ACCEL_NAME_ENUM(prefix, name, text) prefix##name,
#define ACCEL_NAME_TEXT(prefix, name, text) text,
#define ACCEL_NAME_ENUMS(LIST, prefix, count) enum { LIST(ACCEL_NAME_ENUM, prefix) count }
#define ACCEL_NAME_TEXTS(LIST, prefix, texts)                                          \
    static const char *const texts[] = {LIST(ACCEL_NAME_TEXT, prefix)}

#endif /* MODERATO_HEAP_TYPE_H */
