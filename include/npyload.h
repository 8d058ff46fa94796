/*
 * npyload — stream NPY arrays from disk into reused (pinned) host buffers and
 * onto the GPU, in batches, in a deterministic order.
 *
 * This header is the whole public interface. It carries no CUDA, liburing or
 * zstd types: streams are `void *` (a cudaStream_t), so host-only users need
 * neither CUDA headers nor CUDA libraries.
 *
 * Conventions
 *  - Functions return int: 0 (or a count) on success, a negative code on
 *    failure. OS failures are -errno; library failures are the NPYLOAD_E*
 *    codes below. npyload_strerror() turns any of them into words, and
 *    npyload_loader_errmsg() gives the detail of the last failure on a loader
 *    (which file, which offset, what was expected).
 *  - errno is never used as an output.
 *  - Objects are opaque handles in create/destroy pairs; destroy accepts NULL.
 *  - There is no global state: two loaders in one process share nothing.
 *  - Structs that may grow (npyload_stats, npyload_transform,
 *    npyload_pack_options, npyload_pack_result) cross the API with the
 *    size the caller was compiled with (pass `sizeof x`): the library reads
 *    or writes only that many bytes, treats members past them as zero (the
 *    default of every member added later), and refuses with NPYLOAD_EINVAL a
 *    size smaller than the struct's first published layout (a pointer's
 *    size passed by mistake, say). So a program built against an older
 *    header runs against a newer library, and the reverse. npyload_array is
 *    only handed out by pointer (read it through the pointer; it may grow
 *    too). npyload_header is frozen for this ABI version; npyload_state
 *    carries its own version. The ABI version is the shared library's
 *    SONAME: libnpyload.so.0.MINOR while the major version is 0.
 */
#ifndef NPYLOAD_H
#define NPYLOAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPYLOAD_VERSION_MAJOR 0
#define NPYLOAD_VERSION_MINOR 3
#define NPYLOAD_VERSION_PATCH 0
#define NPYLOAD_VERSION_STRING "0.3.0"

#if defined(_WIN32)
#define NPYLOAD_API
#else
#define NPYLOAD_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                     */
/* ------------------------------------------------------------------------ */

/*! NPYLOAD_ERROR_MAP: the one table of library error codes. It generates the
 * enum below and the messages of npyload_strerror(). Codes are negative and
 * far below any -errno value. */
#define NPYLOAD_ERROR_MAP(XX)                                                  \
    XX(INVAL, -10001, "invalid argument")                                     \
    XX(FORMAT, -10002, "malformed NPY file")                                  \
    XX(UNSUPPORTED, -10003, "unsupported NPY content")                        \
    XX(TRUNCATED, -10004, "file shorter than its header says")                \
    XX(MISMATCH, -10005, "fields or files disagree")                          \
    XX(STATE, -10006, "operation not allowed in the loader's current state")  \
    XX(NOFILES, -10007, "no files matched")                                   \
    XX(TOOBIG, -10008, "size over a documented limit")                        \
    XX(NOCUDA, -10009, "CUDA is not usable here")                             \
    XX(CUDA, -10010, "CUDA runtime call failed")                              \
    XX(NOURING, -10011, "io_uring is not usable here")                        \
    XX(CHANGED, -10012, "file changed after the loader started")            \
    XX(HELD, -10013, "all batch slots are held by the caller")                \
    XX(FORKED, -10014, "loader used in a child process after fork()")         \
    XX(REMOTE, -10015, "remote storage request failed")

typedef enum npyload_error {
#define NPYLOAD_XX_ENUM(name, code, msg) NPYLOAD_E##name = (code),
    NPYLOAD_ERROR_MAP(NPYLOAD_XX_ENUM)
#undef NPYLOAD_XX_ENUM
} npyload_error;

/*! NPYLOAD_EOF: npyload_loader_next() returns it (a positive value) when the
 * epoch has no more batches for this rank. */
#define NPYLOAD_EOF 1

/*! npyload_strerror() :
 * @return : a static string describing `err`, which may be 0, NPYLOAD_EOF,
 *           a -errno value or an NPYLOAD_E* code. Never NULL. Thread-safe. */
NPYLOAD_API const char *npyload_strerror(int err);

/*! npyload_mask_urls() :
 * Copies `text` into buf[len] (always NUL-terminated when len > 0) with
 * every URL's secrets masked: the password of a userinfo
 * (scheme://user:PASSWORD@host becomes scheme://user:***@host) and a query
 * string (a presigned URL's signature: "?..."). A URL ends at white space,
 * a quote or an angle bracket. Every message of the library (errmsg,
 * last_skip_error, the err buffers) is already masked this way; the tools
 * and bindings use it for the paths they print themselves.
 * @return : the length of the masked text (as snprintf: buf holds all of
 *           it when the result is below len). Thread-safe. */
NPYLOAD_API size_t npyload_mask_urls(const char *text, char *buf, size_t len);

/*! npyload_version_string() : the library's version, "major.minor.patch". */
NPYLOAD_API const char *npyload_version_string(void);

/* ------------------------------------------------------------------------ */
/* NPY headers                                                                */
/* ------------------------------------------------------------------------ */

/*! Limits. A header longer than NPYLOAD_MAX_HEADER_LEN bytes or an array of
 * more than NPYLOAD_MAX_DIMS dimensions is refused (NPYLOAD_ETOOBIG). numpy
 * itself writes headers far shorter than this limit. */
#define NPYLOAD_MAX_DIMS 32
#define NPYLOAD_MAX_HEADER_LEN (1u << 20)
/* 16: room for "bfloat16", the descr of a transform's bfloat16 output. */
#define NPYLOAD_DESCR_LEN 16

/*! npyload_header: the facts of one NPY file's header. */
typedef struct npyload_header {
    int major_version;          /* 1, 2 or 3 */
    int minor_version;          /* 0 */
    char descr[NPYLOAD_DESCR_LEN]; /* normalised: "<f4", "|b1", ">i8"...; '='
                                   is resolved to the host's byte order and
                                   one-byte types always use '|' */
    char kind;                  /* 'b' bool, 'i', 'u', 'f', 'c' */
    char byteorder;             /* '<', '>' or '|' */
    size_t itemsize;            /* bytes per element */
    int fortran_order;          /* 0 or 1 */
    int ndim;                   /* 0 for a 0-d array */
    int64_t shape[NPYLOAD_MAX_DIMS];
    uint64_t header_len;        /* length of the header dict text, padding in */
    uint64_t data_offset;       /* where the data starts in the file */
    uint64_t data_bytes;        /* product(shape) * itemsize */
    uint64_t file_bytes;        /* size of the whole file (0 if unknown) */
} npyload_header;

/*! npyload_parse_header() :
 * Parses an NPY header held in memory: `buf` holds the first `len` bytes of
 * a file whose total size is `file_size` (pass UINT64_MAX when unknown, then
 * the data length is not checked). The header dict is parsed as the
 * restricted Python literal it is, never evaluated.
 * `name` names the input in messages (a path, or NULL for "<memory>").
 * @return : 0 on success;
 *           NPYLOAD_EFORMAT / EUNSUPPORTED / ETRUNCATED / ETOOBIG / EINVAL
 *           with a message "name: problem" written to `err` (NUL-terminated,
 *           truncated to `errlen`; `err` may be NULL);
 *           when `len` is too short to hold the header that the preamble
 *           announces, NPYLOAD_ETRUNCATED with out->header_len set and
 *           out->data_offset = the bytes needed, so a caller may read more
 *           and retry (header_len stays 0 if even the 10- or 12-byte
 *           preamble is incomplete). A shape whose byte size exceeds
 *           2^63-1 is NPYLOAD_ETOOBIG. numpy writes none of the refused
 *           forms; the corpus in tests/malformed lists where numpy itself
 *           would accept one (negative dims, duplicate keys...). 
 * Thread-safe; touches no global state. */
NPYLOAD_API int npyload_parse_header(const void *buf, size_t len,
                                     uint64_t file_size, const char *name,
                                     npyload_header *out, char *err,
                                     size_t errlen);

/*! npyload_read_header() :
 * Opens `path`, reads only the header bytes it needs, and parses them
 * (npyload_parse_header with the file's real size).
 * @return : 0, a -errno for OS failures, or a parse error; `err` as above. */
NPYLOAD_API int npyload_read_header(const char *path, npyload_header *out,
                                    char *err, size_t errlen);

/*! npyload_format_header() :
 * Writes a version 1.0 NPY preamble and header (version 2.0 if the dict does
 * not fit 65535 bytes) for `descr` (e.g. "<f4"), `fortran_order`, and the
 * `ndim` dimensions of `shape` into `buf` of capacity `cap`. The total length
 * is padded to a multiple of 64 bytes, as numpy does.
 * @return : the number of bytes written (> 0), or NPYLOAD_EINVAL /
 *           NPYLOAD_ETOOBIG when `cap` is too small or arguments are bad. */
NPYLOAD_API int npyload_format_header(void *buf, size_t cap, const char *descr,
                                      int fortran_order, int ndim,
                                      const int64_t *shape);

/* ------------------------------------------------------------------------ */
/* Loader                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct npyload_loader npyload_loader;
typedef struct npyload_batch npyload_batch;

/*! I/O backends (NPYLOAD_OPT_IO_BACKEND). AUTO probes io_uring once at start
 * (containers and seccomp profiles often refuse it) and falls back to PREAD;
 * npyload_loader_backend() says which one is active. */
typedef enum npyload_io_backend {
    NPYLOAD_IO_AUTO = 0,
    NPYLOAD_IO_URING = 1,
    NPYLOAD_IO_PREAD = 2,
    NPYLOAD_IO_MMAP = 3
} npyload_io_backend;

/*! Shuffle modes (NPYLOAD_OPT_SHUFFLE).
 *  NONE   : identity order.
 *  FULL   : a uniform permutation of all N samples per epoch.
 *  LOCAL  : locality-preserving, for disk-bound data: the files of the first
 *           field are permuted, then taken in windows of
 *           NPYLOAD_OPT_SHUFFLE_WINDOW files, and samples are permuted within
 *           each window. Reads stay within a few files at a time. */
typedef enum npyload_shuffle {
    NPYLOAD_SHUFFLE_NONE = 0,
    NPYLOAD_SHUFFLE_FULL = 1,
    NPYLOAD_SHUFFLE_LOCAL = 2
} npyload_shuffle;

/*! NPYLOAD_OPTION_MAP: the one table of options, XX(NAME, value, doc). It
 * generates the enum below (NPYLOAD_OPT_NAME = value) and the names the
 * library's messages use. A value, once given, keeps its meaning; the
 * values need not be contiguous (one not in the table is refused). */
#define NPYLOAD_OPTION_MAP(XX)                                                 \
    XX(BATCH_SIZE, 1, "samples per batch, >= 1; no default: start() refuses " \
                      "a loader without it (as Python's batch_size=)")       \
    XX(NUM_WORKERS, 2, "worker threads, >= 1 (exactly that many, no "         \
                       "controller); 0 or NPYLOAD_AUTO (-2) = auto (the "    \
                       "default): the controller chooses and changes the "   \
                       "count at run time (see NPYLOAD_AUTO); "              \
                       "NPYLOAD_WORKERS_SYNC (-1) = no worker thread: "      \
                       "next() reads each batch on the calling thread "      \
                       "(debugging, like DataLoader's num_workers=0, which " \
                       "is Python's num_workers=0)")                         \
    XX(PREFETCH, 3, "batch slots, >= 1 (exactly that many, no controller); " \
                    "0 or NPYLOAD_AUTO (-2) = auto (the default): the "      \
                    "controller chooses and changes the count within "      \
                    "MEMORY_BUDGET. Memory is slots x batch bytes. "        \
                    "Python's prefetch= counts the "                         \
                    "batches read ahead of the one the loop holds, as "      \
                    "DataLoader's prefetch_factor x workers does: Python "   \
                    "prefetch = PREFETCH - 1 (npyload-bench prints both)")   \
    XX(SHUFFLE, 4, "npyload_shuffle; default NONE")                           \
    XX(SEED, 5, "any int64; default 0")                                       \
    XX(DROP_LAST, 6, "0/1: see Order semantics below")                        \
    XX(RANK, 7, "0 <= rank < world_size; default 0")                          \
    XX(WORLD_SIZE, 8, ">= 1; default 1")                                      \
    XX(IO_BACKEND, 9, "npyload_io_backend; default AUTO")                     \
    XX(DEVICE, 10, "-1 = host memory (default), k >= 0 = CUDA device k")      \
    XX(DIRECT_IO, 11, "0/1: O_DIRECT reads (bypass the page cache); "         \
                      "unaligned data offsets handled by aligned over-reads. " \
                      "Default 0.")                                           \
    XX(SHUFFLE_WINDOW, 12, "files per window in LOCAL shuffle; 0 = default 8") \
    XX(QUEUE_DEPTH, 13, "reads in flight per worker (io_uring); 0 = default "  \
                        "32")                                                 \
    XX(PIN_MEMORY, 14, "-1 auto (pin when CUDA is usable, default), 0 never, " \
                       "1 require") \
    XX(ALIGN, 15, "0 (default): when every field has the same number of "   \
                  "files, the i-th files of all fields must carry the same " \
                  "number as the last run of digits of their names "        \
                  "(train_0007.npy with train_0007_heatmaps.npy); 1: no "   \
                  "check") \
    XX(ON_ERROR, 16, "0 raise (default): a failed read fails the batch; 1 "   \
                     "skip: the batch's reads are retried once, then the "  \
                     "samples that still fail are dropped from the batch "  \
                     "(it is shorter; indices list what it holds) and "     \
                     "counted in stats.samples_skipped")                    \
    XX(MAX_ERRORS, 17, "with ON_ERROR skip: once more than this many "       \
                       "samples were skipped, the batch fails as with "     \
                       "raise; 0 = no limit (default)")                      \
    XX(READ_AHEAD, 18, "0 (default): on when a batch has work after its "   \
                       "reads (.npy.zst decode, narrowed codes, host "      \
                       "transforms, device copies), else off (host mode "   \
                       "under NPYLOAD_AUTO: the controller switches it off "\
                       "while no read blocks, back on when reads block); "  \
                       "1: on; -1: "                                        \
                       "off. Each worker thread has the reads of its next " \
                       "batch in flight while it decodes and transforms "   \
                       "the current one (a read thread and a second read "  \
                       "buffer per worker; sync mode reads no ahead)")       \
    XX(DEVICE_KERNELS, 19, "where device transforms get their kernels: 0 "   \
                           "auto (default): the ahead-of-time fatbin when "  \
                           "the build has one that runs on the GPU, else "   \
                           "compiled at start by NVRTC; 1 ahead of time "    \
                           "only; 2 NVRTC always (see npyload_loader_set_path)") \
    XX(CACHE_FILL, 20, "remote fields with a cache_dir: a background thread "  \
                       "fills the cache from start, in large ranged GETs, "  \
                       "in the order this rank's epoch needs the blocks, "   \
                       "while the epoch reads what has arrived. 0 "          \
                       "(default): on when the cache keeps all it would "    \
                       "fill (the rank's epoch, and with a shuffle the "     \
                       "whole dataset), else off; 1: on (the part the "      \
                       "cache keeps); -1: off. Progress in stats (fill_*)")  \
    XX(MEMORY_BUDGET, 21, "bytes that batch slots plus the workers' read "   \
                          "buffers may take when NUM_WORKERS or PREFETCH is " \
                          "auto; the controller never exceeds it. 0 = "      \
                          "default: a quarter of the memory the process "    \
                          "may use (the smaller of physical memory and the " \
                          "cgroup v2 memory.max / v1 limit_in_bytes)")       \
    XX(AUTO_TARGET, 22, "the consumer's wait in next() the controller aims "  \
                        "below, in basis points of its loop (wait + step): " \
                        "1 .. 10000; 0 = default 200 (2 %)")                \
    XX(AUTO_CORES, 23, "cores this loader's workers may keep busy (several " \
                       "loaders or ranks on a node divide the node's): the " \
                       "controller's worker ceiling, exceeded only when "   \
                       "reads wait for a device; 0 = default: the cores "   \
                       "the process may run on (sched_getaffinity)")        \
    XX(AUTO_FORCE, 24, "testing: with auto, every this many batches the "   \
                       "controller changes workers and slots to a new "     \
                       "pseudo-random pair instead of measuring; 0 = off "  \
                       "(default)")                                         \
    XX(SAMPLES_PER_EPOCH, 25, "a mixture of sources (npyload_loader_add_"   \
                              "source): positions per epoch, T; 0 = "       \
                              "default: every source's samples summed")

