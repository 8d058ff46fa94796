#!/usr/bin/env python3
"""npyload against torch.utils.data.DataLoader on the same files, with the
same cores, in the same run.

    npyload-gen --preset captcha --out /tmp/x --files 8
    python3 bench/torch_compare.py --data /tmp/x [--seconds 5] [--cores 0,1]

torch configurations (both shuffle, measured in samples/s after the first
batch, so worker start-up is excluded):
  trainer   the captcha trainer's: a Dataset of whole files (one item = one
            file of 64 samples loaded with np.load, every field), batch_size=2
            files collated with torch.cat, num_workers 2 and 8,
            pin_memory=True when CUDA is available, shuffle=True.
  persample a Dataset of samples over np.load(mmap_mode='r') per file (one
            item = one sample), batch_size 128, the default collate,
            num_workers 2 and 8, shuffle=True.
npyload's side: `npyload-bench --json` (threads, 128-sample batches, full
shuffle) over --workers with the same counts, or the Python package with
--npyload python when it is importable. The ratio printed is npyload's
best samples/s over the torch configuration's samples/s.

Every process (this one, the DataLoader workers it forks and npyload-bench)
is pinned to the same CPU set (--cores; default: all this process may use).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def files_of(root, split):
    imgs = sorted(glob.glob(f"{root}/images/{split}/{split}_*.npy"))
    heat = sorted(glob.glob(f"{root}/labels/{split}/{split}_*_heatmaps.npy"))
    offs = sorted(glob.glob(f"{root}/labels/{split}/{split}_*_offsets.npy"))
    if not imgs or len(imgs) != len(heat) or len(imgs) != len(offs):
        sys.exit(f"torch_compare: {root}: expected the captcha layout "
                 f"(images/{split}/{split}_NNNN.npy and labels/{split}/...), "
                 f"found {len(imgs)} images, {len(heat)} heatmaps, {len(offs)} offsets")
    return imgs, heat, offs


# ---- torch datasets (module level so worker processes can pickle them) ----

def _torch():
    import torch
    return torch


class FileDataset:
    """The trainer's: one item is a whole file of every field."""

    def __init__(self, imgs, heat, offs):
        self.files = list(zip(imgs, heat, offs))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        torch = _torch()
        im, hm, of = self.files[i]
        return (torch.from_numpy(np.load(im)), torch.from_numpy(np.load(hm)),
                torch.from_numpy(np.load(of)))


def cat_collate(items):
    torch = _torch()
    return tuple(torch.cat([it[k] for it in items]) for k in range(3))


class SampleDataset:
    """One item is one sample; files opened with mmap_mode='r', lazily, once
    per worker process."""

    def __init__(self, imgs, heat, offs):
        self.paths = [imgs, heat, offs]
        counts = [np.load(p, mmap_mode="r").shape[0] for p in imgs]
        self.starts = np.cumsum([0] + counts)
        self.maps = None

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, i):
        if self.maps is None:
            self.maps = [[np.load(p, mmap_mode="r") for p in ps] for ps in self.paths]
        f = int(np.searchsorted(self.starts, i, side="right") - 1)
        j = i - int(self.starts[f])
        return tuple(np.array(m[f][j]) for m in self.maps)


def measure_torch(kind, imgs, heat, offs, workers, seconds):
    torch = _torch()
    from torch.utils.data import DataLoader
    pin = torch.cuda.is_available()
    if kind == "trainer":
        ds = FileDataset(imgs, heat, offs)
        dl = DataLoader(ds, batch_size=2, shuffle=True, num_workers=workers,
                        collate_fn=cat_collate, pin_memory=pin,
                        persistent_workers=workers > 0)
    else:
        ds = SampleDataset(imgs, heat, offs)
        dl = DataLoader(ds, batch_size=128, shuffle=True, num_workers=workers,
                        pin_memory=pin, persistent_workers=workers > 0)
    samples, nbytes, t0 = 0, 0, None
    deadline = None
    while True:
        for batch in dl:
            if t0 is None:  # the first batch pays for worker start-up
                t0 = time.perf_counter()
                deadline = t0 + seconds
                continue
            samples += batch[0].shape[0]
            nbytes += sum(t.numel() * t.element_size() for t in batch)
            if time.perf_counter() >= deadline:
                break
        if deadline is not None and time.perf_counter() >= deadline:
            break
    wall = time.perf_counter() - t0
    del dl
    return {"samples_per_s": samples / wall, "gbps": nbytes / wall / 1e9,
            "samples": samples, "wall_s": wall}


