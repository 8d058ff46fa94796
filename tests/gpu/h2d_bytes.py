#!/usr/bin/env python3
"""Helper of tests/gpu/device-check.sh: the bytes that cross PCIe per batch
on the captcha preset, with device kernels after the copy, against what
the host engine sends (its output), for

  - images with Transform(float16, mean/std, hflip=0.5): the stored
    float32 (and a 16-byte record per row) instead of the float16 output;
  - images packed narrowed (npyload.pack(narrow=True, store=True): the
    8-bit gray levels as one-byte codes), no transform and with the same
    transform: the codes instead of the float32 values.

For each case the device batches are compared with the host loader's
(bit for bit; NaN payloads may differ) and the loader's h2d_bytes with
the stored (or code) bytes plus the records, exactly.

    h2d_bytes.py --data DATA --out DIR --json FILE

Needs torch with CUDA; without it the JSON says why and the exit is 1.
"""
import argparse
import glob
import json
import os
import sys


def same(y, x, torch):
    y, x = y.cpu().contiguous(), x.cpu().contiguous()
    nan = torch.isnan(x.float())
    ib = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[x.element_size()]
    return bool(torch.equal(torch.isnan(y.float()), nan) and
                torch.equal(y.view(ib)[~nan], x.view(ib)[~nan]))


def measure(npyload, torch, name, paths, transform, batches):
    """Host and device loaders over paths: the first batches compared, the
    device loader's h2d_bytes and the host output's bytes per batch."""
    kw = dict(batch_size=64, shuffle=True, seed=1, num_workers=4)
    if transform is not None:
        kw["transforms"] = {"images": transform}
    f = {"images": paths}
    ok, rows, out_bytes, n = True, 0, 0, 0
    with npyload.Loader(f, device="cpu", **kw) as host, \
            npyload.Loader(f, device="cuda:0", **kw) as dev:
        for bh, bd in zip(host, dev):
            x, y = bh["images"], bd["images"]
            ok &= same(y, x, torch)
            rows += len(bh.indices)
            out_bytes += x.element_size() * x.nelement()
            n += 1
            if n == batches:
                break
        torch.cuda.synchronize()
        h2d = dev.stats()["h2d_bytes"]
    return {"name": name, "batches": n, "rows": rows, "equal_to_host": ok,
            "host_engine_bytes_per_batch": out_bytes // max(1, n), "h2d_bytes_total": h2d}


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--batches", type=int, default=6)
    a = ap.parse_args(argv)
    doc = {"ok": False, "cases": []}
    try:
        import numpy as np
        import torch
        import npyload
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        doc["why"] = f"{type(e).__name__}: {e}"
        open(a.json, "w").write(json.dumps(doc, indent=1))
        print(doc["why"])
        return 1
    images = sorted(glob.glob(os.path.join(a.data, "images/train/train_*.npy")))[:4]
    shape = np.load(images[0], mmap_mode="r").shape[1:]
    elems = int(np.prod(shape))
    os.makedirs(a.out, exist_ok=True)
    narrowed = []
    for p in images:
        q = os.path.join(a.out, os.path.basename(p)[:-4] + ".narrow.npy")
        npyload.pack([p], narrow=True, store=True, out=q, force=True, threads=4)
        narrowed.append(q)
    t = npyload.Transform("float16", mean=(0.5, 0.5), std=(0.25, 0.5), hflip=0.5)
    cases = [("images f32 -> f16 normalised, hflip", images, t, elems * 4 + 16),
             ("narrowed images, no transform", narrowed, None, elems + 16),
             ("narrowed images -> f16 normalised, hflip", narrowed, t, elems + 16)]
    ok = True
    for name, paths, tr, per_row in cases:
        c = measure(npyload, torch, name, paths, tr, a.batches)
        # h2d_bytes is a whole number of rows of per_row bytes (the loader
        # may have copied more batches than were compared): the stored (or
        # code) bytes and one record each, nothing else crossed.
        c["h2d_bytes_per_row"] = per_row
        c["h2d_bytes_per_batch"] = 64 * per_row
        c["ok"] = bool(c["equal_to_host"] and c["h2d_bytes_total"] % per_row == 0 and
                       c["h2d_bytes_total"] >= c["rows"] * per_row)
        ok &= c["ok"]
        doc["cases"].append(c)
        print(f"{name}: {c['h2d_bytes_per_batch']} bytes per batch of 64 cross PCIe "
              f"(the host engine's output: {c['host_engine_bytes_per_batch']}); "
              f"{'ok' if c['ok'] else 'FAILED'}")
    doc["ok"] = ok
    open(a.json, "w").write(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