/*! NPYLOAD_WORKERS_SYNC: NPYLOAD_OPT_NUM_WORKERS value for synchronous
 * reads. No thread is started; npyload_loader_next() reads (and
 * transforms, and copies) the batch it returns on the calling thread, so a
 * debugger or a profiler sees the whole pipeline on one stack. Order,
 * bytes and errors are those of any worker count. PREFETCH still bounds the
 * slots (default 2) since batches may be held. */
#define NPYLOAD_WORKERS_SYNC (-1)

/*! NPYLOAD_AUTO: NPYLOAD_OPT_NUM_WORKERS and NPYLOAD_OPT_PREFETCH value
 * (also their default, 0) that hands the count to the loader's controller.
 * It measures, per window of batches, the consumer's wait in next()
 * against its step (the time between a next() returning and the following
 * call), the workers' busy and read-blocked time, and the samples
 * delivered, and changes the worker threads and batch slots while the
 * loader runs. It starts from min(AUTO_CORES, 2) workers and the slots
 * they fill plus the one the caller holds (3 for two workers: the
 * npyload_default_prefetch(0) slots less the ready one, which it adds when
 * the consumer waits for it; workers that read ahead fill two slots each:
 * 4 for two, at most npyload_default_prefetch(0); fewer when
 * MEMORY_BUDGET cannot hold them). Its aims, in order: the
 * consumer waits less than AUTO_TARGET of its loop (default 2 %); then the
 * fewest slots; then the fewest workers. It moves only on evidence: it
 * adds a worker or a slot after two windows in a row above the target,
 * and keeps it only when each of the next two windows delivered at least
 * 5 % more samples/s than the two before, or (a slot, where the workers
 * waited for a free one at least 5 % of their time: slot_wait_ns in
 * npyload_stats) when that wait halved and the mean rate did not fall by
 * 5 % (it takes it back and backs off otherwise, the back-off doubling);
 * it removes one after three windows
 * well below the target (the next one window after a removal it kept),
 * down to the slots the workers fill plus those the caller holds, and
 * takes that back when the wait rises above the target (or the rate falls
 * while the consumer waited at least half of it); a slot removed keeps its
 * memory while the removal is judged (parked_slots in npyload_stats,
 * counted in memory_bytes), so taking it back costs nothing. It judges the steady
 * state: the wait for the first batch of a pass (after start, set_epoch,
 * set_state), which no count removes, is left out. It stays within
 * AUTO_CORES workers unless the workers wait for reads: blocked a share b
 * of their time (off the CPU with a voluntary context switch; preemption
 * does not count; with read-ahead, the workers' wait for their read-ahead
 * threads as far as those were blocked in the reads), AUTO_CORES / (1 - b)
 * of them, at most twice AUTO_CORES; workers busy less than 90 % of their
 * time with b at least 10 % earn the trial of one above AUTO_CORES. It
 * keeps slots plus read buffers within MEMORY_BUDGET, never takes a slot the caller holds, settles after a
 * change that did not help (the back-off doubles), and forgets its
 * back-offs when the regime changes (the step time or the throughput moves
 * by more than a third). Where the workers read ahead by default
 * (READ_AHEAD 0, host mode) it switches read-ahead too: off after two
 * windows whose reads never blocked (the page cache), kept unless the
 * mean rate of the next three falls by 5 %; back on at once when the
 * workers, reading their own batches, block in the reads 5 % of their
 * time (npyload_stats.read_ahead_on; a worker with read-ahead off fills
 * one slot). Order and bytes never depend on it. Device mode:
 * the controller changes the workers; the device slots stay at their
 * first count (with NUM_WORKERS fixed there is no controller).
 * npyload_loader_auto_history() lists its decisions. */
#define NPYLOAD_AUTO (-2)

/*! Options for npyload_loader_set(), generated from NPYLOAD_OPTION_MAP. 0
 * means "default" where a default is documented. All options must be set
 * before npyload_loader_start(); setting one afterwards fails with
 * NPYLOAD_ESTATE. */
typedef enum npyload_option {
#define NPYLOAD_XX_OPT(name, value, doc) NPYLOAD_OPT_##name = (value),
    NPYLOAD_OPTION_MAP(NPYLOAD_XX_OPT)
#undef NPYLOAD_XX_OPT
} npyload_option;

/*! Order semantics (identical in C and Python).
 * Per epoch the loader forms a sequence of all N sample indices: identity, or
 * a permutation that is a pure function of (seed, epoch) — the same for every
 * backend, worker count and prefetch depth. The generator is documented in
 * lib/order (SplitMix64-seeded xoshiro256**, Lemire's bounded draws,
 * Fisher–Yates), so any language can reproduce it.
 * Ranks split the sequence like torch.utils.data.DistributedSampler:
 *  - drop_last = 0: the sequence is padded by repeating its head until its
 *    length is a multiple of world_size, then rank r takes positions
 *    r, r + W, r + 2W, ...; every rank gets ceil(N / W) samples. Ranks are
 *    disjoint except for those (at most W - 1) padded repeats. The last batch
 *    of a rank may be short.
 *  - drop_last = 1: the tail is dropped so the length is a multiple of W
 *    (each rank gets floor(N / W) samples), and the final incomplete batch of
 *    each rank is dropped too.
 * Every rank therefore gets the same number of batches. */

/*! Threads: which calls on one loader may overlap (run at the same time on
 * different threads).
 *  - Configuration (add_field, add_field_files, set, set_transform): before
 *    start, on one thread, overlapping nothing. get() reads options: it may
 *    overlap anything but set_state() (which takes over seed, shuffle and
 *    drop_last) and start().
 *  - Control calls (start, set_epoch, set_state): may overlap each other and
 *    every call below; they run one at a time inside the loader (a lock the
 *    workers never take, so reads go on while an order is built). The one
 *    that returns last decides the epoch and position.
 *  - next() / next_timeout(): one thread at a time; once start has
 *    returned, may overlap set_epoch, set_state, the queries and releases.
 *  - Queries (get_state, get_stats, num_batches, num_samples,
 *    last_skip_error, field_engine) and batch calls (accessors, wait_stream, sync,
 *    release, release_stream, release_checked): may overlap each other and
 *    everything above after start. get_state() reports the position of the
 *    last control call or next() that completed.
 *  - errmsg(): the last failure of any thread's call; read it on the thread
 *    that saw the failure before another call on the loader fails.
 *  - destroy(): waits for control calls in progress and wakes next() (see
 *    npyload_loader_destroy); no call may begin once it has begun.
 * Two loaders share nothing: any calls on different loaders may overlap. */

/*! npyload_loader_create() :
 * @return : 0 and a new loader in *out, or -ENOMEM / NPYLOAD_EINVAL. */
NPYLOAD_API int npyload_loader_create(npyload_loader **out);

/*! npyload_loader_destroy() :
 * Stops the workers, waits for reads and copies in flight, frees every slot.
 * NULL-safe. Safe mid-epoch with workers busy. Batches still held by the
 * caller stay valid until they are released: destroy then joins the workers
 * and frees every descriptor, io_uring ring and slot except the held ones;
 * the last npyload_batch_release() frees those and the handle.
 * Threads (see "Threads" below): destroy waits for a start, set_epoch or
 * set_state in progress on another thread to finish (those still waiting
 * for their turn return NPYLOAD_ESTATE), and wakes a next() waiting for a
 * batch, which returns NPYLOAD_ESTATE; then it frees. It never hangs (the
 * calls it waits for never wait for anything unbounded). No call on the
 * loader may begin once destroy has begun, as with free(): its memory is
 * gone when destroy returns. Releasing batches the caller holds, during or
 * after destroy, is allowed.
 * fork(): a loader belongs to the process that created it. In a child
 * process every call on an inherited loader or batch returns
 * NPYLOAD_EFORKED (create a new loader in the child); there,
 * npyload_loader_destroy() and npyload_batch_release() return at once and
 * free nothing: the worker threads, locks and descriptors they would touch
 * are the parent's, so the child's copy is deliberately leaked. */
NPYLOAD_API void npyload_loader_destroy(npyload_loader *L);

/*! npyload_loader_add_field() :
 * Adds a field named `name` whose files are those matching `glob`, sorted
 * lexicographically (byte order). Headers are read at start. A file may be
 * an NPY file or a FILE.npy.zst (see "Compressed shards" below; told by its
 * first bytes), both kinds in one field too; a .npy.zst's seek table is
 * validated at start.
 * @return : 0, NPYLOAD_ENOFILES if nothing matches, NPYLOAD_EINVAL for a bad
 *           or duplicate name, NPYLOAD_ESTATE after start. */
NPYLOAD_API int npyload_loader_add_field(npyload_loader *L, const char *name,
                                         const char *glob);

/*! npyload_loader_add_field_files() : the same with an explicit ordered list
 * of `n` paths (copied). */
NPYLOAD_API int npyload_loader_add_field_files(npyload_loader *L,
                                               const char *name,
                                               const char *const *paths,
                                               size_t n);

/*! Mixing sources (0.4; docs/mixing.md has the semantics in full).
 * A mixture delivers rows of K >= 1 sources in one stream, in proportion to
 * their weights. Each source is a set of fields with the same names,
 * per-sample shapes and dtypes as every other source's (and the same
 * sample count across its own fields).
 *
 * Which source and which of its samples position p of epoch e holds is a
 * pure function of (seed, epoch, position) and the weights' history: each
 * source keeps its own permutation and pass counter (a small source cycles,
 * a new permutation each pass; a large one is read once, across epochs,
 * before any sample repeats), and an interleave (Bresenham over a tree of
 * the sources, shuffled in blocks of 64 positions) chooses the source of
 * every position with no drift of the proportions. An epoch is T positions
 * (NPYLOAD_OPT_SAMPLES_PER_EPOCH, default the sum of the sources' sizes);
 * ranks, drop_last, padding, batches and elastic resume are the
 * single-source rules with these T positions in place of the permutation.
 * The rule is written in lib/order/npyload_mix.h. */

/*! npyload_loader_add_source() :
 * Begins source number K (0, 1, ... in the order of the calls) named
 * `name`: the fields added after it, up to the next add_source, are this
 * source's. Before the first add_source there is no mixture (the 0.3
 * loader); a field added before it is an error once a source exists. Every
 * source must add the fields of source 0, by the same names (any order); a
 * field of another name, or a field missing, fails (here or at start) with
 * a message naming the source and the field. At start a shape or dtype
 * that differs between sources fails naming both sources and both values.
 * Until npyload_loader_set_weights, each source's weight is its sample
 * count (so an epoch of the default length reads about every sample once).
 * @return : 0; NPYLOAD_EINVAL (empty or duplicate name, more than 65536
 *           sources, fields added before the first source); NPYLOAD_ESTATE
 *           after start. Setup call (see "Threads"). */
NPYLOAD_API int npyload_loader_add_source(npyload_loader *L, const char *name);

/*! npyload_loader_num_sources(), npyload_loader_source_name() : K (0 when
 * the loader has no mixture) and source k's name (NULL out of range). */
NPYLOAD_API size_t npyload_loader_num_sources(const npyload_loader *L);
NPYLOAD_API const char *npyload_loader_source_name(const npyload_loader *L,
                                                   size_t k);

/*! npyload_loader_set_weights() :
 * The sources' weights, w[0 .. k) (k = the number of sources): finite,
 * >= 0, at least one > 0, a positive weight only on a source that holds
 * samples. Only their ratios count (quantised to 2^-30 of the total).
 * Before start: the weights in force from epoch 0 (a state restored before
 * start brings its own history; weights set after load_state then apply
 * from the restored position on). After start: in force from the next
 * batch next() hands out, exactly: the change point is the epoch's global
 * position P = base + consumed * world_size (consumed: this rank's rows
 * handed out), the rest of the epoch (P .. T-1) is split over the ranks as
 * after an elastic resume at P, and the state records the change, so a
 * resume reproduces it. At the end of a pass (or P = T) the change applies
 * from the next epoch's first position. Setting the weights in force again
 * changes nothing (a curriculum may set its schedule before every epoch).
 * With world_size > 1 every rank must call it after the same number of
 * batches. Batches already read ahead are discarded.
 * @return : 0; NPYLOAD_EINVAL (bad weights, k differs from the sources, no
 *           mixture: the message says which); NPYLOAD_ESTATE (a change
 *           before the start of the weights now in force); -ENOMEM.
 *           On failure nothing changes. Thread-safe like set_epoch. */
NPYLOAD_API int npyload_loader_set_weights(npyload_loader *L, const double *w,
                                           size_t k);

/*! npyload_loader_source_samples() :
 * The rows of source k handed out by next() since start (over every epoch).
 * Any thread. @return : the count, or NPYLOAD_EINVAL (k out of range). */
NPYLOAD_API int64_t npyload_loader_source_samples(const npyload_loader *L, size_t k);

/*! npyload_loader_digest() :
 * The running digest of the rows next() handed out, from the run's first
 * row (or from the state it resumed), and how many rows it covers: XXH3
 * chained over each row's (source, index within the source, augmentation
 * decisions of every augmented field), as lib/order/npyload_digest.h
 * documents byte for byte (also without a mixture: source 0, the global
 * index). A function of the rows alone, not of batch size, workers,
 * backend or device. Saved and restored with the state (records _digest,
 * _digest_rows); two runs that hand out the same rows have the same pair.
 * After a restore at another world size each rank continues the saved
 * rank's digest: compare sums of rows, or runs at the same world size.
 * Any thread; with a next() running concurrently it may not yet include
 * the batch being handed out. @return : 0, NPYLOAD_EINVAL (NULL). */
NPYLOAD_API int npyload_loader_digest(const npyload_loader *L, uint64_t *digest,
                                      uint64_t *rows);

/*! Transforms: per field, the loader converts each batch before handing it
 * out. Per element, in float32: y = (x * scale - mean[c]) / std[c], where c
 * is the channel (axis 0 of a sample, axis 1 of the batch), three correctly
 * rounded operations (no FMA); then y is rounded to nearest even into
 * `dtype`. With channels_last, a sample (C, d1..dk) is stored (d1..dk, C):
 * the array keeps its logical shape and reports NHWC strides.
 * Host memory: the workers read the stored bytes into a per-worker buffer
 * and transform into the batch slot (slots are sized for the output dtype).
 * CUDA device: the stored bytes cross PCIe (a uint8 field costs 1 byte per
 * element, not 2 or 4) and a kernel transforms them on the device, on the
 * copy's stream, before the batch is handed out; the kernels are built when
 * the CUDA toolkit (nvcc) is found at build time, and without them start
 * fails with NPYLOAD_ENOCUDA saying so. Device and host results are equal
 * bit for bit (both compute the same three roundings). */
typedef enum npyload_dtype {
    NPYLOAD_DTYPE_KEEP = 0,     /* the stored dtype; only without arithmetic */
    NPYLOAD_DTYPE_FLOAT32 = 1,  /* "<f4" */
    NPYLOAD_DTYPE_FLOAT16 = 2,  /* "<f2", IEEE half */
    NPYLOAD_DTYPE_BFLOAT16 = 3  /* "bfloat16" */
} npyload_dtype;

