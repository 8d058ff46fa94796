/* lib/remote: the configuration and its errors, request URLs, and the
 * loader over http:// lists served by the tests' own HTTP server
 * (tests/tu_http.c), compared byte for byte with the same loader over the
 * local files; the cache; retries; errors naming the URL. (The Python
 * tests run the same against SeaweedFS, a real S3 server, with signing
 * and listings.) */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "npyload.h"
#include "remote/npyload_remote.h"
#include "testutil.h"
#include "tu_http.h"

#ifdef NPYLOAD_HAVE_REMOTE
#include "remote/npyload_remote_impl.h"
#endif

static const int64_t SIZES[] = {7, 5, 9, 3};
#define NF (sizeof SIZES / sizeof SIZES[0])
static const int64_t SHAPE[] = {4, 6};

/* ---- configuration ---------------------------------------------------- */

Test(remote, configuration_errors_name_the_member_never_the_secret)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.secret_key = "TOPSECRET-value-123";
    int rc = npyload_loader_set_remote(L, &r, sizeof r);
    if (!npyl_remote_built(NULL, 0)) {
        cr_assert_eq(rc, NPYLOAD_EUNSUPPORTED);
        cr_assert(strstr(npyload_loader_errmsg(L), "libcurl4-openssl-dev"),
                  "%s", npyload_loader_errmsg(L));
        npyload_loader_destroy(L);
        return;
    }
    cr_assert_eq(rc, NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_loader_errmsg(L), "access_key is missing"), "%s",
              npyload_loader_errmsg(L));
    cr_assert_null(strstr(npyload_loader_errmsg(L), "TOPSECRET"));
    r.access_key = "AK";
    r.endpoint = "ftp://x";
    cr_assert_eq(npyload_loader_set_remote(L, &r, sizeof r), NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_loader_errmsg(L), "endpoint"));
    r.endpoint = "http://127.0.0.1:1";
    cr_assert_eq(npyload_loader_set_remote(L, &r, 8), NPYLOAD_EINVAL, "a pointer's size");
    /* A newer caller's struct with a member this library lacks, set. */
    unsigned char big[sizeof r + 8];
    memset(big, 0, sizeof big);
    memcpy(big, &r, sizeof r);
    big[sizeof r] = 1;
    cr_assert_eq(npyload_loader_set_remote(L, (const npyload_remote *)big, sizeof big),
                 NPYLOAD_EUNSUPPORTED);
    cr_assert_eq(npyload_loader_set_remote(L, &r, sizeof r), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_add_field(L, "x", "s3://bucket/x.npy"), 0);
    cr_assert_eq(npyload_loader_set_remote(L, &r, sizeof r), NPYLOAD_ESTATE);
    npyload_loader_destroy(L);
}

Test(remote, s3_paths_need_a_configuration)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    int rc = npyload_loader_add_field(L, "x", "s3://bucket/train_*.npy");
    cr_assert_lt(rc, 0);
    if (npyl_remote_built(NULL, 0))
        cr_assert(strstr(npyload_loader_errmsg(L), "npyload_loader_set_remote"), "%s",
                  npyload_loader_errmsg(L));
    else
        cr_assert(strstr(npyload_loader_errmsg(L), "libexpat1-dev"), "%s",
                  npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), "s3://bucket/train_*.npy"));
    npyload_build_info bi;
    cr_assert_eq(npyload_get_build_info(&bi, sizeof bi), 0);
    cr_assert_eq(bi.remote_compiled, npyl_remote_built(NULL, 0));
    cr_assert_neq(bi.remote_version[0], 0);
    npyload_loader_destroy(L);
}

#ifdef NPYLOAD_HAVE_REMOTE
Test(remote, request_urls_path_and_virtual_style)
{
    npyload_remote c;
    memset(&c, 0, sizeof c);
    c.endpoint = "http://127.0.0.1:8333/";
    npyl_remote *r;
    char err[256];
    cr_assert_eq(npyl_remote_create(&r, &c, err, sizeof err), 0, "%s", err);
    char *u = npyl_remote_request_url(r, "s3://bkt/dir/a b+c~.npy", NULL);
    cr_assert_str_eq(u, "http://127.0.0.1:8333/bkt/dir/a%20b%2Bc~.npy");
    free(u);
    npyl_remote_destroy(r);
    memset(&c, 0, sizeof c); /* AWS: virtual-hosted, path-style for dotted names */
    c.region = "eu-west-3";
    cr_assert_eq(npyl_remote_create(&r, &c, err, sizeof err), 0, "%s", err);
    u = npyl_remote_request_url(r, "s3://bkt/k.npy", NULL);
    cr_assert_str_eq(u, "https://bkt.s3.eu-west-3.amazonaws.com/k.npy");
    free(u);
    u = npyl_remote_request_url(r, "s3://my.bkt/k.npy", NULL);
    cr_assert_str_eq(u, "https://s3.eu-west-3.amazonaws.com/my.bkt/k.npy");
    free(u);
    u = npyl_remote_request_url(r, "https://h/p?X-Amz-Signature=abc", NULL);
    cr_assert_str_eq(u, "https://h/p?X-Amz-Signature=abc");
    free(u);
    char shown[64];
    npyl_remote_display("https://h/p?X-Amz-Signature=abc", shown, sizeof shown);
    cr_assert_str_eq(shown, "https://h/p?...", "a presigned URL's signature is not shown");
    npyl_remote_destroy(r);
}

/* ---- over http:// ----------------------------------------------------- */

typedef struct site {
    char *dir;
    tu_http *h;
    char *local[NF], *url[NF];
} site;

/* NF files of field x, sizes[k] samples in file k (packed: their .npy.zst
 * twins), in a fresh directory served over http://. */
static void site_up_sized(site *s, int packed, const int64_t *sizes)
{
    s->dir = tu_mkdtemp("remote");
    cr_assert_not_null(s->dir);
    cr_assert_eq(tu_write_field(s->dir, "x", 3, "<f4", 4, 2, SHAPE, sizes, NF, 64), 0);
    cr_assert_eq(tu_http_start(&s->h, s->dir), 0);
    for (size_t k = 0; k < NF; k++) {
        char name[64], u[256];
        snprintf(name, sizeof name, "x_%04zu.npy", k);
        s->local[k] = tu_path(s->dir, name);
        if (packed) {
            npyload_pack_options o;
            memset(&o, 0, sizeof o);
            o.frame_size = 200;
            char out[1024];
            snprintf(out, sizeof out, "%s.zst", s->local[k]);
            char perr[256];
            cr_assert_eq(npyload_pack_file(s->local[k], out, &o, sizeof o, NULL, 0, perr,
                                           sizeof perr), 0, "%s", perr);
            free(s->local[k]);
            s->local[k] = strdup(out);
            strcat(name, ".zst");
        }
        snprintf(u, sizeof u, "http://127.0.0.1:%d/%s", tu_http_port(s->h), name);
        s->url[k] = strdup(u);
    }
}

