/* The sized-struct rule of npyload.h ("Conventions"), as a program built
 * against an older or a newer header meets this library: it links the
 * shared libnpyload and includes only the public header, like any consumer.
 * Structs are malloc'd at exactly the caller's size, so under ASan (CI's
 * sanitizer stage) a byte written past them fails the test. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"
#include "npyload_prev_layout.h"
#include "testutil.h"

/* The copied layout is a prefix of the current one, member for member. */
#define SAME_PLACE(prev, cur, m)                                               \
    _Static_assert(offsetof(prev, m) == offsetof(cur, m), #m " moved")
SAME_PLACE(prev_npyload_stats, npyload_stats, bytes_read);
SAME_PLACE(prev_npyload_stats, npyload_stats, backend);
SAME_PLACE(prev_npyload_stats, npyload_stats, slot_bytes);
SAME_PLACE(prev_npyload_stats, npyload_stats, read_requests);
SAME_PLACE(prev_npyload_stats, npyload_stats, transform_ns);
SAME_PLACE(prev_npyload_transform, npyload_transform, scale);
SAME_PLACE(prev_npyload_transform, npyload_transform, n_std);
SAME_PLACE(prev_npyload_transform, npyload_transform, channels_last);
SAME_PLACE(prev_npyload_pack_options, npyload_pack_options, frame_size);
SAME_PLACE(prev_npyload_pack_options, npyload_pack_options, progress_arg);
SAME_PLACE(prev_npyload_pack_result, npyload_pack_result, seconds);
_Static_assert(sizeof(prev_npyload_stats) <= sizeof(npyload_stats), "stats shrank");
_Static_assert(sizeof(prev_npyload_transform) <= sizeof(npyload_transform),
               "transform shrank");

enum { ROWS = 6, ELEMS = 5 };

static char *dir;

/* A started loader over one uint8 field of ROWS samples of ELEMS bytes. */
static npyload_loader *make_loader(const void *transform, size_t tsize, int *rc_transform)
{
    dir = tu_mkdtemp("abi");
    char *p = tu_path(dir, "x.npy");
    uint8_t data[ROWS * ELEMS];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(3 * i + 1);
    const int64_t shape[] = {ROWS, ELEMS};
    cr_assert(tu_write_npy(p, "|u1", 0, 2, shape, data, sizeof data, 64) > 0);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", p), 0);
    free(p);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, ROWS), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_PREAD), 0);
    if (transform) {
        *rc_transform = npyload_loader_set_transform(L, "x", transform, tsize);
        if (*rc_transform)
            return L;
    }
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

static void drop(npyload_loader *L)
{
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

Test(abi, older_stats_struct_is_filled_within_its_size)
{
    npyload_loader *L = make_loader(NULL, 0, NULL);
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0);
    npyload_batch_release(b);
    prev_npyload_stats *old = malloc(sizeof *old); /* exactly the old size */
    cr_assert_eq(npyload_loader_get_stats(L, (npyload_stats *)old, sizeof *old), 0);
    npyload_stats cur;
    cr_assert_eq(npyload_loader_get_stats(L, &cur, sizeof cur), 0);
    cr_assert_eq(old->bytes_read, ROWS * ELEMS);
    cr_assert_eq(old->batches_delivered, 1);
    cr_assert_eq(old->samples_delivered, ROWS);
    cr_assert_eq(old->backend, NPYLOAD_IO_PREAD);
    cr_assert_eq(old->slot_bytes, cur.slot_bytes);
    cr_assert_eq(old->num_slots, cur.num_slots);
    cr_assert_eq(old->transform_ns, cur.transform_ns);
    free(old);
    drop(L);
}

Test(abi, newer_stats_struct_gets_zeros_past_the_library)
{
    npyload_loader *L = make_loader(NULL, 0, NULL);
    size_t big = sizeof(npyload_stats) + 24;
    unsigned char *s = malloc(big);
    memset(s, 0xab, big);
    cr_assert_eq(npyload_loader_get_stats(L, (npyload_stats *)s, big), 0);
    for (size_t i = sizeof(npyload_stats); i < big; i++)
        cr_assert_eq(s[i], 0, "byte %zu of a newer caller's struct not zeroed", i);
    free(s);
    drop(L);
}

Test(abi, stats_size_below_first_layout_is_refused_untouched)
{
    npyload_loader *L = make_loader(NULL, 0, NULL);
    uint64_t words[4] = {7, 7, 7, 7};
    /* sizeof a pointer, the classic mistake */
    cr_assert_eq(npyload_loader_get_stats(L, (npyload_stats *)words, sizeof(void *)),
                 NPYLOAD_EINVAL);
    cr_assert_eq(npyload_loader_get_stats(L, (npyload_stats *)words, 0), NPYLOAD_EINVAL);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(words[i], 7);
    drop(L);
}

