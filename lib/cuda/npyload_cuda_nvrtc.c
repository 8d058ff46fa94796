/* NVRTC through dlopen: the search, the compile of the embedded kernel
 * source, and the cache of compiled images (npyload_cuda_nvrtc.h says where
 * it looks and why). One dlopen per library, one table filled in one
 * function (resolve), as npyload_cuda.c does for the runtime. */
#include "npyload_cuda_nvrtc.h"
#include "npyload_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef NPYLOAD_HAVE_TRANSFORM_SOURCE
#include "npyl_tk_src_cu.h"
#include "npyl_tk_src_kparams.h"
#include "npyl_tk_src_rtc.h"
#endif

/* nvrtcResult is an enum (int), nvrtcProgram an opaque pointer. */
typedef int (*nvrtc_version_fn)(int *major, int *minor);
typedef const char *(*nvrtc_error_string_fn)(int result);
typedef int (*nvrtc_create_fn)(void **prog, const char *src, const char *name,
                               int nheaders, const char *const *headers,
                               const char *const *include_names);
typedef int (*nvrtc_destroy_fn)(void **prog);
typedef int (*nvrtc_compile_fn)(void *prog, int nopts, const char *const *opts);
typedef int (*nvrtc_size_fn)(void *prog, size_t *n);
typedef int (*nvrtc_get_fn)(void *prog, char *buf);
typedef int (*nvrtc_num_archs_fn)(int *n);
typedef int (*nvrtc_archs_fn)(int *archs);

struct npyl_nvrtc {
    void *lib;
    void *builtins; /* libnvrtc-builtins beside it, when found there */
    int version;    /* 13000 */
    char path[512];
    nvrtc_version_fn version_;
    nvrtc_error_string_fn error_string;
    nvrtc_create_fn create;
    nvrtc_destroy_fn destroy;
    nvrtc_compile_fn compile;
    nvrtc_size_fn log_size;
    nvrtc_get_fn log;
    nvrtc_size_fn ptx_size;
    nvrtc_get_fn ptx;
    nvrtc_size_fn cubin_size;
    nvrtc_get_fn cubin;
    nvrtc_num_archs_fn num_archs; /* optional (NVRTC >= 11.2) */
    nvrtc_archs_fn archs;
};

/* Newest first: the major that matches a CUDA 13 runtime, then older. */
static const char *const SONAMES[] = {"libnvrtc.so.13", "libnvrtc.so.12",
                                      "libnvrtc.so.11.2", "libnvrtc.so"};
#define NSONAMES (sizeof SONAMES / sizeof SONAMES[0])
/* The wheel layouts under a site-packages directory. */
static const char *const WHEEL_DIRS[] = {"nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"};

int npyl_nvrtc_source_built(char *why, size_t whylen)
{
#ifdef NPYLOAD_HAVE_TRANSFORM_SOURCE
    (void)why;
    (void)whylen;
    return 1;
#else
    npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
              "libnpyload was built with NPYLOAD_CUDA_KERNELS=OFF (no device "
              "transform kernels; host transforms work)");
    return 0;
#endif
}

/* ---- the search ---- */

/* dirname of `file` into out ("" when it has no '/'). */
static void dir_of(const char *file, char *out, size_t len)
{
    const char *slash = file ? strrchr(file, '/') : NULL;
    if (!slash) {
        if (len)
            out[0] = '\0';
        return;
    }
    snprintf(out, len, "%.*s", (int)(slash - file), file);
}

const npyl_nvrtc_where *npyl_nvrtc_default_where(npyl_nvrtc_places *p,
                                                 const char *override,
                                                 const char *cudart_path)
{
    memset(p, 0, sizeof *p);
    p->where.override = override && override[0] ? override : NULL;
    /* The runtime's directory, and the site-packages three levels above a
     * runtime that came from a wheel (ROOT/nvidia/cu13/lib/libcudart.so.13). */
    if (cudart_path && strchr(cudart_path, '/')) {
        dir_of(cudart_path, p->dirs[0], sizeof p->dirs[0]);
        p->dirp[p->where.ndirs++] = p->dirs[0];
        if (strstr(cudart_path, "/nvidia/")) {
            snprintf(p->roots[0], sizeof p->roots[0], "%.500s/../../..", p->dirs[0]);
            p->rootp[p->where.nroots++] = p->roots[0];
        }
    }
    /* The file holding this code: site-packages/npyload/_npyload*.so for the
     * wheel, so its parent is a site-packages directory. */
    Dl_info di;
    if (dladdr((void *)npyl_nvrtc_default_where, &di) && di.dli_fname &&
        strchr(di.dli_fname, '/')) {
        char d[512];
        dir_of(di.dli_fname, d, sizeof d);
        char *r = p->roots[p->where.nroots];
        snprintf(r, sizeof p->roots[0], "%.500s/..", d);
        p->rootp[p->where.nroots++] = r;
    }
    p->where.dirs = p->dirp;
    p->where.roots = p->rootp;
    return &p->where;
}

