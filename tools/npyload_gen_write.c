/* npyload-gen, output files: large sequential write()s to NAME.tmp, renamed
 * into place when complete; the free-space check; removal of the temporary
 * files when the process is interrupted. */
#include "npyload_gen.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "npyload.h"

/* The temporary files being written, for the signal handler: a name is
 * stored before its `live` flag is raised and the flag dropped only after
 * the rename (or unlink), so the handler may unlink a name that is not
 * there yet or any more, but never misses a temporary file. */
static char g_tmp[GEN_MAX_OPEN][PATH_MAX + 8];
static volatile sig_atomic_t g_tmp_live[GEN_MAX_OPEN];

static void on_signal(int sig)
{
    for (int i = 0; i < GEN_MAX_OPEN; i++)
        if (g_tmp_live[i])
            unlink(g_tmp[i]); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

void gen_install_cleanup(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask); /* one handler at a time */
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
}

int mkdir_p(const char *dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) {
        fprintf(stderr, PROG ": %s: path too long\n", dir);
        return -1;
    }
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, PROG ": cannot create directory %s: %s\n", p, strerror(errno));
            return -1;
        }
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, PROG ": %s: not a directory\n", dir);
        return -1;
    }
    return 0;
}

/* Formats the NPY header of a file named `name` into hdr[GEN_HDR_MAX].
 * @return : its length, or -1 (said on stderr). */
#define GEN_HDR_MAX 8192
static int npy_header(char *hdr, const char *name, const char *descr, int fortran, int ndim,
                      const int64_t *shape)
{
    int hl = npyload_format_header(hdr, GEN_HDR_MAX, descr, fortran, ndim, shape);
    if (hl <= 0) {
        fprintf(stderr, PROG ": %s: cannot format the NPY header: %s\n", name,
                npyload_strerror(hl));
        return -1;
    }
    return hl;
}

int gen_npy_bytes(const char *descr, int fortran, int ndim, const int64_t *shape,
                  uint64_t data_bytes, uint64_t *out)
{
    char hdr[GEN_HDR_MAX];
    int hl = npy_header(hdr, descr, descr, fortran, ndim, shape);
    *out = (uint64_t)hl + data_bytes;
    return hl < 0 ? -1 : 0;
}

int gen_check_space(const char *dir, const uint64_t *sizes, int n, int64_t copies)
{
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        fprintf(stderr, PROG ": %s: statvfs: %s\n", dir, strerror(errno));
        return -1;
    }
    /* In double: only compared and printed, and never overflows. */
    double bs = vfs.f_frsize ? (double)vfs.f_frsize : 4096.0;
    double set = 0;
    for (int i = 0; i < n; i++)
        set += ceil((double)sizes[i] / bs) * bs; /* whole blocks */
    double need = set * (double)copies;
    double free_bytes = (double)vfs.f_bavail * bs;
    if (need <= free_bytes)
        return 0;
    fprintf(stderr, PROG ": not enough space: need %.1f MiB in %s, %.1f MiB free\n",
            need / 1048576.0, dir, free_bytes / 1048576.0);
    return -1;
}

void buffers_free(char **bufs, int n)
{
    for (int i = 0; i < n; i++)
        free(bufs[i]);
}

int buffers_alloc(char **bufs, int n)
{
    for (int i = 0; i < n; i++) {
        if (posix_memalign((void **)&bufs[i], 64, CHUNK_BYTES) != 0) {
            buffers_free(bufs, i);
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
    }
    return 0;
}

static int writer_flush(writer *w)
{
    size_t off = 0;
    while (off < w->len) {
        ssize_t k = write(w->fd, w->buf + off, w->len - off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, PROG ": %s: write failed: %s\n", g_tmp[w->slot], strerror(errno));
            return -1;
        }
        off += (size_t)k;
    }
    w->written += w->len;
    w->len = 0;
    return 0;
}

/* The buffer is 64-byte aligned and every reservation keeps elements
 * aligned (headers are multiples of 64 bytes, records multiples of their
 * item size). */
void *writer_reserve(writer *w, size_t n)
{
    if (w->len + n > CHUNK_BYTES && writer_flush(w) != 0)
        return NULL;
    void *p = w->buf + w->len;
    w->len += n;
    return p;
}

int writer_open(writer *w, int slot, char *buf, const char *path, const char *descr,
                int fortran, int ndim, const int64_t *shape)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->slot = slot;
    if (strlen(path) >= sizeof w->path) {
        fprintf(stderr, PROG ": %s: path too long\n", path);
        return -1;
    }
    strcpy(w->path, path);
    w->buf = buf;
    char hdr[GEN_HDR_MAX];
    int hl = npy_header(hdr, path, descr, fortran, ndim, shape);
    if (hl < 0)
        return -1;
    snprintf(g_tmp[slot], sizeof g_tmp[slot], "%s.tmp", path);
    g_tmp_live[slot] = 1; /* before open: the handler never misses the file */
    w->fd = open(g_tmp[slot], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", g_tmp[slot], strerror(errno));
        g_tmp_live[slot] = 0;
        return -1;
    }
    memcpy(writer_reserve(w, (size_t)hl), hdr, (size_t)hl);
    return 0;
}

int writer_close(writer *w, int ok)
{
    int rc = ok ? 0 : -1;
    if (w->fd >= 0) {
        const char *tmp = g_tmp[w->slot];
        if (ok && writer_flush(w) != 0)
            rc = -1;
        if (close(w->fd) != 0 && rc == 0) {
            fprintf(stderr, PROG ": %s: close failed: %s\n", tmp, strerror(errno));
            rc = -1;
        }
        if (rc == 0 && rename(tmp, w->path) != 0) {
            fprintf(stderr, PROG ": cannot rename %s to %s: %s\n", tmp, w->path,
                    strerror(errno));
            rc = -1;
        }
        if (rc != 0)
            unlink(tmp);
        g_tmp_live[w->slot] = 0; /* after the rename or unlink */
        w->fd = -1;
    }
    w->buf = NULL;
    return rc;
}
