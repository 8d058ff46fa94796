/*
 * npyload._npyload: module init (the types, the exception class, the
 * constants) and the functions that need no loader: inspect(), load(),
 * order_indices(), cuda_available(), pack_file(). The top of the
 * extension: nothing calls into it.
 */
#include "_npyload.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* Reads a header with the GIL released (it is file I/O). */
static int read_header(PyObject *path_obj, npyload_header *h, PyObject **bytes)
{
    if (!PyUnicode_FSConverter(path_obj, bytes))
        return -1;
    const char *path = PyBytes_AS_STRING(*bytes);
    char err[1024];
    int rc;
    err[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_read_header(path, h, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (!err[0])
            snprintf(err, sizeof err, "%s: %s", path, npyload_strerror(rc));
        npyloadpy_raise(rc, err);
        Py_CLEAR(*bytes);
        return -1;
    }
    return 0;
}

static PyObject *shape_tuple(int ndim, const int64_t *shape)
{
    PyObject *t = PyTuple_New(ndim);
    if (!t)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *v = PyLong_FromLongLong((long long)shape[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

PyDoc_STRVAR(inspect_doc,
"inspect(path, verify=False, remote=None) -> dict\n\n"
"Header facts of one NPY file, read without loading the data: version\n"
"(major, minor), descr (numpy dtype string), shape, fortran_order,\n"
"itemsize, header_len, data_offset, data_bytes, file_bytes.\n"
"A .npy.zst (told by its first bytes) gives the facts of the .npy it holds,\n"
"the same keys and values, plus compressed_bytes, ratio, frames (frame 0,\n"
"the header, in) and samples_per_frame, as npyload-inspect does.\n"
"A narrowed file, packed or stored (npyload-pack --narrow [--store]), adds\n"
"narrow_values (codes in its table) and value_descr (the dtype the loader\n"
"delivers; descr is its codes', '|u1').\n"
"With verify=True every frame of a .npy.zst is also read and decoded with\n"
"the loader's checks (sizes, checksums, zstd windows; the whole file is\n"
"read, without the GIL) and the dict gets verified=True and checksums\n"
"(whether the frames carry them); a .npy has no checksums and is\n"
"inspected as without verify.\n"
"An s3:// or http(s):// path is read with ranged GETs (its header and, for\n"
"a .npy.zst, its seek table and frame 0; verify reads every frame) with\n"
"the configuration `remote` (the dict npyload._remote.build makes; None:\n"
"the defaults, enough for http(s)://).\n"
"Raises NpyloadError (with the file name) for a malformed or truncated file\n"
"or seek table, and with verify=True for the first bad frame: the message\n"
"names the file, the frame index, its byte offset and what is wrong.");

static PyObject *header_dict(const npyload_header *h);

/* A narrowed file's keys (its header is the codes'): narrow_values and
 * value_descr, the dtype the loader delivers. d is consumed on failure. */
static PyObject *with_narrow(PyObject *d, uint32_t values, const char *value_descr)
{
    PyObject *nv = d ? PyLong_FromUnsignedLong(values) : NULL;
    PyObject *vd = nv ? npyloadpy_str(value_descr) : NULL;
    if (!vd || PyDict_SetItemString(d, "narrow_values", nv) < 0 ||
        PyDict_SetItemString(d, "value_descr", vd) < 0)
        Py_CLEAR(d);
    Py_XDECREF(nv);
    Py_XDECREF(vd);
    return d;
}

/* The dict of a .npy: its header, and for the stored narrowed form
 * (narrowed: npyload_narrow_stored's 1) the table's facts. */
static PyObject *npy_dict(const npyload_header *h, int narrowed, uint32_t values,
                          const char *value_descr)
{
    PyObject *d = header_dict(h);
    return narrowed == 1 ? with_narrow(d, values, value_descr) : d;
}

/* The dict of an open .npy.zst: the .npy's facts plus the compression's
 * (verified: verify ran and passed). */
static PyObject *zst_dict(const npyload_zst_file *z, int verify)
{
    const npyload_zst_facts *f = npyload_zst_file_facts(z);
    PyObject *d = header_dict(&f->hdr);
    double ratio = f->compressed_bytes ? (double)f->hdr.file_bytes / (double)f->compressed_bytes
                                       : 0.0;
    PyObject *v[6] = {PyLong_FromUnsignedLongLong(f->compressed_bytes),
                      PyFloat_FromDouble(ratio), PyLong_FromUnsignedLong(f->frames),
                      PyLong_FromUnsignedLongLong(f->samples_per_frame),
                      PyBool_FromLong(1), PyBool_FromLong(f->checksums)};
    static const char *keys[6] = {"compressed_bytes", "ratio", "frames", "samples_per_frame",
                                  "verified", "checksums"};
    int nkeys = verify ? 6 : 4;
    if (d && f->narrow_values) /* narrowed: hdr is the codes' */
        d = with_narrow(d, f->narrow_values, f->value_descr);
    for (int i = 0; i < 6; i++) {
        if (i < nkeys && d && (!v[i] || PyDict_SetItemString(d, keys[i], v[i]) < 0))
            Py_CLEAR(d);
        Py_XDECREF(v[i]);
    }
    return d;
}

/* inspect() of a .npy.zst: the .npy's facts plus the compression's; with
 * `verify`, after every frame was decoded and checked. */
static PyObject *inspect_zst(const char *path, int verify)
{
    npyload_zst_file *z = NULL;
    char err[1024];
    int rc;
    err[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_zst_file_open(path, &z, err, sizeof err);
    if (rc == 0 && verify)
        rc = npyload_zst_file_verify(z, NULL, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) {
        npyload_zst_file_close(z);
        if (!err[0])
            snprintf(err, sizeof err, "%s: %s", path, npyload_strerror(rc));
        npyloadpy_raise(rc, err);
        return NULL;
    }
    PyObject *d = zst_dict(z, verify);
    npyload_zst_file_close(z);
    return d;
}

/* inspect() of an s3:// or http(s):// object: ranged GETs through a
 * client made for the call (`remote`: the configuration dict, or None for
 * the defaults), the same facts as for the local file. */
static PyObject *inspect_remote(const char *path, PyObject *remote, int verify)
{
    npyload_remote r;
    PyObject *keep[NPYLOADPY_REMOTE_STRINGS];
    int have = remote && remote != Py_None;
    if (have && npyloadpy_remote_config(remote, &r, keep) < 0)
        return NULL;
    npyload_remote_client *c = NULL;
    npyload_zst_file *z = NULL;
    npyload_header h;
    char err[1024], vdescr[NPYLOAD_DESCR_LEN] = "";
    uint32_t nvalues = 0;
    int rc, narrowed = 0;
    err[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_remote_client_create(&c, have ? &r : NULL, sizeof r, err, sizeof err);
    if (rc == 0)
        rc = npyload_remote_inspect(c, path, &h, &z, err, sizeof err);
    if (rc == 0 && z && verify)
        rc = npyload_zst_file_verify(z, NULL, err, sizeof err);
    if (rc == 0 && !z && (narrowed = npyload_remote_narrow_stored(c, path, &h, &nvalues, NULL,
                                                                  vdescr, err, sizeof err)) < 0)
        rc = narrowed;
    Py_END_ALLOW_THREADS
    if (have)
        npyloadpy_remote_release(keep);
    PyObject *d = NULL;
    if (rc) {
        if (!err[0])
            snprintf(err, sizeof err, "%s: %s", path, npyload_strerror(rc));
        npyloadpy_raise(rc, err);
    } else {
        d = z ? zst_dict(z, verify) : npy_dict(&h, narrowed, nvalues, vdescr);
    }
    npyload_zst_file_close(z);
    npyload_remote_client_destroy(c);
    return d;
}

static PyObject *mod_inspect(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "verify", "remote", NULL};
    PyObject *path_obj, *bytes = NULL, *remote = Py_None;
    int verify = 0;
    npyload_header h;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pO:inspect", kwlist, &path_obj, &verify,
                                     &remote))
        return NULL;
    if (!PyUnicode_FSConverter(path_obj, &bytes))
        return NULL;
    if (npyload_is_remote(PyBytes_AS_STRING(bytes))) {
        PyObject *d = inspect_remote(PyBytes_AS_STRING(bytes), remote, verify);
        Py_DECREF(bytes);
        return d;
    }
    int zst;
    Py_BEGIN_ALLOW_THREADS
    zst = npyload_zst_probe(PyBytes_AS_STRING(bytes));
    Py_END_ALLOW_THREADS
    if (zst == 1) {
        PyObject *d = inspect_zst(PyBytes_AS_STRING(bytes), verify);
        Py_DECREF(bytes);
        return d;
    }
    Py_CLEAR(bytes);
    if (read_header(path_obj, &h, &bytes) < 0)
        return NULL;
    char err[1024] = "", vdescr[NPYLOAD_DESCR_LEN] = "";
    uint32_t nvalues = 0;
    int narrowed;
    Py_BEGIN_ALLOW_THREADS
    narrowed = npyload_narrow_stored(PyBytes_AS_STRING(bytes), &h, &nvalues, NULL, vdescr, err,
                                     sizeof err);
    Py_END_ALLOW_THREADS
    Py_DECREF(bytes);
    if (narrowed < 0)
        return npyloadpy_raise(narrowed, err);
    return npy_dict(&h, narrowed, nvalues, vdescr);
}

static PyObject *header_dict(const npyload_header *hp)
{
    npyload_header h = *hp;
    PyObject *shape = shape_tuple(h.ndim, h.shape);
    if (!shape)
        return NULL;
    return Py_BuildValue(
        "{s:(ii),s:s,s:N,s:O,s:n,s:K,s:K,s:K,s:K}",
        "version", h.major_version, h.minor_version,
        "descr", h.descr,
        "shape", shape,
        "fortran_order", h.fortran_order ? Py_True : Py_False,
        "itemsize", (Py_ssize_t)h.itemsize,
        "header_len", (unsigned long long)h.header_len,
        "data_offset", (unsigned long long)h.data_offset,
        "data_bytes", (unsigned long long)h.data_bytes,
        "file_bytes", (unsigned long long)h.file_bytes);
}

PyDoc_STRVAR(load_doc,
"load(path, mmap=True) -> numpy.ndarray\n\n"
"Reads one NPY file with npyload's header parser. With mmap=True the result\n"
"is a read-only numpy.memmap over the file's data (nothing is read until\n"
"used); with mmap=False the data is read into a new array. numpy is\n"
"imported on first use (it is not needed by the rest of npyload).");

static PyObject *mod_load(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "mmap", NULL};
    PyObject *path_obj, *bytes = NULL;
    int use_mmap = 1;
    npyload_header h;
    PyObject *np = NULL, *dtype = NULL, *shape = NULL, *res = NULL;
    PyObject *fn = NULL, *a = NULL, *kwargs = NULL, *tmp = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:load", kwlist, &path_obj,
                                     &use_mmap))
        return NULL;
    if (read_header(path_obj, &h, &bytes) < 0)
        return NULL;
    np = PyImport_ImportModule("numpy");
    if (!np)
        goto done;
    dtype = PyObject_CallMethod(np, "dtype", "s", h.descr);
    if (!dtype)
        goto done;
    shape = shape_tuple(h.ndim, h.shape);
    if (!shape)
        goto done;
    const char *order = h.fortran_order ? "F" : "C";
    if (h.data_bytes == 0) {
        res = PyObject_CallMethod(np, "empty", "OOs", shape, dtype, order);
    } else if (use_mmap) {
        fn = PyObject_GetAttrString(np, "memmap");
        if (!fn)
            goto done;
        a = Py_BuildValue("(O)", bytes);
        kwargs = Py_BuildValue("{s:O,s:s,s:K,s:O,s:s}", "dtype", dtype,
                               "mode", "r", "offset",
                               (unsigned long long)h.data_offset, "shape",
                               shape, "order", order);
        if (!a || !kwargs)
            goto done;
        res = PyObject_Call(fn, a, kwargs);
    } else {
        fn = PyObject_GetAttrString(np, "fromfile");
        if (!fn)
            goto done;
        a = Py_BuildValue("(O)", bytes);
        kwargs = Py_BuildValue("{s:O,s:K,s:K}", "dtype", dtype, "count",
                               (unsigned long long)(h.data_bytes / h.itemsize),
                               "offset", (unsigned long long)h.data_offset);
        if (!a || !kwargs)
            goto done;
        tmp = PyObject_Call(fn, a, kwargs);
        if (!tmp)
            goto done;
        Py_DECREF(kwargs);
        kwargs = Py_BuildValue("{s:s}", "order", order);
        Py_DECREF(a);
        a = Py_BuildValue("(O)", shape);
        PyObject *reshape = PyObject_GetAttrString(tmp, "reshape");
        if (reshape && a && kwargs)
            res = PyObject_Call(reshape, a, kwargs);
        Py_XDECREF(reshape);
    }
done:
    Py_XDECREF(tmp);
    Py_XDECREF(kwargs);
    Py_XDECREF(a);
    Py_XDECREF(fn);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(np);
    Py_XDECREF(bytes);
    return res;
}