Test(abi, older_transform_struct_is_read_within_its_size)
{
    prev_npyload_transform *t = malloc(sizeof *t); /* exactly the old size */
    memset(t, 0, sizeof *t);
    t->dtype = NPYLOAD_DTYPE_FLOAT32;
    t->scale = 0.5f;
    int rc = -1;
    npyload_loader *L = make_loader(t, sizeof *t, &rc);
    cr_assert_eq(rc, 0, "%s", npyload_loader_errmsg(L));
    free(t); /* the loader keeps its own copy */
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    const npyload_array *a = npyload_batch_field(b, 0);
    cr_assert_str_eq(a->descr, "<f4");
    const float *y = a->data;
    for (size_t i = 0; i < ROWS * ELEMS; i++)
        cr_assert_eq(y[i], (float)(uint8_t)(3 * i + 1) * 0.5f, "element %zu", i);
    npyload_batch_release(b);
    drop(L);
}

Test(abi, newer_transform_struct_with_unknown_members)
{
    size_t big = sizeof(npyload_transform) + 16;
    unsigned char *raw = calloc(1, big);
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    memcpy(raw, &t, sizeof t);
    int rc = -1;
    /* unknown members left zero (off): accepted */
    npyload_loader *L = make_loader(raw, big, &rc);
    cr_assert_eq(rc, 0, "%s", npyload_loader_errmsg(L));
    drop(L);
    /* a member this library does not know, set: refused, saying so */
    raw[sizeof(npyload_transform) + 3] = 1;
    L = make_loader(raw, big, &rc);
    cr_assert_eq(rc, NPYLOAD_EUNSUPPORTED);
    cr_assert(strstr(npyload_loader_errmsg(L), "does not know"), "%s",
              npyload_loader_errmsg(L));
    drop(L);
    /* smaller than the first layout */
    L = make_loader(raw, sizeof(float), &rc);
    cr_assert_eq(rc, NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_loader_errmsg(L), "sizeof(npyload_transform)"), "%s",
              npyload_loader_errmsg(L));
    drop(L);
    free(raw);
}

/* npyload_pack_file with the first layouts of its options and result, each
 * malloc'd at exactly that size; the output checked against the input
 * through a loader (an independent path: the seek table and frames). */
Test(abi, older_pack_structs_are_read_and_written_within_their_size)
{
    dir = tu_mkdtemp("abipack");
    char *in = tu_path(dir, "x.npy"), *out = tu_path(dir, "x.npy.zst");
    uint8_t data[ROWS * ELEMS];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(7 * i);
    const int64_t shape[] = {ROWS, ELEMS};
    long off = tu_write_npy(in, "|u1", 0, 2, shape, data, sizeof data, 64);
    cr_assert(off > 0);
    prev_npyload_pack_options *o = calloc(1, sizeof *o);
    prev_npyload_pack_result *r = malloc(sizeof *r);
    o->level = 1;
    o->frame_size = 2 * ELEMS;
    o->threads = 1;
    char err[512] = "";
    cr_assert_eq(npyload_pack_file(in, out, (const npyload_pack_options *)o, sizeof *o,
                                   (npyload_pack_result *)r, sizeof *r, err, sizeof err),
                 0, "%s", err);
    cr_assert_eq(r->in_bytes, (uint64_t)off + sizeof data);
    cr_assert_eq(r->samples_per_frame, 2);
    cr_assert_eq(r->frames, 1 + ROWS / 2);
    /* too small: refused, nothing written */
    cr_assert_eq(npyload_pack_file(in, out, (const npyload_pack_options *)o, 4, NULL, 0,
                                   err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "sizeof(npyload_pack_options)"), "%s", err);
    free(o);
    free(r);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", out), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, ROWS), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(memcmp(npyload_batch_field(b, 0)->data, data, sizeof data), 0);
    npyload_batch_release(b);
    free(in);
    free(out);
    drop(L);
}

/* npyload_build_info: first published with every member it has now, so its
 * first layout is the whole struct. Exactly that size is filled (malloc'd
 * at it: ASan sees a byte past it); a newer caller's tail is zeroed. */
Test(abi, build_info_is_filled_within_its_size)
{
    unsigned char *s = malloc(sizeof(npyload_build_info));
    cr_assert_eq(npyload_get_build_info((npyload_build_info *)s, sizeof(npyload_build_info)), 0);
    cr_assert_str_eq(((npyload_build_info *)s)->version, npyload_version_string());
    free(s);
    size_t big = sizeof(npyload_build_info) + 24;
    s = malloc(big);
    memset(s, 0xab, big);
    cr_assert_eq(npyload_get_build_info((npyload_build_info *)s, big), 0);
    for (size_t i = sizeof(npyload_build_info); i < big; i++)
        cr_assert_eq(s[i], 0, "byte %zu of a newer caller's struct not zeroed", i);
    free(s);
    uint64_t words[4] = {7, 7, 7, 7};
    cr_assert_eq(npyload_get_build_info((npyload_build_info *)words, sizeof(void *)),
                 NPYLOAD_EINVAL);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(words[i], 7);
}