/*! npyload_transform: start from NPYLOAD_TRANSFORM_INIT (the identity:
 * keep the dtype, scale 1, no mean/std, channels first) and set what you
 * need. Inputs may be any integer or float dtype, either byte order; bool
 * and complex fields can only be kept (dtype KEEP, channels_last allowed).
 * `scale` has no "unset" value: it is used as given, must be finite and
 * nonzero (0 would zero every element, which no caller means; it is
 * refused naming the member), so a struct zeroed by hand is refused
 * rather than silently scaled by 0. Members added in later releases are at
 * the end and are off when zero. */
typedef struct npyload_transform {
    int dtype;            /* npyload_dtype */
    float scale;          /* applied first; finite, nonzero; 1 = none */
    const float *mean;    /* n_mean values: 0 (none), 1 (every channel) or C */
    size_t n_mean;
    const float *std;     /* n_std values: 0 (none: 1), 1 or C; nonzero */
    size_t n_std;
    int channels_last;    /* 0 or 1 (a sample with one axis is unchanged) */
    /* Random augmentation (0.3), decided per sample as documented below: */
    float hflip;          /* probability in [0, 1] of reversing the last axis */
    float vflip;          /* probability in [0, 1] of reversing the axis before */
    int64_t crop_h, crop_w; /* random crop of the last two axes to this size
                             (both 0: none; with pad, the sample's own size) */
    int64_t pad;          /* zeros added on each side of the last two axes
                             before the crop (stored zeros, before scale) */
    const float *hflip_sign; /* n values, 0 (none), 1 or C, each +1 or -1: */
    size_t n_hflip_sign;     /* channel c is multiplied by it when the sample */
    const float *vflip_sign; /* is flipped (a float stored dtype only): */
    size_t n_vflip_sign;     /* vector targets such as offsets (du, dv) */
} npyload_transform;

/*! Augmentation: what a sample becomes, and how it is decided.
 * Geometry acts on the last two axes (H, W) of a sample with two or more
 * axes; a sample with fewer axes is never moved, only signed. With stored
 * sample x (axes (..., H, W)), P = pad, crop (h, w) (the padded size when
 * crop_h = crop_w = 0) and the sample's decisions (hf, vf, top, left):
 *   padded[..., u, v] = x[..., u - P, v - P] inside x, else 0 (stored zero)
 *   out[..., y, X]    = padded[..., top + (vf ? h-1-y : y),
 *                                  left + (hf ? w-1-X : X)]
 * then channel c (axis 0 of the sample) is negated when hf and
 * hflip_sign[c] = -1, or vf and vflip_sign[c] = -1 (both: negated twice),
 * and then the transform's scale, mean/std, dtype and layout apply as
 * without augmentation. Delivered shape: (..., h, w).
 *
 * The decisions are a pure function of (seed, epoch, global sample index i)
 * (the loader's seed and epoch, as for the shuffle), so any worker count,
 * backend, world size, resume or device gives the same batch, and every
 * field of a sample draws the same numbers: fields with the same hflip
 * probability flip together; fields of the same (H, W, pad, crop) get the
 * same offsets. With mix64 and G of lib/order's generator, on uint64 wrapping:
 *   x  = mix64(mix64(seed + G) ^ epoch) ^ i
 *   dj = mix64(x + j * G) for j = 1, 2, 3, 4
 *   hf = (d1 >> 40) < ceil(hflip * 2^24)       (hflip as a float, exact)
 *   vf = (d2 >> 40) < ceil(vflip * 2^24)
 *   top  = ((d3 >> 32) * (H + 2P - h + 1)) >> 32
 *   left = ((d4 >> 32) * (W + 2P - w + 1)) >> 32
 * npyload_batch_augment() hands out each row's decisions, for labels that
 * are not arrays (keypoints, boxes). In device mode an augmented field
 * crosses PCIe in its stored dtype, with a 16-byte record per row (the
 * row's decisions, computed on the host by the same function), and one
 * kernel after the copy does the pad, crop window, flips, signs and the
 * transform, bit for bit as the host engine (NaN payloads aside, as for
 * every device transform). Where the kernels cannot (flip signs for more
 * than 128 channels, items of an odd size, kernels that did not load) the
 * field runs in the host engine and crosses in its output dtype;
 * npyload_loader_field_engine() says which and why. */

/*! NPYLOAD_TRANSFORM_INIT: the identity transform, an initializer:
 * `npyload_transform t = NPYLOAD_TRANSFORM_INIT; t.dtype = ...;` */
#define NPYLOAD_TRANSFORM_INIT                                                 \
    {NPYLOAD_DTYPE_KEEP, 1.0f, NULL, 0, NULL, 0, 0, 0.0f, 0.0f, 0, 0, 0, NULL, 0,  \
     NULL, 0}

/*! npyload_loader_set_transform() :
 * Sets (or, with t == NULL, removes) the transform of field `field`.
 * `size` is sizeof(npyload_transform) as the caller was compiled (see
 * Conventions; ignored when t is NULL). The struct and its mean/std values
 * are copied. Checked now on its own (dtype, scale finite and nonzero,
 * finite values, std nonzero, arithmetic needs an output dtype) and at
 * start against the field (mean/std count vs the channels, input dtype).
 * @return : 0; NPYLOAD_EINVAL for an unknown field, a size below the first
 *           layout, or a bad description (the message names the field and
 *           the member); NPYLOAD_ESTATE
 *           after start. At start: NPYLOAD_EMISMATCH (mean or std count is
 *           neither 1 nor the channel count), NPYLOAD_EUNSUPPORTED (input
 *           dtype), NPYLOAD_ENOCUDA (device mode without the kernels). */
NPYLOAD_API int npyload_loader_set_transform(npyload_loader *L, const char *field,
                                             const npyload_transform *t,
                                             size_t size);

/*! npyload_loader_set_source_transform() :
 * A mixture (npyload_loader_add_source): sets (or, with t == NULL,
 * removes) source `source`'s own transform of field `field`: that
 * source's rows of the field take t in place of the field's transform
 * (npyload_loader_set_transform; a source without its own takes the
 * field's, or none). Checked and copied as set_transform's. The
 * augmentation decisions of a row are drawn with its own source's
 * transform (probabilities, crop), by the rule above. At start every
 * source's transform of a field must deliver the same dtype, per-sample
 * shape and layout (they may differ in scale, mean, std, flips and
 * signs). Such a field runs in the host engine, also in device mode
 * (npyload_loader_field_engine says so): the kernels take one plan per
 * batch.
 * @return : 0; NPYLOAD_EINVAL for an unknown source or field or a bad
 *           description (the message names the source, the field and the
 *           member); NPYLOAD_ESTATE after start. At start:
 *           NPYLOAD_EMISMATCH naming the field, both sources and what each
 *           delivers, and the errors of set_transform. Setup call (see
 *           "Threads"). */
NPYLOAD_API int npyload_loader_set_source_transform(npyload_loader *L, const char *source,
                                                    const char *field,
                                                    const npyload_transform *t,
                                                    size_t size);

/*! Paths for npyload_loader_set_path().
 *  NVRTC        : libnvrtc for device transforms compiled at run time
 *                 (NPYLOAD_OPT_DEVICE_KERNELS): a file, or a directory
 *                 holding libnvrtc.so.N. When set it is the only place
 *                 looked; unset, the library searches the CUDA runtime's
 *                 directory, the nvidia-cuda-nvrtc wheel beside the library
 *                 (site-packages/nvidia/cu13/lib, .../cuda_nvrtc/lib), the
 *                 dynamic loader's path and /usr/local/cuda*\/lib64.
 *  KERNEL_CACHE : a directory where kernels compiled by NVRTC are kept, one
 *                 file per kernel source version and GPU architecture, so
 *                 that later starts (and processes) skip the compile;
 *                 created when missing. Unset: no cache. (Python's default
 *                 is ~/.cache/npyload/kernels.) The library reads no
 *                 environment variable. */
typedef enum npyload_path_option {
    NPYLOAD_PATH_NVRTC = 1,
    NPYLOAD_PATH_KERNEL_CACHE = 2
} npyload_path_option;

/*! npyload_loader_set_path() : sets (path non-NULL, non-empty) or resets to
 * the default (NULL or "") the path `which`. The string is copied.
 * @return : 0, NPYLOAD_EINVAL (unknown `which`, a path of 4096 bytes or
 *           more), NPYLOAD_ESTATE after start. */
NPYLOAD_API int npyload_loader_set_path(npyload_loader *L, npyload_path_option which,
                                        const char *path);

/*! Remote shards (0.3): `s3://bucket/prefix/train_*.npy.zst` and
 * `https://host/path/file.npy` wherever a path is accepted. An s3:// glob
 * is expanded with ListObjectsV2 (every page; sorted by strcmp like local
 * globs; `*` does not cross '/'); http(s):// URLs are given as explicit
 * lists. At start one small ranged GET per object reads its header (and a
 * second its seek table, for .npy.zst), learning its size and ETag; then
 * the workers fetch exactly the byte ranges a batch needs (adjacent ranges
 * coalesced, up to max_inflight requests in flight per worker and per
 * read-ahead thread) into the same slots, with the same order, resume,
 * skip and transform semantics as local files.
 * Integrity: every response is checked against the range asked
 * (Content-Range, byte count), the size and the ETag seen at start (sent
 * as If-Match): an object that changed fails with NPYLOAD_ECHANGED naming
 * the URL; frames against their checksums as locally. Transient failures
 * (connection refused or reset, timeouts, HTTP 5xx, 429 and 503 "slow
 * down") are retried `retries` times with exponential backoff (from
 * retry_base_ms, doubling, capped at 5 s, half of each delay random);
 * permanent ones (403 -EACCES, 404 -ENOENT, ...) fail at once. Every wait
 * is bounded by timeout_ms per attempt.
 * The cache (cache_dir): fetched data is kept in blocks of cache_block
 * bytes (files named by a hash of URL, ETag and size), written to a
 * temporary file, synced and renamed, so ranks of a node may share one
 * directory and a crash leaves no partial block; later reads of a block
 * come from the file. The least recently used blocks are removed so that
 * the directory stays within cache_bytes. Objects without an ETag are not
 * cached.
 * The library reads no environment variable (no AWS_*, no http_proxy):
 * Python builds this struct from its arguments or the AWS environment.
 * All members zero is the default: AWS's endpoint for us-east-1, unsigned
 * requests, no cache. */
typedef enum npyload_remote_style {
    NPYLOAD_REMOTE_AUTO = 0,    /* path-style with a custom endpoint,
                                   virtual-hosted on AWS */
    NPYLOAD_REMOTE_PATH = 1,    /* ENDPOINT/BUCKET/KEY */
    NPYLOAD_REMOTE_VIRTUAL = 2  /* BUCKET.HOST/KEY */
} npyload_remote_style;

typedef struct npyload_remote {
    const char *endpoint;       /* "http://127.0.0.1:8333"; NULL: AWS,
                                   https://s3.REGION.amazonaws.com */
    const char *region;         /* signing region; NULL: "us-east-1" */
    const char *access_key;     /* NULL: requests are not signed */
    const char *secret_key;     /* with access_key; copied, wiped on
                                   destroy, never in any message */
    const char *session_token;  /* temporary credentials; NULL: none */
    int path_style;             /* npyload_remote_style */
    int retries;                /* after a transient failure; 0: 8; -1: none */
    int64_t timeout_ms;         /* one attempt, whole; 0: 60000 */
    int64_t connect_timeout_ms; /* 0: 10000 */
    int max_inflight;           /* requests in flight per reading thread;
                                   0: 8 */
    const char *cache_dir;      /* NULL: no cache */
    int64_t cache_bytes;        /* the cache's bound; 0: 10 GiB */
    int64_t cache_block;        /* bytes per cache block (4 KiB .. 1 GiB);
                                   0: 4 MiB */
    const char *ca_file;        /* PEM file of trusted CAs; NULL: the system's */
    const char *proxy;          /* a proxy URL; NULL: none */
    int64_t list_max_keys;      /* keys per listing page (1 .. 1000); 0: 1000 */
    int64_t retry_base_ms;      /* the first backoff; 0: 100 */
} npyload_remote;

/*! npyload_loader_set_remote() : the configuration of s3:// and https://
 * paths, before the fields that use it are added (an s3:// glob is listed
 * by add_field). `size` is sizeof(npyload_remote) as the caller was
 * compiled (see Conventions). Strings are copied. http(s):// URLs work
 * without it (unsigned, defaults); s3:// paths need it.
 * @return : 0; NPYLOAD_EINVAL naming a bad or missing member (a secret_key
 *           without access_key, an endpoint that is not http(s)://, ...);
 *           NPYLOAD_EUNSUPPORTED when the library was built without
 *           libcurl; NPYLOAD_ESTATE after start or after a remote field
 *           was added. */
NPYLOAD_API int npyload_loader_set_remote(npyload_loader *L, const npyload_remote *cfg,
                                          size_t size);

/*! npyload_loader_set_interrupt() : a function the loader asks, on the
 * caller's own thread, whether to give up a call that waits for remote
 * storage: add_field and add_field_files (listing an s3:// glob, page
 * after page) and start (probing the remote objects). While such a call
 * waits, fn(arg) is called at least every 100 ms; when it returns non-zero
 * the call stops its transfers and returns -ECANCELED ("interrupted"),
 * leaving the loader as any failed call does. A binding checks for Ctrl-C
 * there (Python: KeyboardInterrupt during a long listing). fn is never
 * called from the loader's worker threads; destroy() stops their
 * transfers by itself, within about 100 ms. NULL (the default) turns it
 * off.
 * @return : 0; NPYLOAD_EINVAL for a NULL loader. Threads: a control call
 *           (not while add_field or start runs on another thread). */
NPYLOAD_API int npyload_loader_set_interrupt(npyload_loader *L, int (*fn)(void *arg),
                                             void *arg);

/*! npyload_loader_set() : sets option `opt` (see npyload_option).
 * @return : 0, NPYLOAD_EINVAL for a value out of range (the message names the
 *           option and the accepted range), NPYLOAD_ESTATE after start,
 *           NPYLOAD_ENOCUDA when a CUDA device is asked for and CUDA is not
 *           usable (the message says why: no runtime library, no driver,
 *           no device, index out of range). */
NPYLOAD_API int npyload_loader_set(npyload_loader *L, npyload_option opt,
                                   int64_t value);

/*! npyload_option_range() : the smallest and largest value
 * npyload_loader_set() accepts for `opt` (0 and -1 where they mean a
 * default or a mode, as documented above; RANK is also checked against
 * WORLD_SIZE at start, DEVICE against the devices present). Bindings check
 * their arguments against it, in their own units, rather than copy the
 * limits. @return : 0, or NPYLOAD_EINVAL for an unknown option or NULL. */
NPYLOAD_API int npyload_option_range(npyload_option opt, int64_t *min,
                                     int64_t *max);

/*! npyload_default_prefetch() : the batch slots a loader gets with PREFETCH
 * 0 (the default) and NUM_WORKERS `num_workers` (in that option's units:
 * 0 the default count, NPYLOAD_WORKERS_SYNC for none). The one place the
 * default is computed: start uses it, bindings ask it rather than recompute.
 * @return : the slot count (>= 1), or NPYLOAD_EINVAL when num_workers is
 *           out of NUM_WORKERS' range. */
NPYLOAD_API int64_t npyload_default_prefetch(int64_t num_workers);

/*! npyload_loader_get() : reads back an option's effective value. Before
 * start: the value set (0 for a default). After start: what the loader runs
 * with, defaults resolved: NUM_WORKERS, PREFETCH (batch slots),
 * QUEUE_DEPTH, SHUFFLE_WINDOW, IO_BACKEND (the backend AUTO chose) and
 * PIN_MEMORY (1 if the slots are pinned, else 0).
 * @return : 0 or NPYLOAD_EINVAL. */
NPYLOAD_API int npyload_loader_get(const npyload_loader *L, npyload_option opt,
                                   int64_t *value);

