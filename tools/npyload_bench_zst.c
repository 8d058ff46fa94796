/* npyload-bench, compression (issue 14): what .npy.zst gives on this
 * machine, measured in the same run as the loader.
 *
 *   packed fields (.npy.zst): the decode ceiling of the cores. Frames
 *     sampled across the field's files are read into memory once and every
 *     usable core decompresses them in a loop, with the loader's own frame
 *     decoder (sizes and checksums checked); the ceiling is the batch's
 *     bytes per second (raw fields counted free). Cold, the storage bound is
 *     the O_DIRECT read of the compressed bytes times the ratio; the lower
 *     of the two is the reference the runs are compared with.
 *   raw fields (.npy): an estimate of what npyload-pack would give. Frames
 *     of npyload-pack's default size (whole samples, at least 128 KiB) are
 *     sampled across the files into a temporary .npy, packed by the
 *     library's own packer (npyload_pack_file, its default level, one
 *     thread: pack MB/s per core) and the packed frames decoded from memory
 *     by every core as for packed fields (decode GB/s); with the raw cold and page-cache samples/s this run
 *     measured (or its ceilings), npyload_bench_zst_report.c judges whether
 *     packing pays here.
 *
 * Uses include/npyload.h only (its packer and .npy.zst file API: the
 * loader's seek-table parser and frame decoder); libzstd only to make the
 * decoders' ZSTD_DCtx. */
#include "npyload_bench_measure.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

enum {
    ZB_MAX_FRAMES = 64,               /* sampled frames per field */
};
#define ZB_BUDGET (48ull << 20)       /* decompressed bytes sampled per field */

int nb_zst_any(const nb_ctx *ctx)
{
    for (int k = 0; k < ctx->nfields; k++)
        for (size_t i = 0; i < ctx->data[k].nfiles; i++)
            if (ctx->data[k].files[i].zst)
                return 1;
    return 0;
}

static int field_packed(const nb_data *d)
{
    for (size_t i = 0; i < d->nfiles; i++)
        if (d->files[i].zst)
            return 1;
    return 0;
}

/* One sampled frame, its compressed bytes in memory. */
typedef struct zb_frame {
    npyload_zst_file *zf; /* the file's index */
    uint32_t f;
    unsigned char *src;
    size_t csize, dsize;
    unsigned mult;        /* delivered bytes per decoded byte (narrowed: the
                             value size; the expansion itself is not timed) */
} zb_frame;

typedef struct zb_set {
    zb_frame *fr;
    int n;
    size_t max_dsize;
    npyload_zst_file **files;
    size_t nfiles;
} zb_set;

static void set_free(zb_set *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->fr[i].src);
    free(s->fr);
    for (size_t i = 0; i < s->nfiles; i++)
        npyload_zst_file_close(s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : -EIO;
        got += (size_t)r;
    }
    return 0;
}