PyDoc_STRVAR(order_doc,
"order_indices(n, shuffle, seed, epoch, rank, world_size, drop_last,\n"
"              batch_size, file_sizes=None, window=0) -> list[int]\n\n"
"The sample indices that `rank` of `world_size` gets in `epoch`, in the\n"
"order a loader with these options yields them (batches concatenated).\n"
"shuffle: 0 none, 1 full, 2 local (local needs file_sizes, the sample\n"
"counts of the first field's files).");

static PyObject *mod_order_indices(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n", "shuffle", "seed", "epoch", "rank",
                             "world_size", "drop_last", "batch_size",
                             "file_sizes", "window", NULL};
    long long n, seed, rank, ws, bs, window = 0;
    unsigned long long epoch;
    int shuffle, drop_last;
    PyObject *fs_obj = Py_None;
    int64_t *fs = NULL, *out = NULL;
    size_t nfs = 0;
    PyObject *res = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LiLKLLpL|OL:order_indices",
                                     kwlist, &n, &shuffle, &seed, &epoch,
                                     &rank, &ws, &drop_last, &bs, &fs_obj,
                                     &window))
        return NULL;
    if (fs_obj != Py_None) {
        PyObject *seq = PySequence_Fast(fs_obj, "file_sizes must be a sequence of ints");
        if (!seq)
            return NULL;
        nfs = (size_t)PySequence_Fast_GET_SIZE(seq);
        fs = PyMem_Malloc((nfs ? nfs : 1) * sizeof *fs);
        if (!fs) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        for (size_t i = 0; i < nfs; i++) {
            if (npyloadpy_as_int64(PySequence_Fast_GET_ITEM(seq, i),
                                   "file_sizes[i]", &fs[i]) < 0) {
                Py_DECREF(seq);
                PyMem_Free(fs);
                return NULL;
            }
        }
        Py_DECREF(seq);
    }
    int64_t cnt = npyload_order_indices(n, shuffle, seed, epoch, rank, ws,
                                        drop_last, bs, fs, nfs, window, NULL, 0);
    if (cnt < 0) {
        PyMem_Free(fs);
        return npyloadpy_raise((int)cnt, NULL);
    }
    out = PyMem_Malloc((cnt ? (size_t)cnt : 1) * sizeof *out);
    if (!out) {
        PyMem_Free(fs);
        return PyErr_NoMemory();
    }
    int64_t got = npyload_order_indices(n, shuffle, seed, epoch, rank, ws,
                                        drop_last, bs, fs, nfs, window, out,
                                        (size_t)cnt);
    PyMem_Free(fs);
    if (got < 0) {
        PyMem_Free(out);
        return npyloadpy_raise((int)got, NULL);
    }
    if (got > cnt)
        got = cnt;
    res = PyList_New((Py_ssize_t)got);
    for (int64_t i = 0; res && i < got; i++) {
        PyObject *v = PyLong_FromLongLong((long long)out[i]);
        if (!v) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)i, v);
    }
    PyMem_Free(out);
    return res;
}

