/*
 * Internal declarations shared by the files of the extension npyload._npyload.
 * One .c file per Python type (python-zstandard's c-ext layout):
 *   _npyload_module.c  module init, NpyloadError, inspect(), load(), order
 *   _npyload_loader.c  _npyload.Loader   (owns an npyload_loader)
 *   _npyload_batch.c   _npyload.Batch    (owns one npyload_batch)
 *   _npyload_view.c    _npyload.View     (one field of a batch: array
 *                                          interface and DLPack exporter)
 *   _npyload_prefetch.c _npyload.Prefetch (owns an npyload_prefetch)
 *   _npyload_util.c    the helpers below them all (the exception, strings,
 *                      int64 arguments, a batch's stream list, the remote
 *                      configuration)
 * Calls go down: module -> loader -> batch -> view -> util, module ->
 * prefetch -> util (checked on the object files by scripts/check_calls.py
 * when the extension is built).
 *
 * Lifetime rule (the one thing to keep in mind when reading these files):
 *   tensor/ndarray --> View --> Batch --(npyload_batch_release)--> slot
 *   Every exported array keeps its View alive (numpy: the array's base;
 *   torch: the DLPack deleter), every View keeps its Batch alive, and the
 *   Batch's dealloc gives the slot back. The Loader is NOT kept alive by its
 *   batches: close() and dealloc destroy it at once (workers stopped, files,
 *   io_uring rings and free slots released by the C library), and only the
 *   slots still held by batches live on until their last release (the
 *   "zombie" rule of npyload_loader_destroy, like sqlite3_close_v2). The
 *   binding holds nothing else of a closed loader: a Batch keeps its
 *   npyload_batch and the shared tuple of field names, nothing more.
 *
 * Only include/npyload.h is used from the library.
 */
#ifndef NPYLOAD_PY_H
#define NPYLOAD_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "npyload.h"

/* The module's exception: npyload.NpyloadError(RuntimeError), with .code. */
extern PyObject *NpyloadPy_Error;

/* A str from bytes the C library produced (a path, or a message that holds
 * paths): the file-system encoding with surrogateescape, as os.fsdecode.
 * Paths need not be UTF-8, and a message cut at its buffer's end may stop
 * inside a character; either way the bytes survive (os.fsencode gives them
 * back) instead of turning the error into a UnicodeDecodeError. */
PyObject *npyloadpy_str(const char *s);

/* Raises NpyloadError(code=rc) with `detail`, or npyload_strerror(rc) when
 * detail is NULL or empty; the text is decoded by npyloadpy_str. Returns NULL. */
PyObject *npyloadpy_raise(int rc, const char *detail);

typedef struct NpyloadPy_Loader {
    PyObject_HEAD
    npyload_loader *L;
    int started;
    /* The in-use guard: the name of the call in progress ("next()",
     * "set_epoch()", "close()", ...; a static string), NULL when none.
     * Set and tested with the GIL held; kept while the call runs without
     * the GIL, so a call from another thread meanwhile is refused (the C
     * API allows one caller at a time, and destroy must race with
     * nothing). Only stats() and the backend attribute may run while it
     * says "next()" (see _npyload_loader.c). */
    const char *busy;
    PyObject *field_names; /* tuple of str, built at start */
    PyObject *joiner;      /* given to every batch (see NpyloadPy_Batch) */
} NpyloadPy_Loader;

typedef struct NpyloadPy_Batch {
    PyObject_HEAD
    npyload_batch *b;      /* NULL once released */
    PyObject *field_names; /* tuple of str (shared with the loader) */
    Py_ssize_t live_views; /* Views alive on this batch */
    int device;            /* -1 host, k CUDA device */
    /* Every CUDA stream the batch was handed to (__dlpack__, wait_stream):
     * distinct cudaStream_t values (NULL = legacy default) in first-seen
     * order, PyMem-allocated. The slot is released after the work queued on
     * all of them: on the one stream when there is one, else on the stream
     * that `joiner` returns after making it wait for all of them. */
    void **streams;
    Py_ssize_t nstreams, streams_cap;
    /* callable(device, [stream ints]) -> stream int, or NULL. The npyload
     * package gives one built on torch (the only way device batches reach
     * Python); the C library releases a slot on one stream only. */
    PyObject *joiner;
} NpyloadPy_Batch;

typedef struct NpyloadPy_View {
    PyObject_HEAD
    NpyloadPy_Batch *batch; /* strong reference: keeps the slot */
    npyload_array arr;      /* copy of the field's description */
    int is_indices;         /* the view is the batch's index array */
} NpyloadPy_View;

extern PyTypeObject NpyloadPy_LoaderType;
extern PyTypeObject NpyloadPy_BatchType;
extern PyTypeObject NpyloadPy_ViewType;
extern PyTypeObject NpyloadPy_PrefetchType; /* _npyload_prefetch.c */

/* New Batch owning `b` (released by the Batch's dealloc). Steals `b` even on
 * failure (then releases it). `joiner` may be NULL. */
PyObject *npyloadpy_batch_new(npyload_batch *b, PyObject *field_names,
                              PyObject *joiner);

/* Records that `batch` was handed to CUDA stream `s` (device batches: the
 * view's __dlpack__ and Batch.wait_stream). -1 with MemoryError set. */
int npyloadpy_batch_note_stream(NpyloadPy_Batch *batch, void *s);

/* New View on field `i` of `batch` (or on its indices when i == (size_t)-1).
 * The view holds a reference to the batch. */
PyObject *npyloadpy_view_new(NpyloadPy_Batch *batch, size_t i);

/* 0 while the interpreter is finalising (or gone): a deleter or dealloc
 * reached then must not run Python code. */
int npyloadpy_can_run_python(void);

/* Parses an int64 from a Python int, refusing bool. */
int npyloadpy_as_int64(PyObject *o, const char *what, int64_t *out);

/* A remote configuration dict (npyload._remote.build) as npyload_remote;
 * keep[] holds its strings until npyloadpy_remote_release (which wipes the
 * secret). 0, or -1 with an exception set. */
#define NPYLOADPY_REMOTE_STRINGS 8 /* the string members of npyload_remote */
int npyloadpy_remote_config(PyObject *d, npyload_remote *r,
                            PyObject *keep[NPYLOADPY_REMOTE_STRINGS]);
void npyloadpy_remote_release(PyObject *keep[NPYLOADPY_REMOTE_STRINGS]);

#endif /* NPYLOAD_PY_H */
