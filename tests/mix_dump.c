/* mix_dump: lib/order's mixture and digest driven from a script on stdin,
 * one command a line, one answer a line on stdout. The Python tests
 * (tests/python/test_mix_order.py) compare its answers with a reference
 * written from npyload_mix.h's text. A test driver, not a tool: built with
 * the tests, never installed.
 *
 *   new T B SHUFFLE SEED WINDOW K  (n nfiles size...) x K  w x K
 *                                   -> ok
 *   rows E W R DROP BS BASE         -> rows N (s i q) x N    rank R's rows
 *   at E P...                       -> at (s i q)...         rows of positions
 *   draws E P                       -> draws d x K
 *   setw E P w x K                  -> ok
 *   seg                             -> seg E P u x K d x K
 *   save                            -> state HEX
 *   load HEX                        -> ok
 *   digest D S I NAUG (hf vf top left) x NAUG
 *                                   -> digest D'
 * A failure answers "err CODE message". Numbers are decimal (weights as
 * Python's repr of a float, which strtod reads back exactly). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order/npyload_digest.h"
#include "order/npyload_mix.h"

static char *tok(void)
{
    return strtok(NULL, " \t\r\n");
}

static int64_t i64(void)
{
    char *t = tok();
    return t ? strtoll(t, NULL, 10) : 0;
}

static uint64_t u64(void)
{
    char *t = tok();
    return t ? strtoull(t, NULL, 10) : 0;
}

static double dbl(void)
{
    char *t = tok();
    return t ? strtod(t, NULL) : 0;
}

static void print_i64s(const char *what, const int64_t *v, size_t n)
{
    printf("%s", what);
    for (size_t i = 0; i < n; i++)
        printf(" %" PRId64, v[i]);
    printf("\n");
}

static void err(int rc, const char *msg)
{
    printf("err %d %s\n", rc, msg);
}

static void print_rows(const char *what, const npyl_mix_row *r, size_t n,
                       int count)
{
    printf("%s", what);
    if (count)
        printf(" %zu", n);
    for (size_t i = 0; i < n; i++)
        printf(" %" PRIu32 " %" PRId64 " %" PRIu64, r[i].source, r[i].index,
               r[i].pass);
    printf("\n");
}

/* new: builds the mixture from the rest of the line. */
static npyl_mix *cmd_new(void)
{
    npyl_mix_params p = {0};
    p.samples_per_epoch = i64();
    p.block = i64();
    p.shuffle = (int)i64();
    p.seed = i64();
    p.window = i64();
    size_t K = (size_t)u64();
    npyl_mix_source *src = calloc(K + 1, sizeof *src);
    int64_t **sizes = calloc(K + 1, sizeof *sizes);
    double *w = calloc(K + 1, sizeof *w);
    for (size_t k = 0; k < K; k++) {
        src[k].n = i64();
        src[k].nfiles = (size_t)u64();
        sizes[k] = calloc(src[k].nfiles + 1, sizeof *sizes[k]);
        for (size_t f = 0; f < src[k].nfiles; f++)
            sizes[k][f] = i64();
        src[k].file_sizes = sizes[k];
    }
    for (size_t k = 0; k < K; k++)
        w[k] = dbl();
    p.sources = src;
    p.nsources = K;
    p.weights = w;
    char msg[256] = "";
    npyl_mix *m = NULL;
    int rc = npyl_mix_create(&p, &m, msg, sizeof msg);
    if (rc)
        err(rc, msg);
    else
        printf("ok\n");
    for (size_t k = 0; k < K; k++)
        free(sizes[k]);
    free(sizes);
    free(src);
    free(w);
    return m;
}

static void cmd_rows(npyl_mix *m)
{
    npyl_order_params op = {0};
    op.n = npyl_mix_epoch_len(m);
    op.epoch = u64();
    op.world_size = i64();
    op.rank = i64();
    op.drop_last = (int)i64();
    op.batch_size = i64();
    op.base = i64();
    char msg[160] = "";
    int rc = npyl_order_check(&op, msg, sizeof msg);
    if (rc) {
        err(rc, msg);
        return;
    }
    size_t len = (size_t)npyl_order_delivered_len(&op);
    npyl_mix_row *r = calloc(len + 1, sizeof *r);
    rc = npyl_mix_build(m, &op, r);
    if (rc)
        err(rc, npyl_mix_errmsg(m));
    else
        print_rows("rows", r, len, 1);
    free(r);
}

