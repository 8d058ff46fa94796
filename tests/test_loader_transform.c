/* Transforms wired into the loader (npyload_loader_set_transform): values
 * against an independent float32 reference on every backend, shuffled, with
 * several workers; channels-last strides; ON_ERROR skip compaction; the
 * synchronous mode (NPYLOAD_WORKERS_SYNC); errors; device mode without
 * kernels or driver. The engine itself is tested in test_transform.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npyload.h"
#include "testutil.h"

#define C_ 3
#define H_ 4
#define W_ 5
#define SAMPLE (C_ * H_ * W_)
#define N_ 50

static const int64_t sshape[3] = {C_, H_, W_};
static const int64_t per_file[2] = {23, 27};
static const float mean3[3] = {0.485f, 0.456f, 0.406f};
static const float std3[3] = {0.229f, 0.224f, 0.225f};
static const float scale = 1.0f / 255.0f;

static char *make_u8(void)
{
    char *dir = tu_mkdtemp("ltr");
    cr_assert_eq(tu_write_field(dir, "img", 7, "|u1", 1, 3, sshape, per_file, 2, 64), 0);
    return dir;
}

static int uring_usable(void)
{
    char why[256];
    (void)why;
    char *dir = make_u8();
    npyload_loader *L;
    npyload_loader_create(&L);
    char *g = tu_path(dir, "img_*.npy");
    npyload_loader_add_field(L, "images", g);
    npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_URING);
    npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 1);
    int rc = npyload_loader_start(L);
    npyload_loader_destroy(L);
    free(g);
    tu_rmtree(dir);
    return rc == 0;
}

/* Independent decoders of the output dtypes. */
static float dec_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static float dec_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One ulp of a format with `mant` explicit mantissa bits and minimum
 * normal exponent `emin`, at magnitude |x|. */
static float ulp_at(float x, int mant, int emin)
{
    int e;
    frexpf(fabsf(x), &e); /* |x| = f * 2^e, f in [0.5, 1) */
    e -= 1;
    if (e < emin)
        e = emin;
    return ldexpf(1.0f, e - mant);
}

/* The float32 reference: three roundings, written out with volatile so no
 * FMA can contract them. */
static float ref_value(uint8_t x, int c, int norm)
{
    volatile float a = (float)x * scale;
    if (!norm)
        return a;
    volatile float b = a - mean3[c];
    return b / std3[c];
}

typedef struct tcase {
    int dtype;       /* NPYLOAD_DTYPE_* */
    int norm;        /* mean/std, else scale only */
    int channels_last;
} tcase;

static void set_case(npyload_loader *L, const tcase *t)
{
    npyload_transform tr = {.dtype = t->dtype, .scale = scale,
                            .channels_last = t->channels_last};
    if (t->norm) {
        tr.mean = mean3;
        tr.n_mean = 3;
        tr.std = std3;
        tr.n_std = 3;
    }
    cr_assert_eq(npyload_loader_set_transform(L, "images", &tr, sizeof tr), 0, "%s",
                 npyload_loader_errmsg(L));
}

static npyload_loader *open_loader(const char *dir, int backend, int workers, int64_t batch,
                                   int shuffle)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    char *g = tu_path(dir, "img_*.npy");
    cr_assert_eq(npyload_loader_add_field(L, "images", g), 0);
    free(g);
    npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend);
    npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers);
    npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch);
    npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, shuffle);
    npyload_loader_set(L, NPYLOAD_OPT_SEED, 11);
    return L;
}

/* Checks every element of a batch, reading it through the reported strides,
 * against the reference of its sample. Returns the rows checked. */
