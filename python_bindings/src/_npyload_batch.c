/*
 * _npyload.Batch: owns one npyload_batch (one slot of the loader's ring).
 *
 * Lifetime: the slot is given back in the Batch's dealloc, i.e. when the
 * last reference goes — the Python layer's Batch mapping, and every View
 * (hence every ndarray / tensor made from a view) holds one. release() gives
 * it back early, but only while no View is alive, so exported memory is
 * never reused under a live array.
 *
 * CUDA batches: the batch records every stream it was handed to (each
 * __dlpack__ with a stream — torch passes its current one — and each
 * wait_stream), and the slot is released with npyload_batch_release_stream()
 * so that the next copy into it is ordered after the work queued on all of
 * them, without blocking the host. One stream: released on it. Several: the
 * joiner (npyload/__init__.py, with torch) makes a side stream wait for an
 * event on each and returns it, and the slot is released on that side
 * stream. Recording only the last stream would leave the work of the
 * others unordered against the slot's reuse.
 */
#include "_npyload.h"

#include <string.h>

PyObject *npyloadpy_batch_new(npyload_batch *b, PyObject *field_names,
                              PyObject *joiner)
{
    NpyloadPy_Batch *self = PyObject_New(NpyloadPy_Batch, &NpyloadPy_BatchType);
    if (!self) {
        npyload_batch_release(b);
        return NULL;
    }
    self->b = b;
    self->field_names = field_names;
    Py_XINCREF(field_names);
    self->live_views = 0;
    self->streams = NULL;
    self->nstreams = 0;
    self->streams_cap = 0;
    self->joiner = joiner;
    Py_XINCREF(joiner);
    self->device = -1;
    const npyload_array *a0 = npyload_batch_field(b, 0);
    if (a0)
        self->device = a0->device;
    return (PyObject *)self;
}

/* The one stream to release the slot on, after the work queued on every
 * recorded stream: the stream itself when there is one, else the joiner's
 * side stream. Runs in dealloc, possibly inside another exception: that
 * exception is kept. If the joiner is missing or fails (reported as
 * unraisable), the last stream is used: the best the binding can do without
 * CUDA calls of its own. */
static void *release_stream_of(NpyloadPy_Batch *self)
{
    if (self->nstreams == 0)
        return NULL; /* legacy default stream, as the library's own default */
    void *last = self->streams[self->nstreams - 1];
    if (self->nstreams == 1 || !self->joiner || !npyloadpy_can_run_python())
        return last;
    void *out = last;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *lst = PyList_New(self->nstreams);
    for (Py_ssize_t i = 0; lst && i < self->nstreams; i++) {
        PyObject *o = PyLong_FromVoidPtr(self->streams[i]);
        if (!o) {
            Py_CLEAR(lst);
            break;
        }
        PyList_SET_ITEM(lst, i, o);
    }
    PyObject *r = lst ? PyObject_CallFunction(self->joiner, "iO", self->device, lst)
                      : NULL;
    Py_XDECREF(lst);
    if (r && r != Py_None) {
        void *p = PyLong_AsVoidPtr(r);
        if (!(p == NULL && PyErr_Occurred()))
            out = p;
    } else if (r == Py_None) {
        out = NULL;
    }
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(self->joiner);
    Py_XDECREF(r);
    PyErr_Restore(t, v, tb);
    return out;
}

static void batch_do_release(NpyloadPy_Batch *self)
{
    npyload_batch *b = self->b;
    if (!b)
        return;
    self->b = NULL; /* first: the joiner runs Python code */
    void *s = release_stream_of(self);
    if (self->device >= 0)
        npyload_batch_release_stream(b, s);
    else
        npyload_batch_release(b);
}

static void batch_dealloc(NpyloadPy_Batch *self)
{
    batch_do_release(self);
    PyMem_Free(self->streams);
    Py_CLEAR(self->joiner);
    Py_CLEAR(self->field_names);
    PyObject_Free(self);
}

static int batch_check(NpyloadPy_Batch *self)
{
    if (!self->b) {
        PyErr_SetString(PyExc_ValueError, "npyload batch was released");
        return -1;
    }
    return 0;
}

static PyObject *batch_release(NpyloadPy_Batch *self, PyObject *unused)
{
    if (self->live_views > 0) {
        PyErr_Format(PyExc_RuntimeError,
                     "npyload batch still has %zd live view(s) (arrays or "
                     "tensors made from it); its slot is released when the "
                     "last one is freed", self->live_views);
        return NULL;
    }
    batch_do_release(self);
    Py_RETURN_NONE;
}