static int resolve(npyl_nvrtc *n, const char **missing)
{
#define SYM(field, name)                                                       \
    do {                                                                       \
        *(void **)(&n->field) = dlsym(n->lib, name);                           \
        if (!n->field) {                                                       \
            *missing = name;                                                   \
            return -1;                                                         \
        }                                                                      \
    } while (0)
    SYM(version_, "nvrtcVersion");
    SYM(error_string, "nvrtcGetErrorString");
    SYM(create, "nvrtcCreateProgram");
    SYM(destroy, "nvrtcDestroyProgram");
    SYM(compile, "nvrtcCompileProgram");
    SYM(log_size, "nvrtcGetProgramLogSize");
    SYM(log, "nvrtcGetProgramLog");
    SYM(ptx_size, "nvrtcGetPTXSize");
    SYM(ptx, "nvrtcGetPTX");
    SYM(cubin_size, "nvrtcGetCUBINSize");
    SYM(cubin, "nvrtcGetCUBIN");
#undef SYM
    *(void **)(&n->num_archs) = dlsym(n->lib, "nvrtcGetNumSupportedArchs");
    *(void **)(&n->archs) = dlsym(n->lib, "nvrtcGetSupportedArchs");
    return 0;
}

/* NVRTC opens libnvrtc-builtins.so.MAJOR.MINOR by name through the dynamic
 * loader's path, which does not include a wheel's directory: load the one
 * beside libnvrtc first, and NVRTC's dlopen finds it among the loaded
 * objects (matched by SONAME). Not finding it here is no error: it may be
 * on the loader's path (a toolkit in ld.so.cache). */