static void site_up(site *s, int packed) { site_up_sized(s, packed, SIZES); }

static void site_down(site *s)
{
    tu_http_stop(s->h);
    for (size_t k = 0; k < NF; k++) {
        free(s->local[k]);
        free(s->url[k]);
    }
    tu_rmtree(s->dir);
}

static npyload_loader *loader(char *const *paths, const npyload_remote *r, int workers)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    if (r)
        cr_assert_eq(npyload_loader_set_remote(L, r, sizeof *r), 0, "%s",
                     npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *const *)paths, NF), 0,
                 "%s", npyload_loader_errmsg(L));
    npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4);
    npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL);
    npyload_loader_set(L, NPYLOAD_OPT_SEED, 5);
    npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers);
    return L;
}

/* Every batch of epoch e of a and b equal (indices and bytes). */
static void same_epoch(npyload_loader *a, npyload_loader *b, uint64_t e)
{
    cr_assert_eq(npyload_loader_set_epoch(a, e), 0);
    cr_assert_eq(npyload_loader_set_epoch(b, e), 0);
    npyload_batch *x, *y;
    int ra, rb, n = 0;
    while ((ra = npyload_loader_next(a, &x)) == 0) {
        rb = npyload_loader_next(b, &y);
        cr_assert_eq(rb, 0, "%s", npyload_loader_errmsg(b));
        size_t rows = npyload_batch_size(x);
        cr_assert_eq(npyload_batch_size(y), rows);
        cr_assert_eq(memcmp(npyload_batch_indices(x), npyload_batch_indices(y),
                            rows * sizeof(int64_t)), 0);
        const npyload_array *fx = npyload_batch_field(x, 0), *fy = npyload_batch_field(y, 0);
        cr_assert_eq(fx->nbytes, fy->nbytes);
        cr_assert_eq(memcmp(fx->data, fy->data, fx->nbytes), 0, "batch %d differs", n);
        npyload_batch_release(x);
        npyload_batch_release(y);
        n++;
    }
    cr_assert_eq(ra, NPYLOAD_EOF, "%s", npyload_loader_errmsg(a));
    cr_assert_eq(npyload_loader_next(b, &y), NPYLOAD_EOF, "%s", npyload_loader_errmsg(b));
    cr_assert_gt(n, 0);
}

static void equal_to_local(int packed)
{
    site s;
    site_up(&s, packed);
    npyload_loader *a = loader(s.local, NULL, 2), *b = loader(s.url, NULL, 2);
    cr_assert_eq(npyload_loader_start(a), 0, "%s", npyload_loader_errmsg(a));
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    same_epoch(a, b, 0);
    same_epoch(a, b, 1);
    npyload_stats st;
    npyload_loader_get_stats(b, &st, sizeof st);
    cr_assert_gt(st.remote_requests, 0);
    cr_assert_gt(st.remote_bytes, 0);
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    site_down(&s);
}

Test(remote, http_npy_equals_local) { equal_to_local(0); }
Test(remote, http_npy_zst_equals_local) { equal_to_local(1); }

Test(remote, cache_serves_the_second_epoch)
{
    site s;
    site_up(&s, 1);
    char *cache = tu_path(s.dir, "cache");
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.cache_dir = cache;
    r.cache_block = 4096;
    npyload_loader *a = loader(s.local, NULL, 2), *b = loader(s.url, &r, 2);
    cr_assert_eq(npyload_loader_start(a), 0);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    same_epoch(a, b, 0);
    npyload_stats s0, s1;
    npyload_loader_get_stats(b, &s0, sizeof s0);
    uint64_t served = tu_http_requests(s.h);
    same_epoch(a, b, 1);
    npyload_loader_get_stats(b, &s1, sizeof s1);
    cr_assert_eq(tu_http_requests(s.h), served, "epoch 1 asked the server");
    cr_assert_eq(s1.remote_requests, s0.remote_requests);
    cr_assert_gt(s1.cache_hits, s0.cache_hits);
    cr_assert_gt(s0.cache_write_bytes, 0);
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    free(cache);
    site_down(&s);
}

/* Concurrent misses of one block in one process wait for the one fetch:
 * on a cold cached epoch with many reading threads (4 workers, each with
 * its read-ahead thread, one-sample batches, shuffled), every block is
 * fetched once: the blocks missed are at most the blocks there are, and
 * the bytes the server sent at most the objects' bytes plus start's
 * probe (each object here fits in one probe and one block). */
Test(remote, concurrent_misses_of_a_block_fetch_it_once)
{
    site s;
    site_up(&s, 0);
    char *cache = tu_path(s.dir, "cache");
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.cache_dir = cache;
    r.cache_block = 1 << 20; /* one block per object */
    uint64_t objects = 0;
    for (size_t k = 0; k < NF; k++) {
        npyload_header h;
        cr_assert_eq(npyload_read_header(s.local[k], &h, NULL, 0), 0);
        objects += h.file_bytes;
        cr_assert_leq(h.file_bytes, 4096, "an object fits in the probe's head");
    }
    for (int round = 0; round < 3; round++) {
        char sub[64];
        snprintf(sub, sizeof sub, "cache%d", round);
        char *dir = tu_path(s.dir, sub);
        r.cache_dir = dir;
        npyload_loader *a = loader(s.local, NULL, 1), *b = loader(s.url, &r, 4);
        npyload_loader_set(b, NPYLOAD_OPT_BATCH_SIZE, 1);
        npyload_loader_set(a, NPYLOAD_OPT_BATCH_SIZE, 1);
        npyload_loader_set(b, NPYLOAD_OPT_PREFETCH, 16);
        cr_assert_eq(npyload_loader_start(a), 0);
        cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
        same_epoch(a, b, (uint64_t)round);
        npyload_stats st;
        npyload_loader_get_stats(b, &st, sizeof st);
        cr_assert_leq(st.cache_misses, NF, "%llu blocks fetched for %zu blocks",
                      (unsigned long long)st.cache_misses, NF);
        cr_assert_leq(st.remote_bytes, 2 * objects, "%llu bytes received for %llu + %llu",
                      (unsigned long long)st.remote_bytes, (unsigned long long)objects,
                      (unsigned long long)objects);
        cr_assert_eq(st.cache_write_bytes, objects);
        npyload_loader_destroy(a);
        npyload_loader_destroy(b);
        free(dir);
    }
    free(cache);
    site_down(&s);
}

/* npyload_loader_stop keeps what start read: the next start (other
 * options) asks the server nothing; a held batch refuses the stop; a field
 * added after it is read at the next start. */
