/*
 * _npyload.View: one field of a batch, exported without a copy.
 *
 *  - numpy:  __array_struct__ for the plain dtypes (bool, ints, floats,
 *            complex), __array_interface__ (version 3) for every dtype.
 *            numpy asks for the struct first: a capsule is read in well under
 *            a microsecond, where the interface's dict and typestr cost about
 *            3 us per field (measured, numpy 2, batch of 256 rows): that is
 *            most of the per-batch cost of small batches. numpy keeps the
 *            View as the array's base either way, so the View (and through
 *            it the Batch and its slot) lives as long as the array.
 *  - torch and any DLPack consumer: __dlpack__ / __dlpack_device__.
 *            The DLManagedTensor (or DLManagedTensorVersioned when the
 *            consumer asks for max_version >= (1, 0)) holds a reference to
 *            the View; the deleter drops it under the GIL.
 *
 * DLPack ABI: the upstream dlpack.h, vendored in third_party/dlpack (v1.3,
 * Apache-2.0; Debian's libdlpack-dev 0.6 lacks the versioned tensor); a
 * versioned capsule carries that header's version. The capsule is named
 * "dltensor" / "dltensor_versioned"; a consumer that takes ownership renames
 * it "used_dltensor" / "used_dltensor_versioned" and calls the deleter when
 * done. If the capsule dies unconsumed (name
 * unchanged), its destructor calls the deleter itself. The deleter may run
 * on any thread, with or without the GIL.
 */
#include "_npyload.h"

#include <dlpack.h>
#include <stdlib.h>
#include <string.h>

/* One allocation per export: the managed tensor, its shape and strides, the
 * reference that keeps the View alive, and an owned buffer for copy=True. */
typedef struct dl_export {
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } m;
    int64_t shape[NPYLOAD_MAX_DIMS];
    int64_t strides[NPYLOAD_MAX_DIMS];
    PyObject *owner; /* the View, or NULL for a copy */
    void *copy;      /* malloc'd data for copy=True, else NULL */
} dl_export;

static void dl_export_free(dl_export *e)
{
    if (e->owner) {
        /* The interpreter may already be gone when a consumer frees its
         * tensor at exit: then the reference is leaked on purpose. */
        if (npyloadpy_can_run_python()) {
            PyGILState_STATE g = PyGILState_Ensure();
            Py_DECREF(e->owner);
            PyGILState_Release(g);
        }
    }
    free(e->copy);
    free(e);
}

static void dl_deleter_legacy(DLManagedTensor *m)
{
    dl_export_free((dl_export *)m->manager_ctx);
}

static void dl_deleter_versioned(DLManagedTensorVersioned *m)
{
    dl_export_free((dl_export *)m->manager_ctx);
}

static void capsule_dtor_legacy(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor"))
        return; /* consumed: the consumer owns it and calls the deleter */
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter)
        m->deleter(m);
    else
        PyErr_WriteUnraisable(cap);
    PyErr_Restore(t, v, tb);
}

static void capsule_dtor_versioned(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor_versioned"))
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m && m->deleter)
        m->deleter(m);
    else
        PyErr_WriteUnraisable(cap);
    PyErr_Restore(t, v, tb);
}

/* ---- View ---- */

PyObject *npyloadpy_view_new(NpyloadPy_Batch *batch, size_t i)
{
    npyload_array a;
    memset(&a, 0, sizeof a);
    if (i == (size_t)-1) {
        a.data = (void *)npyload_batch_indices(batch->b);
        a.ndim = 1;
        a.shape[0] = (int64_t)npyload_batch_size(batch->b);
        const uint16_t probe = 1;
        strcpy(a.descr, *(const uint8_t *)&probe ? "<i8" : ">i8");
        a.itemsize = 8;
        a.nbytes = (size_t)a.shape[0] * 8;
        a.strides[0] = 8;
        a.device = -1;
    } else {
        const npyload_array *f = npyload_batch_field(batch->b, i);
        if (!f) {
            PyErr_Format(PyExc_IndexError, "field index %zu out of range", i);
            return NULL;
        }
        a = *f;
    }
    NpyloadPy_View *self = PyObject_GC_New(NpyloadPy_View, &NpyloadPy_ViewType);
    if (!self)
        return NULL;
    self->arr = a;
    self->is_indices = (i == (size_t)-1);
    Py_INCREF(batch);
    self->batch = batch;
    batch->live_views++;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static void view_dealloc(NpyloadPy_View *self)
{
    PyObject_GC_UnTrack(self);
    NpyloadPy_Batch *b = self->batch;
    self->batch = NULL;
    if (b) {
        b->live_views--;
        Py_DECREF(b); /* may release the slot */
    }
    PyObject_GC_Del(self);
}

/* No tp_clear on purpose: the batch reference is the lifeline of exported
 * memory and a View cannot be part of a cycle on its own (Batch holds no
 * references back). */
static int view_traverse(NpyloadPy_View *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch);
    return 0;
}

