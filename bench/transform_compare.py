#!/usr/bin/env python3
"""Transforms in the loader against the same conversion in torch on the
consuming thread, end to end, in the same run (issue 15's target: >= 1.5x).

    python3 bench/transform_compare.py [--dir DIR] [--files 64] [--seconds 4]

Data: uint8 images (N, 3, 64, 64), 64 samples per file, written once into
--dir (page cache: every file is read once before timing). Both sides: 2
worker threads, batch 128, full shuffle, torch output, the consumer holding
each batch's final tensor (float16, normalised, channels-last):
  loader   Loader(..., transforms={"images": Transform("float16",
           scale=1/255, mean, std, channels_last=True)}): the workers convert.
  torch    Loader(...) of the raw uint8, then on the consuming thread
           ((x.float() * scale - mean) / std).to(float16,
           memory_format=torch.channels_last), torch's own intra-op threads
           as configured (--torch-threads; default torch's default).
Each side runs alternately (--rounds), samples/s after the first batch of a
round; the ratio printed is median(loader) / median(torch). Both results are
checked equal within one float16 ulp on the first batch.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import npyload

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SCALE = 1.0 / 255.0


def write_data(d, files, per_file=64):
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in range(files):
        p = d / f"img_{k:04d}.npy"
        if not p.exists():
            np.save(p, rng.integers(0, 256, size=(per_file, 3, 64, 64), dtype=np.uint8))
    for p in sorted(d.glob("img_*.npy")):  # into the page cache
        p.read_bytes()
    return str(d / "img_*.npy")


def run(glob, torch, mode, seconds, workers, batch):
    tr = None
    if mode == "loader":
        tr = {"images": npyload.Transform("float16", scale=SCALE, mean=MEAN, std=STD,
                                          channels_last=True)}
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    L = npyload.Loader({"images": glob}, batch_size=batch, shuffle=True, seed=1,
                       num_workers=workers, output="torch", transforms=tr)
    n = 0
    t0 = None
    first = None
    epoch = 0
    try:
        while True:
            L.set_epoch(epoch)
            epoch += 1
            for b in L:
                x = b["images"]
                if mode == "torch":
                    x = ((x.float() * SCALE - mean) / std).to(
                        torch.float16, memory_format=torch.channels_last)
                if first is None:
                    first = (b.indices.clone(), x.clone())
                if t0 is None:
                    t0 = time.perf_counter()  # after the first batch
                    continue
                n += x.shape[0]
                del x, b
                if time.perf_counter() - t0 >= seconds:
                    return n / (time.perf_counter() - t0), first
    finally:
        L.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--torch-threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args()
    import torch
    if a.torch_threads:
        torch.set_num_threads(a.torch_threads)
    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="npyload-tr-")
        a.dir = tmp.name
    glob = write_data(Path(a.dir), a.files)
    res = {"loader": [], "torch": []}
    firsts = {}
    for _ in range(a.rounds):
        for mode in ("loader", "torch"):
            sps, first = run(glob, torch, mode, a.seconds, a.workers, a.batch)
            res[mode].append(sps)
            firsts[mode] = first
    # same batch (same seed and epoch): equal within one float16 ulp
    (i0, x0), (i1, x1) = firsts["loader"], firsts["torch"]
    assert torch.equal(i0, i1)
    assert x0.is_contiguous(memory_format=torch.channels_last)
    b0 = x0.contiguous().view(torch.int16).numpy().astype(np.int32)
    b1 = x1.contiguous().view(torch.int16).numpy().astype(np.int32)
    ord0 = np.where(b0 < 0, -(b0 & 0x7FFF), b0)
    ord1 = np.where(b1 < 0, -(b1 & 0x7FFF), b1)
    ulps = int(np.abs(ord0 - ord1).max())
    med = {k: statistics.median(v) for k, v in res.items()}
    ratio = med["loader"] / med["torch"]
    out = {
        "samples_per_s": res, "median": med, "ratio": ratio, "max_ulps_f16": ulps,
        "files": a.files, "batch": a.batch, "workers": a.workers,
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
    }
    print(f"loader with transforms=   {med['loader']:12.0f} samples/s  {res['loader']}")
    print(f"raw loader + torch conv.  {med['torch']:12.0f} samples/s  {res['torch']}")
    print(f"ratio {ratio:.2f}x (target >= 1.5x); results agree within {ulps} float16 ulp")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
