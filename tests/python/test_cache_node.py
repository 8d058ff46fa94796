"""One fetch per block per node, and npyload.prefetch / npyload-prefetch.

Real processes share one cache_dir, reading from the tests' own HTTP server
(weed_server.FileServer, which records every ranged GET) through the tests'
throttling proxy, so that their fetches overlap in time. The truth: the
server's record of which bytes were asked for (each cache block must be
covered by exactly one GET in all), and numpy's reading of the files that
are served (every batch, every filled block compared).

Covered: several loader processes and a prefetch process reading one cold
directory at once fetch each block once; a fetcher SIGKILLed in the middle
of a block leaves it locked only while it lives (a waiting process then
fetches it, once, and reads correct bytes); prefetch fills in sample order
and stops at its budget (a part of a dataset: the first samples of every
field); a second prefetch fetches nothing; the command line fills the same
blocks with a progress report; errors name what is wrong.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import npyload

sys.path.insert(0, os.path.dirname(__file__))
from weed_server import FileServer, ThrottleProxy  # noqa: E402

if not npyload.build_info()["remote_compiled"]:
    pytest.skip("this build has no remote support (libcurl, expat)", allow_module_level=True)

BLOCK = 64 << 10


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two fields, five files each, with sizes that are not block multiples;
    returns (root, {field: [relative paths]}, numpy's arrays)."""
    root = tmp_path_factory.mktemp("node_data")
    rng = np.random.default_rng(5)
    rel, ref = {}, {}
    counts = [37, 41, 29, 50, 33]
    for name, shape in (("images", (3, 40, 40)), ("labels", (250,))):
        arrs = [rng.standard_normal((n,) + shape).astype(np.float32) for n in counts]
        rel[name] = []
        for i, a in enumerate(arrs):
            p = f"{name}/{name}_{i:04d}.npy"
            (root / name).mkdir(exist_ok=True)
            np.save(root / p, a)
            rel[name].append(p)
        ref[name] = np.concatenate(arrs)
    return root, rel, ref