static PyObject *mod_strerror(PyObject *self, PyObject *arg)
{
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(arg, &overflow);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || v < INT32_MIN || v > INT32_MAX)
        return PyUnicode_FromString("unknown error");
    return PyUnicode_FromString(npyload_strerror((int)v));
}

static PyObject *mod_cuda_available(PyObject *self, PyObject *args)
{
    int dev = 0;
    char why[512];
    if (!PyArg_ParseTuple(args, "|i:cuda_available", &dev))
        return NULL;
    why[0] = 0;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = npyload_cuda_available(dev, why, sizeof why);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ON)", ok ? Py_True : Py_False,
                         npyloadpy_str(ok ? "" : why));
}

/* h2d_bandwidth(device=0, nbytes=64 MiB, iters=20) -> GB/s. */
static PyObject *mod_h2d_bandwidth(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"device", "nbytes", "iters", NULL};
    int dev = 0, iters = 20;
    Py_ssize_t nbytes = 64 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|ini:h2d_bandwidth", kwlist, &dev, &nbytes,
                                     &iters))
        return NULL;
    double gbps = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_cuda_h2d_bandwidth(dev, nbytes < 0 ? 0 : (size_t)nbytes, iters, &gbps);
    Py_END_ALLOW_THREADS
    if (rc)
        return npyloadpy_raise(rc, NULL);
    return PyFloat_FromDouble(gbps);
}

