#!/usr/bin/env python3
"""Is npyload-bench's advice stable, with a real step? (issue 23's benchmark)

1. A first run without a step measures the machine's copy ceiling; the step
   is then set to 1.5 x the time that ceiling needs for one batch (a model
   step a little slower than the copy: a loader that keeps overlap can hide
   every read, one that does not stalls).
2. Two runs with that --compute-ms and a normalise transform on the images
   (--transform images=float32,mean=...,std=...): for each, the
   recommendation, its stall, the least stall measured, the close
   candidates the bench repeated, and the verdict.

    python3 bench/advice_stability.py IMAGES_GLOB HEATMAPS_GLOB OFFSETS_GLOB \
        [--bench build-rel/tools/npyload-bench] [--batch-size 128] [--seconds 3]

Prints one block per run and a last line saying whether the two
recommendations agree.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def bench(exe, fields, extra, out):
    cmd = [exe, *fields, *extra, "--quiet", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return json.loads(out.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images")
    ap.add_argument("heatmaps")
    ap.add_argument("offsets")
    ap.add_argument("--bench", default="build-rel/tools/npyload-bench")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    fields = [f"images={a.images}", f"heatmaps={a.heatmaps}", f"offsets={a.offsets}"]
    common = ["--shuffle", "--batch-size", str(a.batch_size), "--seconds", str(a.seconds)]
    tmp = Path(tempfile.mkdtemp(prefix="npyload-advice-"))
    first = bench(a.bench, fields, common + ["--workers", "1", "--prefetch", "2"],
                  tmp / "first.json")
    ref = first["config"]["ceiling_reference"]
    ceil = next(c for c in first["ceilings"] if c["name"] == ref)
    batch_bytes = first["config"]["batch_bytes"]
    copy_ms = batch_bytes / (ceil["gbps"] * 1e9) * 1e3
    step_ms = 1.5 * copy_ms
    print(f"batch {batch_bytes / 2**20:.1f} MiB; {ref} ceiling {ceil['gbps']:.2f} GB/s: "
          f"copy {copy_ms:.2f} ms/batch; step = 1.5 x copy = {step_ms:.2f} ms")
    norm = "images=float32,mean=0.5:0.5,std=0.25:0.25"
    recs = []
    for k in (1, 2):
        doc = bench(a.bench, fields, common + ["--compute-ms", f"{step_ms:.3f}",
                                               "--transform", norm], tmp / f"run{k}.json")
        rec = doc["recommendation"]
        ok = [r for r in doc["runs"] if r["ok"]]
        least = min(r["stall_pct"] for r in ok)
        recs.append((rec["workers"], rec["prefetch"]))
        print(f"run {k}: recommend num_workers={rec['workers']} prefetch={rec['prefetch']} "
              f"(Python prefetch={rec['prefetch'] - 1}): stall {rec['stall_pct']:.1f}%, "
              f"least measured {least:.1f}%, {rec['samples_per_s']:.0f} samples/s, "
              f"{rec['slot_mib']:.0f} MiB of slots")
        print(f"  {rec['criterion']}")
        if rec.get("close"):
            print(f"  {rec['close']}")
        print(f"  {rec['verdict']}")
        for r in sorted(ok, key=lambda r: (r["workers"], r["prefetch"])):
            print(f"    w={r['workers']} p={r['prefetch']}: stall {r['stall_pct']:5.1f}% "
                  f"{r['samples_per_s']:7.0f} samples/s x{r['repeats']}")
    same = recs[0] == recs[1]
    print(f"the two recommendations {'agree' if same else 'differ'}: {recs[0]} {recs[1]}")


if __name__ == "__main__":
    main()
