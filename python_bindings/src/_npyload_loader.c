/*
 * _npyload.Loader: a thin owner of one npyload_loader. The friendly
 * constructor, argument checks and iteration protocol live in Python
 * (npyload/__init__.py); this type maps the C API one call to one method.
 *
 * Threads and the GIL: next() waits with the GIL released, in slices of
 * 100 ms, checking for signals in between so Ctrl-C raises
 * KeyboardInterrupt promptly; start(), set_epoch(), set_state(), set(),
 * add_field() and close() also run without the GIL (file I/O, joins).
 *
 * One call at a time (the in-use guard, self->busy): every method that
 * touches the C loader runs between loader_enter() and loader_leave(), so a
 * call made while another thread is inside one raises RuntimeError("npyload
 * loader is in use: X was called while Y is running") and changes nothing.
 * The guard covers the whole use of self->L, error messages included (they
 * live in the loader); arguments are parsed before it is taken, since
 * parsing may run Python code. The exceptions, "shared" calls: stats() and
 * the backend attribute may run while next() waits (the C library's
 * counters are thread-safe, the backend is fixed at start); they run with
 * the GIL held and no Python code between their C calls, so no other call
 * can start under them. Dealloc needs no guard: a running method holds a
 * reference to the object.
 */
#include "_npyload.h"

#include <errno.h>
#include <string.h>

#define NEXT_SLICE_NS (100LL * 1000 * 1000)

static PyObject *loader_error(NpyloadPy_Loader *self, int rc)
{
    if (PyErr_Occurred())
        return NULL; /* a KeyboardInterrupt that interrupted the call wins */
    char msg[1024];
    npyload_loader_errmsg_copy(self->L, msg, sizeof msg);
    return npyloadpy_raise(rc, msg);
}

/* npyload_loader_set_interrupt's function: add_field and start call it
 * on this thread, without the GIL, while they wait for remote storage (an
 * s3:// listing, start's probe). It takes the GIL to run signal handlers;
 * one that raised (Ctrl-C: KeyboardInterrupt) stops the call, and the
 * exception stays set for the method to return. */
static int loader_interrupt(void *arg)
{
    (void)arg;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = PyErr_Occurred() || PyErr_CheckSignals() < 0;
    PyGILState_Release(g);
    return stop;
}

static const char CALL_NEXT[] = "next()";

static void in_use_error(const char *call, const char *busy)
{
    PyErr_Format(PyExc_RuntimeError,
                 "npyload loader is in use: %s was called while %s is running "
                 "(on another thread, or below this call); calls on one loader "
                 "must not overlap, only stats() and len() may run during a next()",
                 call, busy);
}

/* Takes the in-use guard for `call` (a static string naming the method):
 * refuses while another call runs, or after close(). 0 or -1 with an
 * exception set. Leave with loader_leave(). */
static int loader_enter(NpyloadPy_Loader *self, const char *call)
{
    if (self->busy) {
        in_use_error(call, self->busy);
        return -1;
    }
    if (!self->L) {
        PyErr_SetString(PyExc_ValueError, "npyload loader is closed");
        return -1;
    }
    self->busy = call;
    return 0;
}

static void loader_leave(NpyloadPy_Loader *self)
{
    self->busy = NULL;
}

static PyObject *none_ref(void)
{
    Py_INCREF(Py_None);
    return Py_None;
}

/* For the shared calls (stats(), backend): allowed while nothing or only
 * next() runs; takes nothing, so the caller must not release the GIL or run
 * Python code while it uses self->L. */
static int loader_share(NpyloadPy_Loader *self, const char *call)
{
    if (self->busy && self->busy != CALL_NEXT) {
        in_use_error(call, self->busy);
        return -1;
    }
    if (!self->L) {
        PyErr_SetString(PyExc_ValueError, "npyload loader is closed");
        return -1;
    }
    return 0;
}

static PyObject *loader_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    NpyloadPy_Loader *self = (NpyloadPy_Loader *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    int rc = npyload_loader_create(&self->L);
    if (rc < 0) {
        Py_DECREF(self);
        if (rc == -ENOMEM)
            return PyErr_NoMemory();
        return npyloadpy_raise(rc, NULL);
    }
    npyload_loader_set_interrupt(self->L, loader_interrupt, NULL);
    return (PyObject *)self;
}

