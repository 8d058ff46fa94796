#!/usr/bin/env python3
"""npyload against torch.utils.data.DataLoader on the same files, with the
same cores, in the same run, repeated.

    npyload-gen --preset captcha --out /tmp/x --files 8
    python3 bench/torch_compare.py --data /tmp/x [--seconds 3] [--repeats 5] [--cores 0,1]

Every repeat measures npyload and every torch configuration one after the
other, and the ratios are taken within the repeat (npyload's best
configuration of that repeat over each torch configuration of that repeat),
so that a machine whose speed drifts (other jobs, a shared VM) moves both
sides together. The summary gives, over the repeats, the range (min-max)
and the median of samples/s and of the ratios: quote the ranges, not the
best repeat. --markdown prints the README's table.

torch configurations (all shuffle, 128 samples per step, measured in
samples/s after the first batch, so worker start-up is excluded;
pin_memory=True when CUDA is available; persistent_workers when
num_workers > 0), each at --torch-workers (default 0,2,8):
  trainer   the captcha trainer's: a Dataset of whole files (one item = one
            file of 64 samples loaded with np.load, every field), batch_size=2
            files collated with torch.cat.
  persample a Dataset of samples over np.load(mmap_mode='r') per file (one
            item = one sample), batch_size=128, the default collate.
  batched   the fastest DataLoader pattern we know for these files: a
            BatchSampler(RandomSampler, 128) as the sampler with
            batch_size=None, and a Dataset whose __getitem__ takes the
            batch's 128 indices and preads each row straight into one
            preallocated array per field (one copy, no collate, no per-sample
            tensors).
npyload's side: the Python package's npyload.Loader (--npyload python, the
default; the extension that `pip install .` builds is a Release build) or
`npyload-bench --json` (--npyload bench), 128-sample batches, full shuffle,
at --npyload-workers threads (default 1,2) with --prefetch (default 4); its
best worker count in the repeat is the numerator of every ratio.

Every process (this one, the DataLoader workers it forks and npyload-bench)
is pinned to the same CPU set (--cores; default: all this process may use).
"""
import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
KINDS = ("trainer", "persample", "batched")
BATCH = 128


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


class BatchedDataset:
    """One item is a whole batch: __getitem__ takes a list of sample indices
    (from a BatchSampler used as the sampler, batch_size=None) and preads
    each row into one array per field. Files are opened lazily, once per
    worker process."""

    def __init__(self, imgs, heat, offs):
        self.paths = [imgs, heat, offs]
        self.fields = []                 # (per-sample shape, dtype, data offsets)
        for ps in self.paths:
            maps = [np.load(p, mmap_mode="r") for p in ps]
            self.fields.append((maps[0].shape[1:], maps[0].dtype, [m.offset for m in maps]))
        counts = [np.load(p, mmap_mode="r").shape[0] for p in imgs]
        self.starts = np.cumsum([0] + counts)
        self.fds = None

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, indices):
        torch = _torch()
        if self.fds is None:
            self.fds = [[os.open(p, os.O_RDONLY) for p in ps] for ps in self.paths]
        idx = np.asarray(indices)
        f = np.searchsorted(self.starts, idx, side="right") - 1
        j = idx - self.starts[f]
        out = []
        for fds, (shape, dtype, offsets) in zip(self.fds, self.fields):
            a = np.empty((len(idx),) + shape, dtype)
            row = a[0].nbytes
            mv = memoryview(a.reshape(-1).view(np.uint8))
            for k in range(len(idx)):
                dst = mv[k * row:(k + 1) * row]
                if os.preadv(fds[f[k]], [dst], offsets[f[k]] + int(j[k]) * row) != row:
                    raise OSError(f"{self.paths[0][f[k]]}: short read")
            out.append(torch.from_numpy(a))
        return tuple(out)


def make_torch_loader(kind, imgs, heat, offs, workers):
    torch = _torch()
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler
    common = dict(num_workers=workers, pin_memory=torch.cuda.is_available(),
                  persistent_workers=workers > 0)
    if kind == "trainer":
        ds = FileDataset(imgs, heat, offs)
        return DataLoader(ds, batch_size=BATCH // 64, shuffle=True, collate_fn=cat_collate,
                          **common)
    if kind == "persample":
        return DataLoader(SampleDataset(imgs, heat, offs), batch_size=BATCH, shuffle=True,
                          **common)
    ds = BatchedDataset(imgs, heat, offs)
    return DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), BATCH, drop_last=False),
                      batch_size=None, **common)