/*! NPYLOAD_MAX_SAMPLE_BYTES: the largest sample (one row of a field, as
 * stored, as delivered after its transform and, augmented by the host
 * engine, as augmented in its stored dtype) a loader accepts: 4 GiB.
 * Slots are sized in samples, so a header's per-sample shape alone (a file
 * of shape (0, 2^32) holds 0 bytes) would otherwise decide how much start
 * reserves; 4 GiB is far above any sample a training step uses (the
 * reference workload's largest is 2 MiB; a 1024^3 float32 volume is 4 GiB)
 * and keeps one slot row addressable by every io backend. A larger sample
 * is refused at start with NPYLOAD_ETOOBIG before anything is allocated;
 * the message names the field, its first file and the size. */
#define NPYLOAD_MAX_SAMPLE_BYTES (UINT64_C(1) << 32)

/*! npyload_loader_start() :
 * Reads every header, validates the fields (per-sample shape and dtype agree
 * within a field, totals agree across fields; every mismatch names the file
 * and both values), chooses the io backend, allocates PREFETCH slots once,
 * starts the workers and begins epoch 0 (or the epoch given by
 * npyload_loader_set_epoch / npyload_loader_set_state before start).
 * A slot holds min(BATCH_SIZE, ceil(N / WORLD_SIZE)) rows (a rank never
 * gets more in one batch), so a small field with a large BATCH_SIZE, or an
 * empty one, reserves only what it can deliver; stats slot_bytes says how
 * much. A sample above NPYLOAD_MAX_SAMPLE_BYTES is refused (NPYLOAD_ETOOBIG).
 * Fortran-ordered data is refused unless its bytes are also C-ordered (at
 * most one dimension longer than 1), so it is never delivered transposed;
 * the message names the file. Big-endian
 * data is delivered byte for byte with its descr (">f4"); it is not swapped.
 * @return : 0 or an error (details in npyload_loader_errmsg). */
NPYLOAD_API int npyload_loader_start(npyload_loader *L);

/*! npyload_loader_stop() (0.3) : returns a started loader to the state
 * before start (workers joined, slots and buffers freed), keeping what
 * start read of the fields: the headers, .npy.zst seek tables and remote
 * objects' sizes and ETags. Options may then be set again and the next
 * start does not read a header or probe a remote object again (a remote
 * object changed since fails its reads with NPYLOAD_ECHANGED, a local
 * file its identity check). Adding a field, set_remote or a new ALIGN
 * drops what was kept. Python's Loader checks its arguments with a small
 * start in the constructor, stops it, and starts it for real at the first
 * iteration: remote objects are probed once.
 * @return : 0; NPYLOAD_ESTATE when not started or a batch is still held;
 *           NPYLOAD_EFORKED in a child. */
NPYLOAD_API int npyload_loader_stop(npyload_loader *L);

/*! npyload_loader_set_epoch() :
 * Selects the epoch whose order the loader produces. Before start it sets the
 * first epoch; after start it abandons what is left of the current epoch
 * (reads in flight finish and are discarded; batches the caller holds stay
 * valid) and begins `epoch` from its first batch. It also clears a failure
 * (after a failed read, set_epoch retries from the epoch's start). One
 * exception, the usual `for e in range(saved_epoch, n): set_epoch(e)`
 * after a resume: right after npyload_loader_set_state (or _load_state),
 * before a batch is handed out, set_epoch with the restored epoch keeps
 * the restored position (even one whose pass had ended: it goes on from
 * there, with nothing left).
 * Thread-safe against start/set_epoch/set_state (they run one at a time: the
 * one that returns last decides the order, and every batch next() hands out
 * after it returns, get_state() and num_batches() agree with it) and
 * against next() on another thread; see "Threads".
 * A mixture knows its weights from the point they were put in force on
 * (npyload_loader_set_weights): an epoch before that point is refused
 * (load a state saved then to go back).
 * @return : 0, -ENOMEM (the loader then keeps its previous order), or
 *           NPYLOAD_ESTATE when destroy has begun on another thread, or
 *           (a mixture) for an epoch before the weights in force began. */
NPYLOAD_API int npyload_loader_set_epoch(npyload_loader *L, uint64_t epoch);

/*! npyload_loader_num_batches() : batches per epoch for this rank (of the
 * current split: after an elastic resume, the rest of the epoch split over
 * this world size), or NPYLOAD_ESTATE when the fields were never read
 * (before the first start; a stopped loader knows them). */
NPYLOAD_API int64_t npyload_loader_num_batches(const npyload_loader *L);

/*! Passes: the loader's own rule for "the next loop", as
 * torch.utils.data.DataLoader's iter() has it, so that a binding or a
 * trainer asks the loader rather than keeping a second copy of the rule.
 *
 * npyload_loader_begin_pass() : begins the next pass over the data. The
 * first pass after create or set_epoch(e) runs epoch e from its first
 * batch; the first after set_state / load_state runs the restored position
 * (or, when the saved pass had ended, the next epoch from its start); every
 * later pass runs the epoch after the last one, from its first batch,
 * whether the last pass ran to its end or not. next() returning
 * NPYLOAD_EOF ends a pass (npyload_loader_save_state records it as
 * loop_ended). Optional: a program that calls set_epoch itself never
 * needs it. After start; a control call like set_epoch (see "Threads").
 * @return : 0, NPYLOAD_ESTATE before start, NPYLOAD_EINVAL when the next
 *           epoch would pass INT64_MAX (choose one with set_epoch), -ENOMEM.
 *
 * npyload_loader_pass_batches() : the batches of the pass in progress, from
 * its beginning (a resumed pass begins at the restored position), or when
 * it has ended, those of the next pass (a whole epoch). Known from the time
 * the fields were read (after a start, also a stopped loader). Any thread.
 * @return : the count, or NPYLOAD_ESTATE before the fields are read. */
NPYLOAD_API int npyload_loader_begin_pass(npyload_loader *L);
NPYLOAD_API int64_t npyload_loader_pass_batches(const npyload_loader *L);

/*! npyload_pass / npyload_loader_pass_rule() : what the next begin_pass
 * does: START (the epoch set_epoch chose, from its first batch), RESUME
 * (the position set_state restored), ADVANCE (the next epoch, from its
 * first batch). Any thread. @return : an npyload_pass, or NPYLOAD_EINVAL. */
typedef enum npyload_pass {
    NPYLOAD_PASS_START = 0,
    NPYLOAD_PASS_RESUME = 1,
    NPYLOAD_PASS_ADVANCE = 2
} npyload_pass;
NPYLOAD_API int npyload_loader_pass_rule(const npyload_loader *L);

/*! npyload_loader_num_samples() : N, the samples in every field (after
 * start), or a negative error. */
NPYLOAD_API int64_t npyload_loader_num_samples(const npyload_loader *L);

/*! npyload_loader_next() :
 * Hands out the next batch of the epoch, strictly in order, blocking (without
 * spinning) until it is ready. With a CUDA device the batch's arrays are
 * device pointers; the copy may still be in flight: call
 * npyload_batch_wait_stream() (or npyload_batch_sync()) before using them.
 * @return : 0 with *out set; NPYLOAD_EOF at the end of the epoch (call
 *           set_epoch to go on); NPYLOAD_EHELD when every slot is in the
 *           caller's hands, so waiting could never end (release a batch and
 *           call again: the loader is not failed); another negative error (a
 *           failed read names the file and offset in npyload_loader_errmsg),
 *           after which the loader stays failed until set_epoch/set_state;
 *           NPYLOAD_ESTATE (no message) when destroy() began on another
 *           thread while next() waited.
 * Only one thread may call next() at a time; it may overlap every other
 * call (see "Threads"). A batch prefetched for an epoch that set_epoch or
 * set_state abandoned is never handed out. */
NPYLOAD_API int npyload_loader_next(npyload_loader *L, npyload_batch **out);

/*! npyload_loader_next_timeout() : as next(), but gives up after
 * `timeout_ns` nanoseconds with -ETIMEDOUT (used to stay responsive to
 * signals in bindings). A negative timeout waits forever. -ETIMEDOUT
 * always means "no batch yet": a read that timed out fails the batch with
 * another code (NPYLOAD_EREMOTE for a remote one, naming the URL and the
 * timeout; -EIO for a local file). */
NPYLOAD_API int npyload_loader_next_timeout(npyload_loader *L,
                                            npyload_batch **out,
                                            int64_t timeout_ns);

/*! npyload_loader_errmsg() : the last error on `L` in words (which file,
 * which offset, what was expected), or "" if none. Valid until the next call
 * on `L`. NULL-safe. With calls on several threads (next() on one,
 * set_epoch on another), another call's failure may rewrite it while it is
 * read: copy it with npyload_loader_errmsg_copy. */
NPYLOAD_API const char *npyload_loader_errmsg(const npyload_loader *L);

/*! npyload_loader_errmsg_copy() : the same text, copied into buf[len] under
 * the loader's message lock. Any thread. @return : 0 or NPYLOAD_EINVAL. */
NPYLOAD_API int npyload_loader_errmsg_copy(const npyload_loader *L, char *buf, size_t len);

/*! npyload_loader_backend() : the active io backend (after start), or
 * NPYLOAD_IO_AUTO before. npyload_backend_name() gives its name. */
NPYLOAD_API npyload_io_backend npyload_loader_backend(const npyload_loader *L);
NPYLOAD_API const char *npyload_backend_name(npyload_io_backend b);

/*! npyload_loader_num_fields() and npyload_loader_field_name() : the fields in
 * the order they were added. */
NPYLOAD_API size_t npyload_loader_num_fields(const npyload_loader *L);
NPYLOAD_API const char *npyload_loader_field_name(const npyload_loader *L,
                                                  size_t i);

/*! npyload_loader_field_engine() :
 * After start: where field i's transform (npyload_loader_set_transform) and
 * the expansion of its narrowed codes (npyload-pack --narrow) run.
 * NPYLOAD_ENGINE_NONE: nothing runs, the stored rows are delivered;
 * NPYLOAD_ENGINE_HOST: in the workers (in device mode the output crosses
 * PCIe); NPYLOAD_ENGINE_DEVICE: kernels after the copy (the stored dtype,
 * or one-byte codes, cross PCIe). In device mode a field runs on the host
 * only where the kernels cannot (an augmentation past their limits, a field
 * mixing narrowed and plain files, kernels that did not load); `why` (may
 * be NULL) receives the reason in words, truncated to whylen (768 bytes
 * always suffice). Any thread (a query: see "Threads").
 * @return : an npyload_engine value, NPYLOAD_EINVAL (NULL or an index out
 *           of range) or NPYLOAD_ESTATE (before start). */
typedef enum npyload_engine {
    NPYLOAD_ENGINE_NONE = 0,
    NPYLOAD_ENGINE_HOST = 1,
    NPYLOAD_ENGINE_DEVICE = 2,
} npyload_engine;
NPYLOAD_API int npyload_loader_field_engine(const npyload_loader *L, size_t i, char *why,
                                            size_t whylen);

/* ---- Batches ---- */

/*! npyload_array: one field of a batch. shape[0] is the number of rows of
 * the batch, shape[1..] the per-sample shape (the logical shape: a
 * channels-last transform keeps it and changes the strides). strides[d] is
 * the distance in bytes between neighbours along axis d: C-contiguous
 * unless the field has a channels_last transform, then (N, C, H, W) is laid
 * out as NHWC (strides N: HWC, C: 1, H: WC, W: C, times itemsize). descr and
 * itemsize are those of the delivered dtype (after a transform): "<f4",
 * "<f2", or "bfloat16" (no numpy type code exists; ml_dtypes and torch
 * have the type). The library hands these out by pointer only and may add
 * members at the end: read them through the pointer (never index an array
 * of them by your sizeof). */
typedef struct npyload_array {
    void *data;                   /* host or device pointer */
    int ndim;                     /* 1 + per-sample ndim */
    int64_t shape[NPYLOAD_MAX_DIMS];
    char descr[NPYLOAD_DESCR_LEN]; /* numpy dtype string, e.g. "<f4" */
    size_t itemsize;
    size_t nbytes;                /* shape product x itemsize */
    int device;                   /* -1 host, k >= 0 CUDA device k */
    int64_t strides[NPYLOAD_MAX_DIMS]; /* bytes per step along each axis */
} npyload_array;

/*! npyload_batch_size() : rows (samples) in the batch. */
NPYLOAD_API size_t npyload_batch_size(const npyload_batch *b);

/*! npyload_batch_indices() : the global sample index of each row; with a
 * mixture (npyload_loader_add_source), each row's index within its source. */
NPYLOAD_API const int64_t *npyload_batch_indices(const npyload_batch *b);

/*! npyload_batch_sources() : each row's source (0 .. K-1, in the order the
 * sources were added); NULL when the loader has no mixture. */
NPYLOAD_API const uint32_t *npyload_batch_sources(const npyload_batch *b);

/*! npyload_batch_num_fields(), npyload_batch_field() : the fields in the
 * order they were added; NULL for an index out of range. */
NPYLOAD_API size_t npyload_batch_num_fields(const npyload_batch *b);
NPYLOAD_API const npyload_array *npyload_batch_field(const npyload_batch *b,
                                                     size_t i);

/*! npyload_batch_augment() : the augmentation decisions of each row of the
 * batch for field `index` (see "Augmentation" above): hflip[r], vflip[r]
 * (0 or 1), top[r] and left[r] (the crop window's corner in the padded
 * sample; 0 without a crop). Each pointer may be NULL; the others receive
 * npyload_batch_size() entries. A field without augmentation gets zeros.
 * @return : 0, or NPYLOAD_EINVAL for a NULL batch or an index out of range. */
NPYLOAD_API int npyload_batch_augment(const npyload_batch *b, size_t index,
                                      uint8_t *hflip, uint8_t *vflip,
                                      int64_t *top, int64_t *left);

/*! npyload_batch_epoch(), npyload_batch_seq() : the epoch and the batch's
 * position within this rank's epoch (0, 1, ...). */
NPYLOAD_API uint64_t npyload_batch_epoch(const npyload_batch *b);
NPYLOAD_API int64_t npyload_batch_seq(const npyload_batch *b);

/*! npyload_batch_wait_stream() :
 * Makes the CUDA stream `stream` (a cudaStream_t; NULL is the legacy default
 * stream) wait for the batch's host-to-device copy, without blocking the
 * host (cudaStreamWaitEvent). No-op for host batches.
 * @return : 0 or NPYLOAD_ECUDA. */
NPYLOAD_API int npyload_batch_wait_stream(npyload_batch *b, void *stream);

/*! npyload_batch_sync() : blocks the host until the batch's copy is done.
 * No-op for host batches. @return : 0 or NPYLOAD_ECUDA. */
NPYLOAD_API int npyload_batch_sync(npyload_batch *b);

/*! npyload_batch_release() :
 * Gives the batch's slot back to the loader. For device batches the slot may
 * be overwritten as soon as the copy engine reaches it, so all work reading
 * the batch must have finished — use npyload_batch_release_stream() to
 * release without waiting on the host. NULL-safe. Thread-safe with respect
 * to next() on the same loader and to the release of other batches. If the
 * loader was destroyed, the last release frees its memory.
 * Each batch is released once. A second release of the same handle is
 * detected and ignored: nothing changes (no slot is freed twice, no count
 * moves) and npyload_loader_errmsg() of its loader says which batch; use
 * npyload_batch_release_checked() to get the refusal as a result. next()
 * hands out a different handle each time (a slot's handles are used in
 * turn), so a stale handle is recognised as such even after its slot was
 * refilled and handed out again, for the next 7 hand-outs of that slot;
 * after that it may name a batch the caller holds again. A release after
 * the destroyed loader's last batch was released touches freed memory. */
NPYLOAD_API void npyload_batch_release(npyload_batch *b);

/*! npyload_batch_release_checked() : npyload_batch_release() with a result.
 * @return : 0 when the batch was released; NPYLOAD_ESTATE when `b` is not a
 *           batch the caller holds (released already: nothing changed, the
 *           loader's errmsg names the batch); NPYLOAD_EINVAL for NULL;
 *           NPYLOAD_EFORKED in a fork() child (nothing changed). */