/* Packed field: frames spread over its .npy.zst files. @return : 0 or -1. */
static int sample_packed(const nb_data *d, nb_zst_field *zf, zb_set *s, char *note,
                         size_t nlen)
{
    s->files = calloc(d->nfiles, sizeof *s->files);
    s->fr = calloc(ZB_MAX_FRAMES, sizeof *s->fr);
    if (!s->files || !s->fr) {
        snprintf(note, nlen, "out of memory");
        return -1;
    }
    /* Frames per file so that the field's sample stays within budget. */
    uint64_t spent = 0;
    size_t stride = d->nfiles > ZB_MAX_FRAMES ? d->nfiles / ZB_MAX_FRAMES : 1;
    for (size_t i = 0; i < d->nfiles && s->n < ZB_MAX_FRAMES && spent < ZB_BUDGET;
         i += stride) {
        const nb_file *file = &d->files[i];
        if (!file->zst)
            continue;
        char err[512] = "";
        npyload_zst_file *z = NULL;
        if (npyload_zst_file_open(file->path, &z, err, sizeof err) != 0) {
            snprintf(note, nlen, "%s", err);
            return -1;
        }
        s->files[s->nfiles++] = z;
        const npyload_zst_facts *fa = npyload_zst_file_facts(z);
        if (!zf->samples_per_frame)
            zf->samples_per_frame = fa->samples_per_frame;
        uint32_t data_frames = fa->frames - 1;
        size_t files_left = (d->nfiles - i + stride - 1) / stride;
        uint32_t want = (uint32_t)((ZB_MAX_FRAMES - s->n + files_left - 1) / files_left);
        if (want > data_frames)
            want = data_frames;
        for (uint32_t j = 0; j < want && spent < ZB_BUDGET; j++) {
            uint32_t f = 1 + (uint32_t)((uint64_t)j * data_frames / want);
            uint64_t off, cs, ds;
            npyload_zst_file_frame(z, f, &off, &cs, &ds);
            zb_frame *fr = &s->fr[s->n];
            fr->src = malloc(cs ? cs : 1);
            if (!fr->src) {
                snprintf(note, nlen, "out of memory");
                return -1;
            }
            int rc = pread_all(file->fd, fr->src, (size_t)cs, off);
            if (rc != 0) {
                free(fr->src);
                fr->src = NULL;
                snprintf(note, nlen, "%s: frame %u: %s", file->path, (unsigned)f,
                         strerror(-rc));
                return -1;
            }
            fr->zf = z;
            fr->f = f;
            fr->csize = (size_t)cs;
            fr->dsize = (size_t)ds;
            fr->mult = fa->narrow_values ? fa->value_itemsize : 1;
            s->max_dsize = ds > s->max_dsize ? (size_t)ds : s->max_dsize;
            spent += ds;
            zf->raw_bytes += ds * fr->mult;
            zf->zst_bytes += cs;
            s->n++;
        }
    }
    zf->frames = s->n;
    return 0;
}

/* A directory for the estimate's temporary files: /dev/shm when usable (so
 * the packer's fsyncs cost nothing), else $TMPDIR or /tmp. */
static int temp_dir(char *dir, size_t len)
{
    const char *t = getenv("TMPDIR");
    const char *cands[] = {"/dev/shm", t && *t ? t : "/tmp", "/tmp"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        snprintf(dir, len, "%s/npyload-bench-XXXXXX", cands[i]);
        if (mkdtemp(dir))
            return 0;
    }
    return -1;
}

/* Writes the rows of `want` frames of npyload-pack's rule (spf samples),
 * spread over the field's frames, as one .npy at `path`. @return : 0 or
 * -1 (note says why). */
static int write_sampled(const nb_data *d, const nb_field_info *fi, uint64_t spf,
                         uint64_t want, uint64_t total_frames, const char *path, char *note,
                         size_t nlen)
{
    uint64_t sb = d->sample_bytes, rows_total = 0;
    int64_t shape[9] = {0};
    unsigned char *raw = malloc((size_t)(spf * sb));
    FILE *out = fopen(path, "wb");
    int rc = raw && out ? 0 : -1;
    if (rc)
        snprintf(note, nlen, "%.240s: %s", path, raw ? strerror(errno) : "out of memory");
    /* the header first with a zero row count, rewritten at the end */
    char hdr[4096];
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        shape[0] = (int64_t)rows_total;
        memcpy(shape + 1, fi->shape, (size_t)fi->ndim * sizeof *shape);
        int hl = npyload_format_header(hdr, sizeof hdr, fi->descr, 0, fi->ndim + 1, shape);
        if (hl <= 0 || fseek(out, 0, SEEK_SET) != 0 || fwrite(hdr, 1, (size_t)hl, out) != (size_t)hl) {
            snprintf(note, nlen, "%.200s: cannot write the header", path);
            rc = -1;
        }
        for (uint64_t j = 0; j < want && rc == 0 && pass == 0; j++) {
            /* the j-th of `want` frames spread over the field's frames */
            uint64_t g = j * total_frames / want, first = 0;
            size_t fi_ = 0;
            for (; fi_ < d->nfiles; fi_++) {
                uint64_t nf = ((uint64_t)d->files[fi_].nsamples + spf - 1) / spf;
                if (g < first + nf)
                    break;
                first += nf;
            }
            const nb_file *file = &d->files[fi_];
            uint64_t row = (g - first) * spf;
            uint64_t rows = (uint64_t)file->nsamples - row < spf ? (uint64_t)file->nsamples - row
                                                                 : spf;
            int e = pread_all(file->fd, raw, (size_t)(rows * sb), file->data_offset + row * sb);
            if (e != 0 || fwrite(raw, 1, (size_t)(rows * sb), out) != (size_t)(rows * sb)) {
                snprintf(note, nlen, "%.240s: %s", e ? file->path : path, strerror(e ? -e : errno));
                rc = -1;
            }
            rows_total += rows;
        }
    }
    if (out && fclose(out) != 0 && rc == 0) {
        snprintf(note, nlen, "%.240s: %s", path, strerror(errno));
        rc = -1;
    }
    free(raw);
    return rc;
}