static void loader_dealloc(NpyloadPy_Loader *self)
{
    /* No Python references to other objects that could form a cycle (the
     * field-name tuple holds only str), so the type is not GC-tracked.
     * Destroy is safe with batches outstanding: only their slots stay, until
     * the last npyload_batch_release() (zombie rule); everything else goes
     * now. It joins the workers, so the GIL is released while it waits. */
    npyload_loader *L = self->L;
    self->L = NULL;
    if (L) {
        Py_BEGIN_ALLOW_THREADS
        npyload_loader_destroy(L);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->field_names);
    Py_CLEAR(self->joiner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *loader_close(NpyloadPy_Loader *self, PyObject *unused)
{
    if (!self->busy && !self->L)
        Py_RETURN_NONE; /* closing twice is fine */
    if (loader_enter(self, "close()") < 0)
        return NULL;
    /* self->L is NULL before the GIL goes: a call from now on sees "in use",
     * then "closed", never the loader being destroyed. */
    npyload_loader *L = self->L;
    self->L = NULL;
    Py_BEGIN_ALLOW_THREADS
    npyload_loader_destroy(L);
    Py_END_ALLOW_THREADS
    loader_leave(self);
    Py_RETURN_NONE;
}

/* Field names and paths cross into C as file-system bytes
 * (PyUnicode_FSConverter: str with surrogateescape, bytes, os.PathLike), and
 * come back through npyloadpy_str, so a name or path that is not UTF-8 makes
 * the round trip unchanged. */
static PyObject *loader_add_field(NpyloadPy_Loader *self, PyObject *args)
{
    PyObject *name_b = NULL, *glob_b = NULL;
    if (!PyArg_ParseTuple(args, "O&O&:add_field", PyUnicode_FSConverter,
                          &name_b, PyUnicode_FSConverter, &glob_b)) {
        Py_XDECREF(name_b);
        return NULL;
    }
    PyObject *res = NULL;
    if (loader_enter(self, "add_field()") == 0) {
        int rc;
        npyload_loader *L = self->L;
        const char *name = PyBytes_AS_STRING(name_b);
        const char *glob = PyBytes_AS_STRING(glob_b);
        Py_BEGIN_ALLOW_THREADS /* globbing touches the file system */
        rc = npyload_loader_add_field(L, name, glob);
        Py_END_ALLOW_THREADS
        res = rc < 0 || PyErr_Occurred() ? loader_error(self, rc) : none_ref();
        loader_leave(self);
    }
    Py_DECREF(name_b);
    Py_DECREF(glob_b);
    return res;
}

static PyObject *loader_add_source(NpyloadPy_Loader *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:add_source", &name))
        return NULL;
    if (loader_enter(self, "add_source()") < 0)
        return NULL;
    int rc = npyload_loader_add_source(self->L, name);
    PyObject *res = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
    return res;
}

/* set_weights(list of floats): npyload_loader_set_weights. */
static PyObject *loader_set_weights(NpyloadPy_Loader *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "weights must be a sequence of numbers");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double *w = PyMem_Calloc((size_t)(n ? n : 1), sizeof *w);
    PyObject *res = NULL;
    if (!w) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        w[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (w[i] == -1.0 && PyErr_Occurred())
            goto done;
    }
    if (loader_enter(self, "set_weights()") == 0) {
        int rc;
        npyload_loader *L = self->L;
        Py_BEGIN_ALLOW_THREADS /* may rebuild the rest of the epoch's order */
        rc = npyload_loader_set_weights(L, w, (size_t)n);
        Py_END_ALLOW_THREADS
        res = rc < 0 ? loader_error(self, rc) : none_ref();
        loader_leave(self);
    }
done:
    PyMem_Free(w);
    Py_DECREF(seq);
    return res;
}

/* mix_stats() -> (source_samples list, digest, digest_rows): shared like
 * stats(). */
static PyObject *loader_mix_stats(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_share(self, "stats()") < 0)
        return NULL;
    size_t K = npyload_loader_num_sources(self->L);
    PyObject *l = PyList_New((Py_ssize_t)K);
    for (size_t k = 0; l && k < K; k++) {
        PyObject *v = PyLong_FromLongLong(npyload_loader_source_samples(self->L, k));
        if (!v)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)k, v);
    }
    uint64_t d = 0, rows = 0;
    npyload_loader_digest(self->L, &d, &rows);
    if (!l)
        return NULL;
    return Py_BuildValue("NKK", l, (unsigned long long)d, (unsigned long long)rows);
}

static PyObject *loader_add_field_files(NpyloadPy_Loader *self, PyObject *args)
{
    PyObject *name_b = NULL, *paths_obj;
    if (!PyArg_ParseTuple(args, "O&O:add_field_files", PyUnicode_FSConverter,
                          &name_b, &paths_obj))
        return NULL;
    const char *name = PyBytes_AS_STRING(name_b);
    PyObject *seq = PySequence_Fast(paths_obj, "paths must be a sequence");
    if (!seq) {
        Py_DECREF(name_b);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **bytes = PyMem_Calloc((size_t)(n ? n : 1), sizeof *bytes);
    const char **paths = PyMem_Calloc((size_t)(n ? n : 1), sizeof *paths);
    PyObject *res = NULL;
    if (!bytes || !paths) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &bytes[i]))
            goto done;
        paths[i] = PyBytes_AS_STRING(bytes[i]);
    }
    if (loader_enter(self, "add_field_files()") < 0)
        goto done;
    int rc = npyload_loader_add_field_files(self->L, name, paths, (size_t)n);
    res = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
done:
    if (bytes)
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(bytes[i]);
    PyMem_Free(bytes);
    PyMem_Free(paths);
    Py_DECREF(seq);
    Py_DECREF(name_b);
    return res;
}

static PyObject *loader_set(NpyloadPy_Loader *self, PyObject *args)
{
    int opt;
    PyObject *vobj;
    int64_t v;
    if (!PyArg_ParseTuple(args, "iO:set", &opt, &vobj))
        return NULL;
    if (npyloadpy_as_int64(vobj, "value", &v) < 0 || loader_enter(self, "set()") < 0)
        return NULL;
    int rc;
    npyload_loader *L = self->L;
    /* Asking for a CUDA device loads the runtime (dlopen): no GIL. */
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_set(L, (npyload_option)opt, v);
    Py_END_ALLOW_THREADS
    PyObject *res = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
    return res;
}

static PyObject *loader_get(NpyloadPy_Loader *self, PyObject *args)
{
    int opt;
    int64_t v = 0;
    if (!PyArg_ParseTuple(args, "i:get", &opt))
        return NULL;
    if (loader_enter(self, "get()") < 0)
        return NULL;
    int rc = npyload_loader_get(self->L, (npyload_option)opt, &v);
    PyObject *res = rc < 0 ? loader_error(self, rc) : PyLong_FromLongLong((long long)v);
    loader_leave(self);
    return res;
}

/* The field names of a started loader, as a tuple of str (with the guard
 * held: the names live in the loader). */
static PyObject *field_name_tuple(npyload_loader *L)
{
    size_t nf = npyload_loader_num_fields(L);
    PyObject *names = PyTuple_New((Py_ssize_t)nf);
    if (!names)
        return NULL;
    for (size_t i = 0; i < nf; i++) {
        PyObject *u = npyloadpy_str(npyload_loader_field_name(L, i));
        if (!u) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, (Py_ssize_t)i, u);
    }
    return names;
}

static PyObject *loader_start(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, "start()") < 0)
        return NULL;
    int rc;
    npyload_loader *L = self->L;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_start(L);
    Py_END_ALLOW_THREADS
    PyObject *names = NULL;
    if (rc == 0)
        self->started = 1; /* also when a Ctrl-C came meanwhile: `started` says so */
    if (rc < 0 || PyErr_Occurred())
        loader_error(self, rc);
    else
        names = field_name_tuple(L);
    loader_leave(self);
    if (!names)
        return NULL;
    Py_XSETREF(self->field_names, names);
    Py_RETURN_NONE;
}