NPYLOAD_API int npyload_batch_release_checked(npyload_batch *b);

/*! npyload_batch_release_stream() :
 * Releases the batch once the work queued on `stream` before this call has
 * finished: an event is recorded on `stream` now, and the slot's next copy is
 * ordered after that event (on the device, no host wait). The stream must
 * stay valid until the event completes. For host batches this is
 * npyload_batch_release(). */
NPYLOAD_API void npyload_batch_release_stream(npyload_batch *b, void *stream);

/* ---- Resume ---- */

/*! npyload_state: the loader's position. Small, plain data: save it with
 * your checkpoint. `consumed` counts samples of this rank handed out in
 * `epoch` (a multiple of batch_size except at the epoch's end) since the
 * split began at `base`. `base` is 0 except after a resume at another world
 * size: the number of positions of the epoch's global sequence that were
 * consumed before the current split (see npyload_loader_set_state). */
typedef struct npyload_state {
    uint64_t version;     /* NPYLOAD_STATE_VERSION */
    int64_t seed;
    uint64_t epoch;
    uint64_t consumed;
    int64_t num_samples;  /* N, checked on restore */
    int64_t batch_size;   /* checked on restore */
    int64_t world_size;   /* the saver's; may differ on restore */
    int64_t rank;
    int64_t shuffle;
    int64_t drop_last;
    int64_t base;         /* version 2: resume base, 0 <= base <= N */
} npyload_state;
/* Version 2 added `base`; a version 1 state is read as base 0 (its struct
 * ends before `base`, which is then never read). */
#define NPYLOAD_STATE_VERSION 2

/*! npyload_loader_get_state() : the position after the last batch handed
 * out (before start: the one set_epoch or set_state chose, once the fields
 * were read). The 0.3 form: it cannot grow; npyload_loader_save_state
 * holds the same and what later versions add.
 * @return : 0, or NPYLOAD_ESTATE when the fields were never read. */
NPYLOAD_API int npyload_loader_get_state(const npyload_loader *L,
                                         npyload_state *out);

/*! npyload_loader_set_state() :
 * Restores a position. At the saved world size, the loader then yields
 * exactly the batches the saved one would have yielded next, whatever its
 * num_workers, prefetch or backend. At another world size W' (elastic
 * resume; in DDP every rank consumes the same number of samples, so the
 * state of any rank fixes the global position P = min(N, base + consumed *
 * world_size)), the rest of the epoch's global sequence, positions P..N-1,
 * is split over the W' ranks exactly like DistributedSampler splits a
 * dataset (same padding and drop_last rules): nothing of the epoch is lost,
 * nothing consumed before is repeated except the new split's padding (at
 * most W'-1 samples), and every rank gets the same number of batches. The
 * next set_epoch starts the normal split. Before start the check against N
 * happens at start. seed, shuffle and drop_last are taken from the state
 * (before or after start); batch_size and N must match (NPYLOAD_EMISMATCH
 * otherwise); any malformed field is NPYLOAD_EINVAL with its name. After
 * start it abandons the current position like set_epoch. Thread-safe like
 * set_epoch (see "Threads"); NPYLOAD_ESTATE once destroy has begun. */
NPYLOAD_API int npyload_loader_set_state(npyload_loader *L,
                                         const npyload_state *st);

/*! npyload_loader_save_state() :
 * The position as a versioned byte string that grows with the library: a
 * header ("NPYS", format 1, the number of records, the length) and named
 * records of little-endian numbers (int64, uint64 or float64), each one a
 * name of [a-z0-9_] and its values. This loader's records hold one value
 * each: version (2), seed, epoch, consumed, num_samples, batch_size,
 * world_size, rank, shuffle, drop_last, base (as npyload_state) and
 * loop_ended (1 when next() had returned NPYLOAD_EOF of the saved pass).
 * Later versions add records (a mixing loader's per-source positions and
 * weights); a reader refuses a record it does not know unless its name
 * begins with '_', so an older library refuses a state it cannot honour
 * instead of misreading it. Store the bytes as they are (a checkpoint's
 * blob); npyload.Loader.state_dict() is the same records as a dict.
 * buf may be NULL with cap 0 to learn the size. Any thread.
 * @return : the state's size in bytes (written when it is <= cap, else
 *           nothing is written), or NPYLOAD_ESTATE when the fields were
 *           never read, NPYLOAD_EINVAL. */
NPYLOAD_API int64_t npyload_loader_save_state(const npyload_loader *L, void *buf,
                                              size_t cap);

/*! npyload_loader_load_state() :
 * Restores a position saved by npyload_loader_save_state (of this version
 * or an older one; npyload_state's members as records, version 1 or 2,
 * load too), as npyload_loader_set_state does, and the pass rule: a state
 * whose pass had ended resumes at the next epoch (npyload_loader_begin_pass).
 * Every record is checked (the bytes may come from an untrusted file): a
 * malformed string or value is NPYLOAD_EINVAL naming the record, an
 * unknown record or format NPYLOAD_EMISMATCH. Thread-safe like set_state.
 * @return : 0 or the error, with npyload_loader_errmsg saying which. */
NPYLOAD_API int npyload_loader_load_state(npyload_loader *L, const void *buf, size_t len);

/* ---- Stats ---- */

/*! npyload_stats: grows at its end (see Conventions); read it with
 * npyload_loader_get_stats(L, &st, sizeof st). */
typedef struct npyload_stats {
    uint64_t bytes_read;        /* bytes landed in slots by the workers */
    uint64_t batches_delivered; /* batches handed out by next() */
    uint64_t samples_delivered;
    uint64_t wait_ns;           /* time the consumer waited inside next() */
    uint64_t io_ns;             /* worker time spent in reads, summed */
    uint64_t h2d_bytes;         /* bytes copied to the device */
    uint64_t h2d_ns;            /* copy time measured by CUDA events, summed */
    int backend;                /* npyload_io_backend in use */
    int pinned;                 /* 1 when slots are page-locked */
    int direct_io;              /* 1 when O_DIRECT is in use */
    int device;                 /* -1 host, or the CUDA device */
    uint64_t slot_bytes;        /* host bytes per slot */
    uint64_t num_slots;
    uint64_t uring_fallbacks;   /* workers whose io_uring_enter was refused
                                   at run time and that read with pread
                                   since (backend stays NPYLOAD_IO_URING) */
    uint64_t samples_skipped;   /* ON_ERROR skip: samples missing from
                                   the batches handed out, the one that
                                   failed at MAX_ERRORS included (rows of
                                   a batch read ahead and dropped by
                                   set_epoch or set_state do not count) */
    uint64_t errors;            /* ON_ERROR skip: failed batch reads seen
                                   (those a retry fixed included) */
    uint64_t gather_bytes;      /* bytes copied from a mapping of the file:
                                   the gather path (small requests of files
                                   in the page cache), or every byte with
                                   NPYLOAD_IO_MMAP */
    uint64_t gather_requests;   /* requests (runs of consecutive rows of one
                                   file and field) served that way */
    uint64_t read_requests;     /* requests read with io_uring or pread
                                   (bytes: bytes_read - gather_bytes) */
    uint64_t compressed_bytes_read; /* .npy.zst: frame bytes read from the
                                       files (bytes_read counts the rows
                                       they decompress to) */
    uint64_t decompressed_bytes; /* .npy.zst: bytes the frames read
                                    decompressed to (whole frames) */
    uint64_t decode_ns;         /* .npy.zst: worker time decompressing, summed */
    uint64_t transform_ns;      /* host transforms: worker time converting
                                   batches (npyload_loader_set_transform),
                                   summed; device transforms run on the copy
                                   stream and count in h2d_ns */
    /* Appended after 0.3.0 (the sized-struct rule, Conventions): */
    uint64_t read_ahead_batches; /* READ_AHEAD: batches whose reads a worker
                                    had in flight while it decoded or
                                    transformed the batch before */
    uint64_t read_wait_ns;      /* READ_AHEAD: worker time waiting for the
                                   first round of each batch's reads (those
                                   read ahead, and those read on the worker
                                   when nothing could overlap), summed
                                   (high: the disk is the limit; near 0:
                                   the cores are) */
    uint64_t elapsed_ns;        /* wall time since start() */
    uint64_t step_ns;           /* the consumer's time between a next()
                                   returning and its following call, summed:
                                   the training step as the loop ran it
                                   (wait_ns is the loop's other part) */
    uint64_t worker_cpu_ns;     /* CPU time of the workers and their
                                   read-ahead threads (and of a synchronous
                                   loader's next() while it reads), summed */
    uint64_t num_workers;       /* worker threads (0: synchronous) */
    uint64_t read_blocked_ns;   /* off-CPU time of the threads reading
                                   (wall minus CPU time of the reads, of
                                   the reads in which the thread blocked:
                                   a voluntary context switch), summed:
                                   waiting for a device. A read from the
                                   page cache is a copy on the CPU and
                                   adds ~0, also when a busy machine
                                   preempts it (with zstd, decode time
                                   inside the read is on the CPU too) */
    /* Remote shards (s3://, https://; 0.3): */
    uint64_t remote_bytes;      /* body bytes received from servers (the
                                   probe at start included) */
    uint64_t remote_requests;   /* HTTP requests made (retries included) */
    uint64_t remote_retries;    /* requests repeated after a transient
                                   failure */
    uint64_t remote_wait_ns;    /* time reading threads waited for
                                   transfers, summed */
    uint64_t cache_hits;        /* cache blocks read from cache_dir */
    uint64_t cache_misses;      /* cache blocks fetched from the server */
    uint64_t cache_read_bytes;  /* bytes served from cache_dir */
    uint64_t cache_write_bytes; /* bytes written into cache_dir */
    uint64_t cache_evictions;   /* blocks removed to stay within cache_bytes */
    /* The background cache fill (NPYLOAD_OPT_CACHE_FILL; appended after
     * 0.3, like everything below). Counters of the fill of the current
     * start (a stop and a new start begin another): */
    int32_t fill_state;         /* npyload_fill_state */
    int32_t fill_error;         /* the fill's failure (a negative code; 0
                                   none): the epoch is not failed by it,
                                   reads fetch on demand; the message:
                                   npyload_loader_fill_error() */
    uint64_t fill_wanted_bytes; /* what the fill would bring: the cache
                                   blocks of the rank's epoch from the
                                   position at start, then (shuffling) of
                                   every remote file */
    uint64_t fill_planned_bytes; /* the part it fills: the first of those
                                    blocks that the cache keeps (90 % of
                                    cache_bytes) */
    uint64_t fill_planned_blocks;
    uint64_t fill_done_bytes;   /* of the part, in the cache: found, fetched
                                   or fetched meanwhile by a reader */
    uint64_t fill_found_blocks; /* already in the cache when their turn came */
    uint64_t fill_fetched_blocks; /* fetched by the fill's GETs */
    uint64_t fill_fetched_bytes;
    uint64_t fill_waited_blocks; /* fetched by another thread (a worker) or
                                    process (a rank sharing cache_dir) while
                                    the fill waited for them */
    uint64_t fill_ns;           /* the fill's wall time (so far, while it
                                   runs): with fill_state DONE, the time to
                                   a warm cache */
    /* Self-tuning (appended after the fill; num_workers and num_slots
     * above are the current counts, which the controller changes): */
    uint64_t auto_mode;         /* 0 fixed; bit 1: the controller changes
                                   the workers, bit 2: the slots (never
                                   in device mode: the device slots stay
                                   at their first count) */
    uint64_t memory_budget;     /* MEMORY_BUDGET resolved (0: fixed) */
    uint64_t memory_bytes;      /* slots plus workers' read buffers now,
                                   parked slots included */
    uint64_t auto_decisions;    /* changes the controller made */
    uint64_t parked_slots;      /* slots a removal being judged took out
                                   of the ring: their memory is kept (and
                                   counted in memory_bytes) until the
                                   removal is kept or taken back */
    uint64_t slot_wait_ns;      /* workers' time waiting for a free staging
                                   slot (all the slots filled or held: the
                                   loop has not taken the batches before),
                                   summed; not a parked worker's wait nor
                                   one for the next pass. A share of
                                   num_workers x elapsed_ns well above 0:
                                   a slot more would be used */
    uint64_t read_ahead_on;     /* 1: the workers read ahead now (READ_AHEAD
                                   1, or the default where a batch has work
                                   after its reads, unless NPYLOAD_AUTO's
                                   controller switched it off: the reads
                                   served from the page cache); 0 */
} npyload_stats;

/*! npyload_fill_state: npyload_stats.fill_state. */
typedef enum npyload_fill_state {
    NPYLOAD_FILL_OFF = 0,       /* no fill: CACHE_FILL -1, no remote field
                                   with a cache_dir, or (CACHE_FILL 0) the
                                   cache keeps less than it would fill */
    NPYLOAD_FILL_RUNNING = 1,
    NPYLOAD_FILL_DONE = 2,      /* the part is in the cache */
    NPYLOAD_FILL_FAILED = 3,    /* a GET failed for good (fill_error) */
    NPYLOAD_FILL_STOPPED = 4    /* stop() or destroy() came first */
} npyload_fill_state;

/*! Why the controller changed the counts (npyload_auto_event.reason). */
typedef enum npyload_auto_reason {
    NPYLOAD_AUTO_START = 0,  /* the first counts, at start */
    NPYLOAD_AUTO_WAIT = 1,   /* the consumer waited above target: one more */
    NPYLOAD_AUTO_NO_GAIN = 2, /* the worker or slot added did not raise throughput:
                                 taken back, worker growth backs off */
    NPYLOAD_AUTO_SPARE = 3,  /* the consumer is fed with room to spare: one
                                 fewer */
    NPYLOAD_AUTO_WORSE = 4,  /* the last removal made the wait exceed the
                                target (an UNUSED one: the throughput
                                fall): taken back, that removal backs off */
    NPYLOAD_AUTO_HELD = 5,   /* the caller holds nearly every slot: one more */
    NPYLOAD_AUTO_REGIME = 6, /* the step or the throughput moved: back-offs
                                forgotten (no count changes) */
    NPYLOAD_AUTO_FORCED = 7, /* AUTO_FORCE (testing) */
    NPYLOAD_AUTO_UNUSED = 8, /* the loader is the limit (the consumer waits,
                                no worker or slot more is tried) and holds
                                slots beyond those its workers fill, those
                                the loop holds and one ready: one fewer,
                                taken back (WORSE) when the throughput
                                falls */
    NPYLOAD_AUTO_AHEAD_OFF = 9, /* read-ahead switched off (READ_AHEAD 0):
                                   the reads never blocked (the page
                                   cache) for windows in a row; taken back
                                   (WORSE, read-ahead on) when the
                                   throughput falls */
    NPYLOAD_AUTO_AHEAD_ON = 10 /* read-ahead switched back on: the workers,
                                  reading each batch themselves, blocked
                                  in the reads (a cold disk) */
} npyload_auto_reason;

/*! One decision of the controller (npyload_loader_auto_history), with the
 * measurements of the window behind it. Crosses the API with the caller's
 * sizeof (a public struct that grows). */
typedef struct npyload_auto_event {
    uint64_t t_ns;              /* since start() */
    uint64_t batch;             /* batches delivered when it was made */
    uint32_t workers, slots;    /* the counts after it */
    uint32_t prev_workers, prev_slots; /* and before */
    int32_t reason;             /* npyload_auto_reason */
    int32_t pad_;
    double wait_share;          /* consumer wait / (wait + step) */
    double samples_per_s;       /* delivered */
    double worker_busy;         /* workers' read + decode + transform time
                                   over workers x wall */
    double read_blocked;        /* workers' off-CPU read time over the same
                                   (with read-ahead, also their wait for
                                   their read-ahead threads as far as those
                                   were off the CPU in the reads) */
    /* Appended (the sized-struct rule): */
    double slot_wait;           /* workers' wait for a free slot over the
                                   same (npyload_stats.slot_wait_ns) */
    int32_t read_ahead, prev_read_ahead; /* the workers' read-ahead after it
                                            and before (1 on, 0 off;
                                            npyload_stats.read_ahead_on) */
} npyload_auto_event;