Test(remote, stop_then_start_probes_nothing_again)
{
    site s;
    site_up(&s, 1);
    npyload_loader *a = loader(s.local, NULL, 2), *b = loader(s.url, NULL, -1);
    cr_assert_eq(npyload_loader_stop(b), NPYLOAD_ESTATE, "not started");
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    int64_t n = npyload_loader_num_samples(b);
    npyload_batch *x;
    cr_assert_eq(npyload_loader_next(b, &x), 0);
    cr_assert_eq(npyload_loader_stop(b), NPYLOAD_ESTATE, "a batch is held");
    cr_assert(strstr(npyload_loader_errmsg(b), "held"), "%s", npyload_loader_errmsg(b));
    npyload_batch_release(x);
    cr_assert_eq(npyload_loader_stop(b), 0, "%s", npyload_loader_errmsg(b));
    /* Headers and probes only: the workers' reads begin as soon as start
     * returns (counting every request raced with them). */
    uint64_t before = tu_http_heads(s.h);
    cr_assert_eq(npyload_loader_set(b, NPYLOAD_OPT_NUM_WORKERS, 3), 0);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    cr_assert_eq(tu_http_heads(s.h), before, "the second start asked the server");
    cr_assert_eq(npyload_loader_num_samples(b), n);
    cr_assert_eq(npyload_loader_start(a), 0);
    same_epoch(a, b, 0);
    cr_assert_eq(npyload_loader_stop(b), 0);
    cr_assert_eq(npyload_loader_add_field_files(b, "y", (const char *const *)s.url, NF), 0);
    before = tu_http_heads(s.h);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    cr_assert_gt(tu_http_heads(s.h), before, "a new field is read at start");
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    site_down(&s);
}

#ifdef NPYLOAD_HAVE_REMOTE
/* A crash's temporary file is told by its writer's flock, not only its
 * PID: an old unlocked one goes at the next eviction pass even when its
 * PID is alive (here: ours, as after PID reuse); one whose writer holds it
 * stays, and so does a fresh one of a live PID (its writer may not have
 * locked it yet). (A fresh one of a dead PID goes: test_remote.py.) */
static char *old_tmp(const char *dir, const char *name, int age_s)
{
    char *p = tu_path(dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "partial", 7), 7);
    close(fd);
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= age_s;
    t[1] = t[0];
    cr_assert_eq(utimensat(AT_FDCWD, p, t, 0), 0);
    return p;
}

Test(remote, orphaned_temporary_files_are_told_by_their_lock)
{
    char *dir = tu_mkdtemp("orphans");
    char a[64], b[64], c[64];
    snprintf(a, sizeof a, ".tmp-%ld-1-0123456789ab.0", (long)getpid());
    snprintf(b, sizeof b, ".tmp-%ld-2-0123456789ab.1", (long)getpid());
    snprintf(c, sizeof c, ".tmp-%ld-3-0123456789ab.2", (long)getpid());
    char *pa = old_tmp(dir, a, 3600), *pb = old_tmp(dir, b, 3600), *pc = old_tmp(dir, c, 0);
    int held = open(pb, O_RDONLY);
    cr_assert_eq(flock(held, LOCK_EX | LOCK_NB), 0);
    npyl_cache *cache;
    char err[256];
    cr_assert_eq(npyl_cache_open(&cache, dir, 1 << 20, 4096, err, sizeof err), 0, "%s", err);
    cr_assert_neq(access(pa, F_OK), 0, "an unlocked old temporary file is an orphan");
    cr_assert_eq(access(pb, F_OK), 0, "a locked one has a writer");
    cr_assert_eq(access(pc, F_OK), 0, "a fresh one may not be locked yet");
    npyl_cache_close(cache);
    close(held);
    free(pa);
    free(pb);
    free(pc);
    tu_rmtree(dir);
}
#endif

Test(remote, slow_down_and_closed_connections_are_retried)
{
    site s;
    site_up(&s, 0);
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.retry_base_ms = 1;
    npyload_loader *a = loader(s.local, NULL, 2), *b = loader(s.url, &r, 2);
    cr_assert_eq(npyload_loader_start(a), 0);
    /* Before start: set after it, the workers may have read every batch
     * already (it failed so under ASan on a loaded machine); the probes
     * meet the faults then, with the same retries. */
    tu_http_faults(s.h, 3, 3);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    same_epoch(a, b, 0);
    npyload_stats st;
    npyload_loader_get_stats(b, &st, sizeof st);
    cr_assert_geq(st.remote_retries, 6);
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    site_down(&s);
}

Test(remote, missing_object_names_the_url)
{
    site s;
    site_up(&s, 0);
    free(s.url[2]);
    char u[256];
    snprintf(u, sizeof u, "http://127.0.0.1:%d/nothere.npy", tu_http_port(s.h));
    s.url[2] = strdup(u);
    npyload_loader *b = loader(s.url, NULL, 1);
    cr_assert_eq(npyload_loader_start(b), -ENOENT);
    cr_assert(strstr(npyload_loader_errmsg(b), u), "%s", npyload_loader_errmsg(b));
    cr_assert(strstr(npyload_loader_errmsg(b), "404"), "%s", npyload_loader_errmsg(b));
    npyload_loader_destroy(b);
    site_down(&s);
}

/* Every object replaced: same size, new bytes (a new inode: the ETag
 * changes). */
static void replace_objects(const site *s)
{
    for (size_t k = 0; k < NF; k++) {
        size_t n;
        unsigned char *d = tu_read_file(s->local[k], &n);
        cr_assert_not_null(d);
        d[n - 1] ^= 0xff;
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s.new", s->local[k]);
        FILE *f = fopen(tmp, "wb");
        cr_assert_eq(fwrite(d, 1, n, f), n);
        fclose(f);
        cr_assert_eq(rename(tmp, s->local[k]), 0);
        free(d);
    }
}

Test(remote, an_object_changed_since_start_fails_naming_it)
{
    site s;
    site_up(&s, 0);
    npyload_loader *b = loader(s.url, NULL, 1);
    npyload_loader_set(b, NPYLOAD_OPT_READ_AHEAD, -1);
    npyload_loader_set(b, NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_WORKERS_SYNC);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    replace_objects(&s);
    npyload_batch *x;
    int rc = npyload_loader_next(b, &x);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "%d %s", rc, npyload_loader_errmsg(b));
    cr_assert(strstr(npyload_loader_errmsg(b), "http://127.0.0.1:"), "%s",
              npyload_loader_errmsg(b));
    npyload_loader_destroy(b);
    site_down(&s);
}

Test(remote, a_server_gone_fails_in_bounded_time)
{
    site s;
    site_up(&s, 0);
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.retries = 2;
    r.retry_base_ms = 10;
    r.timeout_ms = 2000;
    npyload_loader *b = loader(s.url, &r, 1);
    npyload_loader_set(b, NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_WORKERS_SYNC);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    tu_http_stop(s.h);
    s.h = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    npyload_batch *x;
    int rc = npyload_loader_next(b, &x);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(npyload_loader_errmsg(b), "3 attempts"), "%s", npyload_loader_errmsg(b));
    cr_assert_lt(t1.tv_sec - t0.tv_sec, 20);
    npyload_loader_destroy(b);
    site_down(&s);
}
#endif

