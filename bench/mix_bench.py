"""Mixing two sources against the same bytes from one source (issue 38's
benchmark): page cache, the captcha layout (npyload-gen --preset captcha).

The dataset's files are split in two halves: "one" reads all of them as one
source, "mix" reads the halves as two sources weighted by their sizes (so
an epoch reads every sample once either way). Same batch size, workers,
shuffle and bytes; each round runs one epoch of each, in alternating order,
after a warm-up epoch that puts the files in the page cache. Prints
samples/s per round and the ratio of the medians and of the bests
(mix / one; the target is >= 0.97).

    python bench/mix_bench.py --data /tmp/mixbench --files 16 --rounds 5

Writes the dataset with npyload-gen (the build's, or --gen PATH) unless
DIR already holds it. Timings on a shared machine are noisy: compare the
ratio, run on a quiet machine for figures."""
import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

import npyload


def fields_of(root, files):
    imgs = sorted(glob.glob(os.path.join(root, "images/train/train_*.npy")))[:files]
    heat = sorted(glob.glob(os.path.join(root, "labels/train/train_*_heatmaps.npy")))[:files]
    offs = sorted(glob.glob(os.path.join(root, "labels/train/train_*_offsets.npy")))[:files]
    return {"images": imgs, "heatmaps": heat, "offsets": offs}


def epoch(loader):
    t0 = time.perf_counter()
    n = 0
    for b in loader:
        n += b.num_samples
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/tmp/npyload-mixbench")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--gen", default=shutil.which("npyload-gen") or "build/tools/npyload-gen")
    a = ap.parse_args()
    if len(glob.glob(os.path.join(a.data, "images/train/train_*.npy"))) < a.files:
        subprocess.run([a.gen, "--preset", "captcha", "--out", a.data,
                        "--files", str(a.files)], check=True)
    f = fields_of(a.data, a.files)
    half = a.files // 2
    one = {k: v for k, v in f.items()}
    two = {"real": {k: v[:half] for k, v in f.items()},
           "synth": {k: v[half:] for k, v in f.items()}}
    kw = dict(batch_size=a.batch_size, shuffle=True, seed=0, num_workers=a.num_workers,
              output="numpy")
    L1 = npyload.Loader(one, **kw)
    L2 = npyload.Loader(sources=two, **kw)  # weights: the sources' sizes
    epoch(L1)  # warm the page cache
    epoch(L2)
    r1, r2 = [], []
    for r in range(a.rounds):
        for name, L, out in ((("one", L1, r1), ("mix", L2, r2)) if r % 2 == 0
                             else (("mix", L2, r2), ("one", L1, r1))):
            L.set_epoch(r + 1)
            out.append(epoch(L))
        print(f"round {r}: one {r1[-1]:.0f} samples/s, mix {r2[-1]:.0f} samples/s",
              flush=True)
    m1, m2 = statistics.median(r1), statistics.median(r2)
    print(f"median: one {m1:.0f}, mix {m2:.0f} samples/s; ratio mix/one {m2 / m1:.3f} "
          f"(best {max(r2) / max(r1):.3f})")
    print("per source:", L2.stats()["source_samples"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