static size_t check_batch(const npyload_batch *b, const tcase *t)
{
    const npyload_array *a = npyload_batch_field(b, 0);
    const int64_t *idx = npyload_batch_indices(b);
    size_t rows = npyload_batch_size(b);
    static const char *const descr[] = {"|u1", "<f4", "<f2", "bfloat16"};
    static const size_t isz[] = {1, 4, 2, 2};
    cr_assert_str_eq(a->descr, descr[t->dtype]);
    cr_assert_eq(a->itemsize, isz[t->dtype]);
    cr_assert_eq(a->ndim, 4);
    cr_assert_eq(a->shape[0], (int64_t)rows);
    cr_assert_eq(a->shape[1], C_);
    cr_assert_eq(a->shape[2], H_);
    cr_assert_eq(a->shape[3], W_);
    cr_assert_eq(a->nbytes, rows * SAMPLE * a->itemsize);
    int64_t is = (int64_t)a->itemsize;
    /* Expected strides, written out (NCHW or NHWC). */
    int64_t want[4] = {SAMPLE * is, H_ * W_ * is, W_ * is, is};
    if (t->channels_last) {
        want[1] = is;
        want[2] = W_ * C_ * is;
        want[3] = C_ * is;
    }
    for (int d = 0; d < 4; d++)
        cr_assert_eq(a->strides[d], want[d], "stride %d: %lld, want %lld", d,
                     (long long)a->strides[d], (long long)want[d]);
    const uint8_t *base = a->data;
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C_; c++)
            for (int h = 0; h < H_; h++)
                for (int w = 0; w < W_; w++) {
                    uint8_t x = tu_byte(7, (uint64_t)idx[r], (uint64_t)((c * H_ + h) * W_ + w));
                    const uint8_t *p = base + (int64_t)r * a->strides[0] +
                                       c * a->strides[1] + h * a->strides[2] +
                                       w * a->strides[3];
                    if (t->dtype == NPYLOAD_DTYPE_KEEP) {
                        cr_assert_eq(*p, x);
                        continue;
                    }
                    float ref = ref_value(x, c, t->norm), got;
                    float tol = 0;
                    if (t->dtype == NPYLOAD_DTYPE_FLOAT32) {
                        memcpy(&got, p, 4);
                    } else {
                        uint16_t u;
                        memcpy(&u, p, 2);
                        int f16 = t->dtype == NPYLOAD_DTYPE_FLOAT16;
                        got = f16 ? dec_f16(u) : dec_bf16(u);
                        tol = f16 ? ulp_at(ref, 10, -14) : ulp_at(ref, 7, -126);
                    }
                    /* float32: the same three roundings, bit exact; the
                     * narrow types: within one ulp of the output dtype. */
                    cr_assert(fabsf(got - ref) <= tol,
                              "sample %lld (c%d h%d w%d): x=%u got %.9g want %.9g (tol %g)",
                              (long long)idx[r], c, h, w, x, (double)got, (double)ref,
                              (double)tol);
                }
    return rows;
}