static void cmd_at(npyl_mix *m, size_t cap)
{
    uint64_t e = u64();
    int64_t *pos = calloc(cap + 1, sizeof *pos);
    npyl_mix_row *r = calloc(cap + 1, sizeof *r);
    size_t n = 0;
    for (char *t; (t = tok()) != NULL;)
        pos[n++] = strtoll(t, NULL, 10);
    int rc = npyl_mix_rows(m, e, pos, n, r);
    if (rc)
        err(rc, npyl_mix_errmsg(m));
    else
        print_rows("at", r, n, 0);
    free(pos);
    free(r);
}

static void cmd_draws(npyl_mix *m)
{
    uint64_t e = u64();
    int64_t p = i64();
    size_t K = npyl_mix_num_sources(m);
    int64_t *d = calloc(K, sizeof *d);
    int rc = npyl_mix_draws_before(m, e, p, d);
    if (rc)
        err(rc, npyl_mix_errmsg(m));
    else
        print_i64s("draws", d, K);
    free(d);
}

static void cmd_setw(npyl_mix *m)
{
    uint64_t e = u64();
    int64_t p = i64();
    size_t K = npyl_mix_num_sources(m);
    double *w = calloc(K, sizeof *w);
    for (size_t k = 0; k < K; k++)
        w[k] = dbl();
    int rc = npyl_mix_set_weights(m, e, p, w);
    if (rc)
        err(rc, npyl_mix_errmsg(m));
    else
        printf("ok\n");
    free(w);
}

static void cmd_seg(npyl_mix *m)
{
    size_t K = npyl_mix_num_sources(m);
    uint32_t *u = calloc(K, sizeof *u);
    int64_t *d = calloc(K, sizeof *d);
    uint64_t e;
    int64_t p;
    npyl_mix_segment(m, &e, &p, u, d);
    printf("seg %" PRIu64 " %" PRId64, e, p);
    for (size_t k = 0; k < K; k++)
        printf(" %" PRIu32, u[k]);
    print_i64s("", d, K);
    free(u);
    free(d);
}

static void cmd_save(npyl_mix *m)
{
    size_t len = npyl_mix_state_size(m);
    unsigned char *b = malloc(len);
    npyl_mix_state_save(m, b, len);
    printf("state ");
    for (size_t i = 0; i < len; i++)
        printf("%02x", b[i]);
    printf("\n");
    free(b);
}

static void cmd_load(npyl_mix *m)
{
    char *hex = tok();
    size_t len = hex ? strlen(hex) / 2 : 0;
    unsigned char *b = malloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    int rc = npyl_mix_state_load(m, b, len);
    if (rc)
        err(rc, npyl_mix_errmsg(m));
    else
        printf("ok\n");
    free(b);
}

static void cmd_digest(void)
{
    uint64_t d = u64();
    uint32_t s = (uint32_t)u64();
    int64_t idx = i64();
    size_t naug = (size_t)u64();
    npyl_digest_aug *a = calloc(naug + 1, sizeof *a);
    for (size_t i = 0; i < naug; i++) {
        a[i].hflip = (uint8_t)u64();
        a[i].vflip = (uint8_t)u64();
        a[i].top = i64();
        a[i].left = i64();
    }
    printf("digest %" PRIu64 "\n", npyl_digest_row(d, s, idx, a, naug));
    free(a);
}

int main(void)
{
    npyl_mix *m = NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        char *cmd = strtok(line, " \t\r\n");
        if (!cmd)
            continue;
        if (strcmp(cmd, "new") == 0) {
            npyl_mix_destroy(m);
            m = cmd_new();
        } else if (strcmp(cmd, "digest") == 0) {
            cmd_digest();
        } else if (!m) {
            err(NPYLOAD_ESTATE, "no mixture: send `new` first");
        } else if (strcmp(cmd, "rows") == 0) {
            cmd_rows(m);
        } else if (strcmp(cmd, "at") == 0) {
            cmd_at(m, (size_t)got);
        } else if (strcmp(cmd, "draws") == 0) {
            cmd_draws(m);
        } else if (strcmp(cmd, "setw") == 0) {
            cmd_setw(m);
        } else if (strcmp(cmd, "seg") == 0) {
            cmd_seg(m);
        } else if (strcmp(cmd, "save") == 0) {
            cmd_save(m);
        } else if (strcmp(cmd, "load") == 0) {
            cmd_load(m);
        } else {
            err(NPYLOAD_EINVAL, "unknown command");
        }
        fflush(stdout);
    }
    npyl_mix_destroy(m);
    free(line);
    return 0;
}
