/* The set of stores a loader reads through: which store a path is, each
 * store's configuration and state (opened when first used), globs and the
 * checks of add_field, the file table, the counters. The registration of a
 * built-in store is one line of `builtin` below. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_store.h"

/* The built-in stores, asked in this order which one reads a path; the
 * local store is last: it takes every path no other store claims. */
static const npyl_store_ops *const builtin[] = {
    &npyl_store_remote,
    &npyl_store_local,
};
#define NBUILTIN (sizeof builtin / sizeof builtin[0])

static void put(npyl_stores *set, size_t i, npyl_store *s);

void npyl_stores_init(npyl_stores *set)
{
    memset(set, 0, sizeof *set);
    for (size_t i = 0; i < NBUILTIN; i++)
        set->ops[set->n++] = builtin[i];
}

void npyl_stores_fini(npyl_stores *set)
{
    npyl_stores_table(set, NULL, 0, NULL, 0);
    for (size_t i = 0; i < set->n; i++) {
        npyl_store *s = set->s[i];
        put(set, i, NULL);
        if (s)
            set->ops[i]->close(s);
    }
}

int npyl_stores_register(npyl_stores *set, const npyl_store_ops *ops, const void *arg)
{
    if (set->n == NPYL_STORE_MAX)
        return NPYLOAD_ETOOBIG;
    for (size_t i = 0; i < set->n; i++)
        if (set->s[i] || set->used[i])
            return NPYLOAD_ESTATE; /* indices are in use: register first */
    memmove(&set->ops[1], &set->ops[0], set->n * sizeof set->ops[0]);
    memmove(&set->arg[1], &set->arg[0], set->n * sizeof set->arg[0]);
    set->ops[0] = ops;
    set->arg[0] = arg;
    set->n++;
    return 0;
}

uint32_t npyl_stores_of(const npyl_stores *set, const char *path)
{
    for (size_t i = 0; i + 1 < set->n; i++)
        if (set->ops[i]->claims(path))
            return (uint32_t)i;
    return (uint32_t)(set->n - 1); /* local */
}

/* Store i's state is s from now on (NULL: none), its interrupt set; read
 * atomically by npyl_stores_cancel on any thread. */
static void put(npyl_stores *set, size_t i, npyl_store *s)
{
    if (s && set->ops[i]->interrupt)
        set->ops[i]->interrupt(s, set->interrupt, set->interrupt_arg);
    __atomic_store_n(&set->s[i], s, __ATOMIC_RELEASE);
}

/* Store i's state, opened with its defaults (or a registered store's
 * argument) when nothing opened it yet. */
static int use(npyl_stores *set, uint32_t i, char *err, size_t errlen)
{
    if (set->s[i])
        return 0;
    npyl_store *s = NULL;
    int rc = set->ops[i]->open(&s, set->arg[i], err, errlen);
    if (rc == 0)
        put(set, i, s);
    return rc;
}

int npyl_stores_configure(npyl_stores *set, const char *name, const void *cfg, char *err,
                          size_t errlen)
{
    size_t i = 0;
    while (i < set->n && strcmp(set->ops[i]->name, name) != 0)
        i++;
    if (i == set->n)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "no store named '%s'", name);
    if (set->used[i])
        return npyl_fail(err, errlen, NPYLOAD_ESTATE, "the %s configuration must be set "
                         "before the fields with %s paths are added", name, name);
    npyl_store *s = NULL;
    int rc = set->ops[i]->open(&s, cfg, err, errlen);
    if (rc)
        return rc;
    npyl_store *was = set->s[i];
    put(set, i, s);
    if (was)
        set->ops[i]->close(was);
    set->configured[i] = 1;
    return 0;
}

int npyl_stores_add(npyl_stores *set, const char *path, int glob, char ***paths, size_t *n,
                    char *err, size_t errlen)
{
    uint32_t i = npyl_stores_of(set, path);
    const npyl_store_ops *o = set->ops[i];
    int rc = 0;
    if (o->check && (rc = o->check(set->s[i], set->configured[i], path, err, errlen)))
        return rc;
    if ((rc = use(set, i, err, errlen)))
        return rc;
    if (glob) {
        if (!o->glob)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: %s paths cannot be globbed: "
                             "give the files as a list", path, o->name);
        if ((rc = o->glob(set->s[i], path, paths, n, err, errlen)))
            return rc;
    }
    set->used[i] = 1;
    return 0;
}