/* ---- hostile servers, close and Ctrl-C (issue 35, items 10, 11, 15) ---- */

#ifdef NPYLOAD_HAVE_REMOTE
static double since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

static npyload_loader *s3_loader(tu_http *h)
{
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", tu_http_port(h));
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.endpoint = ep;
    r.retry_base_ms = 1;
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_set_remote(L, &r, sizeof r), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

/* A listing whose pages never end: the same continuation token given back
 * forever (no keys), or new tokens over the same keys. Fails at once (a
 * few pages), naming the pattern and why, instead of listing forever. */
Test(remote, a_listing_that_never_ends_fails_fast)
{
    char *dir = tu_mkdtemp("remote_list");
    tu_http *h;
    cr_assert_eq(tu_http_start(&h, dir), 0);
    const int modes[] = {TU_LIST_SAME_TOKEN, TU_LIST_REPEAT};
    const char *why[] = {"never end", "does not move on"};
    for (int m = 0; m < 2; m++) {
        tu_http_listing(h, modes[m]);
        uint64_t p0 = tu_http_pages(h);
        npyload_loader *L = s3_loader(h);
        int rc = npyload_loader_add_field(L, "x", "s3://bkt/p/x_*.npy");
        cr_assert_eq(rc, NPYLOAD_EREMOTE, "mode %d: %d %s", m, rc, npyload_loader_errmsg(L));
        cr_assert(strstr(npyload_loader_errmsg(L), "s3://bkt/p/x_*.npy"), "%s",
                  npyload_loader_errmsg(L));
        cr_assert(strstr(npyload_loader_errmsg(L), why[m]), "%s", npyload_loader_errmsg(L));
        cr_assert_leq(tu_http_pages(h) - p0, 3, "%llu pages",
                      (unsigned long long)(tu_http_pages(h) - p0));
        npyload_loader_destroy(L);
    }
    tu_http_stop(h);
    tu_rmtree(dir);
}

typedef struct interrupter {
    pthread_t thread;  /* the thread the callback must be called on */
    struct timespec t0;
    double after;      /* seconds: then it says stop */
    int calls, wrong_thread;
} interrupter;

static int interrupt_after(void *arg)
{
    interrupter *i = arg;
    i->calls++;
    i->wrong_thread += !pthread_equal(pthread_self(), i->thread);
    return since(&i->t0) > i->after;
}

/* The interrupt callback (Ctrl-C in Python) stops a listing that would go
 * on (fresh tokens and keys on every page) and a start whose probe waits
 * for a server that never answers: -ECANCELED "interrupted", soon after
 * the callback says so, on the caller's thread only. */
Test(remote, the_interrupt_callback_stops_a_listing_and_a_probe)
{
    char *dir = tu_mkdtemp("remote_intr");
    tu_http *h;
    cr_assert_eq(tu_http_start(&h, dir), 0);
    tu_http_listing(h, TU_LIST_FRESH);
    interrupter in = {.thread = pthread_self(), .after = 0.5};
    npyload_loader *L = s3_loader(h);
    cr_assert_eq(npyload_loader_set_interrupt(L, interrupt_after, &in), 0);
    clock_gettime(CLOCK_MONOTONIC, &in.t0);
    int rc = npyload_loader_add_field(L, "x", "s3://bkt/p/x_*.npy");
    double took = since(&in.t0);
    cr_assert_eq(rc, -ECANCELED, "%d %s", rc, npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), "interrupted"), "%s", npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), "s3://bkt/p/x_*.npy"), "%s",
              npyload_loader_errmsg(L));
    cr_assert_gt(tu_http_pages(h), 1, "the listing went on until interrupted");
    cr_assert_lt(took, 10.0, "%.1f s", took);
    cr_assert_gt(in.calls, 0);
    cr_assert_eq(in.wrong_thread, 0);
    npyload_loader_destroy(L);
    /* A probe: every request stalls; the default timeouts (60 s x 9). */
    char *p = tu_path(dir, "a.npy");
    const int64_t shape[1] = {4};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 1, shape, (float[4]){0}, 16, 64), 0);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/a.npy", tu_http_port(h));
    tu_http_stall(h, 1);
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_set_interrupt(L, interrupt_after, &in), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){url}, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 1), 0);
    in.calls = 0;
    clock_gettime(CLOCK_MONOTONIC, &in.t0);
    rc = npyload_loader_start(L);
    took = since(&in.t0);
    cr_assert_eq(rc, -ECANCELED, "%d %s", rc, npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), url), "%s", npyload_loader_errmsg(L));
    cr_assert_lt(took, 10.0, "%.1f s", took);
    cr_assert_eq(in.wrong_thread, 0);
    npyload_loader_destroy(L);
    tu_http_stall(h, 0);
    free(p);
    tu_http_stop(h);
    tu_rmtree(dir);
}

/* destroy() while the workers' GETs stall (a server that stopped
 * answering mid-epoch): it aborts them and returns in about 100 ms, not
 * after the timeout (20 s here) times the attempts. */
Test(remote, destroy_aborts_stalled_transfers)
{
    site s;
    site_up(&s, 0);
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.timeout_ms = 20000;
    r.retries = 1;
    npyload_loader *b = loader(s.url, &r, 2);
    npyload_loader_set(b, NPYLOAD_OPT_BATCH_SIZE, 1);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    npyload_batch *x;
    cr_assert_eq(npyload_loader_next(b, &x), 0, "%s", npyload_loader_errmsg(b));
    npyload_batch_release(x);
    tu_http_stall(s.h, 1);
    cr_assert_eq(npyload_loader_set_epoch(b, 1), 0); /* new reads, into the stall */
    for (int i = 0; i < 200 && tu_http_stalled(s.h) == 0; i++)
        usleep(10000);
    cr_assert_gt(tu_http_stalled(s.h), 0, "no GET reached the server");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    npyload_loader_destroy(b);
    double took = since(&t0);
    cr_assert_lt(took, 5.0, "destroy took %.1f s: it waited for the stalled GETs", took);
    tu_http_stall(s.h, 0);
    site_down(&s);
}

/* A stalled GET: next() (as the bindings call it, in slices of
 * next_timeout) reports the URL and the remote timeout, with a code that
 * is not next_timeout's -ETIMEDOUT "no batch yet", and never "the loader
 * failed earlier". */
