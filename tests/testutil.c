#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *tu_mkdtemp(const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    char *p = malloc(strlen(base) + strlen(tag) + 32);
    sprintf(p, "%s/npyload-%s-XXXXXX", base, tag);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

void tu_rmtree(char *dir)
{
    if (!dir)
        return;
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

char *tu_path(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

long tu_write_npy(const char *path, const char *descr, int fortran, int ndim,
                  const int64_t *shape, const void *data, size_t nbytes,
                  unsigned align)
{
    char dict[2048];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (",
                     descr, fortran ? "True" : "False");
    for (int i = 0; i < ndim; i++)
        n += snprintf(dict + n, sizeof dict - n, "%lld,%s", (long long)shape[i],
                      (ndim > 1 && i < ndim - 1) ? " " : "");
    if (ndim > 1)
        n--; /* numpy writes (2, 3), not (2, 3,) */
    n += snprintf(dict + n, sizeof dict - n, "), }");
    size_t pre = 10, total = pre + (size_t)n + 1;
    size_t pad = (align - total % align) % align;
    size_t hlen = (size_t)n + pad + 1;
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                               (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    fwrite(magic, 1, 10, f);
    fwrite(dict, 1, (size_t)n, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    if (nbytes && fwrite(data, 1, nbytes, f) != nbytes) {
        fclose(f);
        return -1;
    }
    if (fclose(f) != 0)
        return -1;
    return (long)(pre + hlen);
}

const int64_t tu_img_shape[2] = {3, 5}, tu_lab_shape[1] = {7};

int tu_img_lab_make(tu_img_lab *d, const char *tag, const int64_t *sizes, size_t nfiles)
{
    memset(d, 0, sizeof *d);
    char *dir = tu_mkdtemp(tag);
    if (!dir)
        return -1;
    if (tu_write_field(dir, "img", 1, "<f4", 4, 2, tu_img_shape, sizes, nfiles, 64) != 0 ||
        tu_write_field(dir, "lab", 2, "|u1", 1, 1, tu_lab_shape, sizes, nfiles, 16) != 0) {
        tu_rmtree(dir);
        return -1;
    }
    d->dir = dir;
    snprintf(d->img, sizeof d->img, "%s/img_*.npy", dir);
    snprintf(d->lab, sizeof d->lab, "%s/lab_*.npy", dir);
    return 0;
}

size_t tu_sample_bytes(size_t itemsize, int sndim, const int64_t *sshape)
{
    size_t b = itemsize;
    for (int i = 0; i < sndim; i++)
        b *= (size_t)sshape[i];
    return b;
}

int tu_write_field(const char *dir, const char *prefix, uint32_t field_seed,
                   const char *descr, size_t itemsize, int sndim,
                   const int64_t *sshape, const int64_t *samples_per_file,
                   size_t nfiles, unsigned align)
{
    size_t sb = tu_sample_bytes(itemsize, sndim, sshape);
    uint64_t g = 0;
    for (size_t k = 0; k < nfiles; k++) {
        int64_t shape[16];
        shape[0] = samples_per_file[k];
        memcpy(shape + 1, sshape, sizeof(int64_t) * (size_t)sndim);
        size_t nb = sb * (size_t)samples_per_file[k];
        uint8_t *buf = malloc(nb ? nb : 1);
        for (int64_t s = 0; s < samples_per_file[k]; s++, g++)
            for (size_t i = 0; i < sb; i++)
                buf[(size_t)s * sb + i] = tu_byte(field_seed, g, i);
        char name[256];
        snprintf(name, sizeof name, "%s_%04zu.npy", prefix, k);
        char *p = tu_path(dir, name);
        long off = tu_write_npy(p, descr, 0, sndim + 1, shape, buf, nb, align);
        free(p);
        free(buf);
        if (off < 0)
            return -1;
    }
    return 0;
}

void *tu_read_file(const char *path, size_t *n)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    fstat(fd, &st);
    char *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *n = got;
    return buf;
}

int tu_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

int tu_nvrtc_wheel_dir(const char *sites, char *out, size_t len)
{
    static const char *const sub[] = {"nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"};
    const char *p = sites ? sites : "";
    while (*p) {
        size_t n = strcspn(p, ":");
        for (size_t k = 0; n && k < sizeof sub / sizeof sub[0]; k++) {
            char dir[1024], file[1100];
            snprintf(dir, sizeof dir, "%.*s/%s", (int)n, p, sub[k]);
            static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12"};
            for (size_t i = 0; i < 2; i++) {
                snprintf(file, sizeof file, "%s/%s", dir, names[i]);
                if (access(file, F_OK) == 0) {
                    snprintf(out, len, "%s", dir);
                    return 1;
                }
            }
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return 0;
}