/* stop(): npyload_loader_stop, keeping what start read of the fields, so
 * that options can be set again and the next start probes nothing again. */
static PyObject *loader_stop(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, "stop()") < 0)
        return NULL;
    int rc;
    npyload_loader *L = self->L;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_stop(L);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (rc < 0) {
        loader_error(self, rc);
    } else {
        self->started = 0;
        ret = none_ref();
    }
    loader_leave(self);
    return ret;
}

static PyObject *loader_set_epoch(NpyloadPy_Loader *self, PyObject *arg)
{
    int64_t e;
    if (npyloadpy_as_int64(arg, "epoch", &e) < 0)
        return NULL;
    if (e < 0) {
        PyErr_Format(PyExc_ValueError, "epoch = %lld out of range: 0 .. 2**63-1",
                     (long long)e);
        return NULL;
    }
    if (loader_enter(self, "set_epoch()") < 0)
        return NULL;
    int rc;
    npyload_loader *L = self->L;
    /* Abandoning an epoch waits for the reads in flight. */
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_set_epoch(L, (uint64_t)e);
    Py_END_ALLOW_THREADS
    PyObject *res = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
    return res;
}

PyDoc_STRVAR(next_doc,
"next() -> Batch or None\n\n"
"The next batch of the epoch, or None at its end. Waits without the GIL;\n"
"signals are checked every 100 ms (Ctrl-C raises KeyboardInterrupt).\n"
"Raises NpyloadError for a failed read, and when every slot is still held\n"
"by live batches (keep fewer batches, or raise `prefetch`).");

static PyObject *loader_next(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, CALL_NEXT) < 0)
        return NULL;
    if (!self->started) {
        loader_leave(self);
        PyErr_SetString(PyExc_RuntimeError, "npyload loader is not started");
        return NULL;
    }
    npyload_batch *b = NULL;
    npyload_loader *L = self->L;
    PyObject *res = NULL;
    int rc;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        rc = npyload_loader_next_timeout(L, &b, NEXT_SLICE_NS);
        Py_END_ALLOW_THREADS
        if (rc != -ETIMEDOUT)
            break;
        /* A signal handler runs here, with the guard held: it may read
         * stats(), and any other call on this loader is refused. */
        if (PyErr_CheckSignals() < 0)
            goto out;
    }
    if (rc == NPYLOAD_EOF)
        res = none_ref();
    else if (rc < 0)
        loader_error(self, rc);
    else
        res = npyloadpy_batch_new(b, self->field_names, self->joiner);
out:
    loader_leave(self);
    return res;
}

static PyObject *loader_num_batches(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, "num_batches()") < 0)
        return NULL;
    int64_t n = npyload_loader_num_batches(self->L);
    PyObject *res = n < 0 ? loader_error(self, (int)n) : PyLong_FromLongLong((long long)n);
    loader_leave(self);
    return res;
}

static PyObject *loader_num_samples(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, "num_samples()") < 0)
        return NULL;
    int64_t n = npyload_loader_num_samples(self->L);
    PyObject *res = n < 0 ? loader_error(self, (int)n) : PyLong_FromLongLong((long long)n);
    loader_leave(self);
    return res;
}

/* field_engines(): npyload_loader_field_engine for every field, as
 * {name: (engine, why)}; a shared call like stats() (what it reads is fixed
 * at start). */
static PyObject *loader_field_engines(NpyloadPy_Loader *self, PyObject *unused)
{
    static const char *const names[] = {"none", "host", "device"};
    if (loader_share(self, "field_engines()") < 0)
        return NULL;
    size_t n = npyload_loader_num_fields(self->L);
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        char why[1024] = "";
        int e = npyload_loader_field_engine(self->L, i, why, sizeof why);
        if (e < 0 || e > NPYLOAD_ENGINE_DEVICE) {
            Py_CLEAR(d);
            npyloadpy_raise(e < 0 ? e : NPYLOAD_EINVAL,
                            e == NPYLOAD_ESTATE ? "field_engines() before start()" : NULL);
            break;
        }
        /* Names and reasons as every string of the library: file-system
         * decoding (a field name or a path may carry any bytes). */
        PyObject *k = npyloadpy_str(npyload_loader_field_name(self->L, i));
        PyObject *w = npyloadpy_str(why);
        PyObject *v = k && w ? Py_BuildValue("(sO)", names[e], w) : NULL;
        if (!v || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(w);
        Py_XDECREF(v);
    }
    return d;
}

/* ---- the resume state ----
 *
 * The C library's state is a byte string of named records
 * (npyload_loader_save_state in npyload.h documents the layout); Python's
 * state_dict() is those records as a dict, {name: number, or list of
 * numbers}, so that it holds whatever records the library writes without
 * this file knowing them. Only the container is read and written here;
 * what the records mean, and every check of them, is the library's. */

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

/* One value of a record as a Python number. */
static PyObject *record_value(int type, uint64_t bits)
{
    if (type == 'u')
        return PyLong_FromUnsignedLongLong(bits);
    if (type == 'f') {
        double d;
        memcpy(&d, &bits, sizeof d);
        return PyFloat_FromDouble(d);
    }
    return PyLong_FromLongLong((long long)bits);
}

/* The records of a saved state (written by this library, so well formed;
 * checked anyway) as a dict. */