Test(remote, a_stalled_get_names_the_url_and_the_timeout)
{
    for (int sync = 0; sync <= 1; sync++) {
        site s;
        site_up(&s, 0);
        npyload_remote r;
        memset(&r, 0, sizeof r);
        r.timeout_ms = 500;
        r.retries = 1;
        r.retry_base_ms = 1;
        npyload_loader *b = loader(s.url, &r, sync ? NPYLOAD_WORKERS_SYNC : 1);
        cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
        tu_http_stall(s.h, 1);
        if (!sync)
            cr_assert_eq(npyload_loader_set_epoch(b, 1), 0); /* reads after the stall */
        npyload_batch *x;
        int rc;
        while ((rc = npyload_loader_next_timeout(b, &x, 50 * 1000 * 1000)) == -ETIMEDOUT)
            ;
        const char *msg = npyload_loader_errmsg(b);
        cr_assert_eq(rc, NPYLOAD_EREMOTE, "sync %d: %d %s", sync, rc, msg);
        cr_assert(strstr(msg, "http://127.0.0.1:"), "%s", msg);
        cr_assert(strstr(msg, "timeout is 0.5 s"), "%s", msg);
        cr_assert_null(strstr(msg, "failed earlier"), "%s", msg);
        npyload_loader_destroy(b);
        tu_http_stall(s.h, 0);
        site_down(&s);
    }
}
#endif

/* ---- secrets in URLs (issue 35, item 14) ---- */

Test(remote, mask_urls_hides_userinfo_passwords_and_query_strings)
{
    static const char *const cases[][2] = {
        {"http://user:PASS@host/x.npy", "http://user:***@host/x.npy"},
        {"https://u:p@h:8443", "https://u:***@h:8443"},
        {"field 'x': http://a:b%40c@h/x.npy: HTTP 404", "field 'x': http://a:***@h/x.npy: HTTP 404"},
        {"http://u:P@ss@h/x", "http://u:***@h/x"},          /* the last '@' ends it */
        {"http://user@h/x (no password)", "http://user@h/x (no password)"},
        {"https://h/p?X-Amz-Signature=abc: GET failed", "https://h/p?...: GET failed"},
        {"https://h/p?X-Amz-Signature=abc", "https://h/p?..."},
        {"s3://bkt/k.npy and http://x:y@z/a?q=1, done", "s3://bkt/k.npy and http://x:***@z/a?..., done"},
        {"'http://u:secret@h/a.npy'", "'http://u:***@h/a.npy'"},
        {"no url here: a:b@c", "no url here: a:b@c"},
        {"://u:p@h", "://u:p@h"},                         /* no scheme */
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[256];
        size_t n = npyload_mask_urls(cases[i][0], out, sizeof out);
        cr_assert_str_eq(out, cases[i][1], "case %zu", i);
        cr_assert_eq(n, strlen(cases[i][1]));
    }
    /* Truncation as snprintf: the length that would be written. */
    char small[12];
    size_t n = npyload_mask_urls("http://u:pw@host/long/path", small, sizeof small);
    cr_assert_eq(n, strlen("http://u:***@host/long/path"));
    cr_assert_str_eq(small, "http://u:**");
    cr_assert_eq(npyload_mask_urls("x", NULL, 0), 1);
}

#ifdef NPYLOAD_HAVE_REMOTE
/* URLs with a password in them: no message of the loader shows it, at
 * add_field/start (a missing object), mid-epoch (an object changed since
 * start) or in last_skip_error (ON_ERROR skip). */
Test(remote, a_password_in_a_url_is_never_shown)
{
    site s;
    site_up(&s, 0);
    for (size_t k = 0; k < NF; k++) {
        char u[256];
        snprintf(u, sizeof u, "http://user:S3cretPw@127.0.0.1:%d/x_%04zu.npy",
                 tu_http_port(s.h), k);
        free(s.url[k]);
        s.url[k] = strdup(u);
    }
    char *keep = s.url[1];
    char missing[256];
    snprintf(missing, sizeof missing, "http://user:S3cretPw@127.0.0.1:%d/gone.npy",
             tu_http_port(s.h));
    s.url[1] = missing;
    npyload_loader *b = loader(s.url, NULL, 1);
    cr_assert_eq(npyload_loader_start(b), -ENOENT, "%s", npyload_loader_errmsg(b));
    const char *msg = npyload_loader_errmsg(b);
    cr_assert(strstr(msg, "http://user:***@127.0.0.1:") && strstr(msg, "gone.npy"), "%s", msg);
    cr_assert_null(strstr(msg, "S3cretPw"), "%s", msg);
    npyload_loader_destroy(b);
    s.url[1] = keep;
    for (int skip = 0; skip <= 1; skip++) {
        b = loader(s.url, NULL, 1);
        npyload_loader_set(b, NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_WORKERS_SYNC);
        npyload_loader_set(b, NPYLOAD_OPT_ON_ERROR, skip);
        cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
        replace_objects(&s);
        npyload_batch *x;
        int rc = npyload_loader_next(b, &x);
        char last[1024];
        if (skip) {
            cr_assert_eq(rc, 0, "%s", npyload_loader_errmsg(b));
            npyload_batch_release(x);
            npyload_loader_last_skip_error(b, last, sizeof last);
            msg = last;
        } else {
            cr_assert_eq(rc, NPYLOAD_ECHANGED, "%d %s", rc, npyload_loader_errmsg(b));
            msg = npyload_loader_errmsg(b);
        }
        cr_assert(strstr(msg, "http://user:***@127.0.0.1:"), "%s", msg);
        cr_assert_null(strstr(msg, "S3cretPw"), "%s", msg);
        npyload_loader_destroy(b);
    }
    site_down(&s);
}
#endif

#ifdef NPYLOAD_HAVE_REMOTE
/* npyload_remote_narrow_stored: a stored narrowed .npy over http:// gives
 * the facts the local file gives (issue 35, item 18). */
Test(remote, a_stored_narrowed_object_reports_its_value_table)
{
    site s;
    site_up(&s, 0);
    npyload_pack_options o = {.threads = 1, .narrow = 1, .store = 1};
    char out[1024], err[512] = "";
    snprintf(out, sizeof out, "%s/n.narrow.npy", s.dir);
    cr_assert_eq(npyload_pack_file(s.local[0], out, &o, sizeof o, NULL, 0, err, sizeof err), 0,
                 "%s", err);
    npyload_remote_client *c;
    cr_assert_eq(npyload_remote_client_create(&c, NULL, 0, err, sizeof err), 0, "%s", err);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/n.narrow.npy", tu_http_port(s.h));
    npyload_header h, lh;
    npyload_zst_file *z = NULL;
    cr_assert_eq(npyload_remote_inspect(c, url, &h, &z, err, sizeof err), 0, "%s", err);
    cr_assert_null(z);
    uint32_t rv = 0, lv = 0, rw = 0, lw = 0;
    char rd[NPYLOAD_DESCR_LEN] = "", ld[NPYLOAD_DESCR_LEN] = "";
    cr_assert_eq(npyload_remote_narrow_stored(c, url, &h, &rv, &rw, rd, err, sizeof err), 1,
                 "%s", err);
    cr_assert_eq(npyload_read_header(out, &lh, err, sizeof err), 0);
    cr_assert_eq(npyload_narrow_stored(out, &lh, &lv, &lw, ld, err, sizeof err), 1, "%s", err);
    cr_assert_eq(rv, lv);
    cr_assert_eq(rw, lw);
    cr_assert_str_eq(rd, ld);
    cr_assert_str_eq(rd, "<f4");
    npyload_remote_client_destroy(c);
    site_down(&s);
}
#endif