def timed_loop(batches_of_epoch, seconds):
    """samples/s and bytes/s over `seconds` after the first batch, running
    epochs as needed. batches_of_epoch(e) -> an iterable of tuples of tensors."""
    samples, nbytes, t0, epoch = 0, 0, None, 0
    while True:
        for batch in batches_of_epoch(epoch):
            if t0 is None:  # the first batch pays for worker start-up
                t0 = time.perf_counter()
                continue
            samples += batch[0].shape[0]
            nbytes += sum(t.numel() * t.element_size() for t in batch)
            if time.perf_counter() - t0 >= seconds:
                break
        epoch += 1
        if t0 is not None and time.perf_counter() - t0 >= seconds:
            break
    wall = time.perf_counter() - t0
    return {"samples_per_s": samples / wall, "gbps": nbytes / wall / 1e9}


def measure_torch(kind, imgs, heat, offs, workers, seconds):
    dl = make_torch_loader(kind, imgs, heat, offs, workers)
    r = timed_loop(lambda e: dl, seconds)
    del dl
    return r


def measure_npyload_python(root, split, workers, prefetch, seconds):
    import npyload
    res = {}
    for w in workers:
        L = npyload.Loader({
            "images": f"{root}/images/{split}/{split}_*.npy",
            "heatmaps": f"{root}/labels/{split}/{split}_*_heatmaps.npy",
            "offsets": f"{root}/labels/{split}/{split}_*_offsets.npy"},
            batch_size=BATCH, shuffle=True, num_workers=w, prefetch=prefetch,
            as_tuple=True)

        def epoch(e):
            L.set_epoch(e)
            return L
        r = timed_loop(epoch, seconds)
        r.update(io=L.backend)
        L.close()
        res[w] = r
    return res