static PyObject *state_dict_of(const unsigned char *b, size_t len)
{
    if (len < 12 || memcmp(b, "NPYS", 4) != 0)
        return PyErr_Format(PyExc_RuntimeError, "npyload: a malformed saved state");
    uint64_t nrec = get_le(b + 6, 2);
    PyObject *d = PyDict_New();
    size_t at = 12;
    for (uint64_t r = 0; d && r < nrec; r++) {
        size_t nl = at < len ? b[at] : 0;
        if (nl == 0 || at + 1 + nl + 5 > len)
            break;
        PyObject *key = PyUnicode_FromStringAndSize((const char *)b + at + 1, (Py_ssize_t)nl);
        at += 1 + nl;
        int type = b[at];
        uint64_t count = get_le(b + at + 1, 4);
        at += 5;
        PyObject *v = NULL;
        if (key && count <= (len - at) / 8) {
            if (count == 1) {
                v = record_value(type, get_le(b + at, 8));
            } else if ((v = PyList_New((Py_ssize_t)count)) != NULL) {
                for (uint64_t i = 0; i < count; i++) {
                    PyObject *x = record_value(type, get_le(b + at + 8 * i, 8));
                    if (!x) {
                        Py_CLEAR(v);
                        break;
                    }
                    PyList_SET_ITEM(v, (Py_ssize_t)i, x);
                }
            }
            at += (size_t)count * 8;
        }
        if (!key || !v || PyDict_SetItem(d, key, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(key);
        Py_XDECREF(v);
    }
    return d;
}

/* A number of a state dict: *type 'i', 'u' or 'f' and its bits. */
static int encode_number(PyObject *key, PyObject *v, int *type, uint64_t *bits)
{
    if (PyFloat_Check(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        memcpy(bits, &x, sizeof x);
        *type = 'f';
        return 0;
    }
    if (PyBool_Check(v) || !PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "state[%R] must be an int, not %.80s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow) {
        if (x == -1 && PyErr_Occurred())
            return -1;
        *bits = (uint64_t)x;
        *type = 'i';
        return 0;
    }
    unsigned long long u = overflow > 0 ? PyLong_AsUnsignedLongLong(v) : 0;
    if (overflow < 0 || (u == (unsigned long long)-1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "state[%R] = %R is out of the 64-bit range", key, v);
        return -1;
    }
    *bits = u;
    *type = 'u';
    return 0;
}

/* A state dict as the library's byte string (a new bytes object). */
static PyObject *state_bytes_of(PyObject *d)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "state must be a dict from state_dict()");
        return NULL;
    }
    Py_ssize_t n = PyDict_Size(d), size = 12, pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(d, &pos, &key, &val)) {
        Py_ssize_t kl = 0;
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &kl) : NULL;
        int ok = k && kl >= 1 && kl <= 63;
        for (Py_ssize_t i = 0; ok && i < kl; i++)
            ok = (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '_';
        if (!ok) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "state: key %R is not a state record's name "
                         "(1 to 63 of a-z, 0-9, _)", key);
            return NULL;
        }
        Py_ssize_t count = PyList_Check(val) || PyTuple_Check(val) ? PySequence_Size(val) : 1;
        size += 1 + kl + 5 + 8 * count;
    }
    if (n > 65535 || size > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "state: too large for a saved state");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (!out)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(o, "NPYS", 4);
    put_le(o + 4, 1, 2);
    put_le(o + 6, (uint64_t)n, 2);
    put_le(o + 8, (uint64_t)size, 4);
    size_t at = 12;
    pos = 0;
    while (PyDict_Next(d, &pos, &key, &val)) {
        Py_ssize_t kl = 0;
        const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
        o[at++] = (unsigned char)kl;
        memcpy(o + at, k, (size_t)kl);
        at += (size_t)kl;
        int seq = PyList_Check(val) || PyTuple_Check(val);
        Py_ssize_t count = seq ? PySequence_Size(val) : 1;
        int type = 'i';
        size_t tat = at;
        put_le(o + at + 1, (uint64_t)count, 4);
        at += 5;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *x = seq ? PySequence_GetItem(val, i) : (Py_INCREF(val), val);
            int t;
            uint64_t bits;
            int rc = x ? encode_number(key, x, &t, &bits) : -1;
            Py_XDECREF(x);
            if (rc < 0 || (i && t != type)) {
                if (rc == 0)
                    PyErr_Format(PyExc_ValueError, "state[%R]: mixed kinds of numbers", key);
                Py_DECREF(out);
                return NULL;
            }
            type = t;
            put_le(o + at, bits, 8);
            at += 8;
        }
        o[tat] = (unsigned char)type;
    }
    return out;
}

static PyObject *loader_save_state(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, "get_state()") < 0)
        return NULL;
    int64_t need = npyload_loader_save_state(self->L, NULL, 0);
    PyObject *out = NULL;
    if (need < 0) {
        loader_error(self, (int)need);
    } else if ((out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)need)) != NULL) {
        int64_t got = npyload_loader_save_state(self->L, PyBytes_AS_STRING(out), (size_t)need);
        if (got != need) { /* the position moved between the calls: never */
            Py_CLEAR(out);
            loader_error(self, got < 0 ? (int)got : NPYLOAD_ESTATE);
        }
    }
    loader_leave(self);
    return out;
}

static PyObject *loader_get_state(NpyloadPy_Loader *self, PyObject *unused)
{
    PyObject *b = loader_save_state(self, NULL);
    if (!b)
        return NULL;
    PyObject *d = state_dict_of((const unsigned char *)PyBytes_AS_STRING(b),
                                (size_t)PyBytes_GET_SIZE(b));
    Py_DECREF(b);
    return d;
}

static PyObject *load_state_bytes(NpyloadPy_Loader *self, PyObject *b)
{
    /* Read (which may run Python code) before the guard. */
    if (loader_enter(self, "set_state()") < 0)
        return NULL;
    int rc;
    npyload_loader *L = self->L;
    const char *p = PyBytes_AS_STRING(b);
    size_t len = (size_t)PyBytes_GET_SIZE(b);
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_load_state(L, p, len);
    Py_END_ALLOW_THREADS
    PyObject *res = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
    return res;
}

static PyObject *loader_set_state(NpyloadPy_Loader *self, PyObject *d)
{
    PyObject *b = state_bytes_of(d);
    if (!b)
        return NULL;
    PyObject *res = load_state_bytes(self, b);
    Py_DECREF(b);
    return res;
}

static PyObject *loader_load_state(NpyloadPy_Loader *self, PyObject *b)
{
    if (!PyBytes_Check(b)) {
        PyErr_SetString(PyExc_TypeError, "load_state() takes the bytes of save_state()");
        return NULL;
    }
    return load_state_bytes(self, b);
}

static PyObject *loader_begin_pass(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_enter(self, "iter()") < 0)
        return NULL;
    int rc;
    npyload_loader *L = self->L;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_begin_pass(L);
    Py_END_ALLOW_THREADS
    PyObject *res = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
    return res;
}