/* ---- npyload_prefetch: a node's cache filled before a job -------------- */

static npyload_prefetch *prefetch_for(const site *s, const char *cache)
{
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.cache_dir = cache;
    r.cache_block = 4096;
    npyload_prefetch *P = NULL;
    char err[512];
    cr_assert_eq(npyload_prefetch_create(&P, &r, sizeof r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyload_prefetch_add_field_files(P, (const char *const *)s->url, NF), 0, "%s",
                 npyload_prefetch_errmsg(P));
    return P;
}

/* A fill puts every block of the objects in the cache (one GET per object
 * here, and one probe), and a loader given the same cache then reads an
 * epoch equal to the local files' asking the server for its start's
 * probes only; a second fill finds every block and fetches none. */
Test(remote, prefetch_fills_what_a_loader_then_reads_without_asking)
{
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    site_up(&s, 0);
    char *cache = tu_path(s.dir, "cache");
    uint64_t objects = 0, blocks = 0;
    for (size_t k = 0; k < NF; k++) {
        struct stat st;
        cr_assert_eq(stat(s.local[k], &st), 0);
        objects += (uint64_t)st.st_size;
        blocks += ((uint64_t)st.st_size + 4095) / 4096;
    }
    npyload_prefetch *P = prefetch_for(&s, cache);
    npyload_prefetch_progress g;
    cr_assert_eq(npyload_prefetch_get_progress(P, &g, sizeof g), 0);
    cr_assert_eq(g.phase, NPYLOAD_PREFETCH_IDLE);
    uint64_t before = tu_http_requests(s.h);
    cr_assert_eq(npyload_prefetch_run(P), 0, "%s", npyload_prefetch_errmsg(P));
    cr_assert_eq(npyload_prefetch_get_progress(P, &g, sizeof g), 0);
    cr_assert_eq(g.phase, NPYLOAD_PREFETCH_DONE);
    cr_assert_eq(g.rc, 0);
    cr_assert_eq(g.objects, NF);
    cr_assert_eq(g.dataset_bytes, objects);
    cr_assert_eq(g.planned_bytes, objects);
    cr_assert_eq(g.cached_bytes, objects);
    cr_assert_eq(g.fetched_bytes, objects);
    cr_assert_eq(g.planned_blocks, blocks);
    cr_assert_eq(g.fetched_blocks, blocks);
    cr_assert_eq(g.requests, tu_http_requests(s.h) - before);
    cr_assert_eq(g.requests, 2 * NF, "a probe and one GET per object: %llu",
                 (unsigned long long)g.requests);
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.cache_dir = cache;
    r.cache_block = 4096;
    npyload_loader *a = loader(s.local, NULL, 2), *b = loader(s.url, &r, 2);
    cr_assert_eq(npyload_loader_start(a), 0);
    before = tu_http_requests(s.h);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    same_epoch(a, b, 0);
    npyload_stats st;
    npyload_loader_get_stats(b, &st, sizeof st);
    cr_assert_eq(st.cache_misses, 0);
    cr_assert_eq(tu_http_requests(s.h) - before, NF, "the loader asked more than its probes");
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    cr_assert_eq(npyload_prefetch_run(P), 0, "%s", npyload_prefetch_errmsg(P));
    cr_assert_eq(npyload_prefetch_get_progress(P, &g, sizeof g), 0);
    cr_assert_eq(g.found_blocks, blocks);
    cr_assert_eq(g.fetched_blocks, 0);
    cr_assert_eq(g.cached_bytes, objects);
    npyload_prefetch_destroy(P);
    free(cache);
    site_down(&s);
}

/* A part: MAX_BYTES fills the first whole blocks in order and no more;
 * the cache's bound caps the part at 90 % of it. */
Test(remote, prefetch_fills_a_part_within_its_budget)
{
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    site_up(&s, 0);
    char *cache = tu_path(s.dir, "cache");
    npyload_prefetch *P = prefetch_for(&s, cache);
    cr_assert_eq(npyload_prefetch_set(P, NPYLOAD_PREFETCH_MAX_BYTES, 1500), 0);
    cr_assert_eq(npyload_prefetch_run(P), 0, "%s", npyload_prefetch_errmsg(P));
    npyload_prefetch_progress g;
    cr_assert_eq(npyload_prefetch_get_progress(P, &g, sizeof g), 0);
    uint64_t want = 0; /* the first objects (one block each) within 1500 bytes */
    for (size_t k = 0; k < NF; k++) {
        struct stat st;
        cr_assert_eq(stat(s.local[k], &st), 0);
        if (want + (uint64_t)st.st_size > 1500)
            break;
        want += (uint64_t)st.st_size;
    }
    cr_assert_gt(want, 0);
    cr_assert_eq(g.planned_bytes, want, "%llu planned, %llu expected",
                 (unsigned long long)g.planned_bytes, (unsigned long long)want);
    cr_assert_eq(g.cached_bytes, g.planned_bytes);
    npyload_prefetch_destroy(P);
    /* cache_bytes bounds the part: 90 % of 2 blocks holds one block. */
    npyload_remote r;
    memset(&r, 0, sizeof r);
    char *small = tu_path(s.dir, "small");
    r.cache_dir = small;
    r.cache_block = 4096;
    r.cache_bytes = 2 * 4096;
    char err[512];
    cr_assert_eq(npyload_prefetch_create(&P, &r, sizeof r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyload_prefetch_add_field_files(P, (const char *const *)s.url, NF), 0);
    cr_assert_eq(npyload_prefetch_run(P), 0, "%s", npyload_prefetch_errmsg(P));
    cr_assert_eq(npyload_prefetch_get_progress(P, &g, sizeof g), 0);
    cr_assert_leq(g.planned_bytes, 2 * 4096 - 2 * 4096 / 10);
    cr_assert_gt(g.planned_bytes, 0);
    npyload_prefetch_destroy(P);
    free(small);
    free(cache);
    site_down(&s);
}

Test(remote, prefetch_errors_name_what_is_wrong)
{
    npyload_prefetch *P = NULL;
    char err[512] = "";
    cr_assert_eq(npyload_prefetch_create(&P, NULL, 0, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "cache_dir"), "%s", err);
    npyload_remote r;
    memset(&r, 0, sizeof r);
    cr_assert_eq(npyload_prefetch_create(&P, &r, sizeof r, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "cache_dir"), "%s", err);
    cr_assert_eq(npyload_prefetch_create(&P, &r, 8, err, sizeof err), NPYLOAD_EINVAL);
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    site_up(&s, 0);
    char *cache = tu_path(s.dir, "cache");
    r.cache_dir = cache;
    cr_assert_eq(npyload_prefetch_create(&P, &r, sizeof r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyload_prefetch_run(P), NPYLOAD_EINVAL, "no field");
    cr_assert(strstr(npyload_prefetch_errmsg(P), "no field"));
    cr_assert_eq(npyload_prefetch_add_field(P, s.local[0]), NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_prefetch_errmsg(P), s.local[0]), "%s", npyload_prefetch_errmsg(P));
    cr_assert_eq(npyload_prefetch_set(P, NPYLOAD_PREFETCH_INFLIGHT, 5000), NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_prefetch_errmsg(P), "INFLIGHT"));
    cr_assert_eq(npyload_prefetch_set(P, NPYLOAD_PREFETCH_REQUEST_BYTES, 100), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_prefetch_set(P, (npyload_prefetch_option)99, 1), NPYLOAD_EINVAL);
    npyload_prefetch_progress g;
    cr_assert_eq(npyload_prefetch_get_progress(P, &g, 8), NPYLOAD_EINVAL);
    char missing[256];
    snprintf(missing, sizeof missing, "http://127.0.0.1:%d/nope.npy", tu_http_port(s.h));
    cr_assert_eq(npyload_prefetch_add_field(P, missing), 0);
    cr_assert_eq(npyload_prefetch_run(P), -ENOENT);
    cr_assert(strstr(npyload_prefetch_errmsg(P), "nope.npy"), "%s", npyload_prefetch_errmsg(P));
    npyload_prefetch_destroy(P);
    npyload_prefetch_destroy(NULL);
    free(cache);
    site_down(&s);
}

/* ---- the loader's background cache fill (NPYLOAD_OPT_CACHE_FILL) ------- */

/* Larger objects than SIZES' (several 4 KiB blocks each). */
static const int64_t BIG[] = {300, 200, 500, 100};

static void big_site_up(site *s) { site_up_sized(s, 0, BIG); }

/* The cache-fill tests' site: the big objects, and a remote description
 * with a cache under the site's directory in 4 KiB blocks. Returns the
 * cache's path (the caller frees it). */
static char *fill_site_up(site *s, npyload_remote *r)
{
    big_site_up(s);
    char *cache = tu_path(s->dir, "cache");
    memset(r, 0, sizeof *r);
    r->cache_dir = cache;
    r->cache_block = 4096;
    return cache;
}

static uint64_t objects_bytes(const site *s)
{
    uint64_t total = 0;
    for (size_t k = 0; k < NF; k++) {
        struct stat st;
        cr_assert_eq(stat(s->local[k], &st), 0);
        total += (uint64_t)st.st_size;
    }
    return total;
}

/* The loader's stats once its fill is no longer running (bounded wait). */
static npyload_stats fill_settled(npyload_loader *L)
{
    npyload_stats st;
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        if (st.fill_state != NPYLOAD_FILL_RUNNING)
            break;
        usleep(10000);
    }
    return st;
}

