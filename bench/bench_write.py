"""npyload.write throughput (issue 26): an array source against `dd` to the
same disk, map-style Python Datasets of 3 KiB and 1 MiB samples, and the
captcha example from PNGs. Indicative, not a test.

    python3 bench/bench_write.py [--dir /tmp/bw] [--gib 2]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import npyload


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class DS:
    def __init__(self, n, nbytes):
        self.n, self.k = n, nbytes // 4

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(self.k, i, np.float32), "y": np.int64(i)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/bw")
    ap.add_argument("--gib", type=float, default=2.0)
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    res = {}
    nbytes = int(a.gib * 2 ** 30)
    # dd: the disk's sequential write with fsync, the same bytes
    dd = subprocess.run(["dd", "if=/dev/zero", f"of={a.dir}/dd.bin", "bs=4M",
                         f"count={nbytes >> 22}", "conv=fsync"], capture_output=True, text=True)
    res["dd_gbps"] = float(dd.stderr.strip().splitlines()[-1].split(",")[-1].split()[0]) \
        if "GB/s" in dd.stderr else dd.stderr.strip().splitlines()[-1]
    os.unlink(f"{a.dir}/dd.bin")
    n = nbytes // (1 << 20)
    arr = {"x": np.random.default_rng(0).integers(0, 255, (n, 1 << 20), dtype=np.uint8)}
    s, _ = timed(lambda: npyload.write(arr, f"{a.dir}/arr", samples_per_file=64,
                                       progress=False))
    res["array_gbps"] = round(nbytes / s / 1e9, 3)
    shutil.rmtree(f"{a.dir}/arr")
    for name, sb, count in (("ds_3KiB", 3 << 10, 100_000), ("ds_1MiB", 1 << 20, 1024)):
        s, _ = timed(lambda: npyload.write(DS(count, sb), f"{a.dir}/{name}",
                                           samples_per_file=256 if sb < 65536 else 64,
                                           progress=False))
        res[name] = {"samples_per_s": round(count / s), "gbps": round(count * sb / s / 1e9, 3)}
        shutil.rmtree(f"{a.dir}/{name}")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
