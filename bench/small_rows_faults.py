#!/usr/bin/env python3
# usage: PYTHONPATH=build-regress/tree/py python3 bench/small_rows_faults.py [--rows DIR] [--batches N] [--read-ahead on|off] [--numpy] [--ceiling]
"""Where the small-rows benchmark's minor faults and kernel time go, per
batch (issue 37 item 5): the loader of bench/regress.py's small_rows
(CIFAR-like rows, 3x32x32 uint8 + int64 label, 256-row shuffled batches,
2 workers, prefetch 3 (4 slots), page cache), with getrusage(RUSAGE_SELF)
(every thread) and RUSAGE_THREAD (the consumer) read around windows of
batches: the first batches (the workers' first touch of their mappings) and
the rest (the steady state). --ceiling: the same around
npyload.copy_ceiling(loader, "gather") (the gather_copy ceiling, 2
threads), --numpy: around numpy's one-thread gather of the same rows in RAM
(X[idx]; Y[idx], as regress.py), both per 256-row batch's worth of bytes.

Figures move with the machine's load (kernel time most); faults do not.
Printed: one line per window: batches, rows/s, minor faults per batch,
user and system microseconds per batch (all threads), and the consumer's.
"""
import argparse
import resource
import sys
import time
from pathlib import Path

ROW_BYTES = 3 * 32 * 32 + 8
BATCH = 256


def usage():
    return (resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter())


def report(name, a, b, batches):
    (s0, t0, w0), (s1, t1, w1) = a, b
    nb = max(batches, 1e-9)
    print(f"{name:<22} {batches:8.0f} batches {batches * BATCH / (w1 - w0) / 1e6:6.2f} M rows/s  "
          f"minflt/batch {(s1.ru_minflt - s0.ru_minflt) / nb:8.2f}  "
          f"user us/batch {(s1.ru_utime - s0.ru_utime) * 1e6 / nb:7.1f}  "
          f"sys us/batch {(s1.ru_stime - s0.ru_stime) * 1e6 / nb:7.1f}  "
          f"(consumer: minflt {(t1.ru_minflt - t0.ru_minflt) / nb:6.2f} "
          f"sys us {(t1.ru_stime - t0.ru_stime) * 1e6 / nb:6.1f})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="/tmp/npyload-regress-data/rows100000")
    ap.add_argument("--batches", type=int, default=4000, help="batches after the first window")
    ap.add_argument("--first", type=int, default=200, help="batches of the first window")
    ap.add_argument("--read-ahead", choices=("on", "off"), default=None,
                    help="the Loader's read_ahead (default: its default, off for plain rows)")
    ap.add_argument("--numpy", action="store_true")
    ap.add_argument("--ceiling", action="store_true")
    a = ap.parse_args()
    import npyload
    rows = Path(a.rows)
    fields = {"x": f"{rows}/x_*.npy", "y": f"{rows}/y_*.npy"}
    kw = {"read_ahead": False} if a.read_ahead == "off" else {}
    L = npyload.Loader(fields, batch_size=BATCH, shuffle=True, seed=1, num_workers=2,
                       prefetch=3, output="numpy", **kw)
    if a.read_ahead == "on":
        # Python's read_ahead=True is the default (READ_AHEAD 0: read ahead
        # only where a batch has work after its reads, not for plain rows);
        # READ_AHEAD 1 (always) is C's, set here before the loader starts.
        L._opts[npyload._npyload.OPT_READ_AHEAD] = 1
        L._c.set(npyload._npyload.OPT_READ_AHEAD, 1)
    marks, n, epoch = [usage()], 0, 0
    want = (a.first, a.first + a.batches)
    try:
        while n < want[1]:
            L.set_epoch(epoch)
            epoch += 1
            for b in L:
                del b
                n += 1
                if n == want[0]:
                    marks.append(usage())
                if n >= want[1]:
                    break
        marks.append(usage())
        st = L.stats()
    finally:
        L.close()
    print(f"npyload {npyload.__file__}: requests gathered {st['gather_requests']}, "
          f"read {st['read_requests']}, batches read ahead {st.get('read_ahead_batches')}")
    report("loader first", marks[0], marks[1], a.first)
    report("loader steady", marks[1], marks[2], a.batches)
    if a.ceiling:
        L = npyload.Loader(fields, batch_size=BATCH, shuffle=True, seed=1, num_workers=2,
                           prefetch=3, output="numpy")
        u0 = usage()
        c = npyload.copy_ceiling(L, "gather", threads=2, seconds=2.0)
        u1 = usage()
        L.close()
        # every pass (warm-up and three timed) copies about c["bytes"]
        print(f"gather_copy: {c['gbps']:.2f} GB/s best pass; around the whole call:")
        report("gather_copy (call)", u0, u1, 4 * c["bytes"] / (BATCH * ROW_BYTES))
    if a.numpy:
        import numpy as np
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from regress import rows_in_ram  # the same arrays as regress.py's numpy side

        X, Y = rows_in_ram(rows, "x"), rows_in_ram(rows, "y")
        perm = np.random.default_rng(0).permutation(len(X))
        u0, i = usage(), 0
        for _ in range(a.batches):
            idx = perm[i:i + BATCH]
            i = i + BATCH if i + 2 * BATCH <= len(perm) else 0
            X[idx]
            Y[idx]
        report("numpy 1 thread", u0, usage(), a.batches)


if __name__ == "__main__":
    main()
