#!/usr/bin/env python3
"""The parallel hook (issue 24, item 3): Loader(transform=fn,
transform_workers=N) for N = 1, 2, 4 on the captcha layout, with a hook of
torch ops that release the GIL: per sample a brightness factor drawn from
``batch.rng``, then horizontal flip and normalise of the images, flip of the
heatmaps, and flip of the offsets with du negated (channels 0 and 2). One
torch thread per hook thread (``--torch-threads``), so N threads can use N
cores. The loop body only takes the results (the hook is the work measured).

    python3 bench/hook_workers.py DIR [--gen build/tools/npyload-gen] [--files 8]
        [--batch-size 128] [--epochs 4] [--rounds 3] [--workers 1 2 4]

DIR: the captcha dataset (written there by npyload-gen --preset captcha
--files F when DIR/images is missing). Prints, per round, samples/s of the
loader alone (no hook: the ceiling here) and of the hook at each N, the
hook_ns per batch and the verdict; the first epoch of every run is warm-up.
A last line per round gives the hook's ceiling: samples/s of fn alone on N
plain threads, on one batch held in memory (no loader, no reads).
"""
import argparse
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch

import npyload

MEAN, STD = 0.5, 0.25


def aug(b):
    x = b["images"]
    n = x.shape[0]
    gain = torch.from_numpy(b.rng.uniform(0.9, 1.1, (n, 1, 1, 1)).astype(np.float32))
    x = torch.flip(x, dims=[3]).mul_(gain).sub_(MEAN).div_(STD)
    h = torch.flip(b["heatmaps"], dims=[3])
    o = torch.flip(b["offsets"], dims=[3])
    o[:, 0::2].neg_()  # du of gap and slider change sign with the flip
    return x, h, o


def run(fields, a, workers):
    kw = dict(batch_size=a.batch_size, shuffle=True, seed=0, num_workers=a.num_workers)
    if workers:
        L = npyload.Loader(fields, transform=aug, transform_workers=workers, **kw)
    else:
        L = npyload.Loader(fields, **kw)
    n, t0 = 0, None
    for e in range(a.epochs + 1):
        if e == 1:
            n, t0 = 0, time.perf_counter()
            base = L.stats()["hook_ns"]
        L.set_epoch(e)
        for out in L:
            n += out[0].shape[0] if workers else out["images"].shape[0]
    dt = time.perf_counter() - t0
    st = L.stats()
    batches = n // a.batch_size
    L.close()
    return n / dt, (st["hook_ns"] - base) / max(1, batches) / 1e6, st["verdict"], L.prefetch


def op_alone(fields, a, workers, per=4):
    """samples/s of aug on `workers` threads, each running it `per` times on
    the first batch (kept: copy=True), the loader closed: fn's own scaling."""
    L = npyload.Loader(fields, batch_size=a.batch_size, num_workers=1, copy=True)
    b = next(iter(L))
    L.close()

    class B(dict):  # the batch's tensors and an rng, as fn sees them
        rng = np.random.default_rng(0)
    batch = B(b)
    ts = [threading.Thread(target=lambda: [aug(batch) for _ in range(per)])
          for _ in range(workers)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return workers * per * a.batch_size / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--gen", default="build/tools/npyload-gen")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--torch-threads", type=int, default=1)
    a = ap.parse_args()
    if not os.path.isdir(os.path.join(a.dir, "images")):
        subprocess.run([a.gen, "--preset", "captcha", "--out", a.dir, "--files", str(a.files)],
                       check=True)
    torch.set_num_threads(a.torch_threads)
    d = a.dir
    fields = {"images": f"{d}/images/train/train_*.npy",
              "heatmaps": f"{d}/labels/train/train_*_heatmaps.npy",
              "offsets": f"{d}/labels/train/train_*_offsets.npy"}
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__} with {a.torch_threads} "
          f"thread(s), batch {a.batch_size}, num_workers {a.num_workers}, "
          f"{a.epochs} timed epochs", flush=True)
    for r in range(a.rounds):
        sps, _, verdict, _ = run(fields, a, 0)
        print(f"round {r}: no hook            {sps:8.1f} samples/s   {verdict[:60]}", flush=True)
        for w in a.workers:
            sps, ms, verdict, pf = run(fields, a, w)
            print(f"round {r}: transform_workers={w} {sps:8.1f} samples/s  "
                  f"hook {ms:6.1f} ms/batch (summed)  prefetch {pf}  {verdict[:60]}",
                  flush=True)
        alone = "  ".join(f"N={w}: {op_alone(fields, a, w):.1f}" for w in a.workers)
        print(f"round {r}: fn alone on N threads (samples/s)  {alone}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