static void load_builtins(npyl_nvrtc *n)
{
    char dir[512], pat[600];
    dir_of(n->path, dir, sizeof dir);
    if (!dir[0])
        return;
    snprintf(pat, sizeof pat, "%s/libnvrtc-builtins.so.*", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; i < g.gl_pathc && !n->builtins; i++)
        if (!strstr(g.gl_pathv[i], ".alt."))
            n->builtins = dlopen(g.gl_pathv[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    globfree(&g);
}

/* Loads `file` (a path or a soname) into n. Returns 0, 1 when it does not
 * load (its reason appended to `failed`), -1 when it loads but is not
 * NVRTC. */
static int try_load(npyl_nvrtc *n, const char *file, char *failed, size_t flen)
{
    /* RTLD_NODELETE, as for the runtime (npyload_cuda.c): libnvrtc is large
     * (100 MB) and keeps process-wide state (its own libstdc++'s
     * allocations among them, which an unmapped library would leave
     * unreachable); a later open finds it mapped. */
    n->lib = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!n->lib) {
        /* A file that exists but does not load is worth naming. */
        if (strchr(file, '/') && access(file, F_OK) == 0) {
            const char *e = dlerror();
            npyl_cuda_why_append(failed, flen, "%s%s", failed[0] ? "; " : "", e ? e : file);
        }
        return 1;
    }
    const char *missing = NULL;
    if (resolve(n, &missing) != 0) {
        npyl_cuda_why_append(failed, flen, "%s%s has no %s", failed[0] ? "; " : "", file, missing);
        dlclose(n->lib);
        n->lib = NULL;
        return -1;
    }
    struct link_map *lm = NULL;
    const char *name = file;
    if (dlinfo(n->lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        name = lm->l_name;
    /* "site-packages/nvidia/cu13/lib/..." rather than ".../npyload/../nvidia/..." */
    char *real = realpath(name, NULL);
    snprintf(n->path, sizeof n->path, "%s", real ? real : name);
    free(real);
    int major = 0, minor = 0;
    if (n->version_(&major, &minor) == 0)
        n->version = major * 1000 + minor * 10;
    load_builtins(n);
    return 0;
}

/* Tries every soname in directory `dir`. */
static int try_dir(npyl_nvrtc *n, const char *dir, char *tried, size_t tlen,
                   char *failed, size_t flen)
{
    npyl_cuda_why_append(tried, tlen, "%s%s", tried[0] ? ", " : "", dir);
    char file[1024];
    for (size_t i = 0; i < NSONAMES; i++) {
        snprintf(file, sizeof file, "%s/%s", dir, SONAMES[i]);
        if (access(file, F_OK) == 0 && try_load(n, file, failed, flen) == 0)
            return 0;
    }
    return 1;
}

static int search(npyl_nvrtc *n, const npyl_nvrtc_where *w, char *tried,
                  size_t tlen, char *failed, size_t flen)
{
    struct stat st;
    if (w->override) {
        if (stat(w->override, &st) == 0 && S_ISDIR(st.st_mode))
            return try_dir(n, w->override, tried, tlen, failed, flen);
        npyl_cuda_why_append(tried, tlen, "%s", w->override);
        if (access(w->override, F_OK) != 0) {
            npyl_cuda_why_append(failed, flen, "%s%s: %s", failed[0] ? "; " : "", w->override,
                   strerror(errno));
            return 1;
        }
        return try_load(n, w->override, failed, flen) == 0 ? 0 : 1;
    }
    char dir[1024];
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i] && w->dirs[i][0] &&
            try_dir(n, w->dirs[i], tried, tlen, failed, flen) == 0)
            return 0;
    for (size_t i = 0; i < w->nroots; i++)
        for (size_t k = 0; w->roots[i] && k < sizeof WHEEL_DIRS / sizeof WHEEL_DIRS[0]; k++) {
            snprintf(dir, sizeof dir, "%s/%s", w->roots[i], WHEEL_DIRS[k]);
            if (stat(dir, &st) == 0 && try_dir(n, dir, tried, tlen, failed, flen) == 0)
                return 0;
        }
    if (w->no_system)
        return 1;
    npyl_cuda_why_append(tried, tlen, "%sthe dynamic loader's path", tried[0] ? ", " : "");
    for (size_t i = 0; i < NSONAMES; i++)
        if (try_load(n, SONAMES[i], failed, flen) == 0)
            return 0;
    static const char *const TOOLKITS[] = {"/usr/local/cuda/lib64",
                                           "/usr/local/cuda-*/lib64", "/opt/cuda/lib64"};
    for (size_t t = 0; t < sizeof TOOLKITS / sizeof TOOLKITS[0]; t++) {
        glob_t g;
        if (glob(TOOLKITS[t], 0, NULL, &g) != 0) {
            if (!strchr(TOOLKITS[t], '*'))
                npyl_cuda_why_append(tried, tlen, ", %s", TOOLKITS[t]);
            continue;
        }
        /* glob sorts ascending: newest toolkit first. */
        for (size_t i = g.gl_pathc; i-- > 0;)
            if (try_dir(n, g.gl_pathv[i], tried, tlen, failed, flen) == 0) {
                globfree(&g);
                return 0;
            }
        globfree(&g);
    }
    return 1;
}

int npyl_nvrtc_open(npyl_nvrtc **out, const npyl_nvrtc_where *w, char *why,
                    size_t whylen)
{
    if (!out || !w)
        return npyl_fail(why, whylen, NPYLOAD_EINVAL, "npyl_nvrtc_open: NULL");
    *out = NULL;
    npyl_nvrtc *n = calloc(1, sizeof *n);
    if (!n)
        return npyl_fail(why, whylen, -ENOMEM, "out of memory");
    char tried[1024] = "", failed[1024] = "";
    if (search(n, w, tried, sizeof tried, failed, sizeof failed) != 0) {
        free(n);
        return npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                         "NVRTC (libnvrtc) not found%s: tried %s%s%s; %s",
                         w->override ? " at the path given" : "", tried,
                         failed[0] ? "; " : "", failed, NPYL_NVRTC_INSTALL);
    }
    *out = n;
    return 0;
}

void npyl_nvrtc_close(npyl_nvrtc *n)
{
    if (!n)
        return;
    if (n->lib)
        dlclose(n->lib);
    if (n->builtins)
        dlclose(n->builtins);
    free(n);
}

const char *npyl_nvrtc_path(const npyl_nvrtc *n) { return n ? n->path : ""; }

int npyl_nvrtc_version(const npyl_nvrtc *n) { return n ? n->version : 0; }

void npyl_kimage_free(npyl_kimage *k)
{
    if (!k)
        return;
    free(k->data);
    k->data = NULL;
    k->len = 0;
}

