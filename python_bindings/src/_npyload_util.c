/*
 * npyload._npyload's helpers, below every type (calls go down: nothing here
 * calls the module, the loader, the batch or the view): the exception and
 * raising it, decoding the library's strings, int64 arguments, a batch's
 * list of consumer streams (the Batch and its Views both add to it), and
 * the remote configuration dict as npyload_remote.
 */
#include "_npyload.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

PyObject *NpyloadPy_Error = NULL;

int npyloadpy_can_run_python(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsInitialized() && !Py_IsFinalizing();
#else
    return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

PyObject *npyloadpy_str(const char *s)
{
    return PyUnicode_DecodeFSDefault(s ? s : "");
}

PyObject *npyloadpy_raise(int rc, const char *detail)
{
    const char *msg = (detail && detail[0]) ? detail : npyload_strerror(rc);
    /* The library's messages are masked; this also covers what the
     * extension formats itself with a path. */
    char shown[2048];
    npyload_mask_urls(msg, shown, sizeof shown);
    PyObject *text = npyloadpy_str(shown);
    if (!text)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(NpyloadPy_Error, text);
    Py_DECREF(text);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong(rc);
    if (!code || PyObject_SetAttrString(exc, "code", code) < 0) {
        Py_XDECREF(code);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(code);
    PyErr_SetObject(NpyloadPy_Error, exc);
    Py_DECREF(exc);
    return NULL;
}

int npyloadpy_as_int64(PyObject *o, const char *what, int64_t *out)
{
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.80s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *idx = PyNumber_Index(o);
    if (!idx)
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s is out of the int64 range", what);
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

int npyloadpy_batch_note_stream(NpyloadPy_Batch *self, void *s)
{
    for (Py_ssize_t i = 0; i < self->nstreams; i++)
        if (self->streams[i] == s)
            return 0;
    if (self->nstreams == self->streams_cap) {
        Py_ssize_t cap = self->streams_cap ? 2 * self->streams_cap : 4;
        void **p = PyMem_Realloc(self->streams, (size_t)cap * sizeof *p);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        self->streams = p;
        self->streams_cap = cap;
    }
    self->streams[self->nstreams++] = s;
    return 0;
}

/* The npyload_remote members a configuration dict may set, by C name.
 * Strings take the keep[] slots in this order (NPYLOADPY_REMOTE_STRINGS of
 * them); a secret's bytes are wiped when released. */
enum { RM_STR, RM_SECRET, RM_INT, RM_INT64 };
static const struct {
    const char *name;
    size_t off;
    int kind;
} REMOTE_MEMBERS[] = {
    {"endpoint", offsetof(npyload_remote, endpoint), RM_STR},
    {"region", offsetof(npyload_remote, region), RM_STR},
    {"access_key", offsetof(npyload_remote, access_key), RM_STR},
    {"secret_key", offsetof(npyload_remote, secret_key), RM_SECRET},
    {"session_token", offsetof(npyload_remote, session_token), RM_SECRET},
    {"cache_dir", offsetof(npyload_remote, cache_dir), RM_STR},
    {"ca_file", offsetof(npyload_remote, ca_file), RM_STR},
    {"proxy", offsetof(npyload_remote, proxy), RM_STR},
    {"path_style", offsetof(npyload_remote, path_style), RM_INT},
    {"retries", offsetof(npyload_remote, retries), RM_INT},
    {"timeout_ms", offsetof(npyload_remote, timeout_ms), RM_INT64},
    {"connect_timeout_ms", offsetof(npyload_remote, connect_timeout_ms), RM_INT64},
    {"max_inflight", offsetof(npyload_remote, max_inflight), RM_INT},
    {"cache_bytes", offsetof(npyload_remote, cache_bytes), RM_INT64},
    {"cache_block", offsetof(npyload_remote, cache_block), RM_INT64},
    {"list_max_keys", offsetof(npyload_remote, list_max_keys), RM_INT64},
    {"retry_base_ms", offsetof(npyload_remote, retry_base_ms), RM_INT64},
};
#define NREMOTE_MEMBERS (sizeof REMOTE_MEMBERS / sizeof REMOTE_MEMBERS[0])

/* One member's value into *r (strings into keep[slot]). 0 or -1. */
static int remote_member(size_t m, PyObject *val, npyload_remote *r, PyObject **keep)
{
    char *dst = (char *)r + REMOTE_MEMBERS[m].off;
    if (REMOTE_MEMBERS[m].kind <= RM_SECRET) {
        Py_CLEAR(*keep);
        if (!PyUnicode_FSConverter(val, keep))
            return -1;
        *(const char **)dst = PyBytes_AS_STRING(*keep);
        return 0;
    }
    long long v = PyLong_AsLongLong(val);
    if (v == -1 && PyErr_Occurred())
        return -1;
    int wide = REMOTE_MEMBERS[m].kind == RM_INT64;
    if (v < INT32_MIN || (!wide && v > INT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "set_remote: %s out of range", REMOTE_MEMBERS[m].name);
        return -1;
    }
    if (wide)
        *(int64_t *)dst = v;
    else
        *(int *)dst = (int)v;
    return 0;
}

/* The npyload_remote members from a mapping {C member name: value}
 * (npyload._remote builds it: arguments, the AWS environment and ~/.aws,
 * units converted). Strings are str or None, numbers int. The strings
 * stay valid while keep[] holds them: npyloadpy_remote_release wipes the
 * secret and the token and drops them. Returns 0 or -1 with an exception. */
int npyloadpy_remote_config(PyObject *d, npyload_remote *r,
                            PyObject *keep[NPYLOADPY_REMOTE_STRINGS])
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < NPYLOADPY_REMOTE_STRINGS; i++)
        keep[i] = NULL;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "the remote configuration must be a dict");
        return -1;
    }
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &val)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!k) {
            PyErr_SetString(PyExc_TypeError, "set_remote: keys must be str");
            goto fail;
        }
        size_t m = 0;
        while (m < NREMOTE_MEMBERS && strcmp(k, REMOTE_MEMBERS[m].name) != 0)
            m++;
        if (m == NREMOTE_MEMBERS) {
            PyErr_Format(PyExc_TypeError, "set_remote: unknown member %R", key);
            goto fail;
        }
        /* The strings come first in the table: m is also their slot. */
        if (val != Py_None && remote_member(m, val, r, m < NPYLOADPY_REMOTE_STRINGS
                                                           ? &keep[m] : NULL) < 0)
            goto fail;
    }
    return 0;
fail:
    npyloadpy_remote_release(keep);
    return -1;
}

void npyloadpy_remote_release(PyObject *keep[NPYLOADPY_REMOTE_STRINGS])
{
    for (int i = 0; i < NPYLOADPY_REMOTE_STRINGS; i++) {
        if (keep[i] && REMOTE_MEMBERS[i].kind == RM_SECRET)
            memset(PyBytes_AS_STRING(keep[i]), 0, (size_t)PyBytes_GET_SIZE(keep[i]));
        Py_CLEAR(keep[i]);
    }
}