int npyl_stores_table(npyl_stores *set, const char *const *paths, size_t nfiles, char *err,
                      size_t errlen)
{
    for (size_t i = 0; i < set->n; i++)
        if (set->s[i] && set->ops[i]->table)
            set->ops[i]->table(set->s[i], 0);
    free(set->files);
    set->files = NULL;
    set->nfiles = 0;
    if (nfiles == 0)
        return 0;
    set->files = calloc(nfiles, sizeof *set->files);
    if (!set->files)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    set->nfiles = nfiles;
    int has[NPYL_STORE_MAX] = {0};
    for (size_t k = 0; k < nfiles; k++) {
        uint32_t i = npyl_stores_of(set, paths[k]);
        set->files[k] = (npyl_sfile){.path = paths[k], .store = i};
        has[i] = 1;
    }
    /* The stores that read these files, each with its own table. */
    for (size_t i = 0; i < set->n; i++) {
        if (!has[i])
            continue;
        int rc = use(set, (uint32_t)i, err, errlen);
        if (rc)
            return rc;
        if (set->ops[i]->table && (rc = set->ops[i]->table(set->s[i], nfiles)))
            return npyl_fail(err, errlen, rc, "out of memory for the %s store's file table",
                             set->ops[i]->name);
    }
    return 0;
}

int npyl_stores_key(const npyl_stores *set, size_t i, const char *path,
                    char key[NPYL_SKEY_LEN])
{
    uint32_t st = set->files[i].store;
    return set->ops[st]->key(set->s[st], set->files, (uint32_t)i, path, key, NPYL_SKEY_LEN);
}

int npyl_stores_changed(const npyl_stores *set)
{
    for (size_t i = 0; i < set->nfiles; i++) {
        uint32_t st = set->files[i].store;
        if (set->ops[st]->changed && set->ops[st]->changed(set->s[st], set->files, (uint32_t)i))
            return 1;
    }
    return 0;
}

void npyl_stores_stats(const npyl_stores *set, npyload_stats *st)
{
    for (size_t i = 0; i < set->n; i++)
        if (set->s[i] && set->ops[i]->stats)
            set->ops[i]->stats(set->s[i], st);
}

void npyl_stores_cancel(npyl_stores *set, int on)
{
    for (size_t i = 0; i < set->n; i++) {
        npyl_store *s = __atomic_load_n(&set->s[i], __ATOMIC_ACQUIRE);
        if (s && set->ops[i]->cancel)
            set->ops[i]->cancel(s, on);
    }
}

void npyl_stores_set_interrupt(npyl_stores *set, int (*fn)(void *), void *arg)
{
    set->interrupt = fn;
    set->interrupt_arg = arg;
    for (size_t i = 0; i < set->n; i++)
        if (set->s[i] && set->ops[i]->interrupt)
            set->ops[i]->interrupt(set->s[i], fn, arg);
}

int npyl_stores_fill_facts(const npyl_stores *set, uint64_t *unit, uint64_t *budget)
{
    *unit = *budget = 0;
    for (size_t i = 0; i < set->nfiles; i++) {
        uint32_t k = set->files[i].store;
        if (!set->s[k] || !set->ops[k]->fill || !set->ops[k]->fill_facts)
            continue;
        set->ops[k]->fill_facts(set->s[k], unit, budget);
        if (*unit)
            return (int)k;
    }
    return -1;
}

int npyl_stores_fill(npyl_stores *set, int store, const npyl_srange *ranges, size_t n,
                     const npyl_sfill_opts *o, npyl_sfill_state *st, char *err, size_t errlen)
{
    if (store < 0 || (size_t)store >= set->n || !set->s[store] || !set->ops[store]->fill)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "no store of these files keeps a cache");
    return set->ops[store]->fill(set->s[store], ranges, n, o, st, err, errlen);
}

int npyl_stores_any_other(const npyl_stores *set)
{
    for (size_t i = 0; i < set->nfiles; i++)
        if (set->files[i].store != set->n - 1)
            return 1;
    return 0;
}

int npyl_stores_auto_backend(char *why, size_t whylen)
{
    /* Kernels, containers and seccomp profiles refuse io_uring; pread on the
     * worker threads is the fallback. */
    return npyl_io_uring_usable(why, whylen) ? NPYLOAD_IO_URING : NPYLOAD_IO_PREAD;
}
