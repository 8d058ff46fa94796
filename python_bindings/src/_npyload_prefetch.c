/* _npyload.Prefetch: owns one npyload_prefetch (npyload.prefetch() and
 * npyload-prefetch drive it from python_bindings/npyload/_prefetch.py).
 *
 * run() releases the GIL for the whole fill; progress() and stop() may be
 * called from another thread meanwhile (the C API allows it). Every other
 * call while run() runs is refused (RuntimeError), and so is a second
 * run(): the guard `busy` is set and tested with the GIL held. The object
 * cannot be freed while run() runs: the running call holds a reference. */
#include <errno.h>

#include "_npyload.h"

typedef struct NpyloadPy_Prefetch {
    PyObject_HEAD
    npyload_prefetch *P;
    int busy; /* run() in progress */
} NpyloadPy_Prefetch;

static PyObject *prefetch_error(NpyloadPy_Prefetch *self, int rc)
{
    if (rc == -ENOMEM)
        return PyErr_NoMemory();
    return npyloadpy_raise(rc, npyload_prefetch_errmsg(self->P));
}

static int prefetch_idle(NpyloadPy_Prefetch *self, const char *what)
{
    if (self->busy) {
        PyErr_Format(PyExc_RuntimeError, "npyload prefetch is in use: %s was called while "
                     "run() is running", what);
        return -1;
    }
    return 0;
}

static PyObject *prefetch_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"remote", NULL};
    PyObject *d;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!:Prefetch", kwlist, &PyDict_Type, &d))
        return NULL;
    npyload_remote r;
    PyObject *keep[NPYLOADPY_REMOTE_STRINGS];
    if (npyloadpy_remote_config(d, &r, keep) < 0)
        return NULL;
    NpyloadPy_Prefetch *self = (NpyloadPy_Prefetch *)type->tp_alloc(type, 0);
    char err[1024] = "";
    int rc = self ? npyload_prefetch_create(&self->P, &r, sizeof r, err, sizeof err) : 0;
    npyloadpy_remote_release(keep);
    if (!self)
        return NULL;
    if (rc < 0) {
        Py_DECREF(self);
        return rc == -ENOMEM ? PyErr_NoMemory() : npyloadpy_raise(rc, err);
    }
    return (PyObject *)self;
}

static void prefetch_dealloc(NpyloadPy_Prefetch *self)
{
    npyload_prefetch_destroy(self->P);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *prefetch_add_field(NpyloadPy_Prefetch *self, PyObject *args)
{
    PyObject *pat_b = NULL;
    if (!PyArg_ParseTuple(args, "O&:add_field", PyUnicode_FSConverter, &pat_b))
        return NULL;
    PyObject *res = NULL;
    if (prefetch_idle(self, "add_field()") == 0) {
        int rc;
        const char *pat = PyBytes_AS_STRING(pat_b);
        self->busy = 1; /* a listing: no GIL, and no other call meanwhile */
        Py_BEGIN_ALLOW_THREADS
        rc = npyload_prefetch_add_field(self->P, pat);
        Py_END_ALLOW_THREADS
        self->busy = 0;
        res = rc < 0 ? prefetch_error(self, rc) : (Py_INCREF(Py_None), Py_None);
    }
    Py_DECREF(pat_b);
    return res;
}

static PyObject *prefetch_add_field_files(NpyloadPy_Prefetch *self, PyObject *paths_obj)
{
    if (prefetch_idle(self, "add_field_files()") < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(paths_obj, "urls must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **bytes = PyMem_Calloc((size_t)(n ? n : 1), sizeof *bytes);
    const char **urls = PyMem_Calloc((size_t)(n ? n : 1), sizeof *urls);
    PyObject *res = NULL;
    if (!bytes || !urls) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &bytes[i]))
            goto done;
        urls[i] = PyBytes_AS_STRING(bytes[i]);
    }
    int rc = npyload_prefetch_add_field_files(self->P, urls, (size_t)n);
    res = rc < 0 ? prefetch_error(self, rc) : (Py_INCREF(Py_None), Py_None);
done:
    if (bytes)
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(bytes[i]);
    PyMem_Free(bytes);
    PyMem_Free(urls);
    Py_DECREF(seq);
    return res;
}

static PyObject *prefetch_set(NpyloadPy_Prefetch *self, PyObject *args)
{
    int opt;
    PyObject *vobj;
    int64_t v;
    if (!PyArg_ParseTuple(args, "iO:set", &opt, &vobj))
        return NULL;
    if (npyloadpy_as_int64(vobj, "value", &v) < 0 || prefetch_idle(self, "set()") < 0)
        return NULL;
    int rc = npyload_prefetch_set(self->P, (npyload_prefetch_option)opt, v);
    if (rc < 0)
        return prefetch_error(self, rc);
    Py_RETURN_NONE;
}