static void run_cases_opt(int backend, int direct)
{
    char *dir = make_u8();
    static const tcase cases[] = {
        {NPYLOAD_DTYPE_FLOAT32, 1, 0},  {NPYLOAD_DTYPE_FLOAT32, 1, 1},
        {NPYLOAD_DTYPE_FLOAT16, 1, 0},  {NPYLOAD_DTYPE_FLOAT16, 1, 1},
        {NPYLOAD_DTYPE_BFLOAT16, 1, 0}, {NPYLOAD_DTYPE_BFLOAT16, 1, 1},
        {NPYLOAD_DTYPE_FLOAT32, 0, 0},  {NPYLOAD_DTYPE_FLOAT16, 0, 1},
        {NPYLOAD_DTYPE_KEEP, 0, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        npyload_loader *L = open_loader(dir, backend, 3, 7, NPYLOAD_SHUFFLE_FULL);
        npyload_loader_set(L, NPYLOAD_OPT_DIRECT_IO, direct);
        tcase t = cases[k];
        npyload_transform tr = {.dtype = t.dtype, .scale = t.dtype ? scale : 1.0f,
                                .channels_last = t.channels_last};
        if (t.norm) {
            tr.mean = mean3;
            tr.n_mean = 3;
            tr.std = std3;
            tr.n_std = 3;
        }
        cr_assert_eq(npyload_loader_set_transform(L, "images", &tr, sizeof tr), 0, "%s",
                     npyload_loader_errmsg(L));
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        size_t seen = 0;
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            seen += check_batch(b, &t);
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
        cr_assert_eq(seen, N_);
        npyload_loader_destroy(L);
    }
    tu_rmtree(dir);
}

static void run_cases(int backend) { run_cases_opt(backend, 0); }

Test(loader_transform, values_pread) { run_cases(NPYLOAD_IO_PREAD); }
/* O_DIRECT reads land in the raw buffer, laid out with their alignment. */
Test(loader_transform, values_pread_direct) { run_cases_opt(NPYLOAD_IO_PREAD, 1); }
Test(loader_transform, values_mmap) { run_cases(NPYLOAD_IO_MMAP); }
Test(loader_transform, values_uring)
{
    if (!uring_usable())
        cr_skip_test("io_uring is not usable on this machine");
    run_cases(NPYLOAD_IO_URING);
}

/* Slots are sized for the output dtype: float16 doubles a uint8 slot, and
 * the raw batch lives once per worker, not per slot. */
Test(loader_transform, slot_bytes_from_output_dtype)
{
    char *dir = make_u8();
    int64_t plain = 0, wide = 0;
    for (int k = 0; k < 2; k++) {
        npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD, 2, 64 * 1024, 0);
        if (k)
            set_case(L, &(tcase){NPYLOAD_DTYPE_FLOAT16, 1, 1});
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        npyload_stats st;
        npyload_loader_get_stats(L, &st, sizeof st);
        *(k ? &wide : &plain) = (int64_t)st.slot_bytes;
        npyload_loader_destroy(L);
    }
    /* A slot holds min(batch_size, N) = N_ rows, rounded up to 4096 bytes. */
    cr_assert(plain >= N_ * SAMPLE && plain < N_ * SAMPLE + 4096, "%lld", (long long)plain);
    cr_assert(wide >= 2 * N_ * SAMPLE && wide < 2 * N_ * SAMPLE + 4096, "%lld", (long long)wide);
    tu_rmtree(dir);
}

/* ON_ERROR skip: rows that fail are dropped and the good ones packed; the
 * transform must run on the packed rows (h->rows after the read), so every
 * delivered row matches its index. */
Test(loader_transform, skip_compaction_transforms_the_kept_rows)
{
    char *dir = make_u8();
    /* Shuffled: failing rows sit between good ones, so good rows move. */
    npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD, 1, 8, NPYLOAD_SHUFFLE_FULL);
    npyload_loader_set(L, NPYLOAD_OPT_ON_ERROR, 1);
    npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 1);
    tcase t = {NPYLOAD_DTYPE_FLOAT32, 1, 1};
    set_case(L, &t);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    /* Cut the second file (samples 23..49) after 10 samples and a half: the
     * loader sees the file changed and every row of it fails. */
    char *p = tu_path(dir, "img_0001.npy");
    size_t sz;
    free(tu_read_file(p, &sz));
    cr_assert_eq(truncate(p, (off_t)(sz - (27 - 10) * SAMPLE + SAMPLE / 2)), 0);
    free(p);
    npyload_loader_set_epoch(L, 1); /* batches read before the cut go away */
    size_t seen = 0;
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        seen += check_batch(b, &t);
        npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(seen, 23, "rows delivered: %zu", seen);
    npyload_stats st;
    npyload_loader_get_stats(L, &st, sizeof st);
    /* Epoch 1 skips exactly the 27 rows of the cut file (23 delivered); a
     * batch of epoch 0 that was in flight when the file was cut and that
     * set_epoch dropped was never delivered, so its rows do not count. */
    cr_assert_eq(st.samples_skipped, 27, "skipped %" PRIu64, st.samples_skipped);
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

/* samples_skipped counts the rows missing from batches handed out, not the
 * rows the workers dropped: batches read ahead and then thrown away by
 * set_epoch (their failures seen, stats.errors > 0) add nothing. */