static PyObject *batch_field(NpyloadPy_Batch *self, PyObject *arg)
{
    if (batch_check(self) < 0)
        return NULL;
    Py_ssize_t i;
    if (PyUnicode_Check(arg)) {
        Py_ssize_t n = self->field_names ? PyTuple_GET_SIZE(self->field_names) : 0;
        for (i = 0; i < n; i++) {
            int eq = PyUnicode_Compare(PyTuple_GET_ITEM(self->field_names, i), arg);
            if (eq == -1 && PyErr_Occurred())
                return NULL;
            if (eq == 0)
                break;
        }
        if (i == n) {
            PyErr_SetObject(PyExc_KeyError, arg);
            return NULL;
        }
    } else {
        i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (i < 0 || (size_t)i >= npyload_batch_num_fields(self->b)) {
            PyErr_Format(PyExc_IndexError, "field index %zd out of range", i);
            return NULL;
        }
    }
    return npyloadpy_view_new(self, (size_t)i);
}

static PyObject *batch_indices_view(NpyloadPy_Batch *self, PyObject *unused)
{
    if (batch_check(self) < 0)
        return NULL;
    return npyloadpy_view_new(self, (size_t)-1);
}

static PyObject *batch_indices_bytes(NpyloadPy_Batch *self, PyObject *unused)
{
    if (batch_check(self) < 0)
        return NULL;
    size_t n = npyload_batch_size(self->b);
    const int64_t *idx = npyload_batch_indices(self->b);
    return PyByteArray_FromStringAndSize((const char *)idx,
                                         (Py_ssize_t)(n * sizeof(int64_t)));
}

/* npyload_batch_sources as int64 bytes (a bytearray), or None without a
 * mixture. */
static PyObject *batch_sources_bytes(NpyloadPy_Batch *self, PyObject *unused)
{
    if (batch_check(self) < 0)
        return NULL;
    size_t n = npyload_batch_size(self->b);
    const uint32_t *src = npyload_batch_sources(self->b);
    if (!src)
        Py_RETURN_NONE;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(int64_t)));
    if (!out)
        return NULL;
    int64_t *o = (int64_t *)(void *)PyByteArray_AS_STRING(out);
    for (size_t i = 0; i < n; i++)
        o[i] = src[i];
    return out;
}

/* npyload_batch_augment of field `index`: n int64 tops, n int64 lefts, then
 * n hflip and n vflip bytes, in one bytearray (the package splits it). */
static PyObject *batch_augment_bytes(NpyloadPy_Batch *self, PyObject *arg)
{
    if (batch_check(self) < 0)
        return NULL;
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    size_t n = npyload_batch_size(self->b);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 18));
    if (!out)
        return NULL;
    char *p = PyByteArray_AS_STRING(out);
    int64_t *top = (int64_t *)(void *)p, *left = top + n; /* bytearray: 8-aligned */
    uint8_t *hf = (uint8_t *)(left + n), *vf = hf + n;
    if (index < 0 || npyload_batch_augment(self->b, (size_t)index, hf, vf, top, left)) {
        Py_DECREF(out);
        PyErr_Format(PyExc_IndexError, "augment: field index %zd out of range", index);
        return NULL;
    }
    return out;
}

