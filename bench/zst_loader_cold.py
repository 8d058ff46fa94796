"""Samples/s of npyload.Loader over a captcha dataset as .npy and as
.npy.zst (npyload-pack), cold (every file's pages evicted with
posix_fadvise(DONTNEED) before each run) and warm (the same run repeated with
the files cached). An indicative measurement, not a test.

    npyload-gen --preset captcha --out DIR --files 32
    npyload-pack DIR/images/train/*.npy DIR/labels/train/*.npy
    python3 bench/zst_loader_cold.py DIR [--batch-size 128] [--workers 2]
"""
import argparse
import glob
import json
import os
import time

import npyload


def fields(root, ext):
    return {
        "images": f"{root}/images/train/*{ext}",
        "heatmaps": f"{root}/labels/train/*_heatmaps{ext}",
        "offsets": f"{root}/labels/train/*_offsets{ext}",
    }


def evict(globs):
    for g in globs.values():
        for p in glob.glob(g):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run(globs, a, cold):
    L = npyload.Loader(globs, batch_size=a.batch_size, shuffle=True, seed=1,
                       num_workers=a.workers, prefetch=a.prefetch, io=a.io,
                       direct_io=a.direct, output="numpy")
    if cold:
        evict(globs)
    n = 0
    t0 = time.perf_counter()
    for b in L:
        n += len(b.indices)
    dt = time.perf_counter() - t0
    s = L.stats()
    return {"samples": n, "seconds": round(dt, 3), "samples_per_s": round(n / dt, 1),
            "bytes_read": s["bytes_read"], "compressed_bytes_read": s["compressed_bytes_read"],
            "decompressed_bytes": s["decompressed_bytes"],
            "decode_s": round(s["decode_ns"] / 1e9, 3), "backend": s["backend"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--io", default="auto")
    ap.add_argument("--direct", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    out = {}
    for cold in (True, False):
        for kind, ext in (("npy", ".npy"), ("zst", ".npy.zst")):
            g = fields(a.root, ext)
            if not cold:
                run(g, a, False)  # fill the cache
            best = max((run(g, a, cold) for _ in range(a.repeat)),
                       key=lambda r: r["samples_per_s"])
            out[f"{'cold' if cold else 'warm'}_{kind}"] = best
            print(f"{'cold' if cold else 'warm'} {kind}: {json.dumps(best)}", flush=True)
    for t in ("cold", "warm"):
        print(f"{t}: zst/npy = {out[t + '_zst']['samples_per_s'] / out[t + '_npy']['samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
