#!/usr/bin/env python3
"""End to end on the CPU: a small model's training step with each loader
running beside it, against the same step on preloaded batches.

    npyload-gen --preset captcha --out /tmp/cap --files 8
    python3 bench/step_slowdown.py --data /tmp/cap [--steps 40] [--rounds 3] [--batch 64]

For each side the script times the same model step (a small CNN over the
captcha images, a 1x1 head against the heatmaps, Adam) three ways:
  preloaded  the batches already in memory (tensors built once): the
             step's own time, nothing else running;
  npyload    npyload.Loader(images, heatmaps), 2 worker threads;
  DataLoader torch.utils.data.DataLoader over a Dataset of samples
             (np.load mmap per file), 2 worker processes, pin_memory=True,
             persistent_workers=True.
Reported per loader: the median time of the step itself (the
forward/backward/optimizer call only, timed around it: the loader's
waits are not in it) and its slowdown against preloaded (the CPU the
loader's workers take from the model: DataLoader's processes compete with
torch's own threads), and samples/s end to end (the whole loop, waits
included). torch's intra-op threads are left at their default.
The sides alternate over --rounds rounds (each round runs all three, in a
rotating order) and each slowdown is taken within its round, so that a
machine whose speed drifts moves every side alike; the median and range
over the rounds are printed. Timings are noisy on a shared machine: run
it quiet, and compare sides of the same run only.
"""
import argparse
import glob
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn

import npyload


def model():
    # (2, 256, 512) -> (2, 64, 128), the heatmaps' shape: small enough for
    # a CPU step of tens of milliseconds.
    return nn.Sequential(
        nn.Conv2d(2, 8, 5, stride=4, padding=2), nn.ReLU(),
        nn.Conv2d(8, 2, 3, padding=1))


class Samples(torch.utils.data.Dataset):
    """One item = one sample, read from np.load(mmap_mode='r') per file."""

    def __init__(self, img, hm):
        self.files = [(np.load(a, mmap_mode="r"), np.load(b, mmap_mode="r"))
                      for a, b in zip(img, hm)]
        self.index = [(f, i) for f, (a, _) in enumerate(self.files) for i in range(len(a))]

    def __len__(self):
        return len(self.index)

    def __getitem__(self, k):
        f, i = self.index[k]
        a, b = self.files[f]
        return {"images": torch.from_numpy(np.array(a[i])),
                "heatmaps": torch.from_numpy(np.array(b[i]))}


def train(batches, steps, seed=0):
    """Runs `steps` steps over `batches` (an iterable re-iterated as needed).
    Returns (step times in s, samples/s end to end)."""
    torch.manual_seed(seed)
    net = model()
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    times, n = [], 0
    t0 = None
    while len(times) < steps:
        for b in batches:
            x, y = b["images"], b["heatmaps"]
            s = time.perf_counter()
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            e = time.perf_counter()
            if t0 is None:
                t0 = e  # from the end of the first step: start-up excluded
            else:
                times.append(e - s)
                n += x.shape[0]
            if len(times) >= steps:
                break
    return times, n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="npyload-gen --preset captcha --out DIR")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per side and round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds; each runs every side once, in a rotating order")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    img = sorted(glob.glob(os.path.join(a.data, "images/train/*.npy")))
    hm = sorted(glob.glob(os.path.join(a.data, "labels/train/*_heatmaps.npy")))
    if not img or len(img) != len(hm):
        raise SystemExit(f"{a.data}: no captcha layout (npyload-gen --preset captcha)")
    # heatmaps are (2, 64, 128); the net maps (2, 256, 512) to (2, 64, 128)
    pre = []
    ds = Samples(img, hm)
    for k in range(0, min(len(ds), a.batch * 8) - a.batch + 1, a.batch):
        rows = [ds[i] for i in range(k, k + a.batch)]
        pre.append({f: torch.stack([r[f] for r in rows]) for f in ("images", "heatmaps")})

    def npyload_side():
        with npyload.Loader({"images": img, "heatmaps": hm}, batch_size=a.batch,
                            shuffle=True, drop_last=True, num_workers=a.workers) as ld:
            return train(ld, a.steps)

    def dataloader_side():
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True,
                                         drop_last=True, num_workers=a.workers,
                                         pin_memory=True, persistent_workers=True)
        try:
            return train(dl, a.steps)
        finally:
            del dl

    sides = {"preloaded": lambda: train(pre, a.steps), "npyload": npyload_side,
             "DataLoader": dataloader_side}
    names = list(sides)
    # per round: each side's median step time and samples/s; the slowdown
    # is taken within the round (against that round's preloaded step), so a
    # machine whose speed drifts moves all three alike
    rounds = []
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {}
        for k in order:
            times, sps = sides[k]()
            got[k] = (statistics.median(times), sps)
        rounds.append(got)
    print(f"{a.rounds} rounds of {a.steps} steps of batch {a.batch}, {a.workers} loader "
          f"workers, torch threads {torch.get_num_threads()}, {os.cpu_count()} cores")
    print(f"{'side':<11} {'step ms (median)':>17} {'slowdown (median, min-max)':>28} "
          f"{'samples/s end to end':>21}")
    for k in names:
        med = statistics.median(g[k][0] for g in rounds)
        slow = [100 * (g[k][0] / g["preloaded"][0] - 1) for g in rounds]
        sps = statistics.median(g[k][1] for g in rounds)
        span = f"{statistics.median(slow):+.0f}% ({min(slow):+.0f} to {max(slow):+.0f})"
        print(f"{k:<11} {1e3 * med:>17.1f} {span:>28} {sps:>21.0f}")


if __name__ == "__main__":
    main()