/* With the fill on, an epoch read while it runs equals the local files',
 * and the server sends each block once: the body bytes received are the
 * probes' heads plus the objects, whoever (fill or worker) fetched a
 * block; the fill's part is the whole dataset (shuffled) and is in the
 * cache. */
Test(remote, loader_fill_fetches_each_block_once_while_the_epoch_runs)
{
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    npyload_remote r;
    char *cache = fill_site_up(&s, &r);
    uint64_t objects = objects_bytes(&s);
    npyload_loader *a = loader(s.local, NULL, 2), *b = loader(s.url, &r, 2);
    cr_assert_eq(npyload_loader_set(b, NPYLOAD_OPT_CACHE_FILL, 0), 0); /* default: fits */
    cr_assert_eq(npyload_loader_start(a), 0);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    same_epoch(a, b, 0);
    npyload_stats st = fill_settled(b);
    char fe[512];
    npyload_loader_fill_error(b, fe, sizeof fe);
    cr_assert_eq(st.fill_state, NPYLOAD_FILL_DONE, "state %d: %s", st.fill_state, fe);
    cr_assert_eq(st.fill_error, 0);
    cr_assert_eq(st.fill_wanted_bytes, objects);
    cr_assert_eq(st.fill_planned_bytes, objects);
    cr_assert_eq(st.fill_done_bytes, objects);
    cr_assert_eq(st.fill_fetched_blocks + st.fill_found_blocks + st.fill_waited_blocks,
                 st.fill_planned_blocks);
    cr_assert_gt(st.fill_ns, 0);
    /* Every object is larger than the probe's 4096-byte head. */
    cr_assert_eq(st.remote_bytes, NF * 4096 + objects, "%llu bytes received for %llu",
                 (unsigned long long)st.remote_bytes,
                 (unsigned long long)(NF * 4096 + objects));
    cr_assert_eq(st.cache_write_bytes, objects);
    uint64_t served = tu_http_requests(s.h);
    same_epoch(a, b, 1);
    cr_assert_eq(tu_http_requests(s.h), served, "epoch 1 asked the server");
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    free(cache);
    site_down(&s);
}

/* A cache smaller than the dataset: the default leaves the fill off (the
 * server asked nothing but the probes before the epoch); CACHE_FILL 1
 * fills the part, the first blocks this rank's epoch needs, in its order,
 * within 90 % of cache_bytes (computed here from the order and the
 * files' layout). */