static PyObject *shape_tuple(const npyload_array *a)
{
    PyObject *t = PyTuple_New(a->ndim);
    for (int i = 0; t && i < a->ndim; i++) {
        PyObject *v = PyLong_FromLongLong((long long)a->shape[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* 1 when the strides are those of C order (what the array interface says
 * with strides None). */
static int view_c_contiguous(const npyload_array *a)
{
    int64_t st = (int64_t)a->itemsize;
    for (int d = a->ndim - 1; d >= 0; d--) {
        if (a->shape[d] != 1 && a->strides[d] != st)
            return 0;
        st *= a->shape[d];
    }
    return 1;
}

static PyObject *view_array_interface(NpyloadPy_View *self, void *c)
{
    if (self->arr.device >= 0) {
        PyErr_Format(PyExc_TypeError,
                     "npyload: this field is in CUDA device %d memory; numpy "
                     "cannot view it (use torch.from_dlpack, or device='cpu')",
                     self->arr.device);
        return NULL;
    }
    PyObject *shape = shape_tuple(&self->arr);
    if (!shape)
        return NULL;
    /* Strides in bytes, or None for C order (a channels-last transform
     * reports NHWC strides on the logical NCHW shape). */
    PyObject *strides = Py_None;
    Py_INCREF(strides);
    if (!view_c_contiguous(&self->arr)) {
        Py_DECREF(strides);
        strides = PyTuple_New(self->arr.ndim);
        for (int i = 0; strides && i < self->arr.ndim; i++) {
            PyObject *v = PyLong_FromLongLong((long long)self->arr.strides[i]);
            if (!v) {
                Py_CLEAR(strides);
                break;
            }
            PyTuple_SET_ITEM(strides, i, v);
        }
        if (!strides) {
            Py_DECREF(shape);
            return NULL;
        }
    }
    /* numpy has no bfloat16 type code: the array interface gives the raw
     * 16-bit patterns ("<u2"), and npyload/__init__.py views them as
     * ml_dtypes.bfloat16 when that package is importable. */
    const char *typestr = strcmp(self->arr.descr, "bfloat16") ? self->arr.descr : "<u2";
    /* Writable: the slot belongs to this batch until it is released, so
     * in-place transforms are safe (torch tensors are writable too). */
    return Py_BuildValue("{s:N,s:s,s:(NO),s:N,s:i}", "shape", shape, "typestr",
                         typestr, "data",
                         PyLong_FromVoidPtr(self->arr.data), Py_False,
                         "strides", strides, "version", 3);
}

/* numpy's PyArrayInterface (numpy/ndarraytypes.h), the __array_struct__
 * ABI, stable since numpy 1.0; written out here so that building the
 * extension needs no numpy headers. */
typedef struct npy_array_struct {
    int two;               /* 2: the version check */
    int nd;
    char typekind;         /* 'b', 'i', 'u', 'f', 'c' */
    int itemsize;
    int flags;
    Py_intptr_t *shape;
    Py_intptr_t *strides;  /* NULL: C-contiguous */
    void *data;
    PyObject *descr;       /* NULL: typekind and itemsize say it all */
} npy_array_struct;

enum {
    NPY_AS_C_CONTIGUOUS = 0x0001,
    NPY_AS_ALIGNED = 0x0100,
    NPY_AS_NOTSWAPPED = 0x0200,
    NPY_AS_WRITEABLE = 0x0400,
};

typedef struct array_struct_box {
    npy_array_struct s;
    Py_intptr_t shape[NPYLOAD_MAX_DIMS];
    Py_intptr_t strides[NPYLOAD_MAX_DIMS];
} array_struct_box;

static void array_struct_free(PyObject *cap)
{
    PyMem_Free(PyCapsule_GetPointer(cap, NULL));
}

/* The struct for the dtypes it can describe ([<>|=] then b i u f c, then
 * the item size); other dtypes (datetimes, strings, structured) raise
 * AttributeError, so numpy falls back to __array_interface__. */
static PyObject *view_array_struct(NpyloadPy_View *self, void *c)
{
    const npyload_array *a = &self->arr;
    if (a->device >= 0)
        return view_array_interface(self, c); /* raises the same TypeError */
    const char *d = a->descr;
    const uint16_t probe = 1;
    char native = *(const uint8_t *)&probe ? '<' : '>';
    if (strlen(d) < 3 || !strchr("<>|=", d[0]) || !strchr("biufc", d[1]) ||
        a->itemsize == 0 || a->itemsize > 32 || a->ndim > NPYLOAD_MAX_DIMS) {
        PyErr_SetString(PyExc_AttributeError, "__array_struct__");
        return NULL;
    }
    array_struct_box *b = PyMem_Malloc(sizeof *b);
    if (!b)
        return PyErr_NoMemory();
    for (int i = 0; i < a->ndim; i++) {
        b->shape[i] = (Py_intptr_t)a->shape[i];
        b->strides[i] = (Py_intptr_t)a->strides[i];
    }
    /* Channels-last batches keep their NHWC strides on the NCHW shape. */
    int contiguous = view_c_contiguous(a);
    int swapped = d[0] != '|' && d[0] != '=' && d[0] != native && a->itemsize > 1;
    b->s = (npy_array_struct){
        .two = 2,
        .nd = a->ndim,
        .typekind = d[1],
        .itemsize = (int)a->itemsize,
        /* Writable, as with __array_interface__: the slot belongs to this
         * batch until it is released. */
        .flags = (contiguous ? NPY_AS_C_CONTIGUOUS : 0) | NPY_AS_ALIGNED | NPY_AS_WRITEABLE |
                 (swapped ? 0 : NPY_AS_NOTSWAPPED),
        .shape = b->shape,
        .strides = contiguous ? NULL : b->strides,
        .data = a->data,
        .descr = NULL,
    };
    PyObject *cap = PyCapsule_New(b, NULL, array_struct_free);
    if (!cap)
        PyMem_Free(b);
    return cap;
}

static int dl_dtype(const npyload_array *a, DLDataType *out)
{
    const uint16_t probe = 1;
    char native = *(const uint8_t *)&probe ? '<' : '>';
    char bo = a->descr[0], kind = a->descr[1];
    if (!strcmp(a->descr, "bfloat16")) {
        /* A transform's output, always in the host byte order. */
        out->lanes = 1;
        out->bits = 16;
        out->code = kDLBfloat;
        return 0;
    }
    if (bo != '|' && bo != native && bo != '=') {
        PyErr_Format(PyExc_BufferError,
                     "npyload: dtype '%s' is not in the host byte order; DLPack "
                     "cannot describe it (view it with numpy instead)", a->descr);
        return -1;
    }
    out->lanes = 1;
    out->bits = (uint8_t)(a->itemsize * 8);
    switch (kind) {
    case 'f': out->code = kDLFloat; break;
    case 'i': out->code = kDLInt; break;
    case 'u': out->code = kDLUInt; break;
    case 'c': out->code = kDLComplex; break;
    case 'b': out->code = kDLBool; break;
    default:
        PyErr_Format(PyExc_BufferError,
                     "npyload: dtype '%s' has no DLPack equivalent", a->descr);
        return -1;
    }
    if (a->itemsize == 0 || a->itemsize > 32) {
        PyErr_Format(PyExc_BufferError, "npyload: bad itemsize for '%s'", a->descr);
        return -1;
    }
    return 0;
}

static DLDevice view_dl_device(const NpyloadPy_View *self)
{
    DLDevice d;
    if (self->arr.device >= 0) {
        d.device_type = kDLCUDA;
        d.device_id = self->arr.device;
    } else {
        d.device_type = kDLCPU;
        d.device_id = 0;
    }
    return d;
}

static PyObject *view_dlpack_device(NpyloadPy_View *self, PyObject *unused)
{
    DLDevice d = view_dl_device(self);
    return Py_BuildValue("(ii)", (int)d.device_type, (int)d.device_id);
}

PyDoc_STRVAR(dlpack_doc,
"__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\n"
"DLPack export. The tensor shares the slot's memory and keeps this view,\n"
"hence the batch and its slot, alive until the consumer frees it.\n"
"CUDA: `stream` is the consumer's stream (None or 1: legacy default,\n"
"2: per-thread default, -1: no synchronisation, else a cudaStream_t as int);\n"
"the stream is made to wait for the batch's host-to-device copy, and the\n"
"slot is later released in order with it (and with every other stream the\n"
"batch was handed to).\n"
"copy=True copies host data into memory owned by the capsule; device data\n"
"is never copied here (BufferError).");

static PyObject *view_dlpack(NpyloadPy_View *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
             *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist,
                                     &stream, &max_version, &dl_device, &copy))
        return NULL;
    NpyloadPy_Batch *batch = self->batch;
    if (!batch || !batch->b) {
        PyErr_SetString(PyExc_BufferError, "npyload batch was released");
        return NULL;
    }
    const npyload_array *a = &self->arr;
    DLDevice dev = view_dl_device(self);

    int versioned = 0;
    if (max_version != Py_None) {
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
            PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
            return NULL;
        }
        long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
        if (major == -1 && PyErr_Occurred())
            return NULL;
        versioned = major >= DLPACK_MAJOR_VERSION;
    }
    if (dl_device != Py_None) {
        long t, id;
        if (!PyArg_ParseTuple(dl_device, "ll;dl_device must be a (device_type, device_id) tuple",
                              &t, &id))
            return NULL;
        if (t != dev.device_type || id != dev.device_id) {
            PyErr_Format(PyExc_BufferError,
                         "npyload: data is on DLPack device (%d, %d); export to "
                         "(%ld, %ld) is not supported",
                         (int)dev.device_type, (int)dev.device_id, t, id);
            return NULL;
        }
    }
    int want_copy = 0;
    if (copy != Py_None) {
        want_copy = PyObject_IsTrue(copy);
        if (want_copy < 0)
            return NULL;
    }
    if (want_copy && a->device >= 0) {
        PyErr_SetString(PyExc_BufferError,
                        "npyload: copy=True is not supported for device data; "
                        "clone the tensor instead");
        return NULL;
    }

    DLDataType dtype;
    if (dl_dtype(a, &dtype) < 0)
        return NULL;

    /* CUDA: order the consumer's stream after the batch's copy. */
    if (a->device >= 0) {
        void *s = NULL;
        int sync = 1;
        if (stream != Py_None) {
            long long sv = PyLong_AsLongLong(stream);
            if (sv == -1 && PyErr_Occurred())
                return NULL;
            if (sv == 0) {
                PyErr_SetString(PyExc_ValueError,
                                "stream=0 is ambiguous for CUDA (DLPack): pass "
                                "1 for the legacy default stream or 2 for the "
                                "per-thread default stream");
                return NULL;
            }
            if (sv == -1)
                sync = 0;
            else if (sv == 1)
                s = NULL; /* legacy default stream */
            else
                s = (void *)(uintptr_t)sv; /* 2 is cudaStreamPerThread */
        }
        if (sync) {
            int rc = npyload_batch_wait_stream(batch->b, s);
            if (rc < 0)
                return npyloadpy_raise(rc, "npyload: cudaStreamWaitEvent on the "
                                           "consumer's stream failed");
            if (npyloadpy_batch_note_stream(batch, s) < 0)
                return NULL;
        }
    }

    dl_export *e = calloc(1, sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    /* DLPack strides count elements; the array's count bytes (channels-last
     * batches are not C-ordered). */
    for (int d = 0; d < a->ndim; d++) {
        e->shape[d] = a->shape[d];
        e->strides[d] = a->itemsize ? a->strides[d] / (int64_t)a->itemsize : 0;
    }
    void *data = a->data;
    if (want_copy) {
        e->copy = malloc(a->nbytes ? a->nbytes : 1);
        if (!e->copy) {
            free(e);
            return PyErr_NoMemory();
        }
        memcpy(e->copy, a->data, a->nbytes);
        data = e->copy;
    } else {
        Py_INCREF(self);
        e->owner = (PyObject *)self;
    }
    DLTensor *t = versioned ? &e->m.versioned.dl_tensor : &e->m.legacy.dl_tensor;
    t->data = data;
    t->device = dev;
    t->ndim = a->ndim;
    t->dtype = dtype;
    t->shape = e->shape;
    t->strides = e->strides;
    t->byte_offset = 0;
    PyObject *cap;
    if (versioned) {
        e->m.versioned.version.major = DLPACK_MAJOR_VERSION;
        e->m.versioned.version.minor = DLPACK_MINOR_VERSION;
        e->m.versioned.manager_ctx = e;
        e->m.versioned.deleter = dl_deleter_versioned;
        e->m.versioned.flags = want_copy ? DLPACK_FLAG_BITMASK_IS_COPIED : 0;
        cap = PyCapsule_New(&e->m.versioned, "dltensor_versioned",
                            capsule_dtor_versioned);
    } else {
        e->m.legacy.manager_ctx = e;
        e->m.legacy.deleter = dl_deleter_legacy;
        cap = PyCapsule_New(&e->m.legacy, "dltensor", capsule_dtor_legacy);
    }
    if (!cap) {
        /* We hold the GIL: drop the reference directly. */
        Py_XDECREF(e->owner);
        free(e->copy);
        free(e);
        return NULL;
    }
    return cap;
}

static PyObject *view_get_shape(NpyloadPy_View *self, void *c)
{
    return shape_tuple(&self->arr);
}

static PyObject *view_get_descr(NpyloadPy_View *self, void *c)
{
    return PyUnicode_FromString(self->arr.descr);
}

static PyObject *view_get_data_ptr(NpyloadPy_View *self, void *c)
{
    return PyLong_FromVoidPtr(self->arr.data);
}

static PyObject *view_get_nbytes(NpyloadPy_View *self, void *c)
{
    return PyLong_FromSize_t(self->arr.nbytes);
}

static PyObject *view_get_device(NpyloadPy_View *self, void *c)
{
    return PyLong_FromLong(self->arr.device);
}

static PyObject *view_get_batch(NpyloadPy_View *self, void *c)
{
    PyObject *b = self->batch ? (PyObject *)self->batch : Py_None;
    Py_INCREF(b);
    return b;
}

static PyMethodDef view_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))view_dlpack,
     METH_VARARGS | METH_KEYWORDS, dlpack_doc},
    {"__dlpack_device__", (PyCFunction)view_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (device_type, device_id): (1, 0) for host "
     "memory, (2, k) for CUDA device k."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef view_getset[] = {
    {"__array_struct__", (getter)view_array_struct, NULL,
     "numpy array struct (host data, plain dtypes); the array keeps this "
     "view, hence the batch's slot, alive", NULL},
    {"__array_interface__", (getter)view_array_interface, NULL,
     "numpy array interface (host data only); the array keeps this view, "
     "hence the batch's slot, alive", NULL},
    {"shape", (getter)view_get_shape, NULL, "shape (rows first)", NULL},
    {"descr", (getter)view_get_descr, NULL, "numpy dtype string", NULL},
    {"data_ptr", (getter)view_get_data_ptr, NULL, "address of the data", NULL},
    {"nbytes", (getter)view_get_nbytes, NULL, "bytes", NULL},
    {"device", (getter)view_get_device, NULL, "-1 host, k CUDA device", NULL},
    {"batch", (getter)view_get_batch, NULL, "the owning batch", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject NpyloadPy_ViewType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npyload._npyload.View",
    .tp_basicsize = sizeof(NpyloadPy_View),
    .tp_dealloc = (destructor)view_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)view_traverse,
    .tp_doc = "Zero-copy view of one field of a batch (array interface and "
              "DLPack). Keeps the batch's slot alive while it lives.",
    .tp_methods = view_methods,
    .tp_getset = view_getset,
};