/* ceiling(kind, threads, seconds) -> {gbps, seconds, bytes, threads}. */
static PyObject *loader_ceiling(NpyloadPy_Loader *self, PyObject *args)
{
    int kind, threads;
    double seconds;
    if (!PyArg_ParseTuple(args, "iid:ceiling", &kind, &threads, &seconds))
        return NULL;
    if (loader_enter(self, "ceiling()") < 0)
        return NULL;
    npyload_ceiling c;
    int rc;
    npyload_loader *L = self->L;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_loader_ceiling(L, (npyload_ceiling_kind)kind, threads, seconds, &c, sizeof c);
    Py_END_ALLOW_THREADS
    PyObject *res = rc < 0 ? loader_error(self, rc)
                           : Py_BuildValue("{s:d,s:d,s:K,s:i}", "gbps", c.gbps, "seconds",
                                           c.seconds, "bytes", (unsigned long long)c.bytes,
                                           "threads", c.threads);
    loader_leave(self);
    return res;
}

static PyObject *loader_pass_rule(NpyloadPy_Loader *self, PyObject *unused)
{
    if (loader_share(self, "pass_rule()") < 0)
        return NULL;
    int rc = npyload_loader_pass_rule(self->L);
    return rc < 0 ? loader_error(self, rc) : PyLong_FromLong(rc);
}

static PyObject *loader_pass_batches(NpyloadPy_Loader *self, PyObject *unused)
{
    /* Shared with a next() in progress, as stats(): the library answers
     * from the ring under its own lock. */
    if (!self->L) {
        PyErr_SetString(PyExc_ValueError, "npyload loader is closed");
        return NULL;
    }
    int64_t n = npyload_loader_pass_batches(self->L);
    if (n < 0)
        return loader_error(self, (int)n);
    return PyLong_FromLongLong((long long)n);
}

/* stats(hook_ns=0, loop_wait_ns=-1, loop_step_ns=-1): the counters and the
 * verdict; a per-batch hook between the loader and the loop passes its
 * time and the loop's own wait and step (then the verdict judges the loop
 * the user runs, not the hook thread's calls of next()). */
static PyObject *loader_stats(NpyloadPy_Loader *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"hook_ns", "loop_wait_ns", "loop_step_ns", NULL};
    unsigned long long hook_ns = 0;
    long long loop_wait = -1, loop_step = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|KLL:stats", kwlist, &hook_ns, &loop_wait,
                                     &loop_step))
        return NULL;
    npyload_stats s;
    char last[1024], verdict[512];
    /* Shared: both C calls are thread-safe, and nothing between them
     * releases the GIL; from here on only the copies are used. */
    if (loader_share(self, "stats()") < 0)
        return NULL;
    int rc = npyload_loader_get_stats(self->L, &s, sizeof s);
    if (rc < 0)
        return loader_error(self, rc);
    npyload_loader_last_skip_error(self->L, last, sizeof last);
    npyload_stats judged = s;
    if (loop_wait >= 0 && loop_step >= 0) {
        judged.wait_ns = (uint64_t)loop_wait;
        judged.step_ns = (uint64_t)loop_step;
    }
    npyload_stats_verdict(&judged, hook_ns, verdict, sizeof verdict);
    PyObject *last_s = npyloadpy_str(last);
    if (!last_s)
        return NULL;
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:s,s:O,s:O,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N,s:K,s:K,s:K,s:K,s:K,s:K,"
        "s:K,s:K,s:K,s:K,s:K,s:s}",
        "bytes_read", (unsigned long long)s.bytes_read,
        "batches_delivered", (unsigned long long)s.batches_delivered,
        "samples_delivered", (unsigned long long)s.samples_delivered,
        "wait_ns", (unsigned long long)s.wait_ns,
        "io_ns", (unsigned long long)s.io_ns,
        "h2d_bytes", (unsigned long long)s.h2d_bytes,
        "h2d_ns", (unsigned long long)s.h2d_ns,
        "backend", npyload_backend_name((npyload_io_backend)s.backend),
        "pinned", s.pinned ? Py_True : Py_False,
        "direct_io", s.direct_io ? Py_True : Py_False,
        "device", s.device,
        "slot_bytes", (unsigned long long)s.slot_bytes,
        "num_slots", (unsigned long long)s.num_slots,
        "uring_fallbacks", (unsigned long long)s.uring_fallbacks,
        "samples_skipped", (unsigned long long)s.samples_skipped,
        "errors", (unsigned long long)s.errors,
        "gather_bytes", (unsigned long long)s.gather_bytes,
        "gather_requests", (unsigned long long)s.gather_requests,
        "read_requests", (unsigned long long)s.read_requests,
        "last_error", last_s,
        "compressed_bytes_read", (unsigned long long)s.compressed_bytes_read,
        "decompressed_bytes", (unsigned long long)s.decompressed_bytes,
        "decode_ns", (unsigned long long)s.decode_ns,
        "transform_ns", (unsigned long long)s.transform_ns,
        "read_ahead_batches", (unsigned long long)s.read_ahead_batches,
        "read_wait_ns", (unsigned long long)s.read_wait_ns,
        "elapsed_ns", (unsigned long long)s.elapsed_ns,
        "step_ns", (unsigned long long)s.step_ns,
        "worker_cpu_ns", (unsigned long long)s.worker_cpu_ns,
        "num_workers", (unsigned long long)s.num_workers,
        "read_blocked_ns", (unsigned long long)s.read_blocked_ns,
        "verdict", verdict);
    const struct {
        const char *name;
        uint64_t v;
    } more[] = {{"remote_bytes", s.remote_bytes},
                {"remote_requests", s.remote_requests},
                {"remote_retries", s.remote_retries},
                {"remote_wait_ns", s.remote_wait_ns},
                {"cache_hits", s.cache_hits},
                {"cache_misses", s.cache_misses},
                {"cache_read_bytes", s.cache_read_bytes},
                {"cache_write_bytes", s.cache_write_bytes},
                {"cache_evictions", s.cache_evictions},
                {"fill_wanted_bytes", s.fill_wanted_bytes},
                {"fill_planned_bytes", s.fill_planned_bytes},
                {"fill_planned_blocks", s.fill_planned_blocks},
                {"fill_done_bytes", s.fill_done_bytes},
                {"fill_found_blocks", s.fill_found_blocks},
                {"fill_fetched_blocks", s.fill_fetched_blocks},
                {"fill_fetched_bytes", s.fill_fetched_bytes},
                {"fill_waited_blocks", s.fill_waited_blocks},
                {"fill_ns", s.fill_ns},
                {"auto_mode", s.auto_mode},
                {"memory_budget", s.memory_budget},
                {"memory_bytes", s.memory_bytes},
                {"auto_decisions", s.auto_decisions},
                {"parked_slots", s.parked_slots},
                {"slot_wait_ns", s.slot_wait_ns},
                {"read_ahead_on", s.read_ahead_on}};
    for (size_t i = 0; d && i < sizeof more / sizeof more[0]; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)more[i].v);
        if (!v || PyDict_SetItemString(d, more[i].name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    /* The background cache fill: its state by name, its failure. */
    static const char *const fill_states[] = {"off", "running", "done", "failed", "stopped"};
    char fill_err[1024];
    npyload_loader_fill_error(self->L, fill_err, sizeof fill_err);
    unsigned fs = (unsigned)s.fill_state < 5 ? (unsigned)s.fill_state : 0;
    PyObject *fst = d ? PyUnicode_FromString(fill_states[fs]) : NULL;
    PyObject *fe = d ? npyloadpy_str(fill_err) : NULL;
    PyObject *fc = d ? PyLong_FromLong((long)s.fill_error) : NULL;
    if (d && (!fst || !fe || !fc || PyDict_SetItemString(d, "fill_state", fst) < 0 ||
              PyDict_SetItemString(d, "fill_error", fe) < 0 ||
              PyDict_SetItemString(d, "fill_error_code", fc) < 0))
        Py_CLEAR(d);
    Py_XDECREF(fst);
    Py_XDECREF(fe);
    Py_XDECREF(fc);
    return d;
}

/* auto_history(since=0) -> (total, [(t_ns, batch, workers, slots,
 * prev_workers, prev_slots, reason name, wait_share, samples_per_s,
 * worker_busy, read_blocked, slot_wait, read_ahead, prev_read_ahead), ...]): the
 * controller's decisions numbered
 * `since` and later that the library still keeps (the last 32). Shared,
 * as stats(). */
static PyObject *loader_auto_history(NpyloadPy_Loader *self, PyObject *args)
{
    unsigned long long since = 0;
    if (!PyArg_ParseTuple(args, "|K:auto_history", &since))
        return NULL;
    if (loader_share(self, "auto_history()") < 0)
        return NULL;
    npyload_auto_event ev[32];
    uint64_t total = 0;
    int n = npyload_loader_auto_history(self->L, NULL, 0, sizeof *ev, &total);
    if (n >= 0 && total > since)
        n = npyload_loader_auto_history(self->L, ev, total - since < 32 ? (size_t)(total - since)
                                                                        : 32, sizeof *ev, &total);
    if (n < 0)
        return loader_error(self, n);
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < n; i++) {
        const npyload_auto_event *e = &ev[i];
        PyObject *t = Py_BuildValue("(KKIIIIsdddddii)", (unsigned long long)e->t_ns,
                                    (unsigned long long)e->batch, e->workers, e->slots,
                                    e->prev_workers, e->prev_slots,
                                    npyload_auto_reason_name(e->reason), e->wait_share,
                                    e->samples_per_s, e->worker_busy, e->read_blocked,
                                    e->slot_wait, (int)e->read_ahead, (int)e->prev_read_ahead);
        if (!t || PyList_Append(list, t) < 0)
            Py_CLEAR(list);
        Py_XDECREF(t);
    }
    if (!list)
        return NULL;
    return Py_BuildValue("(KN)", (unsigned long long)total, list);
}