static PyObject *prefetch_run(NpyloadPy_Prefetch *self, PyObject *unused)
{
    if (prefetch_idle(self, "run()") < 0)
        return NULL;
    int rc;
    self->busy = 1;
    Py_INCREF(self);
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_prefetch_run(self->P);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyObject *res = rc < 0 ? prefetch_error(self, rc) : (Py_INCREF(Py_None), Py_None);
    Py_DECREF(self);
    return res;
}

static PyObject *prefetch_stop(NpyloadPy_Prefetch *self, PyObject *unused)
{
    npyload_prefetch_stop(self->P);
    Py_RETURN_NONE;
}

static PyObject *prefetch_progress(NpyloadPy_Prefetch *self, PyObject *unused)
{
    npyload_prefetch_progress g;
    if (npyload_prefetch_get_progress(self->P, &g, sizeof g) < 0)
        return npyloadpy_raise(NPYLOAD_EINVAL, "npyload_prefetch_get_progress failed");
    static const char *phases[] = {"idle", "probing", "filling", "done"};
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:s,s:i}",
        "objects", (unsigned long long)g.objects,
        "dataset_bytes", (unsigned long long)g.dataset_bytes,
        "planned_bytes", (unsigned long long)g.planned_bytes,
        "cached_bytes", (unsigned long long)g.cached_bytes,
        "fetched_bytes", (unsigned long long)g.fetched_bytes,
        "planned_blocks", (unsigned long long)g.planned_blocks,
        "found_blocks", (unsigned long long)g.found_blocks,
        "fetched_blocks", (unsigned long long)g.fetched_blocks,
        "waited_blocks", (unsigned long long)g.waited_blocks,
        "requests", (unsigned long long)g.requests,
        "received_bytes", (unsigned long long)g.received_bytes,
        "seconds", (double)g.elapsed_ns / 1e9,
        "probe_seconds", (double)g.probe_ns / 1e9,
        "phase", g.phase < 4 ? phases[g.phase] : "?",
        "rc", (int)g.rc);
}

/* Prefetch.glob(pattern, remote) -> [url]: npyload_remote_glob with a
 * client of the configuration (npyload.cost_model reads the objects of an
 * s3:// glob with it). */
static PyObject *prefetch_glob(PyObject *unused_cls, PyObject *args)
{
    PyObject *pat_b = NULL, *d;
    if (!PyArg_ParseTuple(args, "O&O!:glob", PyUnicode_FSConverter, &pat_b, &PyDict_Type, &d))
        return NULL;
    npyload_remote r;
    PyObject *keep[NPYLOADPY_REMOTE_STRINGS];
    if (npyloadpy_remote_config(d, &r, keep) < 0) {
        Py_DECREF(pat_b);
        return NULL;
    }
    char err[1024] = "";
    char **paths = NULL;
    size_t n = 0;
    npyload_remote_client *c = NULL;
    const char *pat = PyBytes_AS_STRING(pat_b);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_remote_client_create(&c, &r, sizeof r, err, sizeof err);
    if (rc == 0)
        rc = npyload_remote_glob(c, pat, &paths, &n, err, sizeof err);
    npyload_remote_client_destroy(c);
    Py_END_ALLOW_THREADS
    npyloadpy_remote_release(keep);
    Py_DECREF(pat_b);
    if (rc < 0)
        return rc == -ENOMEM ? PyErr_NoMemory() : npyloadpy_raise(rc, err);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *u = npyloadpy_str(paths[i]);
        if (!u) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, u);
    }
    npyload_paths_free(paths, n);
    return list;
}

static PyMethodDef prefetch_methods[] = {
    {"glob", (PyCFunction)prefetch_glob, METH_VARARGS | METH_STATIC,
     "glob(pattern, remote) -> [url]: an s3:// glob expanded (ListObjectsV2)."},
    {"add_field", (PyCFunction)prefetch_add_field, METH_VARARGS,
     "add_field(pattern): an s3:// glob (listed now) or one URL."},
    {"add_field_files", (PyCFunction)prefetch_add_field_files, METH_O,
     "add_field_files(urls): a field given as a list of URLs."},
    {"set", (PyCFunction)prefetch_set, METH_VARARGS,
     "set(option, value): an npyload_prefetch_option."},
    {"run", (PyCFunction)prefetch_run, METH_NOARGS,
     "run(): probes and fills, without the GIL; raises NpyloadError."},
    {"stop", (PyCFunction)prefetch_stop, METH_NOARGS,
     "stop(): asks run() to end (any thread)."},
    {"progress", (PyCFunction)prefetch_progress, METH_NOARGS,
     "progress() -> dict of the counters (any thread)."},
    {NULL, NULL, 0, NULL}};

PyTypeObject NpyloadPy_PrefetchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npyload._npyload.Prefetch",
    .tp_basicsize = sizeof(NpyloadPy_Prefetch),
    .tp_dealloc = (destructor)prefetch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Low-level owner of one npyload_prefetch (see npyload.prefetch).",
    .tp_methods = prefetch_methods,
    .tp_new = prefetch_new,
};