def measure_npyload_bench(exe, root, split, workers, prefetch, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [str(exe),
               f"images={root}/images/{split}/{split}_*.npy",
               f"heatmaps={root}/labels/{split}/{split}_*_heatmaps.npy",
               f"offsets={root}/labels/{split}/{split}_*_offsets.npy",
               "--shuffle", "--batch-size", str(BATCH),
               "--workers", ",".join(map(str, workers)),
               "--prefetch", str(prefetch), "--seconds", str(seconds),
               "--quiet", "--json", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"torch_compare: npyload-bench failed:\n{p.stdout}{p.stderr}")
        doc = json.loads(out.read_text())
    res = {}
    for r in doc["runs"]:
        if r["ok"] and r["samples_per_s"] > res.get(r["workers"], {}).get("samples_per_s", 0):
            res[r["workers"]] = {"samples_per_s": r["samples_per_s"], "gbps": r["gbps"],
                                 "io": r["io_used"]}
    return res


def span(values, fmt):
    lo, med, hi = min(values), statistics.median(values), max(values)
    return f"{fmt(lo)}-{fmt(hi)} ({fmt(med)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="root written by npyload-gen --preset captcha")
    ap.add_argument("--split", default="train")
    ap.add_argument("--seconds", type=float, default=3.0, help="per configuration and repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-workers", default="0,2,8")
    ap.add_argument("--kinds", default=",".join(KINDS), help="torch configurations")
    ap.add_argument("--npyload", choices=("python", "bench"), default="python")
    ap.add_argument("--npyload-workers", default="1,2")
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--cores", default=None,
                    help="CPU list for every process, e.g. 0,1 (default: all allowed)")
    ap.add_argument("--bench-exe", default=None,
                    help="npyload-bench (default $NPYLOAD_BUILD_DIR/tools/npyload-bench, "
                         "then <repo>/build, then PATH)")
    ap.add_argument("--json", default=None, help="write every number here")
    ap.add_argument("--markdown", action="store_true", help="print the README's table")
    a = ap.parse_args()

    if a.cores:
        os.sched_setaffinity(0, {int(c) for c in a.cores.split(",")})
    cores = sorted(os.sched_getaffinity(0))
    imgs, heat, offs = files_of(a.data, a.split)
    tw = [int(w) for w in a.torch_workers.split(",")]
    nw = [int(w) for w in a.npyload_workers.split(",")]
    kinds = a.kinds.split(",")
    for k in kinds:
        if k not in KINDS:
            sys.exit(f"torch_compare: --kinds: {k!r} is none of {', '.join(KINDS)}")

    import torch
    if a.npyload == "python":
        import npyload
        who = f"npyload {npyload.__version__} (Python Loader)"
    else:
        exe = a.bench_exe
        if exe is None:
            cand = Path(os.environ.get("NPYLOAD_BUILD_DIR", REPO / "build")) / "tools" / "npyload-bench"
            exe = cand if cand.is_file() else "npyload-bench"
        who = f"npyload-bench ({exe})"
    print(f"{who}, torch {torch.__version__}, numpy {np.__version__}, "
          f"cores {cores} of {os.cpu_count()}, {platform.machine()}, {len(imgs)} files, "
          f"cuda={torch.cuda.is_available()}; {a.repeats} repeats of {a.seconds:g} s "
          f"per configuration", flush=True)

    configs = [(k, w) for k in kinds for w in tw]
    repeats = []
    for rep in range(a.repeats):
        if a.npyload == "python":
            npy = measure_npyload_python(a.data, a.split, nw, a.prefetch, a.seconds)
        else:
            npy = measure_npyload_bench(exe, a.data, a.split, nw, a.prefetch, a.seconds)
        best_w = max(npy, key=lambda w: npy[w]["samples_per_s"])
        best = npy[best_w]["samples_per_s"]
        torch_runs = {}
        for kind, w in configs:
            torch_runs[f"{kind} num_workers={w}"] = measure_torch(kind, imgs, heat, offs, w,
                                                                 a.seconds)
        best_torch = max(torch_runs, key=lambda c: torch_runs[c]["samples_per_s"])
        r = {"npyload": {str(w): v for w, v in npy.items()}, "npyload_best_workers": best_w,
             "torch": torch_runs, "best_torch": best_torch,
             "ratio": {c: best / v["samples_per_s"] for c, v in torch_runs.items()}}
        r["ratio_vs_best_torch"] = r["ratio"][best_torch]
        repeats.append(r)
        print(f"repeat {rep + 1}/{a.repeats}: npyload {best:.0f} samples/s "
              f"(workers={best_w}); best torch {best_torch} "
              f"{torch_runs[best_torch]['samples_per_s']:.0f}; "
              f"ratio {r['ratio_vs_best_torch']:.1f}x", flush=True)

    n0 = lambda x: f"{x:,.0f}"     # noqa: E731
    r1 = lambda x: f"{x:.1f}x"     # noqa: E731
    rows = []
    for w in nw:
        rows.append((f"npyload, {w} worker thread{'s' if w > 1 else ''} (prefetch {a.prefetch})",
                     span([r["npyload"][str(w)]["samples_per_s"] for r in repeats], n0), ""))
    for c in torch_runs:
        rows.append((f"torch {c}",
                     span([r["torch"][c]["samples_per_s"] for r in repeats], n0),
                     span([r["ratio"][c] for r in repeats], r1)))
    vs_best = [r["ratio_vs_best_torch"] for r in repeats]
    bests = sorted({r["best_torch"] for r in repeats})
    if a.markdown:
        print("\n| loader | samples/s, min-max (median) | npyload best / torch, min-max (median) |")
        print("|---|---|---|")
        for name, s, q in rows:
            print(f"| {name} | {s} | {q} |")
        print(f"| **npyload best / best torch configuration** ({', '.join(bests)}) | | "
              f"**{span(vs_best, r1)}** |")
    else:
        print(f"\n{'loader':<40} {'samples/s min-max (median)':>30} {'npyload/torch':>26}")
        for name, s, q in rows:
            print(f"{name:<40} {s:>30} {q:>26}")
    print(f"\nnpyload's best over the best torch configuration ({', '.join(bests)}), "
          f"{a.repeats} repeats: {span(vs_best, r1)}")
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"cores": cores, "seconds": a.seconds, "npyload_side": a.npyload,
             "repeats": repeats, "ratio_vs_best_torch": {
                 "min": min(vs_best), "median": statistics.median(vs_best),
                 "max": max(vs_best)}}, indent=2))


if __name__ == "__main__":
    main()