/* "12.4" from CUDA's 12040; "" for 0 (not found). */
static PyObject *cuda_version_str(int v)
{
    if (v <= 0)
        return PyUnicode_FromString("");
    return PyUnicode_FromFormat("%d.%d", v / 1000, (v % 1000) / 10);
}

static PyObject *mod_build_info(PyObject *self, PyObject *noargs)
{
    npyload_build_info bi;
    int rc;
    /* It probes io_uring and looks for the CUDA runtime (a driver's
     * initialisation can take a while): without the GIL. */
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_get_build_info(&bi, sizeof bi);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return npyloadpy_raise(rc, "npyload_get_build_info failed");
    return Py_BuildValue(
        "{s:N,s:O,s:O,s:N,s:N,s:N,s:N,s:O,s:i,s:N,s:N,s:N,s:N,s:N,s:O,s:N,s:N,"
        "s:O,s:O,s:L,s:L,s:L,s:L,s:s,s:O,s:O,s:O,s:N,s:N,s:N,s:O,s:N}",
        "version", npyloadpy_str(bi.version),
        "uring_compiled", bi.uring_compiled ? Py_True : Py_False,
        "uring_usable", bi.uring_usable ? Py_True : Py_False,
        "liburing_version", npyloadpy_str(bi.liburing_version),
        "uring_why", npyloadpy_str(bi.uring_why),
        "zstd_compiled", npyloadpy_str(bi.zstd_compiled),
        "zstd_loaded", npyloadpy_str(bi.zstd_loaded),
        "cuda_runtime_found", bi.cuda_runtime_found ? Py_True : Py_False,
        "cuda_devices", bi.cuda_devices,
        "cuda_runtime_version", cuda_version_str(bi.cuda_runtime_version),
        "cuda_driver_version", cuda_version_str(bi.cuda_driver_version),
        "cuda_runtime_soname", npyloadpy_str(bi.cuda_runtime_soname),
        "cuda_runtime_path", npyloadpy_str(bi.cuda_runtime_path),
        "cuda_why", npyloadpy_str(bi.cuda_why),
        "transform_kernels", bi.transform_kernels ? Py_True : Py_False,
        "transform_kernel_archs", npyloadpy_str(bi.transform_kernel_archs),
        "transform_kernels_why", npyloadpy_str(bi.transform_kernels_why),
        "f16c_compiled", bi.f16c_compiled ? Py_True : Py_False,
        "f16c_used", bi.f16c_used ? Py_True : Py_False,
        "default_num_workers", (long long)bi.default_num_workers,
        "default_prefetch", (long long)bi.default_prefetch,
        "default_queue_depth", (long long)bi.default_queue_depth,
        "default_shuffle_window", (long long)bi.default_shuffle_window,
        "default_io_backend", npyload_backend_name((npyload_io_backend)bi.default_io_backend),
        "default_read_ahead", bi.default_read_ahead ? Py_True : Py_False,
        "transform_nvrtc", bi.transform_nvrtc ? Py_True : Py_False,
        "nvrtc_found", bi.nvrtc_found ? Py_True : Py_False,
        "nvrtc_version", cuda_version_str(bi.nvrtc_version),
        "nvrtc_path", npyloadpy_str(bi.nvrtc_path),
        "nvrtc_why", npyloadpy_str(bi.nvrtc_why),
        "remote_compiled", bi.remote_compiled ? Py_True : Py_False,
        "remote_version", npyloadpy_str(bi.remote_version));
}