/* Raw field: what npyload-pack would make of it, made by the library's own
 * packer: frames of its rule are sampled into a temporary .npy and packed
 * with npyload_pack_file on one thread (pack MB/s per core: its wall time),
 * then sampled as a packed field. @return : 0 or -1. */
static int sample_raw(const nb_data *d, const nb_field_info *fi, int level, uint64_t frame_size,
                      nb_zst_field *zf, zb_set *s, char *note, size_t nlen)
{
    uint64_t sb = d->sample_bytes;
    if (sb == 0 || d->nsamples <= 0) {
        snprintf(note, nlen, "field %s has no data", zf->name);
        return -1;
    }
    uint64_t spf = (frame_size + sb - 1) / sb;
    spf = spf ? spf : 1;
    zf->samples_per_frame = spf;
    uint64_t total_frames = 0;
    for (size_t i = 0; i < d->nfiles; i++)
        total_frames += ((uint64_t)d->files[i].nsamples + spf - 1) / spf;
    uint64_t want = ZB_BUDGET / (spf * sb);
    want = want < 1 ? 1 : want > ZB_MAX_FRAMES ? ZB_MAX_FRAMES : want;
    want = want > total_frames ? total_frames : want;
    char dir[200], in[240], out[240];
    if (temp_dir(dir, sizeof dir) != 0) {
        snprintf(note, nlen, "cannot make a temporary directory: %s", strerror(errno));
        return -1;
    }
    snprintf(in, sizeof in, "%s/sample.npy", dir);
    snprintf(out, sizeof out, "%s/sample.npy.zst", dir);
    int rc = write_sampled(d, fi, spf, want, total_frames, in, note, nlen);
    npyload_pack_options o = {.level = level, .frame_size = frame_size, .threads = 1,
                              .force = 1};
    npyload_pack_result r = {0};
    if (rc == 0)
        rc = npyload_pack_file(in, out, &o, sizeof o, &r, sizeof r, note, nlen) ? -1 : 0;
    nb_file pf = {.path = out, .fd = rc == 0 ? open(out, O_RDONLY | O_CLOEXEC) : -1, .zst = 1};
    nb_data pd = {.files = &pf, .nfiles = 1, .sample_bytes = sb};
    if (rc == 0 && pf.fd < 0) {
        snprintf(note, nlen, "%s: %s", out, strerror(errno));
        rc = -1;
    }
    if (rc == 0)
        rc = sample_packed(&pd, zf, s, note, nlen);
    if (rc == 0)
        zf->compress_mbps_per_core =
            r.seconds > 0 ? (double)(r.in_bytes) / r.seconds / 1e6 : 0;
    if (pf.fd >= 0)
        close(pf.fd);
    unlink(in);
    unlink(out);
    rmdir(dir);
    return rc;
}

/* ---- decoding from memory, every core ---- */

typedef struct zb_dec {
    const zb_set *s;
    int id;
    uint64_t deadline;
    uint64_t bytes;
    int failed;
    char err[512];
} zb_dec;

#define DEC_RING_BYTES (64u << 20)

