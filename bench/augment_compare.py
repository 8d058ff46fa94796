#!/usr/bin/env python3
"""Random horizontal flip in the pipeline, three ways, on the same files and
cores in one run (issue 24's user trial: normalise + flip + channels-last,
2 workers, 128-sample shuffled batches, the captcha layout):

  transform  npyload, Transform(float32, mean/std, channels_last, hflip=0.5)
             on images and heatmaps, hflip_sign=(-1, 1, -1, 1) on the offset maps: the
             flip runs in the C workers, fused with the normalise pass.
  hook       npyload, the same Transform without hflip, and the flip done in
             a transform= hook (one Python thread): rows chosen with a
             per-batch Generator, flipped with index assignment, as the user
             trial did.
  torch      torch.utils.data.DataLoader over a per-sample Dataset (np.load
             mmap_mode='r'), normalise + flip (p = 0.5) in __getitem__, the
             default collate, num_workers 2, then channels-last in the loop.

    npyload-gen --preset captcha --out /tmp/cap --files 16
    python3 bench/augment_compare.py --data /tmp/cap [--epochs 2] [--repeats 2]

Prints samples/s of each (after one warm-up epoch), repeated, as min-max, and
the ratios of the medians."""
import argparse
import glob
import os
import statistics
import sys
import time

import numpy as np
import torch

import npyload

MEAN, STD = (0.5, 0.5), (0.25, 0.25)
# The preset's offsets are (4, H, W) maps: channels 0 and 2 taken as the
# horizontal components, negated when a sample is mirrored.
SIGN = (-1.0, 1.0, -1.0, 1.0)


def fields(root):
    imgs = sorted(glob.glob(f"{root}/images/train/train_*.npy"))
    heat = sorted(glob.glob(f"{root}/labels/train/train_*_heatmaps.npy"))
    offs = sorted(glob.glob(f"{root}/labels/train/train_*_offsets.npy"))
    if not imgs or len(imgs) != len(heat) or len(imgs) != len(offs):
        sys.exit(f"augment_compare: {root}: expected npyload-gen --preset captcha output")
    return {"images": imgs, "heatmaps": heat, "offsets": offs}


def timed(batches, epochs):
    """samples/s over `epochs` after the first (warm-up) epoch."""
    n, t0 = 0, None
    for e in range(epochs + 1):
        if e == 1:
            n, t0 = 0, time.perf_counter()
        for b in batches(e):
            x = b["images"] if isinstance(b, dict) or hasattr(b, "keys") else b[0]
            n += x.shape[0]
    return n / (time.perf_counter() - t0)


def npyload_run(f, epochs, flip_in_transform, workers):
    norm = dict(dtype="float32", mean=MEAN, std=STD, channels_last=True)
    p = 0.5 if flip_in_transform else 0.0
    ts = {"images": npyload.Transform(hflip=p, **norm),
          "heatmaps": npyload.Transform("float32", hflip=p),
          "offsets": npyload.Transform(hflip=p, hflip_sign=SIGN if p else None)}
    hook = None
    sign = torch.tensor(SIGN).view(-1, 1, 1)
    if not flip_in_transform:
        def hook(b):
            rng = np.random.default_rng((7, b.epoch, b.seq))
            m = torch.from_numpy(rng.random(b.num_samples) < 0.5)
            out = dict(b.items())
            for k in ("images", "heatmaps", "offsets"):
                x = out[k]
                x[m] = x[m].flip(-1)   # the user trial's index-assign flip
            out["offsets"][m] *= sign
            return out
    L = npyload.Loader(f, batch_size=128, shuffle=True, seed=7, num_workers=workers,
                       transforms=ts, transform=hook, output="torch")

    def batches(e):
        L.set_epoch(e)
        return iter(L)
    try:
        return timed(batches, epochs)
    finally:
        L.close()


class SampleDataset(torch.utils.data.Dataset):
    def __init__(self, f):
        self.maps = None
        self.f = f
        self.index = []
        for i, p in enumerate(f["images"]):
            n = np.load(p, mmap_mode="r").shape[0]
            self.index += [(i, r) for r in range(n)]
        self.mean = torch.tensor(MEAN).view(-1, 1, 1)
        self.std = torch.tensor(STD).view(-1, 1, 1)

    def __len__(self):
        return len(self.index)

    def __getitem__(self, k):
        if self.maps is None:
            self.maps = {n: [np.load(p, mmap_mode="r") for p in ps] for n, ps in self.f.items()}
        i, r = self.index[k]
        x = (torch.from_numpy(np.array(self.maps["images"][i][r])) - self.mean) / self.std
        h = torch.from_numpy(np.array(self.maps["heatmaps"][i][r]))
        o = torch.from_numpy(np.array(self.maps["offsets"][i][r]))
        if torch.rand(()) < 0.5:
            x, h = x.flip(-1), h.flip(-1)
            o = o.flip(-1) * torch.tensor(SIGN).view(-1, 1, 1)
        return {"images": x, "heatmaps": h, "offsets": o}


def torch_run(f, epochs, workers):
    ds = SampleDataset(f)
    dl = torch.utils.data.DataLoader(ds, batch_size=128, shuffle=True, num_workers=workers,
                                     persistent_workers=True)

    def batches(e):
        for b in dl:
            b["images"] = b["images"].contiguous(memory_format=torch.channels_last)
            yield b
    return timed(batches, epochs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    f = fields(a.data)
    runs = {"transform": [], "hook": [], "torch": []}
    for _ in range(a.repeats):
        runs["transform"].append(npyload_run(f, a.epochs, True, a.workers))
        runs["hook"].append(npyload_run(f, a.epochs, False, a.workers))
        runs["torch"].append(torch_run(f, a.epochs, a.workers))
    print(f"cores available: {len(os.sched_getaffinity(0))}, workers {a.workers}, "
          f"batch 128, {a.epochs} timed epochs, {a.repeats} repeats")
    for k, v in runs.items():
        print(f"  {k:9s} {min(v):8.0f} - {max(v):8.0f} samples/s")
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"  transform / hook  = {med['transform'] / med['hook']:.2f}x")
    print(f"  transform / torch = {med['transform'] / med['torch']:.2f}x")


if __name__ == "__main__":
    main()