/*! npyload_loader_auto_history() : the controller's last decisions
 * (at most 32 are kept), oldest first.
 * @ev    : room for `n` events of `size` bytes each (sizeof(npyload_auto_event));
 *          may be NULL when n is 0.
 * @total : if not NULL, receives the number of decisions made since start
 *          (a caller polling it learns of new ones cheaply).
 * @return : the number of events written, or NPYLOAD_EINVAL (size below the
 *           first layout), NPYLOAD_EFORKED.
 * Thread-safety: a query (may overlap next() and control calls). */
NPYLOAD_API int npyload_loader_auto_history(const npyload_loader *L, npyload_auto_event *ev,
                                            size_t n, size_t size, uint64_t *total);

/*! npyload_auto_reason_name() : "start", "wait", "no-gain", "spare", "worse",
 * "held", "regime", "forced", "unused", "read-ahead-off", "read-ahead-on",
 * or "?" for an unknown value. */
NPYLOAD_API const char *npyload_auto_reason_name(int reason);

/*! npyload_stats_verdict() : one line naming where the time of `s` went
 * (the bottleneck) and what to do about it, for logs and bug reports.
 * `hook_ns` is the time a per-batch hook ran on a thread of its own between
 * the loader and the loop (0 without one; then wait_ns and step_ns are the
 * loop's own). The rules, first match wins:
 *  - fewer than NPYLOAD_VERDICT_MIN_BATCHES (10) batches delivered, or
 *    fewer than num_slots + 2: start-up (workers starting, slots filling),
 *    nothing to judge;
 *  - the consumer: the loop waited at most NPYLOAD_VERDICT_IDLE (5 %) of
 *    wait_ns + step_ns: the loader keeps up, the step is the limit;
 *  - the hook: it ran at least NPYLOAD_VERDICT_HOOK (50 %) of elapsed_ns;
 *  - else the largest share above NPYLOAD_VERDICT_SHARE (40 %) among
 *    the disk (the workers' time waiting for reads, read_wait_ns with
 *    read-ahead, else io_ns, over elapsed_ns x workers, but at most the
 *    share of read_blocked_ns: a read from the page cache is a copy that
 *    keeps its thread on the CPU, not a wait for the disk; named "the
 *    object store" when remote requests were made and remote_wait_ns is
 *    at least half of those read waits; a cache_dir is advised only when
 *    cache_hits + cache_misses is 0, no cache), zstd decode
 *    (decode_ns), host
 *    transforms (transform_ns; the advice names the GPU only when device
 *    >= 0 or npyload_cuda_available(0) says one exists), each over
 *    elapsed_ns x workers, and the H2D
 *    copy (h2d_ns over elapsed_ns);
 *  - else copies on the CPU (reads into the slots).
 * The line starts with "bottleneck: " and one of "none", "the consumer",
 * "the hook", "the disk", "the object store", "decode", "host transforms",
 * "the H2D copy",
 * "CPU copies". @return : 0 or NPYLOAD_EINVAL. */
#define NPYLOAD_VERDICT_MIN_BATCHES 10
#define NPYLOAD_VERDICT_IDLE 0.05
#define NPYLOAD_VERDICT_HOOK 0.50
#define NPYLOAD_VERDICT_SHARE 0.40
NPYLOAD_API int npyload_stats_verdict(const npyload_stats *s, uint64_t hook_ns, char *buf,
                                      size_t len);

/*! npyload_loader_last_skip_error() : with ON_ERROR skip, copies the message
 * of the last failure that made a sample be skipped (or a retry happen) to
 * buf (always NUL-terminated; "" when none). Thread-safe.
 * @return : 0 or NPYLOAD_EINVAL. */
NPYLOAD_API int npyload_loader_last_skip_error(const npyload_loader *L, char *buf,
                                               size_t len);

/*! npyload_loader_fill_error() : copies the message of the background
 * cache fill's failure (stats.fill_state NPYLOAD_FILL_FAILED: the URL and
 * what happened) to buf (always NUL-terminated; "" when none).
 * Thread-safe.
 * @return : 0 or NPYLOAD_EINVAL. */
NPYLOAD_API int npyload_loader_fill_error(const npyload_loader *L, char *buf, size_t len);

/*! npyload_loader_get_stats() : counters since start (reading them is
 * cheap and thread-safe). `size` is sizeof(npyload_stats) as the caller
 * was compiled (see Conventions): only that many bytes of `out` are
 * written, so a program built against an older, shorter npyload_stats gets
 * the members it knows.
 * @return : 0, or NPYLOAD_EINVAL (NULL, or a size below the first layout:
 *           bytes_read .. transform_ns). */
NPYLOAD_API int npyload_loader_get_stats(const npyload_loader *L,
                                         npyload_stats *out, size_t size);

/* ---- Order, without a loader ---- */

/*! npyload_order_indices() :
 * Writes the sample indices that `rank` of `world_size` gets in `epoch` for
 * N samples (the exact sequence a loader with these options yields, batches
 * concatenated) into `out`, which holds `cap` entries. `file_sizes` (the
 * sample counts of the first field's files, `nfiles` of them) is needed for
 * NPYLOAD_SHUFFLE_LOCAL only; pass NULL otherwise.
 * @return : the number of indices (may exceed cap: then only cap written),
 *           or a negative error. */
NPYLOAD_API int64_t npyload_order_indices(int64_t n, int shuffle, int64_t seed,
                                          uint64_t epoch, int64_t rank,
                                          int64_t world_size, int drop_last,
                                          int64_t batch_size,
                                          const int64_t *file_sizes,
                                          size_t nfiles, int64_t window,
                                          int64_t *out, size_t cap);

/* ---- CUDA helpers (no CUDA types) ---- */

/*! npyload_cuda_available() : 1 if the CUDA runtime loads and at least
 * `device`+1 devices exist, else 0; when 0 and `why` is not NULL, a reason
 * is written to it. The runtime is loaded at run time (dlopen), so host-only
 * programs never need CUDA libraries. */
NPYLOAD_API int npyload_cuda_available(int device, char *why, size_t whylen);

/*! npyload_cuda_h2d_bandwidth() : the H2D ceiling: pinned host-to-device
 * cudaMemcpyAsync bandwidth on `device` with `bytes` per copy, `iters`
 * copies, on a non-blocking stream of a thread of its own (the caller's
 * current device is untouched); GB/s (1e9 bytes/s) into *gbps. What the
 * loader's device copies compare with (npyload-bench's h2d_pinned).
 * Any thread. @return : 0, NPYLOAD_EINVAL, NPYLOAD_ENOCUDA or
 * NPYLOAD_ECUDA. */
NPYLOAD_API int npyload_cuda_h2d_bandwidth(int device, size_t bytes, int iters, double *gbps);

/* ---- Ceilings: what this machine gives on a loader's own bytes ---- */

/*! npyload_ceiling_kind : how npyload_loader_ceiling reads.
 * PREAD: threads pread the samples of the loader's current order, batch by
 * batch, one request per sample and field, into a batch buffer each (the
 * copy ceiling of the page cache); GATHER: the same as memcpy from the
 * files mapped once (small rows: no system call per row); DIRECT: one
 * thread reads every file's data with O_DIRECT through io_uring, 1 MiB
 * blocks, 32 in flight (the disk's ceiling; evict the page cache first for
 * a cold one). */
typedef enum npyload_ceiling_kind {
    NPYLOAD_CEILING_PREAD = 1,
    NPYLOAD_CEILING_GATHER = 2,
    NPYLOAD_CEILING_DIRECT = 3
} npyload_ceiling_kind;

/*! npyload_ceiling: a ceiling measured. Grows at its end (see Conventions):
 * pass `sizeof` it. */
typedef struct npyload_ceiling {
    double gbps;          /* 1e9 bytes/s: the best pass (PREAD, GATHER) */
    double seconds;       /* that pass's time */
    uint64_t bytes;       /* and its bytes */
    int threads;
} npyload_ceiling;

/*! npyload_loader_ceiling() :
 * Measures what the machine gives on the loader's bytes, through the
 * loader's own readers (lib/io), so that the loader's samples/s can be
 * compared with it in the same run (npyload-bench's "ratio to the pread
 * ceiling"). PREAD and GATHER run `threads` threads for `seconds` (a
 * 0.2 s warm-up, then three passes of seconds/3, the best one kept);
 * DIRECT reads until all is read or `seconds` pass (a packed or narrowed
 * file whole). The fields' files must be local (plain .npy for PREAD and
 * GATHER), read already (after start, or start and stop).
 * A control call: set_epoch and the like wait for it (see "Threads").
 * @return : 0, NPYLOAD_EINVAL (an argument, named), NPYLOAD_ESTATE (the
 *           fields not read), NPYLOAD_EUNSUPPORTED (a remote file, or a
 *           .npy.zst or narrowed one for PREAD/GATHER, named),
 *           NPYLOAD_ENOURING (DIRECT without
 *           io_uring), or a read's error; npyload_loader_errmsg says which. */
NPYLOAD_API int npyload_loader_ceiling(npyload_loader *L, npyload_ceiling_kind kind,
                                       int threads, double seconds, npyload_ceiling *out,
                                       size_t size);

/* ---- Build and machine facts, for bug reports ---- */

/*! npyload_build_info: what this library was built with and what it finds
 * on this machine now: the facts a bug report needs (`python -m npyload
 * info` and npyload-bench print them). Strings are NUL-terminated, "" when
 * they do not apply. It grows at its end (see Conventions): read it with
 * npyload_get_build_info(&bi, sizeof bi). */
typedef struct npyload_build_info {
    char version[16];             /* npyload_version_string() */
    /* io_uring */
    int uring_compiled;           /* 1: built with liburing */
    int uring_usable;             /* 1: a ring and a no-op submission work
                                     here, now, in this process */
    char liburing_version[16];    /* liburing built against ("2.3") */
    char uring_why[256];          /* not usable: the call that failed and
                                     the kernel's answer ("io_uring_setup
                                     failed: Operation not permitted (...)"),
                                     or "built without liburing" */
    /* zstd */
    char zstd_compiled[16];       /* ZSTD_VERSION_STRING built against */
    char zstd_loaded[16];         /* ZSTD_versionString() of the libzstd
                                     this process runs */
    /* CUDA, loaded at run time (see npyload_cuda_available) */
    int cuda_runtime_found;       /* 1: a libcudart loaded */
    int cuda_devices;             /* devices it counts; 0 when unusable */
    int cuda_runtime_version;     /* 12040 for 12.4; 0 when not found */
    int cuda_driver_version;      /* 0 when no driver answers */
    char cuda_runtime_soname[32]; /* "libcudart.so.12" */
    char cuda_runtime_path[256];  /* the file the dynamic loader mapped */
    char cuda_why[512];           /* why CUDA is not usable ("no CUDA
                                     runtime library (libcudart) found:
                                     tried ..."); "" with a device */
    /* device transforms (npyload_loader_set_transform with a device) */
    int transform_kernels;        /* 1: kernels compiled ahead of time and
                                     embedded (a fatbin) */
    char transform_kernel_archs[64]; /* "sm_80 sm_90 compute_75": SASS for
                                     each sm_, PTX (compiled by the driver
                                     for other GPUs) for each compute_ */
    char transform_kernels_why[192]; /* without them: why ("... nvcc was not
                                        found when libnpyload was built ...") */
    /* CPU features */
    int f16c_compiled;            /* 1: the x86 F16C float16 path is built in */
    int f16c_used;                /* 1: and this CPU and OS have F16C and
                                     AVX: float16 transforms use it */
    /* What 0 (the default) means for the options, here */
    int64_t default_num_workers;  /* NUM_WORKERS */
    int64_t default_prefetch;     /* PREFETCH slots with the default
                                     workers: npyload_default_prefetch(0) */
    int64_t default_queue_depth;  /* QUEUE_DEPTH, reads in flight per worker */
    int64_t default_shuffle_window; /* SHUFFLE_WINDOW, files */
    int default_io_backend;       /* what IO_BACKEND AUTO resolves to on this
                                     machine now (URING or PREAD) */
    int default_read_ahead;       /* 1: READ_AHEAD is on by default (where
                                     a batch has work after its reads) */
    /* device transforms compiled at run time (NVRTC) */
    int transform_nvrtc;          /* 1: the kernels' source is embedded:
                                     NVRTC compiles it for a GPU that no
                                     ahead-of-time image covers (or for
                                     every GPU without a fatbin) */
    int nvrtc_found;              /* 1: the default search (no
                                     NPYLOAD_PATH_NVRTC) loads libnvrtc */
    int nvrtc_version;            /* 13000 for 13.0; 0 when not found */
    char nvrtc_path[256];         /* the libnvrtc file it found */
    char nvrtc_why[512];          /* not found: what was tried and what to
                                     install; "" when found */
    /* remote shards (s3://, https://) */
    int remote_compiled;          /* 1: built with libcurl and expat */
    char remote_version[160];     /* "libcurl 7.88.1 (OpenSSL/3.0.19), expat",
                                     or without: what to install */
} npyload_build_info;

/*! npyload_get_build_info() : fills `out` with the facts above. `size` is
 * sizeof(npyload_build_info) as the caller was compiled (see Conventions):
 * only that many bytes of `out` are written.
 * Cost: it probes io_uring (a two-entry ring, torn down) and looks for the
 * CUDA runtime as npyload_cuda_available() does (dlopen of libcudart, which
 * stays mapped, and a device count, which initialises the CUDA driver in
 * this process: call it before fork() only where a CUDA program could),
 * and for NVRTC as device transforms would without NPYLOAD_PATH_NVRTC
 * (dlopen of libnvrtc, closed again).
 * No current device is set and no context is created.
 * @return : 0, or NPYLOAD_EINVAL (NULL, or a size below the first layout:
 *           version .. nvrtc_why). Thread-safe; no global state. */
NPYLOAD_API int npyload_get_build_info(npyload_build_info *out, size_t size);

/*! npyload_build_info_text() : `bi` as the lines a person reads ("npyload
 * 0.3.0", "io_uring: ...", ... "defaults: ..."), each ending in '\n': the
 * block npyload-bench starts with and `python -m npyload info` prints
 * before its Python lines. Writes at most len bytes, NUL-terminated.
 * @return : the length of the whole text (as snprintf: compare with len). */
NPYLOAD_API size_t npyload_build_info_text(const npyload_build_info *bi, char *buf,
                                           size_t len);

/* ------------------------------------------------------------------------ */
/* Compressed shards: FILE.npy.zst                                            */
/* ------------------------------------------------------------------------ */

/*! FILE.npy.zst is zstd's seekable format (facebook/zstd,
 * contrib/seekable_format): frame 0 holds exactly the NPY header (magic
 * through padding), every later frame a whole number of consecutive
 * samples, and a skippable frame at the end holds the seek table (per frame
 * compressed size, decompressed size and, by default, the low 32 bits of
 * the XXH64 of its content, which is also the frame's own zstd checksum).
 * The stock `zstd -d FILE.npy.zst` gives back FILE.npy byte for byte.
 * Loaders read FILE.npy.zst wherever they read FILE.npy; a field holding
 * both FILE and FILE.zst (a glob over a directory packed without --rm) is
 * refused by npyload_loader_start (NPYLOAD_EINVAL naming both files). */

#define NPYLOAD_PACK_DEFAULT_LEVEL 3
/* Default target decompressed bytes per frame (see npyload_pack_options). */
#define NPYLOAD_PACK_DEFAULT_FRAME_SIZE (128u << 10)

/*! npyload_pack_options: a zeroed struct (or NULL) gives every default.
 * It grows at its end (see Conventions): pass sizeof with it. */