static void *dec_thread(void *arg)
{
    zb_dec *t = arg;
    const zb_set *s = t->s;
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    /* The loader decodes into batch slots, megabytes apart, so its output
     * goes to memory, not to a cache-hot buffer: the frames land one after
     * the other in a ring of DEC_RING_BYTES per thread, as in a slot
     * (decoding into one reused buffer measured ~20% above what the loader's
     * workers reach on the same frames). */
    size_t one = s->max_dsize ? s->max_dsize : 1;
    size_t cap = one > DEC_RING_BYTES ? one : DEC_RING_BYTES;
    uint8_t *dst = malloc(cap);
    size_t at = 0;
    if (!dc || !dst) {
        t->failed = 1;
        snprintf(t->err, sizeof t->err, "out of memory");
        goto out;
    }
    /* each thread starts at its own frame; the clock is read every frame */
    for (int i = t->id % s->n; nb_now_ns() < t->deadline; i = (i + 1) % s->n) {
        const zb_frame *fr = &s->fr[i];
        if (at + one > cap)
            at = 0;
        if (npyload_zst_file_decode(fr->zf, fr->f, dc, fr->src, dst + at, one, t->err,
                                    sizeof t->err) != 0) {
            t->failed = 1;
            break;
        }
        at += fr->dsize;
        t->bytes += fr->dsize * (fr->mult ? fr->mult : 1);
    }
out:
    free(dst);
    ZSTD_freeDCtx(dc);
    return NULL;
}

/* Decompressed GB/s of `threads` threads over the set for `seconds` (after
 * a short warm-up), or -1 with `note`. */
static double decode_rate(const zb_set *s, int threads, double seconds, char *note,
                          size_t nlen)
{
    zb_dec *t = calloc((size_t)threads, sizeof *t);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double gbps = -1;
    if (!t || !th || s->n == 0) {
        snprintf(note, nlen, s->n ? "out of memory" : "no frame sampled");
        goto out;
    }
    for (int pass = 0; pass < 2; pass++) {
        uint64_t t0 = nb_now_ns();
        uint64_t dl = t0 + (uint64_t)((pass ? seconds : 0.1) * 1e9);
        int started = 0;
        for (int i = 0; i < threads; i++) {
            memset(&t[i], 0, sizeof t[i]);
            t[i].s = s;
            t[i].id = i * (s->n / threads > 0 ? s->n / threads : 1);
            t[i].deadline = dl;
            if (pthread_create(&th[i], NULL, dec_thread, &t[i]) != 0)
                break;
            started++;
        }
        uint64_t bytes = 0;
        for (int i = 0; i < started; i++) {
            pthread_join(th[i], NULL);
            bytes += t[i].bytes;
        }
        double sec = (double)(nb_now_ns() - t0) / 1e9;
        for (int i = 0; i < started; i++)
            if (t[i].failed) {
                snprintf(note, nlen, "%.*s", (int)(nlen ? nlen - 1 : 0), t[i].err);
                goto out;
            }
        if (started < threads) {
            snprintf(note, nlen, "cannot start %d decode threads", threads);
            goto out;
        }
        gbps = sec > 0 ? (double)bytes / sec / 1e9 : -1;
    }
out:
    free(t);
    free(th);
    return gbps;
}

/* ---- the report's figures ---- */

static void combine(const nb_ctx *ctx, nb_zst_report *z)
{
    double s = 0, zs = 0, dec_t = 0, pack_t = 0;
    for (int k = 0; k < ctx->nfields; k++) {
        double sb = (double)ctx->data[k].sample_bytes;
        const nb_zst_field *f = &z->fields[k];
        s += sb;
        if (!f->zst_bytes) {
            zs += sb;
            continue;
        }
        zs += sb / f->ratio;
        dec_t += f->decode_gbps > 0 ? sb / (f->decode_gbps * 1e9) : 0;
        if (z->estimate && f->compress_mbps_per_core > 0)
            pack_t += sb / (f->compress_mbps_per_core * 1e6);
    }
    z->ratio = zs > 0 ? s / zs : 0;
    z->decode_gbps = dec_t > 0 ? s / dec_t / 1e9 : 0;
    z->decode_gbps_per_core = z->threads ? z->decode_gbps / z->threads : 0;
    z->compress_mbps_per_core = pack_t > 0 ? s / pack_t / 1e6 : 0;
}