Test(remote, loader_fill_of_a_small_cache_fills_its_part_in_epoch_order)
{
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    npyload_remote r;
    char *cache = fill_site_up(&s, &r);
    r.cache_bytes = 4 * 4096; /* keeps 3 blocks of 4 KiB */
    npyload_loader *b = loader(s.url, &r, NPYLOAD_WORKERS_SYNC);
    uint64_t before = tu_http_requests(s.h);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    usleep(100000);
    npyload_stats st = fill_settled(b);
    cr_assert_eq(st.fill_state, NPYLOAD_FILL_OFF);
    cr_assert_gt(st.fill_wanted_bytes, 4 * 4096);
    cr_assert_eq(tu_http_requests(s.h) - before, NF, "only the probes");
    cr_assert_eq(npyload_loader_stop(b), 0);
    cr_assert_eq(npyload_loader_set(b, NPYLOAD_OPT_CACHE_FILL, 1), 0);
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    st = fill_settled(b);
    cr_assert_eq(st.fill_state, NPYLOAD_FILL_DONE);
    /* The expected part: the blocks of the epoch's samples in order. */
    int64_t n = 0;
    for (size_t k = 0; k < NF; k++)
        n += BIG[k];
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    cr_assert_eq(npyload_order_indices(n, NPYLOAD_SHUFFLE_FULL, 5, 0, 0, 1, 0, 4, NULL, 0, 0,
                                       idx, (size_t)n), n);
    uint64_t row = tu_sample_bytes(4, 2, SHAPE), budget = 4 * 4096 - 4 * 4096 / 10, part = 0;
    uint64_t seen[64][2]; /* (file, block) listed */
    size_t nseen = 0;
    for (int64_t q = 0; q < n; q++) {
        int64_t sidx = idx[q];
        size_t f = 0;
        while (sidx >= BIG[f])
            sidx -= BIG[f++];
        npyload_header h;
        cr_assert_eq(npyload_read_header(s.local[f], &h, NULL, 0), 0);
        uint64_t a0 = h.data_offset + (uint64_t)sidx * row, a1 = a0 + row;
        int full = 0;
        for (uint64_t k = a0 / 4096; k * 4096 < a1 && !full; k++) {
            int dup = 0;
            for (size_t j = 0; j < nseen; j++)
                dup |= seen[j][0] == f && seen[j][1] == k;
            if (dup)
                continue;
            uint64_t blen = (k + 1) * 4096 <= h.file_bytes ? 4096 : h.file_bytes - k * 4096;
            if (part + blen > budget) {
                full = 1;
                break;
            }
            part += blen;
            seen[nseen][0] = f;
            seen[nseen++][1] = k;
        }
        if (full)
            break;
    }
    free(idx);
    cr_assert_eq(st.fill_planned_bytes, part, "%llu planned, %llu expected",
                 (unsigned long long)st.fill_planned_bytes, (unsigned long long)part);
    cr_assert_eq(st.fill_planned_blocks, nseen);
    cr_assert_eq(st.fill_done_bytes, part);
    cr_assert_eq(st.fill_fetched_blocks, nseen);
    npyload_loader_destroy(b);
    free(cache);
    site_down(&s);
}

/* The probes of a first start, kept by stop, so that the next start sends
 * the fill's GETs only (the server's faults then meet the fill). */
static npyload_loader *probed_loader(const site *s, const npyload_remote *r, int workers)
{
    npyload_loader *b = loader((char *const *)s->url, r, NPYLOAD_WORKERS_SYNC);
    npyload_loader_set(b, NPYLOAD_OPT_CACHE_FILL, -1); /* and no worker reads */
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    cr_assert_eq(npyload_loader_stop(b), 0);
    cr_assert_eq(npyload_loader_set(b, NPYLOAD_OPT_CACHE_FILL, 1), 0);
    cr_assert_eq(npyload_loader_set(b, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    return b;
}

/* A server failure during the fill: the fill fails (its error in stats,
 * naming the URL), the epoch does not: its reads fetch on demand and
 * equal the local files'. */
Test(remote, loader_fill_failure_leaves_the_epoch_correct)
{
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    npyload_remote r;
    char *cache = fill_site_up(&s, &r);
    r.retries = -1;
    npyload_loader *a = loader(s.local, NULL, 2);
    npyload_loader *b = probed_loader(&s, &r, NPYLOAD_WORKERS_SYNC);
    tu_http_faults(s.h, 0, 1000000); /* every connection closed unanswered */
    cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
    npyload_stats st = fill_settled(b);
    tu_http_faults(s.h, 0, 0);
    char fe[512];
    npyload_loader_fill_error(b, fe, sizeof fe);
    cr_assert_eq(st.fill_state, NPYLOAD_FILL_FAILED, "state %d", st.fill_state);
    cr_assert_lt(st.fill_error, 0);
    cr_assert(strstr(fe, "http://127.0.0.1:"), "%s", fe);
    cr_assert_lt(st.fill_done_bytes, st.fill_planned_bytes);
    cr_assert_eq(npyload_loader_start(a), 0);
    same_epoch(a, b, 0);
    npyload_loader_destroy(a);
    npyload_loader_destroy(b);
    free(cache);
    site_down(&s);
}

/* stop and destroy in the middle of a fill whose GETs stall return at once
 * (the stores' cancel; ASan checks that nothing leaks), and a stopped
 * fill's next start fills the rest. */
Test(remote, loader_fill_stops_at_once_mid_fill)
{
    if (!npyl_remote_built(NULL, 0))
        cr_skip_test("built without libcurl");
    site s;
    npyload_remote r;
    char *cache = fill_site_up(&s, &r);
    uint64_t objects = objects_bytes(&s);
    r.timeout_ms = 30000;
    for (int destroy = 0; destroy < 2; destroy++) {
        char sub[32];
        snprintf(sub, sizeof sub, "cache%d", destroy); /* cold each time */
        char *dir = tu_path(s.dir, sub);
        r.cache_dir = dir;
        npyload_loader *b = probed_loader(&s, &r, 2);
        tu_http_stall(s.h, 1);
        uint64_t stalled = tu_http_stalled(s.h);
        cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
        for (int i = 0; i < 500 && tu_http_stalled(s.h) == stalled; i++)
            usleep(10000);
        npyload_stats st;
        npyload_loader_get_stats(b, &st, sizeof st);
        cr_assert_gt(tu_http_stalled(s.h), stalled, "no GET reached the server (fill %d, "
                     "%llu planned, fetched %llu found %llu waited %llu, stalled %llu)", st.fill_state, (unsigned long long)st.fill_planned_bytes, (unsigned long long)st.fill_fetched_blocks, (unsigned long long)st.fill_found_blocks, (unsigned long long)st.fill_waited_blocks, (unsigned long long)tu_http_stalled(s.h));
        cr_assert_eq(st.fill_state, NPYLOAD_FILL_RUNNING);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (destroy) {
            npyload_loader_destroy(b);
        } else {
            cr_assert_eq(npyload_loader_stop(b), 0, "%s", npyload_loader_errmsg(b));
            npyload_loader_get_stats(b, &st, sizeof st);
            cr_assert_eq(st.fill_state, NPYLOAD_FILL_STOPPED);
        }
        double took = since(&t0);
        cr_assert_lt(took, 5.0, "%s took %.1f s: it waited for the stalled GETs",
                     destroy ? "destroy" : "stop", took);
        tu_http_stall(s.h, 0);
        if (!destroy) {
            cr_assert_eq(npyload_loader_start(b), 0, "%s", npyload_loader_errmsg(b));
            st = fill_settled(b);
            cr_assert_eq(st.fill_state, NPYLOAD_FILL_DONE);
            cr_assert_eq(st.fill_done_bytes, objects);
            npyload_loader_destroy(b);
        }
        free(dir);
    }
    free(cache);
    site_down(&s);
}
