/* Where the time went: one line from a loader's counters naming the
 * bottleneck and what to do about it (npyload_stats_verdict; the rules and
 * thresholds are documented in npyload.h). Used by the bench, Python's
 * Loader.stats() and anyone logging a C loader's stats. */
#include <stdio.h>

#include "npyload.h"

/* ns as a share of `of` ns, at most 1. */
static double share(uint64_t ns, double of)
{
    double s = of > 0 ? (double)ns / of : 0;
    return s < 1 ? s : 1;
}

int npyload_stats_verdict(const npyload_stats *s, uint64_t hook_ns, char *buf, size_t len)
{
    if (!s || !buf || len == 0)
        return NPYLOAD_EINVAL;
    /* Start-up: the first batches wait for the workers to start and the
     * slots to fill; a verdict from them names copies that later batches
     * do not wait for. */
    uint64_t need = NPYLOAD_VERDICT_MIN_BATCHES;
    if (s->num_slots + 2 > need)
        need = s->num_slots + 2;
    if (s->batches_delivered < need || s->elapsed_ns == 0) {
        snprintf(buf, len, "bottleneck: none judged (%llu batches delivered: start-up; "
                 "judged from %llu)", (unsigned long long)s->batches_delivered,
                 (unsigned long long)need);
        return 0;
    }
    double loop = (double)s->wait_ns + (double)s->step_ns;
    double waited = share(s->wait_ns, loop);
    if (s->step_ns > 0 && waited <= NPYLOAD_VERDICT_IDLE) {
        snprintf(buf, len, "bottleneck: the consumer (the loop waited %.1f%% of its time "
                 "for batches): the loader keeps up; a faster step (model, optimizer, "
                 "logging) is what would go faster", 100 * waited);
        return 0;
    }
    double elapsed = (double)s->elapsed_ns;
    double hook = share(hook_ns, elapsed);
    if (hook >= NPYLOAD_VERDICT_HOOK) {
        snprintf(buf, len, "bottleneck: the hook (the transform= function ran %.0f%% of the "
                 "time (per hook thread) while the loop waited %.0f%%): move its work into "
                 "a Transform (in the workers or on the GPU), or run it on more threads "
                 "(transform_workers=)",
                 100 * hook, 100 * waited);
        return 0;
    }
    /* A transform moves to the GPU only where there is one: the loader's
     * device, else a CUDA device this process can open. */
    int gpu = s->device >= 0 || npyload_cuda_available(0, NULL, 0) == 1;
    double workers = elapsed * (double)(s->num_workers > 0 ? s->num_workers : 1);
    uint64_t read_wait = s->read_ahead_batches ? s->read_wait_ns : s->io_ns;
    struct {
        const char *what, *todo;
        double s;
    } c[] = {
        {"the disk (workers waited for reads", "pack the data (npyload-pack; --narrow for "
         "8-bit data stored wider), a faster disk, or more workers to keep more reads in "
         "flight", share(read_wait, workers)},
        {"decode (zstd in the workers", "more cores, a faster level (npyload-pack -l 1) or "
         "--narrow, or keep hot data raw in the page cache", share(s->decode_ns, workers)},
        {"host transforms (in the workers", gpu ? "move the transform to the GPU "
         "(device=\"cuda\": the kernel runs after the copy, PCIe carries the stored dtype)"
         : "more workers if cores are free, a cheaper transform (keep the stored dtype, "
         "fewer steps), or store the data already transformed (no CUDA device here to "
         "run it on)", share(s->transform_ns, workers)},
        {"the H2D copy (copy engine busy", "a narrower dtype on the wire (transform on the "
         "GPU), pinned slots", share(s->h2d_ns, elapsed)},
    };
    /* Read waits name the disk only as far as the reads were off the CPU:
     * a read from the page cache is a copy that keeps its thread busy. */
    double blocked = share(s->read_blocked_ns, workers);
    if (c[0].s > blocked)
        c[0].s = blocked;
    /* Reads of s3:// / https:// shards: the waits are for the server and
     * the network when at least half of them were waits for transfers. */
    if (s->remote_requests > 0 && 2 * s->remote_wait_ns >= read_wait) {
        c[0].what = "the object store (workers waited for ranged GETs";
        /* A cache counts its blocks, hits or misses: one is set. */
        c[0].todo = s->cache_hits + s->cache_misses > 0
                        ? "more requests in flight (max_inflight) or workers, or packed "
                          "shards (npyload-pack: fewer bytes per sample); the cache_dir "
                          "serves the blocks it holds, so later epochs wait less"
                        : "a local cache (cache_dir=) so later epochs read local disk, more "
                          "requests in flight (max_inflight) or workers, or packed shards "
                          "(npyload-pack: fewer bytes per sample)";
    }
    double cpu = share(s->worker_cpu_ns, workers);
    int k = -1;
    for (int i = 0; i < 4; i++)
        if (c[i].s > NPYLOAD_VERDICT_SHARE && (k < 0 || c[i].s > c[k].s))
            k = i;
    if (k < 0) {
        snprintf(buf, len, "bottleneck: CPU copies (reads into the slots; the workers were "
                 "busy %.0f%% of their time): more workers if cores are free, else the "
                 "machine's copy rate is the limit", 100 * cpu);
        return 0;
    }
    snprintf(buf, len, "bottleneck: %s %.0f%% of the time): %s", c[k].what, 100 * c[k].s,
             c[k].todo);
    return 0;
}