Test(loader_transform, skipped_counts_only_delivered_batches)
{
    char *dir = make_u8();
    npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD, 2, 8, NPYLOAD_SHUFFLE_NONE);
    npyload_loader_set(L, NPYLOAD_OPT_ON_ERROR, 1);
    npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 6);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    /* Batch 0 (samples 0..7, all in the first file) first, so the workers
     * read the later batches after the cut. */
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    char *p = tu_path(dir, "img_0001.npy");
    size_t sz;
    free(tu_read_file(p, &sz));
    cr_assert_eq(truncate(p, (off_t)(sz - (27 - 10) * SAMPLE + SAMPLE / 2)), 0);
    free(p);
    size_t first = npyload_batch_size(b);
    npyload_batch_release(b);
    /* The workers go on reading epoch 0 past the cut: wait until some of
     * its rows failed (bounded), then drop the epoch. */
    npyload_stats st;
    for (int i = 0; i < 500; i++) {
        npyload_loader_get_stats(L, &st, sizeof st);
        if (st.errors > 0)
            break;
        usleep(10000);
    }
    cr_assert_gt(st.errors, 0, "no batch of epoch 0 read the cut file");
    npyload_loader_set_epoch(L, 1);
    size_t seen = 0;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        seen += npyload_batch_size(b);
        npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(seen, 23);
    npyload_loader_get_stats(L, &st, sizeof st);
    cr_assert_eq(first, 8);
    cr_assert_eq(st.samples_skipped, 27, "skipped %" PRIu64 " (errors %" PRIu64 ")",
                 st.samples_skipped, st.errors);
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

/* Reads every batch of an epoch into one buffer (indices + bytes). */
static uint8_t *epoch_bytes(npyload_loader *L, size_t *len, int64_t *idx_out)
{
    size_t cap = 1 << 20, n = 0, k = 0;
    uint8_t *buf = malloc(cap);
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        const npyload_array *a = npyload_batch_field(b, 0);
        cr_assert_leq(n + a->nbytes, cap);
        memcpy(buf + n, a->data, a->nbytes);
        n += a->nbytes;
        memcpy(idx_out + k, npyload_batch_indices(b), npyload_batch_size(b) * 8);
        k += npyload_batch_size(b);
        npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(k, N_);
    *len = n;
    return buf;
}

/* NPYLOAD_WORKERS_SYNC: next() reads on the calling thread; the bytes and
 * the order are those of two workers, with and without a transform, over
 * two epochs. */
Test(loader_transform, sync_mode_same_bytes_as_workers)
{
    char *dir = make_u8();
    for (int with = 0; with < 2; with++) {
        size_t len[2];
        uint8_t *bytes[2];
        int64_t idx[2][N_];
        for (int k = 0; k < 2; k++) {
            npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD,
                                            k ? NPYLOAD_WORKERS_SYNC : 2, 6,
                                            NPYLOAD_SHUFFLE_FULL);
            if (with)
                set_case(L, &(tcase){NPYLOAD_DTYPE_BFLOAT16, 1, 1});
            cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
            int64_t v = 0;
            npyload_loader_get(L, NPYLOAD_OPT_NUM_WORKERS, &v);
            cr_assert_eq(v, k ? NPYLOAD_WORKERS_SYNC : 2);
            cr_assert_eq(npyload_loader_set_epoch(L, 3), 0);
            bytes[k] = epoch_bytes(L, &len[k], idx[k]);
            npyload_loader_destroy(L);
        }
        cr_assert_eq(len[0], len[1]);
        cr_assert_eq(memcmp(idx[0], idx[1], sizeof idx[0]), 0);
        cr_assert_eq(memcmp(bytes[0], bytes[1], len[0]), 0);
        free(bytes[0]);
        free(bytes[1]);
    }
    tu_rmtree(dir);
}

/* Sync mode with every slot held: an error, never a wait. */
Test(loader_transform, sync_mode_all_held_is_an_error)
{
    char *dir = make_u8();
    npyload_loader *L = open_loader(dir, NPYLOAD_IO_MMAP, NPYLOAD_WORKERS_SYNC, 4, 0);
    npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 2);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b1, *b2, *b3;
    cr_assert_eq(npyload_loader_next(L, &b1), 0);
    cr_assert_eq(npyload_loader_next(L, &b2), 0);
    cr_assert_eq(npyload_loader_next(L, &b3), NPYLOAD_EHELD);
    npyload_batch_release(b1);
    cr_assert_eq(npyload_loader_next(L, &b3), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_batch_seq(b3), 2);
    npyload_batch_release(b2);
    npyload_batch_release(b3);
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