static PyObject *mod_build_info_text(PyObject *self, PyObject *noargs)
{
    npyload_build_info bi;
    char text[4096];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_get_build_info(&bi, sizeof bi);
    if (rc == 0)
        npyload_build_info_text(&bi, text, sizeof text);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return npyloadpy_raise(rc, "npyload_get_build_info failed");
    return npyloadpy_str(text);
}

static PyObject *mod_default_prefetch(PyObject *self, PyObject *arg)
{
    long long w = PyLong_AsLongLong(arg);
    if (w == -1 && PyErr_Occurred())
        return NULL;
    int64_t slots = npyload_default_prefetch((int64_t)w);
    if (slots < 0)
        return npyloadpy_raise((int)slots, "default_prefetch: num_workers out of range");
    return PyLong_FromLongLong((long long)slots);
}

/* stats_verdict(stats, hook_ns=0): npyload_stats_verdict() of the counters
 * in a mapping (Loader.stats()'s keys; a missing key counts 0, device -1):
 * the verdict of given figures, without a loader. */
static PyObject *mod_stats_verdict(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stats", "hook_ns", NULL};
    PyObject *m;
    unsigned long long hook_ns = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|K:stats_verdict", kwlist, &m, &hook_ns))
        return NULL;
    if (!PyMapping_Check(m)) {
        PyErr_SetString(PyExc_TypeError, "stats_verdict: stats must be a mapping");
        return NULL;
    }
    npyload_stats s;
    memset(&s, 0, sizeof s);
    s.device = -1;
    static const struct { const char *key; size_t off; } u64[] = {
#define K(f) {#f, offsetof(npyload_stats, f)}
        K(batches_delivered), K(samples_delivered), K(wait_ns), K(io_ns), K(h2d_ns),
        K(num_slots), K(decode_ns), K(transform_ns), K(read_ahead_batches),
        K(read_wait_ns), K(elapsed_ns), K(step_ns), K(worker_cpu_ns), K(num_workers),
        K(read_blocked_ns), K(remote_requests), K(remote_wait_ns), K(cache_hits),
        K(cache_misses),
#undef K
    };
    for (size_t i = 0; i < sizeof u64 / sizeof u64[0]; i++) {
        PyObject *v = PyMapping_GetItemString(m, u64[i].key);
        if (!v) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError))
                return NULL;
            PyErr_Clear();
            continue;
        }
        unsigned long long x = PyLong_AsUnsignedLongLong(v);
        Py_DECREF(v);
        if (x == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        *(uint64_t *)(void *)((char *)&s + u64[i].off) = x;
    }
    PyObject *d = PyMapping_GetItemString(m, "device");
    if (d) {
        long dv = PyLong_AsLong(d);
        Py_DECREF(d);
        if (dv == -1 && PyErr_Occurred())
            return NULL;
        s.device = (int)dv;
    } else if (PyErr_ExceptionMatches(PyExc_KeyError)) {
        PyErr_Clear();
    } else {
        return NULL;
    }
    char verdict[512];
    npyload_stats_verdict(&s, hook_ns, verdict, sizeof verdict);
    return npyloadpy_str(verdict);
}

