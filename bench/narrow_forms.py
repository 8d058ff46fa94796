#!/usr/bin/env python3
"""The three packed forms of a captcha dataset, side by side (issue 28):
plain packing (.npy.zst), narrowed packing (--narrow: one-byte codes + the
value table, compressed) and the narrowed codes stored without compression
(--narrow --store: FILE.narrow.npy, no decode). Images and heatmaps are
narrowed (8-bit levels stored as float32); offsets hold continuous values
and stay plain-packed in every form.

    npyload-gen --preset captcha --out DIR --files 16 --seed 0
    python3 bench/narrow_forms.py prepare DIR OUT     # writes OUT/{packed,narrow,store}
    python3 bench/narrow_forms.py run OUT FORM [--cold] [--workers 2] [--prefetch 4]
    bash bench/cold_throttled.sh 400000000 -- python3 bench/narrow_forms.py run OUT store --cold

`prepare` prints each form's bytes per field and the ratio of the delivered
bytes; `run` prints one JSON line: samples/s of one shuffled epoch (batch
128), bytes read, decode time.
"""
import argparse
import glob
import json
import os
import time

import npyload
from zst_loader_cold import evict  # bench/: the same eviction as the zst figures

FIELDS = {"images": "images/train/train_*.npy",
          "heatmaps": "labels/train/train_*_heatmaps.npy",
          "offsets": "labels/train/train_*_offsets.npy"}
NARROWED = ("images", "heatmaps")


def prepare(src, out):
    sizes = {}
    for form in ("packed", "narrow", "store"):
        for name, pattern in FIELDS.items():
            d = os.path.join(out, form, name)
            os.makedirs(d, exist_ok=True)
            for p in sorted(glob.glob(os.path.join(src, pattern))):
                base = os.path.basename(p)[:-len(".npy")]
                narrow = form != "packed" and name in NARROWED
                store = form == "store" and narrow
                dst = os.path.join(d, base + (".narrow.npy" if store else ".npy.zst"))
                (r,) = npyload.pack(p, out=dst, narrow=narrow, store=store, force=True)
                s = sizes.setdefault((form, name), [0, 0])
                s[0] += r["in_bytes"]
                s[1] += r["out_bytes"]
    for form in ("packed", "narrow", "store"):
        tin = sum(sizes[(form, n)][0] for n in FIELDS)
        tout = sum(sizes[(form, n)][1] for n in FIELDS)
        per = ", ".join(f"{n} {sizes[(form, n)][1] / 2**20:.1f} MiB" for n in FIELDS)
        print(f"{form}: {tout / 2**30:.3f} GiB ({per}); ratio {tin / tout:.2f}x of the "
              f"delivered bytes")


def form_globs(out, form):
    return {n: os.path.join(out, form, n, "*") for n in FIELDS}


def run(out, form, cold, workers, prefetch):
    g = form_globs(out, form)
    if cold:
        evict(g)
    L = npyload.Loader(g, batch_size=128, shuffle=True, seed=1, num_workers=workers,
                       prefetch=prefetch, output="numpy")
    n = 0
    t0 = time.perf_counter()
    for b in L:
        n += len(b.indices)
    dt = time.perf_counter() - t0
    s = L.stats()
    L.close()
    print(json.dumps({"form": form, "cold": cold, "samples": n,
                      "samples_per_s": round(n / dt, 1), "seconds": round(dt, 3),
                      "compressed_bytes_read": s["compressed_bytes_read"],
                      "bytes_read": s["bytes_read"],
                      "decode_s": round(s["decode_ns"] / 1e9, 3),
                      "verdict": s["verdict"]}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("src")
    p.add_argument("out")
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("form", choices=("packed", "narrow", "store"))
    r.add_argument("--cold", action="store_true")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--prefetch", type=int, default=4)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.src, a.out)
    else:
        run(a.out, a.form, a.cold, a.workers, a.prefetch)


if __name__ == "__main__":
    main()
