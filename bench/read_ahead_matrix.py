#!/usr/bin/env python3
"""Read-ahead on (READ_AHEAD 1) against off (READ_AHEAD -1) at fixed
workers and slots, per regime (issue 37 item 5: which regimes the
controller should read ahead in). The two run alternately, --repeats
times each; the table gives each run's samples/s and the medians' ratio,
with the workers' read_wait and the reading threads' off-CPU time
(read_blocked) per batch, the measures a run-time rule can see.

Regimes (the captcha data of bench/bench_auto.py, 128-sample shuffled
batches; the consumer does nothing):
  transforms   page cache, bench_auto's transforms on the images
  zst-cache    the packed shards (.npy.zst) in the page cache
  zst-cold     the packed shards, evicted before every epoch, the disk
               throttled to --throttle bytes/s (cgroup v1 blkio; root)
  plain-cold   the plain captcha rows, evicted, throttled likewise
  small-cache  CIFAR-like rows (3x32x32 uint8, 256-row batches) in the
               page cache (--small-dir, written with npyload-gen when empty)

    python bench/read_ahead_matrix.py --dir /tmp/autobench64 \
        --packed-dir /tmp/tune-packed64 [--regimes ...] [--workers 2]
        [--prefetch 4] [--repeats 3] [--epochs 2]

Shared machine figures: compare on and off within one run.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import npyload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_auto as ba  # noqa: E402


def _one(fields: Any, on: bool, workers: int, prefetch: int, epochs: int, *,
         batch: int = 128, transforms: bool = False,
         evict: list[str] | None = None) -> dict[str, float]:
    ld = npyload.Loader(fields, batch_size=batch, shuffle=True, seed=0, num_workers=workers,
                        prefetch=prefetch, transforms=ba._transforms() if transforms else None)
    # READ_AHEAD 1 forces it on (the Python option only turns it off).
    ld._c.set(npyload._npyload.OPT_READ_AHEAD, 1 if on else -1)
    n = 0
    t0 = time.perf_counter()
    for e in range(epochs):
        if evict:
            ba._evict(evict)
        ld.set_epoch(e)
        for b in ld:
            n += len(b.indices)
    wall = time.perf_counter() - t0
    st = ld.stats()
    nb = max(1, st["batches_delivered"])
    ld.close()
    return {"sps": n / wall, "rw": st["read_wait_ns"] / nb / 1e3,
            "blk": st["read_blocked_ns"] / nb / 1e3,
            "wait": st["wait_ns"] / max(1, st["wait_ns"] + st["step_ns"])}


def _pair(name: str, run: Any, repeats: int) -> None:
    res: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for k in range(repeats):
        for on in ((True, False) if k % 2 == 0 else (False, True)):
            res[on].append(run(on))
    med = {on: statistics.median(r["sps"] for r in res[on]) for on in res}
    def cols(on: bool) -> str:
        r = res[on]
        return (", ".join(f"{x['sps']:.0f}" for x in r) +
                f" | {statistics.median(x['rw'] for x in r):.0f}"
                f" | {statistics.median(x['blk'] for x in r):.0f}"
                f" | {statistics.median(x['wait'] for x in r) * 100:.0f} %")
    print(f"| {name} | {cols(True)} | {cols(False)} | {med[True] / med[False]:.2f} |",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--packed-dir", required=True)
    ap.add_argument("--small-dir", default="/tmp/npyload-ra-small")
    ap.add_argument("--regimes",
                    default="transforms,zst-cache,zst-cold,plain-cold,small-cache")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--throttle", type=int, default=400_000_000, help="bytes/s")
    a = ap.parse_args()
    w, p, ep = a.workers, a.prefetch, a.epochs
    print(f"workers={w} prefetch={p} epochs={ep} repeats={a.repeats}; "
          f"load {os.getloadavg()[0]:.1f} (shared machine figures)")
    print("| regime | on: samples/s | read_wait us/batch | read_blocked us/batch | loop wait "
          "| off: samples/s | read_wait | read_blocked | loop wait | on/off (medians) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    raw, packed = ba._fields(a.dir), ba._fields(a.packed_dir, ".npy.zst")
    raw_files, packed_files = ba._files(a.dir, ".npy"), ba._files(a.packed_dir, ".npy.zst")
    for regime in a.regimes.split(","):
        if regime == "transforms":
            ba._warm(raw_files)
            _pair(regime, lambda on: _one(raw, on, w, p, ep, transforms=True), a.repeats)
        elif regime == "zst-cache":
            ba._warm(packed_files)
            _pair(regime, lambda on: _one(packed, on, w, p, ep), a.repeats)
        elif regime in ("zst-cold", "plain-cold"):
            d, f, files = ((a.packed_dir, packed, packed_files) if regime == "zst-cold"
                           else (a.dir, raw, raw_files))
            with ba._throttled(d, a.throttle) as why:
                if why is not None:
                    print(f"| {regime} | SKIPPED: {why} |")
                    continue
                _pair(f"{regime} ({a.throttle / 1e6:.0f} MB/s)",
                      lambda on: _one(f, on, w, p, ep, evict=files), a.repeats)
        elif regime == "small-cache":
            if not glob.glob(f"{a.small_dir}/data_*.npy"):
                subprocess.run(["npyload-gen", "--generic", "--out", a.small_dir, "--shape",
                                "3,32,32", "--dtype", "|u1", "--files", "50",
                                "--samples-per-file", "1000"], check=True,
                               stdout=subprocess.DEVNULL)
            files = sorted(glob.glob(f"{a.small_dir}/data_*.npy"))
            ba._warm(files)
            _pair(regime, lambda on: _one({"x": f"{a.small_dir}/data_*.npy"}, on, w, p,
                                          ep * 3, batch=256), a.repeats)
        else:
            ap.error(f"unknown regime {regime}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