static PyObject *batch_indices_list(NpyloadPy_Batch *self, PyObject *unused)
{
    if (batch_check(self) < 0)
        return NULL;
    size_t n = npyload_batch_size(self->b);
    const int64_t *idx = npyload_batch_indices(self->b);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLongLong((long long)idx[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    return l;
}

static int parse_stream(PyObject *o, void **out)
{
    if (o == Py_None) {
        *out = NULL;
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (void *)(uintptr_t)v;
    return 0;
}

static PyObject *batch_wait_stream(NpyloadPy_Batch *self, PyObject *arg)
{
    void *s;
    if (batch_check(self) < 0 || parse_stream(arg, &s) < 0)
        return NULL;
    int rc = npyload_batch_wait_stream(self->b, s);
    if (rc < 0)
        return npyloadpy_raise(rc, NULL);
    if (self->device >= 0 && npyloadpy_batch_note_stream(self, s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Test hooks (no CUDA needed): record a stream as __dlpack__ does for a
 * device batch, and read the record. */
static PyObject *batch_note_stream(NpyloadPy_Batch *self, PyObject *arg)
{
    void *s;
    if (batch_check(self) < 0 || parse_stream(arg, &s) < 0)
        return NULL;
    if (npyloadpy_batch_note_stream(self, s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *batch_get_streams(NpyloadPy_Batch *self, void *c)
{
    PyObject *t = PyTuple_New(self->nstreams);
    for (Py_ssize_t i = 0; t && i < self->nstreams; i++) {
        PyObject *v = PyLong_FromVoidPtr(self->streams[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *batch_sync(NpyloadPy_Batch *self, PyObject *unused)
{
    if (batch_check(self) < 0)
        return NULL;
    int rc;
    npyload_batch *b = self->b;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_batch_sync(b);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return npyloadpy_raise(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *batch_get_size(NpyloadPy_Batch *self, void *c)
{
    if (batch_check(self) < 0)
        return NULL;
    return PyLong_FromSize_t(npyload_batch_size(self->b));
}

static PyObject *batch_get_epoch(NpyloadPy_Batch *self, void *c)
{
    if (batch_check(self) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(npyload_batch_epoch(self->b));
}

static PyObject *batch_get_seq(NpyloadPy_Batch *self, void *c)
{
    if (batch_check(self) < 0)
        return NULL;
    return PyLong_FromLongLong((long long)npyload_batch_seq(self->b));
}

static PyObject *batch_get_device(NpyloadPy_Batch *self, void *c)
{
    return PyLong_FromLong(self->device);
}

static PyObject *batch_get_field_names(NpyloadPy_Batch *self, void *c)
{
    if (!self->field_names)
        return PyTuple_New(0);
    Py_INCREF(self->field_names);
    return self->field_names;
}

static PyObject *batch_get_released(NpyloadPy_Batch *self, void *c)
{
    return PyBool_FromLong(self->b == NULL);
}

static PyObject *batch_get_live_views(NpyloadPy_Batch *self, void *c)
{
    return PyLong_FromSsize_t(self->live_views);
}

static PyObject *batch_get_data_ptrs(NpyloadPy_Batch *self, void *c)
{
    if (batch_check(self) < 0)
        return NULL;
    size_t n = npyload_batch_num_fields(self->b);
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        const npyload_array *a = npyload_batch_field(self->b, i);
        PyObject *v = PyLong_FromVoidPtr(a ? a->data : NULL);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, v);
    }
    return t;
}

static PyMethodDef batch_methods[] = {
    {"field", (PyCFunction)batch_field, METH_O,
     "field(name_or_index) -> View: zero-copy view of one field; the view "
     "keeps the batch (and its slot) alive."},
    {"sources_bytes", (PyCFunction)batch_sources_bytes, METH_NOARGS,
     "sources_bytes() -> bytearray of int64 (each row's source), or None without sources."},
    {"indices_view", (PyCFunction)batch_indices_view, METH_NOARGS,
     "indices_view() -> View of the global sample indices (host, int64)."},
    {"indices_bytes", (PyCFunction)batch_indices_bytes, METH_NOARGS,
     "indices_bytes() -> bytearray: a copy of the indices as native int64."},
    {"augment_bytes", (PyCFunction)batch_augment_bytes, METH_O,
     "augment_bytes(index): npyload_batch_augment of field index: n int64 tops, "
     "n int64 lefts, n hflip bytes, n vflip bytes"},
    {"indices_list", (PyCFunction)batch_indices_list, METH_NOARGS,
     "indices_list() -> list[int]: a copy of the indices."},
    {"wait_stream", (PyCFunction)batch_wait_stream, METH_O,
     "wait_stream(stream): make CUDA stream (int handle, None = legacy "
     "default) wait for the batch's copy; no-op on the host."},
    {"sync", (PyCFunction)batch_sync, METH_NOARGS,
     "sync(): block until the batch's copy to the device is done."},
    {"release", (PyCFunction)batch_release, METH_NOARGS,
     "release(): give the slot back now; refused while views are alive."},
    {"_note_stream", (PyCFunction)batch_note_stream, METH_O,
     "_note_stream(stream): record a consumer stream as __dlpack__ does for "
     "a device batch (tests)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef batch_getset[] = {
    {"size", (getter)batch_get_size, NULL, "rows (samples) in the batch", NULL},
    {"epoch", (getter)batch_get_epoch, NULL, "the batch's epoch", NULL},
    {"seq", (getter)batch_get_seq, NULL,
     "position of the batch within this rank's epoch", NULL},
    {"device", (getter)batch_get_device, NULL, "-1 host, k CUDA device k", NULL},
    {"field_names", (getter)batch_get_field_names, NULL, "field names", NULL},
    {"released", (getter)batch_get_released, NULL, "slot given back", NULL},
    {"live_views", (getter)batch_get_live_views, NULL, "views alive", NULL},
    {"data_ptrs", (getter)batch_get_data_ptrs, NULL,
     "tuple of each field's data pointer (for tests and debugging)", NULL},
    {"_streams", (getter)batch_get_streams, NULL,
     "the CUDA streams the batch was handed to, as ints (0 = legacy "
     "default), in first-seen order; the slot is released after all of them",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject NpyloadPy_BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npyload._npyload.Batch",
    .tp_basicsize = sizeof(NpyloadPy_Batch),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One batch: owns a slot of the loader until it is freed.",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};