PyDoc_STRVAR(pack_file_doc,
"pack_file(path, out=None, level=0, frame_size=0, threads=0, force=False,\n"
"          checksum=True) -> dict\n\n"
"npyload_pack_file(): compresses one NPY file into a seekable .npy.zst\n"
"(out None: path + '.zst'); 0 means the library default for level,\n"
"frame_size and threads. Returns in_bytes, out_bytes, frames,\n"
"samples_per_frame, seconds and out. Raises NpyloadError naming the file\n"
"(code -EEXIST when out exists and force is False; a non-regular out is\n"
"refused even with force); Ctrl-C cancels between chunks (no partial\n"
"output) and raises KeyboardInterrupt. A number that does not fit the C\n"
"option raises ValueError naming it. Use npyload.pack().");

/* Called by npyload_pack_file on this thread between chunks, with the GIL
 * released: takes it to run signal handlers, and cancels the pack when one
 * raised (the exception stays set for pack_file to return). */
static int pack_progress(void *arg, uint64_t done, uint64_t total)
{
    (void)done;
    (void)total;
    int *raised = arg;
    PyGILState_STATE g = PyGILState_Ensure();
    if (PyErr_CheckSignals() < 0)
        *raised = 1;
    PyGILState_Release(g);
    return *raised;
}

static PyObject *mod_pack_file(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "out", "level", "frame_size", "threads",
                             "force", "checksum", "narrow", "store", NULL};
    PyObject *path_obj, *out_obj = Py_None, *in_b = NULL, *out_b = NULL;
    PyObject *level_obj = NULL, *frame_obj = NULL, *threads_obj = NULL;
    int force = 0, checksum = 1, narrow = 0, store = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOOpppp:pack_file", kwlist,
                                     &path_obj, &out_obj, &level_obj,
                                     &frame_obj, &threads_obj, &force,
                                     &checksum, &narrow, &store))
        return NULL;
    /* Narrowed to the C types with a ValueError naming the argument; the
     * library checks the ranges themselves (NpyloadError). */
    long long level = 0, frame_size = 0, threads = 0;
    struct {
        const char *name;
        PyObject *obj;
        long long *v, lo, hi;
    } nums[] = {
        {"level", level_obj, &level, INT_MIN, INT_MAX},
        {"frame_size", frame_obj, &frame_size, 0, LLONG_MAX},
        {"threads", threads_obj, &threads, INT_MIN, INT_MAX},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (!nums[i].obj)
            continue;
        if (!PyLong_Check(nums[i].obj)) {
            PyErr_Format(PyExc_TypeError, "pack_file: %s must be an int, got %R",
                         nums[i].name, nums[i].obj);
            return NULL;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(nums[i].obj, &overflow);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (overflow || v < nums[i].lo || v > nums[i].hi) {
            PyErr_Format(PyExc_ValueError, "pack_file: %s=%R out of range "
                         "(%lld .. %lld)", nums[i].name, nums[i].obj,
                         nums[i].lo, nums[i].hi);
            return NULL;
        }
        *nums[i].v = v;
    }
    if (!PyUnicode_FSConverter(path_obj, &in_b))
        return NULL;
    if (out_obj != Py_None && !PyUnicode_FSConverter(out_obj, &out_b)) {
        Py_DECREF(in_b);
        return NULL;
    }
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.level = (int)level;
    o.frame_size = (uint64_t)frame_size;
    o.threads = (int)threads;
    o.force = force;
    o.no_checksum = !checksum;
    o.narrow = narrow;
    o.store = store;
    int raised = 0;
    o.progress = pack_progress;
    o.progress_arg = &raised;
    const char *in = PyBytes_AS_STRING(in_b);
    const char *out = out_b ? PyBytes_AS_STRING(out_b) : NULL;
    npyload_pack_result r;
    char err[1024];
    int rc;
    err[0] = 0;
    memset(&r, 0, sizeof r);
    Py_BEGIN_ALLOW_THREADS
    rc = npyload_pack_file(in, out, &o, sizeof o, &r, sizeof r, err, sizeof err);
    Py_END_ALLOW_THREADS
    PyObject *res = NULL;
    if (raised && PyErr_Occurred()) {
        /* KeyboardInterrupt (or what a handler raised) */
    } else if (rc != 0) {
        if (!err[0])
            snprintf(err, sizeof err, "%s: %s", in, npyload_strerror(rc));
        npyloadpy_raise(rc, err);
    } else {
        PyObject *dst = NULL;
        if (out_b) {
            dst = npyloadpy_str(out);
        } else {
            size_t n = npyload_pack_default_out(in, store, NULL, 0) + 1;
            char *name = PyMem_Malloc(n);
            if (name) {
                npyload_pack_default_out(in, store, name, n);
                dst = npyloadpy_str(name);
                PyMem_Free(name);
            } else {
                PyErr_NoMemory();
            }
        }
        if (dst)
            res = Py_BuildValue("{s:K,s:K,s:K,s:K,s:d,s:N,s:K}",
                                "in_bytes", (unsigned long long)r.in_bytes,
                                "out_bytes", (unsigned long long)r.out_bytes,
                                "frames", (unsigned long long)r.frames,
                                "samples_per_frame", (unsigned long long)r.samples_per_frame,
                                "seconds", r.seconds, "out", dst,
                                "narrow_values", (unsigned long long)r.narrow_values);
    }
    Py_DECREF(in_b);
    Py_XDECREF(out_b);
    return res;
}

