"""Indicative benchmark of Loader(transform=fn): a per-batch torch
augmentation (uint8 -> normalise, flip, channels-last float16; ~12 ms a batch
here) run inline on the consuming thread vs on the hook thread, with a
"training step" of two 768x768 matmuls (~18 ms) on the consumer. One torch
thread each, so overlap needs no more cores than the two threads. Prints
samples/s of both and the ratio (ideal here: (12+18)/18 = 1.67).

    python bench/bench_transform_hook.py [DIR]     # DIR: scratch (default /tmp/npyload-bench-hook)
"""
import os
import sys
import time

import numpy as np
import torch

import npyload

torch.set_num_threads(1)
d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/npyload-bench-hook"
os.makedirs(d, exist_ok=True)
if not os.path.exists(f"{d}/x_0007.npy"):
    rng = np.random.default_rng(0)
    for i in range(8):
        np.save(f"{d}/x_{i:04d}.npy", rng.integers(0, 256, (512, 3, 64, 64), dtype=np.uint8))
mean = torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1)
std = torch.tensor([0.2, 0.2, 0.2]).view(1, 3, 1, 1)
w = torch.randn(768, 768)


def aug(b):
    x = b["images"].float().div_(255).sub_(mean).div_(std)
    return torch.flip(x, dims=[3]).contiguous(memory_format=torch.channels_last).half()


def step(x):
    for _ in range(2):
        w @ w


def run(hook):
    L = npyload.Loader({"images": f"{d}/x_*.npy"}, batch_size=256, num_workers=1, prefetch=3,
                       transform=aug if hook else None)
    n, t = 0, None
    for e in range(8):                      # epochs 0..2 warm up
        if e == 3:
            t, n = time.perf_counter(), 0
        L.set_epoch(e)
        for y in L:
            y = y if hook else aug(y)
            step(y)
            n += y.shape[0]
    return n / (time.perf_counter() - t)


for _ in range(3):
    a, b = run(False), run(True)
    print(f"inline {a:8.0f} samples/s   transform= {b:8.0f} samples/s   x{b / a:.2f}")