typedef struct npyload_pack_options {
    int level;           /* zstd level (negative: fast levels);
                            0 = NPYLOAD_PACK_DEFAULT_LEVEL */
    uint64_t frame_size; /* target decompressed bytes per frame: a frame
                            holds the fewest whole samples whose bytes reach
                            it (at least one; at most 1 GiB per frame).
                            0 = NPYLOAD_PACK_DEFAULT_FRAME_SIZE */
    int threads;         /* compression threads (frames are independent);
                            0 = all online cores */
    int no_checksum;     /* 1: frames without content checksums and a seek
                            table without them. Default 0: checksummed. */
    int force;           /* 1: replace an existing output file */
    /* Called on the calling thread before the first frame and after every
     * chunk of frames with the input bytes done and the total. A nonzero
     * return cancels the pack: the temporary file is removed and
     * npyload_pack_file returns -ECANCELED. A tool's SIGINT handler sets a
     * flag that this callback returns. May be NULL. */
    int (*progress)(void *arg, uint64_t done, uint64_t total);
    void *progress_arg;
    /* Appended after 0.3.0 (the sized-struct rule, Conventions): */
    int narrow;          /* 1: lossless narrowing. A file whose values (2, 4
                            or 8 bytes each) are at most 256 distinct bit
                            patterns is stored as one-byte codes plus the
                            table of values (NaN payloads, -0.0 and
                            denormals kept bit for bit); npyload delivers
                            the original values (device mode: the codes
                            cross PCIe, a kernel expands them, fused with
                            the field's transform). More distinct values, or
                            another dtype: refused, NPYLOAD_EUNSUPPORTED
                            naming the file. `zstd -d` of such a file gives
                            a valid .npy of the uint8 codes ('|u1', the same
                            shape): the table sits in a skippable frame
                            after the header's frame (README, "Narrowing"). */
    int store;           /* with narrow: the codes stored without
                            compression, as a plain .npy of the codes ('|u1',
                            the same shape; numpy reads it as the codes)
                            followed by a trailer holding the value table;
                            npyload delivers the values, and a read costs no
                            decode. The default output name is the input's
                            with ".npy" replaced by ".narrow.npy". Without
                            narrow: NPYLOAD_EINVAL. */
} npyload_pack_options;

/*! npyload_pack_result: what one npyload_pack_file did. */
typedef struct npyload_pack_result {
    uint64_t in_bytes;          /* size of the .npy */
    uint64_t out_bytes;         /* size of the .npy.zst, seek table in */
    uint64_t frames;            /* zstd frames, frame 0 (the header) in */
    uint64_t samples_per_frame; /* samples in each data frame but the last */
    double seconds;             /* wall time */
    /* Appended after 0.3.0: */
    uint64_t narrow_values;     /* narrowed: the distinct values (codes); 0
                                   when stored as is */
} npyload_pack_result;

/*! npyload_pack_file() :
 * Compresses the NPY file `in` into `out` (NULL: `in` + ".zst") in the
 * format above. The input is validated with the NPY parser first: a
 * malformed file, a Fortran-ordered array of more than one dimension, or
 * bytes after the array data are refused (the message names the file).
 * The input is streamed in chunks of frames (memory: 4 x threads frames
 * in and as many compressed out, a chunk capped at 64 MiB or one frame,
 * whichever is larger; never the whole file), compressed by `threads`
 * threads and written to a temporary file in the output's directory:
 * nameless (O_TMPFILE) where the filesystem allows it, else a short name
 * ".npyl-XXXXXX", so any legal `out` (a last component of up to NAME_MAX
 * bytes) works. When complete it is fsynced, then linked (or renamed) to
 * `out`, then the directory is fsynced: a pack that is interrupted
 * (cancelled, failed, killed, or a power loss after the call returned 0)
 * never leaves a partial file under the final name. Without `force` an
 * existing `out` is never replaced (checked again, atomically, at the
 * link/rename). `force` replaces regular files only: a directory, FIFO,
 * socket, device or symbolic link at `out` is refused by name (checked up
 * front and again, with lstat, right before the rename; a link is neither
 * followed nor replaced). The output gets the input's permission bits.
 * The input's identity (size, mtime in ns, device, inode) is taken before
 * its header is read and compared after every chunk and before the output
 * is published: a file rewritten in place or replaced during the pack is
 * refused with NPYLOAD_ECHANGED naming it, and nothing is written (a
 * rewrite within one tick of the filesystem's clock keeps the mtime and
 * cannot be seen).
 * Options' ranges (anything else is NPYLOAD_EINVAL naming the option, the
 * value and the range): level -131072 .. 22 (zstd's; 0 = the default),
 * frame_size 1 .. 1 GiB (0 = the default), threads 0 .. 1024 (0 = all
 * online cores; at most 256 are started).
 * `o_size` and `r_size` are sizeof(npyload_pack_options) and
 * sizeof(npyload_pack_result) as the caller was compiled (see Conventions;
 * ignored for a NULL pointer).
 * @return : 0 and `r` filled (r may be NULL); -EEXIST when `out` exists and
 *           force is 0; -ECANCELED when the progress callback cancelled;
 *           NPYLOAD_ECHANGED when the input changed during the pack;
 *           NPYLOAD_EFORMAT / EUNSUPPORTED / ETRUNCATED / ETOOBIG for the
 *           input; NPYLOAD_EINVAL for bad options (a number out of range,
 *           `out` naming the input or something other than a regular
 *           file); another -errno for I/O (an fsync error included: after
 *           the directory's fsync fails the output is complete under its
 *           name but may not survive a power loss). `err` gets
 *           "PATH: problem" (may be NULL).
 * Thread-safe; no global state (threads are created and joined inside). */
NPYLOAD_API int npyload_pack_file(const char *in, const char *out,
                                  const npyload_pack_options *o, size_t o_size,
                                  npyload_pack_result *r, size_t r_size,
                                  char *err, size_t errlen);

/*! npyload_pack_default_out() : the output name npyload_pack_file uses when
 * `out` is NULL: `in` + ".zst", or with store `in` with a final ".npy"
 * replaced by ".narrow.npy" (".narrow.npy" appended when it has none).
 * @return : the length of the name (written when it fits in len bytes,
 *           NUL included; compare with len as with snprintf). */
NPYLOAD_API size_t npyload_pack_default_out(const char *in, int store, char *buf,
                                            size_t len);

/*! NPYLOAD_ZST_MAX_WINDOW_LOG: the largest zstd window (2^23 = 8 MiB) a
 * frame of several samples may ask for. Readers decode such frames through
 * a bounded buffer while zstd keeps the frame's window, so a worker's
 * decoding memory is a constant (about 1 MiB + 2^23 + 384 KiB) whatever the
 * frame's size. zstd levels 1 to 19 never ask for more; levels 20-22 would
 * for frames of several samples larger than 8 MiB, so npyload_pack_file
 * caps their window at this value. Such a frame written by another tool is
 * refused when the file is opened (NPYLOAD_ETOOBIG naming the file, the
 * frame and the window). Frames of one sample decode straight into the
 * batch and may use any window. */
#define NPYLOAD_ZST_MAX_WINDOW_LOG 23

/*! npyload_zst_probe() : 1 if `path` starts with a zstd frame (a .npy.zst,
 * whatever its name), 0 if not (a .npy, or shorter than 4 bytes), -errno
 * when it cannot be opened or read, NPYLOAD_EINVAL for a NULL path. Reads
 * 4 bytes. Thread-safe. */
NPYLOAD_API int npyload_zst_probe(const char *path);

/*! npyload_zst_facts: what a validated .npy.zst holds. Owned by its
 * npyload_zst_file (npyload_zst_file_facts); later versions only append
 * members, so a pointer from an older build stays valid. */
typedef struct npyload_zst_facts {
    npyload_header hdr;            /* the NPY facts, exactly as
                                      npyload_read_header gives them for the
                                      .npy (file_bytes: the .npy's size) */
    uint64_t compressed_bytes;     /* the .npy.zst's size, seek table in */
    uint64_t table_bytes;          /* the seek table's skippable frame */
    uint32_t frames;               /* zstd frames, frame 0 (the header) in */
    int checksums;                 /* the seek table carries checksums */
    uint64_t samples_per_frame;    /* samples in data frame 1 (every data
                                      frame but the last holds as many when
                                      npyload-pack wrote it); 0: no data */
    uint64_t max_frame_bytes;      /* largest data frame, decompressed */
    uint64_t max_frame_compressed; /* largest data frame, compressed */
    /* Appended after 0.3.0: a narrowed file (npyload_pack_options.narrow)
     * has hdr of its one-byte codes ('|u1', what zstd -d gives); the loader
     * delivers values of value_descr (value_itemsize bytes each). */
    uint32_t narrow_values;        /* codes in its value table; 0: not narrowed */
    uint32_t value_itemsize;       /* narrowed: bytes per delivered value */
    char value_descr[NPYLOAD_DESCR_LEN]; /* narrowed: the delivered dtype */
} npyload_zst_facts;

/*! npyload_narrow_stored() :
 * Whether the .npy `path`, whose header `h` npyload_read_header gave, is
 * the stored narrowed form (npyload-pack --narrow --store: one-byte codes,
 * h->descr '|u1', followed by a trailer holding their value table), read
 * and checked as the loader's start does (one read of the trailer; the
 * table's checksum). The loader delivers value_descr for it, as it does
 * for a narrowed .npy.zst (npyload_zst_facts).
 * @return : 1 with *values (codes in the table), *value_itemsize (bytes per
 *           delivered value) and value_descr (NPYLOAD_DESCR_LEN bytes: the
 *           delivered dtype); each output may be NULL. 0 for any other
 *           .npy (outputs untouched). NPYLOAD_EFORMAT / ETRUNCATED / -errno
 *           with "PATH: problem" in `err` for a damaged or cut trailer
 *           (the loader refuses the file the same way). Thread-safe. */
NPYLOAD_API int npyload_narrow_stored(const char *path, const npyload_header *h,
                                      uint32_t *values, uint32_t *value_itemsize,
                                      char *value_descr, char *err, size_t errlen);

/*! npyload_zst_file: a .npy.zst whose seek table and header were read and
 * validated as the loader does at start (the file is closed again; later
 * calls that read frames open it by name). Opaque. */
typedef struct npyload_zst_file npyload_zst_file;

/*! npyload_zst_file_open() :
 * Validates the seek table at the end of `path` (sizes add up to the file,
 * frames hold whole samples, no size or zstd window over the documented
 * limits, all before anything is sized from it) and parses the NPY header
 * in frame 0. Reads the footer, the table, frame 0 and the headers of
 * frames larger than 2^NPYLOAD_ZST_MAX_WINDOW_LOG; never the data.
 * @return : 0 and *out (npyload_zst_file_close it), or NPYLOAD_EFORMAT /
 *           EUNSUPPORTED / ETRUNCATED / ETOOBIG / -errno with "PATH:
 *           problem" in `err` (may be NULL). A zstd file without a seek
 *           table says to repack it with npyload-pack. Thread-safe. */
NPYLOAD_API int npyload_zst_file_open(const char *path, npyload_zst_file **out,
                                      char *err, size_t errlen);

/*! npyload_zst_file_close() : frees the file's index. NULL-safe. */
NPYLOAD_API void npyload_zst_file_close(npyload_zst_file *z);

/*! npyload_zst_file_facts() : the facts of an open file (valid until it is
 * closed). */
NPYLOAD_API const npyload_zst_facts *npyload_zst_file_facts(const npyload_zst_file *z);

/*! npyload_zst_file_frame() : frame `f`'s compressed bytes are
 * [*offset, *offset + *csize) of the file; it decompresses to *dsize bytes.
 * @return : 0, or NPYLOAD_EINVAL for f >= frames (outputs untouched). */
NPYLOAD_API int npyload_zst_file_frame(const npyload_zst_file *z, uint32_t f,
                                       uint64_t *offset, uint64_t *csize,
                                       uint64_t *dsize);

/*! npyload_zst_file_decode() :
 * Decodes frame `f` from its compressed bytes `src` (read by the caller,
 * npyload_zst_file_frame says where) into `dst` (`cap` >= its dsize), with
 * the loader's checks: one whole frame of the table's sizes, the frame's
 * content checksum, and the table's checksum against the frame's.
 * `dctx` is a ZSTD_DCtx * the caller made with libzstd's ZSTD_createDCtx()
 * (this header carries no zstd types), reused across calls and used by one
 * thread at a time; NULL makes one for the call. Allocates nothing else.
 * @return : 0, or NPYLOAD_EFORMAT / EINVAL (-ENOMEM without a dctx) with
 *           "PATH: frame F at byte B: problem" in `err`. */
NPYLOAD_API int npyload_zst_file_decode(const npyload_zst_file *z, uint32_t f,
                                        void *dctx, const void *src, void *dst,
                                        size_t cap, char *err, size_t errlen);

/*! npyload_zst_file_verify() :
 * Reads and decodes every frame of the file, frame 0 included, in order,
 * with every check the loader makes when it reads them: sizes against the
 * seek table, each frame's content checksum (frames carry them unless
 * packed with no_checksum; then sizes and structure only), the table's
 * checksum against the frame's, the zstd window limit. Stops at the first
 * bad frame. What `zstd -t` tests, and more: it also checks the seek
 * table, which zstd skips. Memory: the largest compressed frame plus about
 * 1 MiB and a zstd context (its window: 2^NPYLOAD_ZST_MAX_WINDOW_LOG for
 * frames of several samples); time: one decode of the whole file.
 * `bad_frame` (may be NULL) receives the index of the first bad frame, or
 * UINT32_MAX when every frame is good or the failure is not one frame's
 * (the file changed since npyload_zst_file_open, out of memory);
 * npyload_zst_file_frame gives its byte offset.
 * @return : 0, or NPYLOAD_EFORMAT / ETOOBIG / ECHANGED / -errno with
 *           "PATH: frame F at byte B: what is wrong" in `err`. Thread-safe
 *           (several threads may verify one file). */
NPYLOAD_API int npyload_zst_file_verify(const npyload_zst_file *z, uint32_t *bad_frame,
                                        char *err, size_t errlen);

/*! Remote objects outside a loader (0.3): what npyload-inspect,
 * npyload-bench and npyload.inspect() read of s3:// and http(s):// paths.
 * A client holds one configuration (the same npyload_remote, the same
 * rules as npyload_loader_set_remote). The library still reads no environment variable: the
 * tools build the configuration from the AWS environment themselves.
 * A client may be used by one thread at a time. */
typedef struct npyload_remote_client npyload_remote_client;

/*! npyload_remote_client_create() : a client for `cfg` (`size` is
 * sizeof(npyload_remote) as the caller was compiled; cfg NULL: every
 * default, unsigned requests, enough for http(s):// URLs).
 * @return : 0 and *out; NPYLOAD_EINVAL naming a bad member;
 *           NPYLOAD_EUNSUPPORTED in a build without libcurl; -ENOMEM.
 *           `err` (may be NULL) never holds a secret. */
NPYLOAD_API int npyload_remote_client_create(npyload_remote_client **out,
                                             const npyload_remote *cfg, size_t size,
                                             char *err, size_t errlen);

/*! npyload_remote_client_destroy() : frees it (the secret wiped). NULL-safe. */
NPYLOAD_API void npyload_remote_client_destroy(npyload_remote_client *c);

/*! npyload_is_remote() : 1 for an s3://, http:// or https:// path (any
 * case of the scheme), else 0. */
NPYLOAD_API int npyload_is_remote(const char *path);

/*! npyload_remote_glob() : expands an s3:// pattern as add_field does
 * (ListObjectsV2, every page; `*` does not cross '/'; sorted by strcmp)
 * into *paths (*n of them; npyload_paths_free them). A path without a
 * wildcard is returned as is, unlisted; an http(s):// URL too (HTTP has no
 * listing). @return : 0, NPYLOAD_ENOFILES when nothing matches, or an
 * error naming the pattern (credentials, bucket, server). */