static PyObject *loader_set_stream_joiner(NpyloadPy_Loader *self, PyObject *fn)
{
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the stream joiner must be callable or None");
        return NULL;
    }
    if (fn == Py_None)
        fn = NULL;
    /* next() hands the joiner to each batch: not while it runs. */
    if (loader_enter(self, "_set_stream_joiner()") < 0)
        return NULL;
    Py_XINCREF(fn);
    PyObject *old = self->joiner;
    self->joiner = fn;
    loader_leave(self);
    Py_XDECREF(old); /* may run Python code: after the guard */
    Py_RETURN_NONE;
}

static PyObject *loader_get_backend(NpyloadPy_Loader *self, void *closure)
{
    if (loader_share(self, "backend") < 0)
        return NULL;
    /* A static string: nothing of the loader is used after this line. */
    return PyUnicode_FromString(npyload_backend_name(npyload_loader_backend(self->L)));
}

static PyObject *loader_get_field_names(NpyloadPy_Loader *self, void *closure)
{
    if (!self->field_names)
        return PyTuple_New(0);
    Py_INCREF(self->field_names);
    return self->field_names;
}

static PyObject *loader_get_closed(NpyloadPy_Loader *self, void *closure)
{
    return PyBool_FromLong(self->L == NULL);
}

static PyObject *loader_get_started(NpyloadPy_Loader *self, void *closure)
{
    return PyBool_FromLong(self->started);
}

/* A sequence of numbers (or None) as floats in a PyMem buffer; *n its
 * length. Returns 0, or -1 with an exception naming `what`. */