def blocks_of(root, rel_paths):
    """{(path, k): length} of every cache block of the files."""
    out = {}
    for rp in rel_paths:
        size = os.path.getsize(os.path.join(root, rp))
        for k in range((size + BLOCK - 1) // BLOCK):
            out[("/" + rp, k)] = min(BLOCK, size - k * BLOCK)
    return out


def gets_per_block(srv, blocks):
    """How many ranged GETs covered each block whole (a probe of the first
    4 KiB covers none: blocks are 64 KiB)."""
    n = {b: 0 for b in blocks}
    with srv.lock:
        ranges = list(srv.ranges)
    for path, a, b in ranges:
        end = b + 1 if b is not None else None
        for (p, k), ln in blocks.items():
            if p == path and a <= k * BLOCK and (end is None or end >= k * BLOCK + ln):
                n[(p, k)] += 1
    return n


LOADER_CHILD = r"""
import json, sys, time
import numpy as np
import npyload
fields, remote, ref, seed = json.loads(sys.argv[1])
ref = np.load(ref)
x = npyload.Loader(fields, batch_size=6, shuffle=True, seed=seed, num_workers=2,
                   output="numpy", remote=remote)
n = 0
for b in x:
    for name in fields:
        assert np.array_equal(b[name], ref[name][b.indices]), name
    n += len(b.indices)
assert n == len(ref["labels"]), n
st = x.stats()
while st["fill_state"] == "running":  # the loader's own fill fetches too
    time.sleep(0.01)
    st = x.stats()
print(json.dumps(st), flush=True)
"""

PREFETCH_CHILD = r"""
import json, sys
import npyload
fields, remote = json.loads(sys.argv[1])
print(json.dumps(npyload.prefetch(fields, remote=remote, inflight=4,
                                  request_bytes=4 * 65536)), flush=True)
"""


def urls(base, rel):
    return {n: [f"{base}/{p}" for p in ps] for n, ps in rel.items()}


def test_processes_sharing_a_cache_fetch_each_block_once(data, tmp_path):
    root, rel, ref = data
    ref_path = tmp_path / "ref.npz"
    np.savez(ref_path, **ref)
    remote = {"cache_dir": str(tmp_path / "cache"), "cache_block": BLOCK}
    with FileServer(root) as srv:
        # A 20 ms link: every fetch is in flight long enough to be met by
        # the other processes' misses of the same block.
        proxy = ThrottleProxy(srv.port, rate=40e6, rtt=0.020)
        try:
            fields = urls(proxy.endpoint, rel)
            procs = [subprocess.Popen([sys.executable, "-c", LOADER_CHILD,
                                       json.dumps([fields, remote, str(ref_path), seed])],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for seed in (1, 2, 3)]
            procs.append(subprocess.Popen([sys.executable, "-c", PREFETCH_CHILD,
                                           json.dumps([fields, remote])],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=180)
                assert p.returncode == 0, err[-3000:]
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            proxy.close()
        blocks = blocks_of(root, [p for ps in rel.values() for p in ps])
        per = gets_per_block(srv, blocks)
    twice = {b: c for b, c in per.items() if c != 1}
    assert not twice, f"blocks not fetched exactly once on the node: {twice}"
    fetched = (sum(o["cache_misses"] + o["fill_fetched_blocks"] for o in outs[:3])
               + outs[3]["fetched_blocks"])
    assert fetched == len(blocks)
    # The fill's own view: every block of the dataset is in the cache.
    assert outs[3]["cached_bytes"] == outs[3]["planned_bytes"] == outs[3]["dataset_bytes"]


SLOW_FILL = r"""
import json, sys
import npyload
fields, remote = json.loads(sys.argv[1])
npyload.prefetch(fields, remote=remote, inflight=1, request_bytes=65536)
"""


def test_sigkilled_fetcher_leaves_no_block_locked(data, tmp_path):
    """A fetches a block over a slow link and is SIGKILLed mid-block while B
    waits for that block: B does not fetch it while A lives (one GET at the
    server), takes it over once A is dead (the kernel drops A's lock), and
    ends with correct bytes; the block crossed the link twice in all."""
    root, rel, ref = data
    cache = tmp_path / "cache"
    remote = {"cache_dir": str(cache), "cache_block": BLOCK}
    one = rel["images"][3]
    size = os.path.getsize(root / one)
    blocks = blocks_of(root, [one])

    def writing():
        return cache.exists() and any(n.startswith(".tmp-") for n in os.listdir(cache))

    def gets():
        with srv.lock:
            return len(srv.ranges)

    with FileServer(root) as srv:
        proxy = ThrottleProxy(srv.port, rate=10e3, rtt=0.002)  # 64 KiB: ~6 s
        try:
            fields = {"images": [f"{proxy.endpoint}/{one}"]}
            a = subprocess.Popen([sys.executable, "-c", SLOW_FILL,
                                  json.dumps([fields, remote])], stderr=subprocess.PIPE,
                                 text=True)
            t0 = time.monotonic()
            while not writing():  # A is inside block 0
                assert a.poll() is None and time.monotonic() - t0 < 60, "A never started"
                time.sleep(0.02)
            b = subprocess.Popen([sys.executable, "-c", PREFETCH_CHILD,
                                  json.dumps([fields, remote])],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            t1 = time.monotonic()
            # A's probe and GET, B's probe and its first fill GET (of the
            # blocks nobody fetches): B has met A's blocks and waits.
            while gets() < 4:
                assert b.poll() is None and time.monotonic() - t1 < 60, "B never began"
                time.sleep(0.02)
            time.sleep(0.3)
            assert gets_per_block(srv, blocks)[("/" + one, 0)] == 1, \
                "B fetched a block that A was fetching"
            os.kill(a.pid, signal.SIGKILL)
            a.wait(timeout=30)
            proxy.rate = 50e6
            out, err = b.communicate(timeout=60)
            assert b.returncode == 0, err[-3000:]
            res = json.loads(out.strip().splitlines()[-1])
            assert time.monotonic() - t1 < 60
            per = gets_per_block(srv, blocks)
            # The blocks in the cache are the file's bytes, and they serve a
            # loader without another fetch.
            x = npyload.Loader(fields, batch_size=50, output="numpy", remote=remote)
            got = np.concatenate([bt["images"] for bt in x])
            assert np.array_equal(got, np.load(root / one))
            assert x.stats()["cache_misses"] == 0 and gets_per_block(srv, blocks) == per
        finally:
            proxy.close()
    assert per[("/" + one, 0)] == 2, per
    assert all(c == 1 for (p, k), c in per.items() if k > 0), per
    assert res["cached_bytes"] == size and res["waited_blocks"] == 0


def test_prefetch_fills_in_sample_order_within_its_budget(data, tmp_path):
    root, rel, ref = data
    cache = tmp_path / "cache"
    with FileServer(root) as srv:
        fields = urls(f"http://127.0.0.1:{srv.port}", rel)
        total = sum(os.path.getsize(root / p) for ps in rel.values() for p in ps)
        budget = total // 2
        res = npyload.prefetch(fields, cache_dir=cache, cache_block=BLOCK, max_bytes=budget)
        assert res["dataset_bytes"] == total
        assert budget - BLOCK < res["planned_bytes"] <= budget
        assert res["cached_bytes"] == res["planned_bytes"] == res["fetched_bytes"]
        # Sample order: every field's first files, never one field's all.
        with srv.lock:
            filled = sorted({(p, a) for p, a, b in srv.ranges if b != 4095})
        got = {n: {p for p, _ in filled if p.startswith(f"/{n}/")} for n in rel}
        for n, ps in rel.items():
            assert got[n], f"field {n} got nothing of the part"
            assert got[n] == {"/" + p for p in ps[:len(got[n])]}, f"{n}: not its first files"
        assert not all(len(got[n]) == len(rel[n]) for n in rel)
        # The cache's bound holds the part, and a second run fetches nothing.
        n0 = srv.count()
        again = npyload.prefetch(fields, cache_dir=cache, cache_block=BLOCK, max_bytes=budget)
        assert again["fetched_blocks"] == 0 and again["found_blocks"] == res["planned_blocks"]
        assert srv.count() - n0 == res["objects"]  # the probes only
        # cache_bytes bounds the part: 90 % of it at most.
        small = npyload.prefetch(fields, cache_dir=tmp_path / "small", cache_block=BLOCK,
                                 cache_bytes=10 * BLOCK)
        assert small["planned_bytes"] <= 9 * BLOCK
        on_disk = sum(f.stat().st_size for f in (tmp_path / "small").iterdir())
        assert on_disk <= 10 * BLOCK


def test_prefetch_counters_and_errors(data, tmp_path):
    root, rel, ref = data
    with FileServer(root) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        seen = []
        res = npyload.prefetch({"labels": [f"{base}/{p}" for p in rel["labels"]]},
                               cache_dir=tmp_path / "c", cache_block=BLOCK,
                               progress=seen.append, interval=0.01)
        assert seen and seen[-1]["phase"] == "done" and seen[-1] == res
        assert res["requests"] >= res["objects"] and res["seconds"] > 0
        with pytest.raises(ValueError, match="cache_dir"):
            npyload.prefetch([f"{base}/{rel['labels'][0]}"])
        with pytest.raises(ValueError, match="not an s3://"):
            npyload.prefetch([str(root / rel["labels"][0])], cache_dir=tmp_path / "c")
        with pytest.raises(ValueError, match="inflight"):
            npyload.prefetch([f"{base}/{rel['labels'][0]}"], cache_dir=tmp_path / "c",
                             inflight=5000)
        with pytest.raises(npyload.NpyloadError, match="nope.npy"):
            npyload.prefetch([f"{base}/nope.npy"], cache_dir=tmp_path / "c")


def test_prefetch_command_line(data, tmp_path):
    root, rel, ref = data
    exe = [sys.executable, "-c", "import sys, npyload._prefetch as m; sys.exit(m.main())"]
    with FileServer(root) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        args = [f"labels={base}/{p}" for p in rel["labels"][:2]]
        out = tmp_path / "res.json"
        r = subprocess.run(exe + ["--cache-dir", str(tmp_path / "c"), "--cache-block", "64K",
                                  "--json", str(out)] + args,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        res = json.loads(out.read_text())
        assert res["cached_bytes"] == res["dataset_bytes"] == sum(
            os.path.getsize(root / p) for p in rel["labels"][:2])
        assert "npyload-prefetch" in r.stderr and "100.0 %" in r.stderr
        bad = subprocess.run(exe + ["--cache-dir", str(tmp_path / "c"), f"{base}/nope.npy"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "nope.npy" in bad.stderr


def test_prefetch_command_line_interrupted(data, tmp_path):
    """Ctrl-C (SIGINT) stops the fill after the GETs of its current round:
    exit status 130, what was filled stays and is whole (a later fill finds
    it and fetches the rest)."""
    root, rel, ref = data
    exe = [sys.executable, "-c", "import sys, npyload._prefetch as m; sys.exit(m.main())"]
    cache = tmp_path / "c"
    with FileServer(root) as srv:
        proxy = ThrottleProxy(srv.port, rate=300e3, rtt=0.002)
        try:
            args = [f"{proxy.endpoint}/{p}" for p in rel["images"]]
            p = subprocess.Popen(exe + ["--cache-dir", str(cache), "--cache-block", "64K",
                                        "--inflight", "2", "--request-bytes", "64K"] + args,
                                 stderr=subprocess.PIPE, text=True)
            t0 = time.monotonic()
            while not (cache.exists() and any(n.startswith(".tmp-") for n in os.listdir(cache))):
                assert p.poll() is None and time.monotonic() - t0 < 60, "it never began"
                time.sleep(0.02)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)
            assert p.returncode == 130, err
            assert "interrupted" in err
            assert not [n for n in os.listdir(cache) if n.startswith(".tmp-")], \
                "the run was left behind: its temporary files remain"
            total = sum(os.path.getsize(root / q) for q in rel["images"])
            kept = [f.stat().st_size for f in cache.iterdir() if not f.name.startswith(
                ("npyload-cache", ".tmp"))]
            assert 0 < sum(kept) < total
            proxy.rate = 50e6
            res = npyload.prefetch({"images": args}, cache_dir=cache, cache_block=BLOCK)
            assert res["found_blocks"] == len(kept) and res["fetched_blocks"] > 0
            assert res["cached_bytes"] == total
        finally:
            proxy.close()