/* ---- compile ---- */

#ifdef NPYLOAD_HAVE_TRANSFORM_SOURCE
/* The architecture NVRTC compiles for: `arch` when it knows it, else (a GPU
 * newer than this NVRTC) the newest it knows, as PTX. 0 when `arch` is
 * older than every one it knows. */
static int pick_arch(npyl_nvrtc *n, int arch, int *ptx)
{
    int cnt = 0;
    if (!n->num_archs || !n->archs || n->num_archs(&cnt) != 0 || cnt <= 0 || cnt > 256)
        return arch;
    int list[256];
    if (n->archs(list) != 0)
        return arch;
    int best = 0;
    for (int i = 0; i < cnt; i++) {
        if (list[i] == arch)
            return arch;
        if (list[i] < arch && list[i] > best)
            best = list[i];
    }
    if (best)
        *ptx = 1;
    return best;
}
#endif

int npyl_nvrtc_compile(npyl_nvrtc *n, int arch, int ptx, npyl_kimage *out,
                       char *err, size_t errlen)
{
    if (!n || !out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_nvrtc_compile: NULL");
    memset(out, 0, sizeof *out);
#ifndef NPYLOAD_HAVE_TRANSFORM_SOURCE
    (void)arch;
    (void)ptx;
    char why[256];
    npyl_nvrtc_source_built(why, sizeof why);
    return npyl_fail(err, errlen, NPYLOAD_ENOCUDA, "%s", why);
#else
    int vmaj = n->version / 1000, vmin = (n->version % 1000) / 10;
    int use = pick_arch(n, arch, &ptx);
    if (!use)
        return npyl_fail(err, errlen, NPYLOAD_ECUDA,
                         "NVRTC %d.%d (%s) cannot compile for sm_%d: the GPU is "
                         "older than every architecture it supports",
                         vmaj, vmin, n->path, arch);
    const char *const headers[] = {(const char *)npyl_tk_src_kparams,
                                   (const char *)npyl_tk_src_rtc};
    const char *const names[] = {"npyload_cuda_transform_kparams.h",
                                 "npyload_cuda_transform_rtc.h"};
    void *prog = NULL;
    int e = n->create(&prog, (const char *)npyl_tk_src_cu,
                      "npyload_cuda_transform_kernels.cu", 2, headers, names);
    if (e != 0)
        return npyl_fail(err, errlen, NPYLOAD_ECUDA,
                         "NVRTC %d.%d (%s): nvrtcCreateProgram failed: %s", vmaj,
                         vmin, n->path, n->error_string(e));
    char archopt[48];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s_%d",
             ptx ? "compute" : "sm", use);
    /* As nvcc compiles them (npyload_cuda_transform_kernels.cmake). */
    const char *const opts[] = {archopt, "-std=c++14"};
    e = n->compile(prog, 2, opts);
    int rc = 0;
    if (e != 0) {
        size_t ln = 0;
        char log[1024] = "";
        if (n->log_size(prog, &ln) == 0 && ln > 0) {
            char *full = malloc(ln + 1);
            if (full && n->log(prog, full) == 0) {
                full[ln] = '\0';
                snprintf(log, sizeof log, "%s", full);
            }
            free(full);
        }
        rc = npyl_fail(err, errlen, NPYLOAD_ECUDA,
                       "NVRTC %d.%d (%s) failed to compile the device transform "
                       "kernels for %s_%d: %s: %s", vmaj, vmin, n->path,
                       ptx ? "compute" : "sm", use, n->error_string(e), log);
        goto done;
    }
    size_t len = 0;
    e = ptx ? n->ptx_size(prog, &len) : n->cubin_size(prog, &len);
    if (e == 0 && len > 0) {
        out->data = calloc(1, len + 1); /* PTX: NUL-terminated for the driver */
        if (!out->data) {
            rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
            goto done;
        }
        e = ptx ? n->ptx(prog, out->data) : n->cubin(prog, out->data);
    }
    if (e != 0 || len == 0) {
        npyl_kimage_free(out);
        rc = npyl_fail(err, errlen, NPYLOAD_ECUDA, "NVRTC %d.%d (%s): getting the %s "
                       "failed: %s", vmaj, vmin, n->path, ptx ? "PTX" : "cubin",
                       e ? n->error_string(e) : "empty");
        goto done;
    }
    out->len = len;
    out->ptx = ptx;
    out->arch = use;
    snprintf(out->from, sizeof out->from, "NVRTC %d.%d (%.300s), %s_%d %s", vmaj,
             vmin, n->path, ptx ? "compute" : "sm", use, ptx ? "PTX" : "cubin");
done:
    n->destroy(&prog);
    return rc;
#endif
}