static PyObject *mod_mask_urls(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    const char *s = PyBytes_AS_STRING(b);
    size_t need = npyload_mask_urls(s, NULL, 0) + 1;
    char *buf = PyMem_Malloc(need);
    PyObject *res = NULL;
    if (!buf) {
        PyErr_NoMemory();
    } else {
        npyload_mask_urls(s, buf, need);
        res = npyloadpy_str(buf);
        PyMem_Free(buf);
    }
    Py_DECREF(b);
    return res;
}

static PyMethodDef module_methods[] = {
    {"inspect", (PyCFunction)(void (*)(void))mod_inspect,
     METH_VARARGS | METH_KEYWORDS, inspect_doc},
    {"load", (PyCFunction)(void (*)(void))mod_load,
     METH_VARARGS | METH_KEYWORDS, load_doc},
    {"order_indices", (PyCFunction)(void (*)(void))mod_order_indices,
     METH_VARARGS | METH_KEYWORDS, order_doc},
    {"pack_file", (PyCFunction)(void (*)(void))mod_pack_file,
     METH_VARARGS | METH_KEYWORDS, pack_file_doc},
    {"mask_urls", mod_mask_urls, METH_O,
     "mask_urls(text) -> str: npyload_mask_urls(): text with every URL's "
     "userinfo password shown as *** and its query string cut (?...), as "
     "every message of the library is."},
    {"strerror", mod_strerror, METH_O,
     "strerror(code) -> str: npyload_strerror() of an error code."},
    {"stats_verdict", (PyCFunction)(void (*)(void))mod_stats_verdict,
     METH_VARARGS | METH_KEYWORDS,
     "stats_verdict(stats, hook_ns=0) -> str: npyload_stats_verdict() of the "
     "counters in a mapping with Loader.stats()'s keys (a missing one counts 0, "
     "device -1): the verdict of given figures."},
    {"default_prefetch", mod_default_prefetch, METH_O,
     "default_prefetch(num_workers) -> int: npyload_default_prefetch(), the "
     "batch slots of a loader with PREFETCH 0 and NUM_WORKERS num_workers "
     "(0 the default count, -1 none)."},
    {"build_info_text", mod_build_info_text, METH_NOARGS,
     "build_info_text() -> str: npyload_build_info_text() of a fresh "
     "npyload_get_build_info(): the block `python -m npyload info` and "
     "npyload-bench start with."},
    {"build_info", mod_build_info, METH_NOARGS,
     "build_info() -> dict: npyload_get_build_info(), the library's build and "
     "what it finds on this machine (io_uring, zstd, the CUDA runtime, the "
     "device kernels, F16C, the defaults). npyload.build_info() adds the "
     "Python side."},
    {"h2d_bandwidth", (PyCFunction)(void (*)(void))mod_h2d_bandwidth,
     METH_VARARGS | METH_KEYWORDS,
     "h2d_bandwidth(device=0, nbytes=67108864, iters=20) -> float: pinned host-to-\n"
     "device copy bandwidth in GB/s (npyload_cuda_h2d_bandwidth)."},
    {"cuda_available", mod_cuda_available, METH_VARARGS,
     "cuda_available(device=0) -> (bool, reason): whether CUDA device "
     "`device` is usable by npyload (the runtime is loaded with dlopen)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_npyload",
    "C extension of npyload; use the `npyload` package instead.", -1,
    module_methods, NULL, NULL, NULL, NULL};

static int add_int(PyObject *m, const char *name, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (!o)
        return -1;
    if (PyModule_AddObject(m, name, o) < 0) {
        Py_DECREF(o);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__npyload(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    PyObject *dict = Py_BuildValue("{s:O,s:s}", "code", Py_None, "__doc__",
        "Raised for every failure reported by the npyload C library. The\n"
        "message says which file, offset or field and what was expected;\n"
        "`code` is the library's negative error code (NPYLOAD_E* or -errno).");
    if (!dict)
        goto fail;
    NpyloadPy_Error = PyErr_NewException("npyload.NpyloadError",
                                         PyExc_RuntimeError, dict);
    Py_DECREF(dict);
    if (!NpyloadPy_Error)
        goto fail;
    Py_INCREF(NpyloadPy_Error);
    if (PyModule_AddObject(m, "NpyloadError", NpyloadPy_Error) < 0) {
        Py_DECREF(NpyloadPy_Error);
        goto fail;
    }
    PyTypeObject *types[] = {&NpyloadPy_LoaderType, &NpyloadPy_BatchType,
                             &NpyloadPy_ViewType, &NpyloadPy_PrefetchType};
    const char *names[] = {"Loader", "Batch", "View", "Prefetch"};
    for (int i = 0; i < 4; i++) {
        if (PyType_Ready(types[i]) < 0)
            goto fail;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            goto fail;
        }
    }
    if (PyModule_AddStringConstant(m, "__version__", npyload_version_string()) < 0)
        goto fail;
#define ADD(name, v) if (add_int(m, name, (long long)(v)) < 0) goto fail
    /* Every option of the one table (npyload.h, NPYLOAD_OPTION_MAP). */
#define NPYLOAD_XX_OPT(name, value, doc) ADD("OPT_" #name, NPYLOAD_OPT_##name);
    NPYLOAD_OPTION_MAP(NPYLOAD_XX_OPT)
#undef NPYLOAD_XX_OPT
    ADD("PATH_NVRTC", NPYLOAD_PATH_NVRTC);
    ADD("PATH_KERNEL_CACHE", NPYLOAD_PATH_KERNEL_CACHE);
    ADD("PREFETCH_MAX_BYTES", NPYLOAD_PREFETCH_MAX_BYTES);
    ADD("PREFETCH_INFLIGHT", NPYLOAD_PREFETCH_INFLIGHT);
    ADD("PREFETCH_REQUEST_BYTES", NPYLOAD_PREFETCH_REQUEST_BYTES);
    ADD("IO_AUTO", NPYLOAD_IO_AUTO);
    ADD("IO_URING", NPYLOAD_IO_URING);
    ADD("IO_PREAD", NPYLOAD_IO_PREAD);
    ADD("IO_MMAP", NPYLOAD_IO_MMAP);
    ADD("SHUFFLE_NONE", NPYLOAD_SHUFFLE_NONE);
    ADD("SHUFFLE_FULL", NPYLOAD_SHUFFLE_FULL);
    ADD("SHUFFLE_LOCAL", NPYLOAD_SHUFFLE_LOCAL);
    ADD("CEILING_PREAD", NPYLOAD_CEILING_PREAD);
    ADD("CEILING_GATHER", NPYLOAD_CEILING_GATHER);
    ADD("CEILING_DIRECT", NPYLOAD_CEILING_DIRECT);
    ADD("AUTO", NPYLOAD_AUTO);
    ADD("PASS_START", NPYLOAD_PASS_START);
    ADD("PASS_RESUME", NPYLOAD_PASS_RESUME);
    ADD("PASS_ADVANCE", NPYLOAD_PASS_ADVANCE);
    ADD("EOF", NPYLOAD_EOF);
    ADD("STATE_VERSION", NPYLOAD_STATE_VERSION);
#define NPYLOAD_PY_ADD_ERR(name, code, msg) ADD("E" #name, code);
    NPYLOAD_ERROR_MAP(NPYLOAD_PY_ADD_ERR)
#undef NPYLOAD_PY_ADD_ERR
#undef ADD
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