def measure_npyload_bench(exe, root, split, workers, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [str(exe),
               f"images={root}/images/{split}/{split}_*.npy",
               f"heatmaps={root}/labels/{split}/{split}_*_heatmaps.npy",
               f"offsets={root}/labels/{split}/{split}_*_offsets.npy",
               "--shuffle", "--batch-size", "128",
               "--workers", ",".join(map(str, workers)),
               "--prefetch", "1,2,4", "--seconds", str(seconds),
               "--quiet", "--json", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"torch_compare: npyload-bench failed:\n{p.stdout}{p.stderr}")
        doc = json.loads(out.read_text())
    best = {}
    for r in doc["runs"]:
        if r["ok"] and r["samples_per_s"] > best.get(r["workers"], {}).get("samples_per_s", 0):
            best[r["workers"]] = r
    return {w: {"samples_per_s": r["samples_per_s"], "gbps": r["gbps"],
                "prefetch": r["prefetch"], "io": r["io_used"]}
            for w, r in best.items()}, doc


def measure_npyload_python(root, split, workers, seconds):
    import npyload
    res = {}
    for w in workers:
        best = None
        for p in (1, 2, 4):
            L = npyload.Loader({
                "images": f"{root}/images/{split}/{split}_*.npy",
                "heatmaps": f"{root}/labels/{split}/{split}_*_heatmaps.npy",
                "offsets": f"{root}/labels/{split}/{split}_*_offsets.npy"},
                batch_size=128, shuffle=True, num_workers=w, prefetch=p)
            samples, t0, epoch = 0, None, 0
            while True:
                L.set_epoch(epoch)
                for b in L:
                    if t0 is None:
                        t0 = time.perf_counter()
                        continue
                    samples += len(b.indices)
                    if time.perf_counter() - t0 >= seconds:
                        break
                epoch += 1
                if t0 is not None and time.perf_counter() - t0 >= seconds:
                    break
            sps = samples / (time.perf_counter() - t0)
            del L
            if best is None or sps > best["samples_per_s"]:
                best = {"samples_per_s": sps, "prefetch": p, "io": "auto"}
        res[w] = best
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="root written by npyload-gen --preset captcha")
    ap.add_argument("--split", default="train")
    ap.add_argument("--seconds", type=float, default=5.0, help="per configuration")
    ap.add_argument("--torch-workers", default="2,8")
    ap.add_argument("--cores", default=None,
                    help="CPU list for every process, e.g. 0,1 (default: all allowed)")
    ap.add_argument("--npyload", choices=("bench", "python"), default="bench")
    ap.add_argument("--bench-exe", default=None,
                    help="npyload-bench (default $NPYLOAD_BUILD_DIR/tools/npyload-bench, "
                         "then <repo>/build, then PATH)")
    ap.add_argument("--json", default=None, help="write every number here")
    a = ap.parse_args()

    if a.cores:
        os.sched_setaffinity(0, {int(c) for c in a.cores.split(",")})
    cores = sorted(os.sched_getaffinity(0))
    imgs, heat, offs = files_of(a.data, a.split)
    tw = [int(w) for w in a.torch_workers.split(",")]

    import torch
    print(f"torch {torch.__version__}, numpy {np.__version__}, cores {cores}, "
          f"{len(imgs)} files, cuda={torch.cuda.is_available()}")

    # npyload first (threads; the same worker counts, capped at nothing: a
    # thread costs no process).
    if a.npyload == "python":
        npy = measure_npyload_python(a.data, a.split, tw, a.seconds)
        doc = None
    else:
        exe = a.bench_exe
        if exe is None:
            cands = [Path(os.environ.get("NPYLOAD_BUILD_DIR", REPO / "build")) / "tools" / "npyload-bench"]
            exe = next((c for c in cands if c.is_file()), None) or "npyload-bench"
        npy, doc = measure_npyload_bench(exe, a.data, a.split, tw, a.seconds)
    best_npy = max(npy.values(), key=lambda r: r["samples_per_s"])

    results = []
    for kind in ("trainer", "persample"):
        for w in tw:
            r = measure_torch(kind, imgs, heat, offs, w, a.seconds)
            r.update(kind=kind, workers=w)
            n = npy.get(w, best_npy)
            r["npyload_samples_per_s"] = n["samples_per_s"]
            r["ratio_same_workers"] = n["samples_per_s"] / r["samples_per_s"]
            r["ratio_best"] = best_npy["samples_per_s"] / r["samples_per_s"]
            results.append(r)

    print(f"\n{'loader':<34} {'samples/s':>10} {'GB/s':>7} {'npyload/torch':>14}")
    for w, n in sorted(npy.items()):
        gb = f"{n['gbps']:.2f}" if "gbps" in n else "-"
        name = "npyload workers=%d prefetch=%d" % (w, n["prefetch"])
        print(f"{name:<34} {n['samples_per_s']:>10.0f} {gb:>7}")
    for r in results:
        name = f"torch {r['kind']} num_workers={r['workers']}"
        print(f"{name:<34} {r['samples_per_s']:>10.0f} {r['gbps']:>7.2f} "
              f"{r['ratio_same_workers']:>13.1f}x")
    worst = min(r["ratio_best"] for r in results)
    print(f"\nnpyload best: {best_npy['samples_per_s']:.0f} samples/s; "
          f"ratio against the best torch configuration: {worst:.1f}x "
          f"(goal: >= 10x)")
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"cores": cores, "torch": results, "npyload": npy,
             "ratio_vs_best_torch": worst, "npyload_bench": doc}, indent=2))


if __name__ == "__main__":
    main()