/* ---- the cache ---- */

#ifdef NPYLOAD_HAVE_TRANSFORM_SOURCE
/* FNV-1a 64 over the embedded source texts: the cache key of this source
 * version (a build that changes the kernels gets other file names). */
static uint64_t source_hash(void)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *parts[] = {npyl_tk_src_cu, npyl_tk_src_kparams, npyl_tk_src_rtc};
    const size_t lens[] = {sizeof npyl_tk_src_cu, sizeof npyl_tk_src_kparams,
                           sizeof npyl_tk_src_rtc};
    for (size_t p = 0; p < 3; p++)
        for (size_t i = 0; i < lens[p]; i++) {
            h ^= parts[p][i];
            h *= 1099511628211ull;
        }
    return h;
}
#endif

static void cache_file(char *buf, size_t len, const char *dir, int arch, int ptx)
{
    uint64_t h = 0;
#ifdef NPYLOAD_HAVE_TRANSFORM_SOURCE
    h = source_hash();
#endif
    snprintf(buf, len, "%s/npyload-transform-%016" PRIx64 "-%s_%d.%s", dir, h,
             ptx ? "compute" : "sm", arch, ptx ? "ptx" : "cubin");
}

/* Reads a cached image; 0 when there is none fit to use. */
static int cache_read(const char *file, int ptx, npyl_kimage *out)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    int ok = 0;
    /* A cached image is a few hundred KiB: anything far larger is not ours. */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 16 &&
        st.st_size < (64 << 20)) {
        size_t n = (size_t)st.st_size;
        unsigned char *d = calloc(1, n + 1);
        if (d && pread(fd, d, n, 0) == (ssize_t)n &&
            (ptx ? strstr((char *)d, ".entry") != NULL : memcmp(d, "\177ELF", 4) == 0)) {
            out->data = d;
            out->len = n;
            ok = 1;
        } else {
            free(d);
        }
    }
    close(fd);
    return ok;
}

/* mkdir -p; 0 or -1. */
static int make_dirs(const char *dir)
{
    char p[1024];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(p, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* Writes the image as `file`, atomically: readers see the old file, none,
 * or the whole new one. Failures leave no temporary behind. */
static void cache_write(const char *dir, const char *file, const npyl_kimage *k)
{
    if (make_dirs(dir) != 0)
        return;
    char tmp[1100];
    int n = snprintf(tmp, sizeof tmp, "%s.XXXXXX", file);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return; /* a name too long to hold the template: no cache */
    int fd = mkstemp(tmp);
    if (fd < 0)
        return;
    int ok = write(fd, k->data, k->len) == (ssize_t)k->len;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, file) != 0)
        unlink(tmp);
}

int npyl_nvrtc_kernels(const npyl_nvrtc_where *w, const char *cache_dir,
                       int skip_cache, int arch, npyl_kimage *out, char *err,
                       size_t errlen)
{
    if (!w || !out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_nvrtc_kernels: NULL");
    memset(out, 0, sizeof *out);
    char why[256];
    if (!npyl_nvrtc_source_built(why, sizeof why))
        return npyl_fail(err, errlen, NPYLOAD_ENOCUDA, "%s", why);
    char file[1100];
    if (cache_dir && cache_dir[0] && !skip_cache) {
        for (int ptx = 0; ptx <= 1; ptx++) {
            cache_file(file, sizeof file, cache_dir, arch, ptx);
            if (cache_read(file, ptx, out)) {
                out->ptx = ptx;
                out->arch = arch;
                out->cached = 1;
                snprintf(out->from, sizeof out->from, "cache %.370s", file);
                return 0;
            }
        }
    }
    npyl_nvrtc *n = NULL;
    int rc = npyl_nvrtc_open(&n, w, err, errlen);
    if (rc)
        return rc;
    rc = npyl_nvrtc_compile(n, arch, 0, out, err, errlen);
    npyl_nvrtc_close(n);
    if (rc)
        return rc;
    /* Kept under the GPU's architecture even when NVRTC made PTX for an
     * older one: that is what the next lookup asks for. */
    if (cache_dir && cache_dir[0]) {
        cache_file(file, sizeof file, cache_dir, arch, out->ptx);
        cache_write(cache_dir, file, out);
    }
    return 0;
}
