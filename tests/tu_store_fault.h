/* A test-only store (tests/tu_store_fault.c): "fault://PATH" reads the
 * local file PATH and injects latency, short reads and errors. It is the
 * proof that a store is one file and one registration line
 * (npyl_loader_register_store(L, &tu_store_fault, &cfg)), and the tests'
 * fault injection. Tests only. */
#ifndef TU_STORE_FAULT_H
#define TU_STORE_FAULT_H

#include <stdatomic.h>
#include <stdint.h>

#include "store/npyload_store.h"

typedef struct tu_fault {
    uint32_t latency_us;     /* each complete sleeps this long first */
    uint64_t short_max;      /* > 0: a request gets at most this many bytes
                                per complete (the round asks for the rest) */
    const char *fail_path;   /* reads of a file whose path contains this, */
    uint64_t fail_from;      /* touching bytes [fail_from, fail_to), */
    uint64_t fail_to;
    int fail_code;           /* fail with this code (e.g. -EIO) */
    uint64_t fail_limit;     /* > 0: fail only the first fail_limit such
                                reads (then read them as they are) */
    /* Called at the start of every complete (may be NULL). */
    void (*on_complete)(void *arg);
    void *arg;
    /* What happened, for the tests to read. */
    _Atomic uint64_t completes, shorts, failures;
    _Atomic uint64_t budget_used; /* fail_limit's count */
} tu_fault;

extern const npyl_store_ops tu_store_fault;

#endif