static int float_list(PyObject *obj, const char *what, float **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (obj == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(obj, what);
    if (!seq)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    float *v = PyMem_Malloc((size_t)(k ? k : 1) * sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        double d = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (d == -1.0 && PyErr_Occurred()) {
            PyMem_Free(v);
            Py_DECREF(seq);
            return -1;
        }
        v[i] = (float)d;
    }
    Py_DECREF(seq);
    *out = v;
    *n = (size_t)k;
    return 0;
}

/* set_transform(field, ...) and set_source_transform(source, field, ...):
 * the description from Python's arguments (`args` from the field on);
 * source NULL: the field's own transform. */
static PyObject *set_transform_of(NpyloadPy_Loader *self, const char *source, PyObject *args,
                                  const char *fmt)
{
    PyObject *name_b = NULL, *mean_obj, *std_obj, *hsign_obj = Py_None, *vsign_obj = Py_None;
    int dtype, channels_last;
    double scale, hflip = 0.0, vflip = 0.0;
    long long crop_h = 0, crop_w = 0, pad = 0;
    if (!PyArg_ParseTuple(args, fmt, PyUnicode_FSConverter,
                          &name_b, &dtype, &scale, &mean_obj, &std_obj, &channels_last,
                          &hflip, &vflip, &crop_h, &crop_w, &pad, &hsign_obj, &vsign_obj))
        return NULL;
    PyObject *ret = NULL;
    float *mean = NULL, *std = NULL, *hsign = NULL, *vsign = NULL;
    npyload_transform t = {.dtype = dtype, .scale = (float)scale,
                           .channels_last = channels_last, .hflip = (float)hflip,
                           .vflip = (float)vflip, .crop_h = crop_h, .crop_w = crop_w,
                           .pad = pad};
    if (float_list(mean_obj, "mean must be a sequence of numbers", &mean, &t.n_mean) < 0 ||
        float_list(std_obj, "std must be a sequence of numbers", &std, &t.n_std) < 0 ||
        float_list(hsign_obj, "hflip_sign must be a sequence of numbers", &hsign,
                   &t.n_hflip_sign) < 0 ||
        float_list(vsign_obj, "vflip_sign must be a sequence of numbers", &vsign,
                   &t.n_vflip_sign) < 0 ||
        loader_enter(self, source ? "set_source_transform()" : "set_transform()") < 0)
        goto out;
    t.mean = mean;
    t.std = std;
    t.hflip_sign = hsign;
    t.vflip_sign = vsign;
    int rc = source ? npyload_loader_set_source_transform(self->L, source,
                                                          PyBytes_AS_STRING(name_b), &t,
                                                          sizeof t)
                    : npyload_loader_set_transform(self->L, PyBytes_AS_STRING(name_b), &t,
                                                   sizeof t);
    ret = rc < 0 ? loader_error(self, rc) : none_ref();
    loader_leave(self);
out:
    PyMem_Free(mean);
    PyMem_Free(std);
    PyMem_Free(hsign);
    PyMem_Free(vsign);
    Py_DECREF(name_b);
    return ret;
}

static PyObject *loader_set_transform(NpyloadPy_Loader *self, PyObject *args)
{
    return set_transform_of(self, NULL, args, "O&idOOp|ddLLLOO:set_transform");
}

static PyObject *loader_set_source_transform(NpyloadPy_Loader *self, PyObject *args)
{
    Py_ssize_t n = PyTuple_Size(args);
    if (n < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(args, 0)))
        return PyErr_Format(PyExc_TypeError, "set_source_transform(source, field, ...): "
                            "source must be a str");
    const char *source = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, 0));
    PyObject *rest = source ? PyTuple_GetSlice(args, 1, n) : NULL;
    if (!rest)
        return NULL;
    PyObject *ret = set_transform_of(self, source, rest,
                                     "O&idOOp|ddLLLOO:set_source_transform");
    Py_DECREF(rest);
    return ret;
}

static PyObject *loader_set_path(NpyloadPy_Loader *self, PyObject *args)
{
    int which;
    PyObject *path_b = NULL;
    if (!PyArg_ParseTuple(args, "iO&:set_path", &which, PyUnicode_FSConverter, &path_b))
        return NULL;
    PyObject *ret = NULL;
    if (loader_enter(self, "set_path()") == 0) {
        int rc = npyload_loader_set_path(self->L, (npyload_path_option)which,
                                         PyBytes_AS_STRING(path_b));
        ret = rc < 0 ? loader_error(self, rc) : none_ref();
        loader_leave(self);
    }
    Py_DECREF(path_b);
    return ret;
}

/* set_remote({name: value}): npyload_loader_set_remote() with the members
 * npyloadpy_remote_config reads. The secret crosses as a bytes copy that
 * is wiped after the call. */
static PyObject *loader_set_remote(NpyloadPy_Loader *self, PyObject *d)
{
    npyload_remote r;
    PyObject *keep[NPYLOADPY_REMOTE_STRINGS];
    if (npyloadpy_remote_config(d, &r, keep) < 0)
        return NULL;
    PyObject *ret = NULL;
    if (loader_enter(self, "set_remote()") == 0) {
        int rc = npyload_loader_set_remote(self->L, &r, sizeof r);
        ret = rc < 0 ? loader_error(self, rc) : none_ref();
        loader_leave(self);
    }
    npyloadpy_remote_release(keep);
    return ret;
}

PyDoc_STRVAR(option_ranges_doc,
"option_ranges() -> {option: (lo, hi, default)}\n\n"
"For every option of npyload_loader_set(): the smallest and the largest\n"
"value the library accepts (npyload_option_range) and the value of a new\n"
"loader, so that npyload.Loader checks its arguments, in its own units,\n"
"against the library's limits rather than copies of them.");

static PyObject *loader_option_ranges(PyObject *unused_cls, PyObject *unused)
{
    static const npyload_option opts[] = {
#define NPYLOAD_XX_OPT(name, value, doc) NPYLOAD_OPT_##name,
        NPYLOAD_OPTION_MAP(NPYLOAD_XX_OPT)
#undef NPYLOAD_XX_OPT
    };
    npyload_loader *L = NULL;
    int rc = npyload_loader_create(&L);
    if (rc < 0)
        return rc == -ENOMEM ? PyErr_NoMemory() : npyloadpy_raise(rc, NULL);
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < sizeof opts / sizeof opts[0]; i++) {
        int64_t lo, hi, def = 0;
        if (npyload_option_range(opts[i], &lo, &hi) < 0 ||
            npyload_loader_get(L, opts[i], &def) < 0)
            continue;
        PyObject *k = PyLong_FromLong((long)opts[i]);
        PyObject *v = Py_BuildValue("(LLL)", (long long)lo, (long long)hi, (long long)def);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    npyload_loader_destroy(L);
    return d;
}