static void measure_fields(nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                           nb_zst_report *z)
{
    z->threads = threads;
    z->nfields = ctx->nfields;
    int todo = 0;
    for (int k = 0; k < ctx->nfields; k++)
        todo += z->estimate ? !field_packed(&ctx->data[k]) : field_packed(&ctx->data[k]);
    double per = todo ? seconds / todo : seconds;
    for (int k = 0; k < ctx->nfields; k++) {
        nb_zst_field *f = &z->fields[k];
        const nb_data *d = &ctx->data[k];
        snprintf(f->name, sizeof f->name, "%s", cfg->fields[k].name);
        f->compressed = field_packed(d);
        if (z->estimate == f->compressed)
            continue; /* packed fields in estimate mode, raw ones in packed mode */
        zb_set s;
        memset(&s, 0, sizeof s);
        int rc = f->compressed ? sample_packed(d, f, &s, z->note, sizeof z->note)
                               : sample_raw(d, &cfg->fields[k], z->level, z->frame_size, f,
                                            &s, z->note, sizeof z->note);
        if (rc == 0) {
            f->ratio = f->zst_bytes ? (double)f->raw_bytes / (double)f->zst_bytes : 0;
            f->decode_gbps = decode_rate(&s, threads, per, z->note, sizeof z->note);
            if (f->decode_gbps <= 0)
                rc = -1;
        }
        set_free(&s);
        if (rc != 0) {
            z->valid = 0;
            return;
        }
    }
    z->valid = 1;
    combine(ctx, z);
}

void nb_zst_decode_ceiling(nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                           nb_zst_report *z, nb_ceiling *out)
{
    memset(z, 0, sizeof *z);
    z->estimate = 0;
    snprintf(out->name, sizeof out->name, "zst_decode");
    out->threads = threads;
    uint64_t t0 = nb_now_ns();
    measure_fields(ctx, cfg, threads, seconds, z);
    out->seconds = (double)(nb_now_ns() - t0) / 1e9;
    if (!z->valid) {
        snprintf(out->note, sizeof out->note, "skipped: %.240s", z->note);
        return;
    }
    uint64_t raw = 0;
    int frames = 0;
    for (int k = 0; k < z->nfields; k++) {
        raw += z->fields[k].raw_bytes;
        frames += z->fields[k].frames;
    }
    out->measured = 1;
    out->gbps = z->decode_gbps;
    out->bytes = raw;
    snprintf(out->note, sizeof out->note,
             "%d threads decompress %d frames of the .npy.zst fields (%.1f MiB) from memory "
             "with the loader's decoder; batch bytes/s at ratio %.2fx, raw fields free",
             threads, frames, raw / 1048576.0, z->ratio);
}

void nb_zst_cold_ceiling(const nb_zst_report *z, const nb_ceiling *od, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "zst_cold");
    out->threads = z->threads;
    if (!z->valid || !od->measured) {
        snprintf(out->note, sizeof out->note, "skipped: needs odirect_uring and zst_decode");
        return;
    }
    double disk = od->gbps * z->ratio;
    out->measured = 1;
    out->gbps = disk < z->decode_gbps ? disk : z->decode_gbps;
    out->bytes = od->bytes;
    out->seconds = od->seconds;
    snprintf(out->note, sizeof out->note,
             "min(odirect_uring %.2f GB/s of compressed bytes x ratio %.2f = %.2f, zst_decode "
             "%.2f): %s-bound",
             od->gbps, z->ratio, disk, z->decode_gbps, disk < z->decode_gbps ? "disk" : "decode");
}

/* The run that succeeded with the best samples/s, or NULL. */
static const nb_run *best_run(const nb_run *runs, size_t n)
{
    const nb_run *best = NULL;
    for (size_t i = 0; i < n; i++)
        if (runs[i].ok && (!best || runs[i].samples_per_s > best->samples_per_s))
            best = &runs[i];
    return best;
}

/* The raw run's worker CPU per sample (and its transforms' part): what the
 * judge compares packed data with, on the same workers. With a simulated
 * step the run's samples/s is the step's rate, not the loader's: the raw
 * rate is then what those workers could deliver at that CPU cost. @return :
 * the loader's raw samples/s (< 0 unknown). */
static double raw_like_for_like(const nb_run *r, const nb_config *cfg, int cores,
                                nb_zst_report *z)
{
    const npyload_stats *t = &r->timed;
    if (t->samples_delivered == 0 || t->worker_cpu_ns == 0)
        return cfg->compute_ms > 0 ? -1 : r->samples_per_s;
    z->raw_cpu_ns_per_sample = (double)t->worker_cpu_ns / (double)t->samples_delivered;
    z->transform_ns_per_sample = (double)t->transform_ns / (double)t->samples_delivered;
    z->workers = r->workers < cores ? r->workers : cores;
    if (z->workers < 1)
        z->workers = 1;
    if (!(cfg->compute_ms > 0))
        return r->samples_per_s;
    return (double)z->workers * 1e9 / z->raw_cpu_ns_per_sample;
}