NPYLOAD_API int npyload_remote_glob(npyload_remote_client *c, const char *pattern,
                                    char ***paths, size_t *n, char *err, size_t errlen);

/*! npyload_paths_free() : frees what npyload_remote_glob returned. */
NPYLOAD_API void npyload_paths_free(char **paths, size_t n);

/*! npyload_remote_inspect() : the facts of one remote object, read with
 * ranged GETs as the loader's start reads them: the first 4 KiB (size,
 * ETag, the NPY header; more when the header is longer) and, for a
 * .npy.zst (told by its first bytes), the last 16 KiB (the seek table;
 * more when it is longer) and frame 0. A .npy gives *hdr (file_bytes: the
 * object's size) and *zst = NULL; a .npy.zst gives *zst (facts as
 * npyload_zst_file_open gives them for the local file;
 * npyload_zst_file_verify on it reads every frame with ranged GETs, each
 * checked against the ETag seen here; close it before the client is
 * destroyed) and *hdr = its facts' hdr.
 * @return : 0; the parse errors of npyload_read_header /
 *           npyload_zst_file_open; -ENOENT (404), -EACCES (403),
 *           -ECONNREFUSED, NPYLOAD_EREMOTE (a timeout too)... with "URL: what
 *           happened" in `err`. */
NPYLOAD_API int npyload_remote_inspect(npyload_remote_client *c, const char *url,
                                       npyload_header *hdr, npyload_zst_file **zst,
                                       char *err, size_t errlen);

/*! npyload_remote_narrow_stored() : npyload_narrow_stored for a remote
 * .npy whose header `h` npyload_remote_inspect gave (one ranged GET of its
 * trailer, checked against the size and ETag seen now). The same returns,
 * with "URL: problem" in `err`; the network failures of
 * npyload_remote_inspect. */
NPYLOAD_API int npyload_remote_narrow_stored(npyload_remote_client *c, const char *url,
                                             const npyload_header *h, uint32_t *values,
                                             uint32_t *value_itemsize, char *value_descr,
                                             char *err, size_t errlen);

/*! Filling a node's cache before a job (0.4): npyload_prefetch copies the
 * remote objects of a dataset into a cache_dir, so that every epoch (and
 * every rank of the node sharing that directory) reads them at local speed.
 * What a job scheduler's prologue runs (`npyload-prefetch`, and
 * npyload.prefetch() in Python, are this API).
 *
 * How: the objects are listed (s3:// globs) and probed (one 4 KiB GET
 * each: size and ETag), then their cache blocks are fetched in the order
 * of the samples (the fields' files interleaved by their position in the
 * dataset, so that a part of the dataset holds whole samples), with large
 * sequential ranged GETs (whole blocks of one object, up to REQUEST_BYTES
 * each, INFLIGHT at once) written straight into the blocks' files. The
 * part filled is the dataset's first MAX_BYTES in that order, at most 90 %
 * of cache_bytes (what the cache keeps without evicting it again). Blocks
 * already in the cache are kept; the fill coordinates with loaders and
 * other fills reading the same cache_dir (one fetch per block per node:
 * a block another process is fetching is waited for, not fetched again),
 * so it is safe to run while they read.
 *
 * Thread-safety: one thread calls create, add_*, set, run and destroy (run
 * never overlaps destroy); npyload_prefetch_stop and
 * npyload_prefetch_get_progress may be called from any thread at any
 * time between create and destroy, also while run runs. */
typedef struct npyload_prefetch npyload_prefetch;

typedef enum npyload_prefetch_option {
    NPYLOAD_PREFETCH_MAX_BYTES = 1,    /* bytes of the dataset to fill, its
                                          first part in sample order; 0
                                          (default) and at most: 90 % of
                                          the configuration's cache_bytes */
    NPYLOAD_PREFETCH_INFLIGHT = 2,     /* GETs at once, 1 .. 1024; 0: 16 */
    NPYLOAD_PREFETCH_REQUEST_BYTES = 3 /* bytes per GET (rounded up to whole
                                          cache blocks), 4 KiB .. 1 GiB;
                                          0: 32 MiB */
} npyload_prefetch_option;

/* Phases of a run (npyload_prefetch_progress.phase). */
#define NPYLOAD_PREFETCH_IDLE 0        /* run not called yet */
#define NPYLOAD_PREFETCH_PROBING 1     /* listing and probing the objects */
#define NPYLOAD_PREFETCH_FILLING 2     /* fetching blocks */
#define NPYLOAD_PREFETCH_DONE 3        /* run returned (rc tells how) */

/* The counters of a fill, since run began (sized: see Conventions). */
typedef struct npyload_prefetch_progress {
    uint64_t objects;          /* objects of the fields (globs expanded) */
    uint64_t dataset_bytes;    /* their bytes, once probed */
    uint64_t planned_bytes;    /* the part to fill (all of the dataset, or
                                  its first MAX_BYTES in sample order) */
    uint64_t cached_bytes;     /* of the part, in the cache: found there,
                                  fetched, or fetched meanwhile by another
                                  process (at the end: counted there) */
    uint64_t fetched_bytes;    /* of the part, fetched by this fill */
    uint64_t planned_blocks;   /* cache blocks of the part */
    uint64_t found_blocks;     /* of those, already in the cache */
    uint64_t fetched_blocks;   /* fetched by this fill */
    uint64_t waited_blocks;    /* fetched meanwhile by another reader of the
                                  cache (a loader, another fill) */
    uint64_t requests;         /* HTTP requests made (listings, probes,
                                  fills, retries) */
    uint64_t received_bytes;   /* body bytes received (probes included) */
    uint64_t elapsed_ns;       /* since run began (frozen when it returned) */
    uint64_t probe_ns;         /* of it, probing (the rest is filling) */
    uint32_t phase;            /* NPYLOAD_PREFETCH_IDLE .. _DONE */
    int32_t rc;                /* run's result once DONE */
} npyload_prefetch_progress;

/*! npyload_prefetch_create() : a fill for the configuration `cfg` (as
 * npyload_loader_set_remote takes it; `size` is sizeof(npyload_remote) as
 * the caller was compiled). cfg->cache_dir is required: the directory the
 * loaders of the node will be given (with the same cache_block: a block
 * size is part of the blocks' names).
 * @return : 0 and *out; NPYLOAD_EINVAL naming a bad member or a missing
 *           cache_dir; NPYLOAD_EUNSUPPORTED in a build without libcurl;
 *           -ENOMEM. `err` (may be NULL) never holds a secret. */
NPYLOAD_API int npyload_prefetch_create(npyload_prefetch **out, const npyload_remote *cfg,
                                        size_t size, char *err, size_t errlen);

/*! npyload_prefetch_destroy() : frees it (the secret wiped). NULL-safe;
 * never while run runs (stop it and let run return first). */
NPYLOAD_API void npyload_prefetch_destroy(npyload_prefetch *P);

/*! npyload_prefetch_add_field() : adds a field: an s3:// glob (listed now,
 * as npyload_loader_add_field lists it) or one s3:// / http(s):// URL.
 * Fields are what a loader's fields are: their files are filled
 * interleaved by position, so a part holds whole samples.
 * @return : 0; NPYLOAD_EINVAL for a local path (naming it);
 *           NPYLOAD_ENOFILES; a listing's error naming the pattern;
 *           NPYLOAD_ESTATE while run runs. The message:
 *           npyload_prefetch_errmsg. */
NPYLOAD_API int npyload_prefetch_add_field(npyload_prefetch *P, const char *pattern);

/*! npyload_prefetch_add_field_files() : adds a field given as n URLs, in
 * order. @return : as npyload_prefetch_add_field. */
NPYLOAD_API int npyload_prefetch_add_field_files(npyload_prefetch *P,
                                                 const char *const *urls, size_t n);

/*! npyload_prefetch_set() : sets an option (npyload_prefetch_option).
 * @return : 0, NPYLOAD_EINVAL for an unknown option or a value out of its
 *           range (the message names both), NPYLOAD_ESTATE while run runs. */
NPYLOAD_API int npyload_prefetch_set(npyload_prefetch *P, npyload_prefetch_option opt,
                                     int64_t value);

/*! npyload_prefetch_run() : probes every object, then fills the cache with
 * the part (see above); blocks the calling thread until the part is in the
 * cache, npyload_prefetch_stop was called, or a request failed for good
 * (after the configuration's retries). May be called again (a second run
 * finds what the first fetched and fetches what is missing).
 * @return : 0; -ECANCELED when stopped; NPYLOAD_EINVAL when no field was
 *           added; -ENOENT (404), -EACCES (403), NPYLOAD_ECHANGED (an object
 *           changed during the run), NPYLOAD_EREMOTE... with "URL: what
 *           happened" in npyload_prefetch_errmsg. What was filled before a
 *           failure stays in the cache. */
NPYLOAD_API int npyload_prefetch_run(npyload_prefetch *P);

/*! npyload_prefetch_stop() : asks a run to end: the GETs of the current
 * round (at most 3 x INFLIGHT of REQUEST_BYTES) complete first, and run
 * returns -ECANCELED. Before run: the next run returns -ECANCELED at once.
 * Any thread. */
NPYLOAD_API void npyload_prefetch_stop(npyload_prefetch *P);

/*! npyload_prefetch_get_progress() : the counters now into *out (`size`:
 * sizeof(npyload_prefetch_progress) as the caller was compiled). Any
 * thread, cheap (a few atomic loads).
 * @return : 0 or NPYLOAD_EINVAL (NULL, or a size below the first layout). */
NPYLOAD_API int npyload_prefetch_get_progress(const npyload_prefetch *P,
                                              npyload_prefetch_progress *out, size_t size);

/*! npyload_prefetch_errmsg() : the last failure of add_*, set or run in
 * words ("" when none). Valid until the next call on P from its thread. */
NPYLOAD_API const char *npyload_prefetch_errmsg(const npyload_prefetch *P);

/* ==== Experimental API ====================================================
 *
 * What npyload's own tools and tests use and users do not need yet: a GPU
 * stand-in for a training step, NVML monitoring, a remote store's ranged-GET
 * sweep. Declared only for a program that defines NPYLOAD_EXPERIMENTAL
 * before including this header (as zstd's ZSTD_STATIC_LINKING_ONLY):
 *
 *     #define NPYLOAD_EXPERIMENTAL
 *     #include "npyload.h"
 *
 * These names, types and meanings may change in any release, the ABI too
 * (the SONAME does not follow them); everything above this line is the
 * stable API. */
#ifdef NPYLOAD_EXPERIMENTAL

/*! npyload_compute_sim: a non-blocking CUDA stream on a device and a kernel
 * that keeps it busy for a given time, so programs without CUDA headers (the
 * bench, tests) can stand in for a training step: take a batch, make the
 * simulator's stream wait for it (npyload_batch_wait_stream), queue
 * npyload_compute_sim_busy, release with npyload_batch_release_stream. The
 * kernel is PTX JIT-compiled by the driver; nothing here needs nvcc. */
typedef struct npyload_compute_sim npyload_compute_sim;

/*! npyload_compute_sim_create() :
 * @return : 0, NPYLOAD_ENOCUDA (reason in `why`) or NPYLOAD_ECUDA. */
NPYLOAD_API int npyload_compute_sim_create(int device, npyload_compute_sim **out, char *why,
                                           size_t whylen);
/*! npyload_compute_sim_stream() : its stream (a cudaStream_t). */
NPYLOAD_API void *npyload_compute_sim_stream(const npyload_compute_sim *s);
/*! npyload_compute_sim_busy() : queues a kernel that spins for `ns`
 * nanoseconds (GPU global timer) on the stream; returns at once. */
NPYLOAD_API int npyload_compute_sim_busy(npyload_compute_sim *s, uint64_t ns);
/*! npyload_compute_sim_sync() : waits on the host for the stream. */
NPYLOAD_API int npyload_compute_sim_sync(npyload_compute_sim *s);
/*! npyload_compute_sim_destroy() : waits for the stream, frees. NULL-safe. */
NPYLOAD_API void npyload_compute_sim_destroy(npyload_compute_sim *s);

/*! npyload_nvml: GPU monitoring through NVML (libnvidia-ml.so.1, loaded at
 * run time by lib/cuda; absent on machines without an NVIDIA driver). */
typedef struct npyload_nvml npyload_nvml;
typedef struct npyload_nvml_sample_t {
    double util_pct;     /* GPU utilisation, percent */
    double power_w;      /* 0 when NVML cannot tell */
    double mem_used_mib; /* < 0 when NVML cannot tell */
} npyload_nvml_sample_t;
/*! npyload_nvml_open() : NVML for `device` (an NVML index).
 * @return : 0, or -1 with the reason in `why`. */
NPYLOAD_API int npyload_nvml_open(int device, npyload_nvml **out, char *why, size_t whylen);
/*! npyload_nvml_sample() : @return : 0, or -1 when no sample came. */
NPYLOAD_API int npyload_nvml_sample(const npyload_nvml *n, npyload_nvml_sample_t *s);
/*! npyload_nvml_close() : NULL-safe. */
NPYLOAD_API void npyload_nvml_close(npyload_nvml *n);

/*! npyload_rget: what a remote store gives, measured with the loader's own
 * HTTP path (lib/remote: a libcurl multi handle per thread, keep-alive,
 * signing) but without the loader: ranged GETs of `bytes` bytes at random
 * offsets of the objects, at several concurrencies (threads x requests in
 * flight per thread), each for `seconds`. Used by npyload-bench on remote
 * fields and by bench/bench_remote. */
#define NPYLOAD_RGET_MAX_POINTS 16
typedef struct npyload_rget_point {
    int concurrency, threads, inflight;
    double requests_per_s, mb_per_s;
    double p50_ms, p99_ms;     /* single-request latency: measured at
                                  inflight 1 only, else < 0 */
} npyload_rget_point;
typedef struct npyload_rget_result {
    size_t objects;
    uint64_t object_bytes;
    size_t bytes_per_request;
    double seconds;
    int npoints;
    npyload_rget_point points[NPYLOAD_RGET_MAX_POINTS];
    double best_mb_per_s;
    /* The recommendation: the smallest concurrency within 10 % of the best
     * throughput, as reading threads x requests in flight per thread; a
     * worker has two reading threads with read-ahead (itself and its
     * read-ahead thread), so workers = threads / 2 (at least 1) and
     * max_inflight = concurrency / (2 x workers), rounded up. */
    int pick;                  /* index of the point chosen */
    int concurrency, workers, max_inflight;
    uint64_t requests, retries; /* HTTP requests of the whole sweep (the
                                   probe included) */
} npyload_rget_result;
/*! npyload_rget_row() : one point as a table row "conc threads inflight
 * req/s MB/s p50 p99" (npyload_rget_header() the header), as npyload-bench
 * and bench_remote print them. */
NPYLOAD_API void npyload_rget_row(const npyload_rget_point *p, char *buf, size_t len);
NPYLOAD_API const char *npyload_rget_header(void);
/*! npyload_rget_measure() : probes the n objects (size, ETag), then
 * measures each concurrency of conc[0 .. nconc) (at most
 * NPYLOAD_RGET_MAX_POINTS) with at most tmax threads. `each` (may be NULL)
 * is called after every point (for a table printed as it goes).
 * `cfg` is copied (max_inflight is raised to what the points need).
 * @return : 0, or an error with the message (URL and what happened, never
 * a secret) in err; NPYLOAD_EUNSUPPORTED in a build without libcurl. */
NPYLOAD_API int npyload_rget_measure(const npyload_remote *cfg, const char *const *urls,
                                     size_t n, size_t bytes, double seconds, const int *conc,
                                     int nconc, int tmax,
                                     void (*each)(const npyload_rget_point *p, void *arg),
                                     void *arg, npyload_rget_result *out, char *err,
                                     size_t errlen);

#endif /* NPYLOAD_EXPERIMENTAL */

#ifdef __cplusplus
}
#endif
#endif /* NPYLOAD_H */