static PyMethodDef loader_methods[] = {
    {"option_ranges", (PyCFunction)loader_option_ranges, METH_NOARGS | METH_STATIC,
     option_ranges_doc},
    {"add_source", (PyCFunction)loader_add_source, METH_VARARGS,
     "add_source(name): begins a source; the fields added next are its own."},
    {"set_weights", (PyCFunction)loader_set_weights, METH_O,
     "set_weights(weights): the sources' weights (npyload_loader_set_weights)."},
    {"mix_stats", (PyCFunction)loader_mix_stats, METH_NOARGS,
     "mix_stats() -> (rows per source, digest, digest_rows)."},
    {"add_field", (PyCFunction)loader_add_field, METH_VARARGS,
     "add_field(name, glob): a field made of the files matching glob, sorted."},
    {"add_field_files", (PyCFunction)loader_add_field_files, METH_VARARGS,
     "add_field_files(name, paths): a field made of these files, in order."},
    {"set", (PyCFunction)loader_set, METH_VARARGS,
     "set(option, value): npyload_loader_set (before start)."},
    {"set_transform", (PyCFunction)loader_set_transform, METH_VARARGS,
     "set_transform(field, dtype, scale, mean, std, channels_last): "
     "npyload_loader_set_transform (before start); dtype 0 keep, 1 float32, "
     "2 float16, 3 bfloat16; mean/std None or sequences of numbers."},
    {"set_source_transform", (PyCFunction)loader_set_source_transform, METH_VARARGS,
     "set_source_transform(source, field, dtype, scale, mean, std, channels_last, ...): "
     "npyload_loader_set_source_transform (before start): source's own transform of "
     "field, the arguments of set_transform after the source"},
    {"set_remote", (PyCFunction)loader_set_remote, METH_O,
     "set_remote(config: dict) -> None: npyload_loader_set_remote()"},
    {"set_path", (PyCFunction)loader_set_path, METH_VARARGS,
     "set_path(which, path): npyload_loader_set_path (before start); which "
     "PATH_NVRTC or PATH_KERNEL_CACHE, '' for the default."},
    {"get", (PyCFunction)loader_get, METH_VARARGS,
     "get(option) -> int: the option's effective value."},
    {"start", (PyCFunction)loader_start, METH_NOARGS,
     "start(): read headers, validate fields, start the workers."},
    {"stop", (PyCFunction)loader_stop, METH_NOARGS,
     "stop(): back to before start, keeping the headers and remote probes read."},
    {"set_epoch", (PyCFunction)loader_set_epoch, METH_O,
     "set_epoch(e): (re)start epoch e from its first batch."},
    {"next", (PyCFunction)loader_next, METH_NOARGS, next_doc},
    {"num_batches", (PyCFunction)loader_num_batches, METH_NOARGS,
     "num_batches() -> int: batches per epoch for this rank."},
    {"num_samples", (PyCFunction)loader_num_samples, METH_NOARGS,
     "num_samples() -> int: N, the samples in every field."},
    {"field_engines", (PyCFunction)loader_field_engines, METH_NOARGS,
     "field_engines() -> dict: after start, {field: (engine, why)}: where its "
     "transform and narrowed codes run ('none', 'host' or 'device', "
     "npyload_loader_field_engine) and why in words."},
    {"get_state", (PyCFunction)loader_get_state, METH_NOARGS,
     "get_state() -> dict: position after the last batch handed out, as the\n"
     "library's state records {name: number or list}."},
    {"set_state", (PyCFunction)loader_set_state, METH_O,
     "set_state(d): resume from a get_state() dict."},
    {"save_state", (PyCFunction)loader_save_state, METH_NOARGS,
     "save_state() -> bytes: the position as the library's byte string."},
    {"load_state", (PyCFunction)loader_load_state, METH_O,
     "load_state(b): resume from save_state()'s bytes."},
    {"begin_pass", (PyCFunction)loader_begin_pass, METH_NOARGS,
     "begin_pass(): the next pass by the library's rule (npyload_loader_begin_pass)."},
    {"ceiling", (PyCFunction)loader_ceiling, METH_VARARGS,
     "ceiling(kind, threads, seconds) -> dict: npyload_loader_ceiling."},
    {"pass_rule", (PyCFunction)loader_pass_rule, METH_NOARGS,
     "pass_rule() -> int: what the next begin_pass() does (PASS_START, _RESUME, _ADVANCE)."},
    {"pass_batches", (PyCFunction)loader_pass_batches, METH_NOARGS,
     "pass_batches() -> int: batches of the pass in progress, or of the next."},
    {"stats", (PyCFunction)(void (*)(void))loader_stats, METH_VARARGS | METH_KEYWORDS,
     "stats(hook_ns=0, loop_wait_ns=-1, loop_step_ns=-1) -> dict: counters since "
     "start and the verdict (npyload_stats_verdict) of the loop described."},
    {"auto_history", (PyCFunction)loader_auto_history, METH_VARARGS,
     "auto_history(since=0) -> (total, [event tuples]): the controller's decisions "
     "(npyload_loader_auto_history) numbered since and later, of the last 32."},
    {"_set_stream_joiner", (PyCFunction)loader_set_stream_joiner, METH_O,
     "_set_stream_joiner(fn): fn(device, [stream ints]) -> stream int, "
     "called when a device batch handed to several CUDA streams is released; "
     "it must return a stream ordered after the work queued on all of them "
     "(npyload.Loader sets one built on torch)."},
    {"close", (PyCFunction)loader_close, METH_NOARGS,
     "close(): stop the workers and free the loader now (files, rings, free "
     "slots); batches still alive keep only their own slots, until they die."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef loader_getset[] = {
    {"backend", (getter)loader_get_backend, NULL,
     "name of the active io backend ('auto' before start)", NULL},
    {"field_names", (getter)loader_get_field_names, NULL,
     "tuple of the field names, in the order they were added", NULL},
    {"closed", (getter)loader_get_closed, NULL, "True after close()", NULL},
    {"started", (getter)loader_get_started, NULL,
     "True from a start() that succeeded (even one a Ctrl-C interrupted as it "
     "returned) until stop() or close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject NpyloadPy_LoaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npyload._npyload.Loader",
    .tp_basicsize = sizeof(NpyloadPy_Loader),
    .tp_dealloc = (destructor)loader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Low-level owner of one npyload_loader (see npyload.Loader).",
    .tp_methods = loader_methods,
    .tp_getset = loader_getset,
    .tp_new = loader_new,
};