Test(loader_transform, errors_name_the_problem)
{
    char *dir = make_u8();
    npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD, 1, 4, 0);
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT16};
    cr_assert_eq(npyload_loader_set_transform(L, "labels", &t, sizeof t), NPYLOAD_EINVAL);
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), "labels"), "%s",
                       npyload_loader_errmsg(L));
    /* arithmetic with dtype keep */
    npyload_transform k = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_KEEP, .mean = mean3, .n_mean = 3};
    cr_assert_eq(npyload_loader_set_transform(L, "images", &k, sizeof k), NPYLOAD_EINVAL);
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), "images"));
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), "mean"), "%s",
                       npyload_loader_errmsg(L));
    /* std zero */
    static const float zero = 0;
    npyload_transform z = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .std = &zero, .n_std = 1};
    cr_assert_eq(npyload_loader_set_transform(L, "images", &z, sizeof z), NPYLOAD_EINVAL);
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), "std"), "%s", npyload_loader_errmsg(L));
    /* mean of 2 values for 3 channels: at start, naming both counts */
    npyload_transform m2 = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .mean = mean3, .n_mean = 2};
    cr_assert_eq(npyload_loader_set_transform(L, "images", &m2, sizeof m2), 0);
    cr_assert_eq(npyload_loader_start(L), NPYLOAD_EMISMATCH);
    const char *msg = npyload_loader_errmsg(L);
    cr_assert(strstr(msg, "images") && strstr(msg, "mean") && strstr(msg, "2 values") &&
                  strstr(msg, "3 channels"), "%s", msg);
    /* removed: the loader starts, then refuses a change */
    cr_assert_eq(npyload_loader_set_transform(L, "images", NULL, 0), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set_transform(L, "images", &t, sizeof t), NPYLOAD_ESTATE);
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), "after start"));
    /* without a transform: the stored dtype, contiguous strides */
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0);
    const npyload_array *a = npyload_batch_field(b, 0);
    cr_assert_str_eq(a->descr, "|u1");
    cr_assert_eq(a->strides[0], SAMPLE);
    cr_assert_eq(a->strides[1], H_ * W_);
    cr_assert_eq(a->strides[3], 1);
    npyload_batch_release(b);
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

/* The mean/std values are copied: the caller's arrays may go away. */
Test(loader_transform, values_copied)
{
    char *dir = make_u8();
    npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD, 2, 5, 0);
    float *m = malloc(3 * sizeof *m), *s = malloc(3 * sizeof *s);
    memcpy(m, mean3, sizeof mean3);
    memcpy(s, std3, sizeof std3);
    npyload_transform tr = {.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = scale, .mean = m,
                            .n_mean = 3, .std = s, .n_std = 3};
    cr_assert_eq(npyload_loader_set_transform(L, "images", &tr, sizeof tr), 0);
    memset(m, 0xff, 3 * sizeof *m); /* NaNs if the loader kept the pointer */
    free(m);
    free(s);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b;
    tcase t = {NPYLOAD_DTYPE_FLOAT32, 1, 0};
    while (npyload_loader_next(L, &b) == 0) {
        check_batch(b, &t);
        npyload_batch_release(b);
    }
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

/* Device mode fails at start with a clear message when the kernels or the
 * driver are missing; with neither a GPU nor CUDA here, DEVICE cannot even
 * be set, which also says why. */
Test(loader_transform, device_mode_without_cuda_says_why)
{
    char why[256] = "";
    if (npyload_cuda_available(0, why, sizeof why))
        cr_skip_test("a CUDA device is present: tests/gpu/test_gpu_transform.c covers it");
    char *dir = make_u8();
    npyload_loader *L = open_loader(dir, NPYLOAD_IO_PREAD, 1, 4, 0);
    set_case(L, &(tcase){NPYLOAD_DTYPE_FLOAT16, 1, 1});
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), NPYLOAD_ENOCUDA);
    cr_assert_neq(npyload_loader_errmsg(L)[0], 0);
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}