static const nb_ceiling *find_ceiling(const nb_ceiling *ce, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ce[i].name, name) && ce[i].measured)
            return &ce[i];
    return NULL;
}

void nb_zst_after_grid(nb_ctx *ctx, const nb_config *cfg, int threads, const nb_ceiling *ce,
                       size_t nce, const nb_run *runs, size_t nruns, uint64_t total_bytes,
                       nb_zst_report *z)
{
    uint64_t sb = 0; /* a sample's bytes (--source: one source's fields) */
    for (int k = 0; k < ctx->nfields; k++)
        if (nb_field_source(cfg, k) <= 0)
            sb += ctx->data[k].sample_bytes;
    int packed = nb_zst_any(ctx);
    if (!packed) {
        memset(z, 0, sizeof *z);
        z->estimate = 1;
        z->level = NPYLOAD_PACK_DEFAULT_LEVEL;
        z->frame_size = NPYLOAD_PACK_DEFAULT_FRAME_SIZE;
        double secs = cfg->seconds > 0 ? cfg->seconds : 1.0;
        measure_fields(ctx, cfg, threads, secs > 2 ? 2 : secs, z);
    }
    z->raw_cold_sps = z->raw_warm_sps = -1;
    z->dataset_gib = (double)total_bytes / 1073741824.0;
    z->packed_gib = z->valid && z->ratio > 0 ? z->dataset_gib / z->ratio : -1;
    z->mem_available_gib = nb_mem_available_gib();
    int disk_bound = cfg->cold ||
                     (z->mem_available_gib > 0 && z->dataset_gib > 0.6 * z->mem_available_gib);
    const nb_run *br = best_run(runs, nruns);
    double best = br ? raw_like_for_like(br, cfg, threads, z) : -1;
    if (!packed && z->valid && sb > 0) {
        /* raw cold: the cold runs, else an O_DIRECT read of the files now
         * (the grid is done: evicting no longer disturbs it) */
        const nb_ceiling *od = find_ceiling(ce, nce, "odirect_uring");
        nb_ceiling mine;
        if (cfg->cold && best > 0 && !(cfg->compute_ms > 0)) { /* a step paces runs */
            z->raw_cold_sps = best;
            snprintf(z->raw_cold_source, sizeof z->raw_cold_source, "runs (cold)");
        } else if (!od && !disk_bound) {
            /* the data fits in the page cache: no O_DIRECT read (it would
             * evict the files the user just warmed); --cold measures it */
            snprintf(z->raw_cold_source, sizeof z->raw_cold_source, "not measured (--cold)");
        } else {
            if (!od) {
                memset(&mine, 0, sizeof mine);
                nb_ceiling_odirect(ctx, cfg, 1.0, &mine);
                od = mine.measured ? &mine : NULL;
                if (!od)
                    snprintf(z->raw_cold_source, sizeof z->raw_cold_source, "%.31s",
                             mine.note);
            }
            if (od) {
                z->raw_cold_sps = od->gbps * 1e9 / (double)sb;
                snprintf(z->raw_cold_source, sizeof z->raw_cold_source, "odirect_uring");
            }
        }
        const nb_ceiling *cp = find_ceiling(ce, nce, "pread_copy");
        if (!cfg->cold && best > 0) {
            z->raw_warm_sps = best;
            snprintf(z->raw_warm_source, sizeof z->raw_warm_source, "%s",
                     cfg->compute_ms > 0 ? "runs' worker CPU" : "runs (page cache)");
        } else if (cp) {
            z->raw_warm_sps = cp->gbps * 1e9 / (double)sb;
            snprintf(z->raw_warm_source, sizeof z->raw_warm_source, "pread_copy");
        }
    }
    nb_zst_judge(z, sb, disk_bound);
    if (packed && z->valid && sb > 0) {
        /* the bounds of the packed data: decode, and cold the disk x ratio */
        const nb_ceiling *zc = find_ceiling(ce, nce, "zst_cold");
        z->expected_warm_sps = z->decode_gbps * 1e9 / (double)sb;
        if (zc)
            z->expected_cold_sps = zc->gbps * 1e9 / (double)sb;
    }
}
