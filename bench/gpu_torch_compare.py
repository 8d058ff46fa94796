#!/usr/bin/env python3
"""Batches delivered *on the GPU*: npyload (device="cuda") against
torch.utils.data.DataLoader with pin_memory=True and
.to(device, non_blocking=True), on the same captcha files, the same batch
size (128 samples), the same worker counts, in the same run.

    python3 bench/gpu_torch_compare.py --data DIR [--seconds 4] [--workers 2,8]
                                       [--json FILE]

torch side: bench/torch_compare.py's "trainer" dataset (one item = one file of
64 samples, batch_size=2 files, torch.cat collate) and "persample" dataset
(one item = one sample, default collate), each with pin_memory=True, and
every tensor moved with .to("cuda", non_blocking=True). npyload side: the
Python package with device="cuda", prefetch 4. Both are measured after their
first batch, with torch.cuda.synchronize() before the clock stops; a step
reads one value of every field on the GPU so nothing is skipped.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_compare as tc  # noqa: E402  (the torch datasets, shared)


def _consume(torch, tensors, acc):
    # A touch of every field on the GPU, queued: no host sync per step.
    for t in tensors:
        acc += t.view(-1)[0].double()
    return acc


def measure_torch(kind, imgs, heat, offs, workers, seconds, device):
    import torch
    from torch.utils.data import DataLoader
    if kind == "trainer":
        ds = tc.FileDataset(imgs, heat, offs)
        dl = DataLoader(ds, batch_size=2, shuffle=True, num_workers=workers,
                        collate_fn=tc.cat_collate, pin_memory=True,
                        persistent_workers=workers > 0)
    else:
        ds = tc.SampleDataset(imgs, heat, offs)
        dl = DataLoader(ds, batch_size=128, shuffle=True, num_workers=workers,
                        pin_memory=True, persistent_workers=workers > 0)
    acc = torch.zeros((), dtype=torch.float64, device=device)
    samples, t0, deadline = 0, None, None
    while True:
        for batch in dl:
            gpu = [t.to(device, non_blocking=True) for t in batch]
            if t0 is None:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                deadline = t0 + seconds
                continue
            acc = _consume(torch, gpu, acc)
            samples += gpu[0].shape[0]
            if time.perf_counter() >= deadline:
                break
        if deadline is not None and time.perf_counter() >= deadline:
            break
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    del dl
    return {"samples_per_s": samples / wall, "samples": samples, "wall_s": wall}


def measure_npyload(root, split, workers, seconds, device):
    import torch
    import npyload
    L = npyload.Loader({
        "images": f"{root}/images/{split}/{split}_*.npy",
        "heatmaps": f"{root}/labels/{split}/{split}_*_heatmaps.npy",
        "offsets": f"{root}/labels/{split}/{split}_*_offsets.npy"},
        batch_size=128, shuffle=True, num_workers=workers, prefetch=4, device=device)
    acc = torch.zeros((), dtype=torch.float64, device=device)
    samples, t0, epoch = 0, None, 0
    while True:
        L.set_epoch(epoch)
        for b in L:
            if t0 is None:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                continue
            acc = _consume(torch, [b["images"], b["heatmaps"], b["offsets"]], acc)
            samples += b["images"].shape[0]
            if time.perf_counter() - t0 >= seconds:
                break
        epoch += 1
        if t0 is not None and time.perf_counter() - t0 >= seconds:
            break
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    del L
    return {"samples_per_s": samples / wall, "samples": samples, "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--workers", default="2,8")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("gpu_torch_compare: torch sees no CUDA device")
    imgs, heat, offs = tc.files_of(a.data, a.split)
    ws = [int(w) for w in a.workers.split(",")]
    rows = []
    for w in ws:
        rows.append(dict(loader="npyload", workers=w,
                         **measure_npyload(a.data, a.split, w, a.seconds, a.device)))
        for kind in ("trainer", "persample"):
            rows.append(dict(loader=f"torch-{kind}", workers=w,
                             **measure_torch(kind, imgs, heat, offs, w, a.seconds, a.device)))
    best_npy = max(r["samples_per_s"] for r in rows if r["loader"] == "npyload")
    best_torch = max(r["samples_per_s"] for r in rows if r["loader"] != "npyload")
    print(f"{'loader':<22} {'workers':>7} {'samples/s':>10}")
    for r in rows:
        print(f"{r['loader']:<22} {r['workers']:>7} {r['samples_per_s']:>10.0f}")
    print(f"npyload best / torch best (pin_memory + non_blocking): "
          f"{best_npy / best_torch:.2f}x")
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "rows": rows, "npyload_best": best_npy, "torch_best": best_torch,
           "ratio": best_npy / best_torch}
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
