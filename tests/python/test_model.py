"""npyload.cost_model, dataset_facts and npyload-model against independent
truths: hand-computed cases of the documented formulas, a Monte-Carlo
simulation of a shuffled epoch for the share of blocks a node meets (the
on-demand formula's core), the files' sizes and numpy's shapes for the
facts. (bench/multinode_bench.py holds the model to measured runs of 2
emulated nodes; timings never belong in a test.)"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import npyload
from npyload._model import _phi, _rate

MB = 1 << 20


def one_field(nbytes, objects, probes=1):
    return {"data": {"sizes": [nbytes // objects] * objects, "probes": [probes] * objects}}


def test_fill_time_is_the_documented_formula():
    # 1 node, 8 objects of 64 MiB, 4 MiB blocks, 32 MiB GETs, 16 in flight.
    L, rtt = 125e6, 0.010
    m = npyload.cost_model(samples=8 * 64, fields=one_field(8 * 64 * MB, 8), nodes=1,
                           ranks_per_node=1, cache_bytes=1 << 40, link=L, rtt=rtt,
                           cache_block=4 * MB, request_bytes=32 * MB, inflight=16)
    D = 8 * 64 * MB
    gets = 8 * 2  # two 32 MiB GETs per object
    X = D / gets
    phi = L * 16 * X / (16 * X + L * rtt)
    t_probe = max(math.ceil(8 / 16) * (rtt + 4096 / L), 8 / 5500)
    assert m["fill"]["requests"] == 8 + gets
    assert m["fill"]["bytes"] == D
    assert m["fill"]["time_to_warm_s"] == pytest.approx(t_probe + D / phi, rel=1e-9)
    assert m["fill"]["limited_by"] == "link"
    assert m["dataset"]["blocks"] == D // (4 * MB)


def test_link_throughput_formula():
    assert _phi(100.0, 4, 10.0, 0.0) == 100.0
    assert _phi(100.0, 1, 10.0, 1.0) == pytest.approx(100 * 10 / (10 + 100))
    assert _phi(100.0, 0, 10.0, 1.0) == 0.0
    assert _rate("1Gbit") == 125e6 and _rate("125M") == 125 << 20


def test_a_thousand_nodes_hit_the_get_rate():
    # The arithmetic: 22 GB in 4 MiB blocks per node, 125 nodes.
    m = npyload.cost_model(samples=214464, fields=one_field(22 << 30, 10053, 2), nodes=125,
                           ranks_per_node=8, samples_per_s=10000, cache_bytes=400 << 30,
                           link=12.5e9, rtt=0.01, server_s=0.015)
    assert m["fill"]["limited_by"] == "GET rate"
    assert m["fill"]["job_requests_per_s"] == pytest.approx(5500, rel=0.01)
    assert m["fed"]["after_fill_or_epoch1"] and not m["fed"]["epoch1_on_demand"]
    more = npyload.cost_model(samples=214464, fields=one_field(22 << 30, 10053, 2), nodes=125,
                              ranks_per_node=8, samples_per_s=10000, cache_bytes=400 << 30,
                              link=12.5e9, rtt=0.01, server_s=0.015, prefixes=10)
    assert more["fill"]["time_to_warm_s"] < m["fill"]["time_to_warm_s"] / 5


def test_on_demand_counts_blocks_and_every_ranks_probes():
    # One node: every block is met in epoch 1; each rank probes each object.
    m = npyload.cost_model(samples=1000, fields=one_field(1000 * MB, 10, 2), nodes=1,
                           ranks_per_node=4, cache_bytes=1 << 40, cache_block=4 * MB)
    K = 10 * math.ceil(100 * MB / (4 * MB))
    assert m["on_demand"]["epoch1_bytes"] == pytest.approx(1000 * MB)
    assert m["on_demand"]["epoch1_requests"] == pytest.approx(K + 4 * 10 * 2)
    assert m["on_demand"]["epochs_to_warm"] == 1
    assert m["later_epochs"]["bytes_per_epoch"] == 0


def test_a_cache_smaller_than_the_data():
    m = npyload.cost_model(samples=1000, fields=one_field(1000 * MB, 10), nodes=1,
                           ranks_per_node=1, cache_bytes=500 * MB, cache_block=4 * MB,
                           samples_per_s=100, link=10e6)
    P = 0.9 * 500 * MB
    assert m["fill"]["bytes"] == pytest.approx(P)
    assert m["job"]["cached_fraction"] == pytest.approx(P / (1000 * MB))
    assert m["later_epochs"]["bytes_per_epoch"] == pytest.approx(
        (1 - P / (1000 * MB)) * m["on_demand"]["epoch1_bytes"])
    assert m["on_demand"]["time_to_warm_s"] == math.inf
    # 100 samples/s of 1 MB over 10 MB/s cannot be fed, even warm.
    assert not m["fed"]["after_fill_or_epoch1"]


def test_share_of_blocks_a_node_meets_matches_a_simulated_shuffle():
    """The on-demand formula's core: after a node has taken a fraction x of
    its samples of a global shuffle split over n nodes, a block of m
    samples has been met with probability 1 - (1 - x/n)^m. Checked against
    a simulated permutation with DistributedSampler's interleaved split."""
    rng = np.random.default_rng(1)
    N, m, n = 20000, 16, 4
    blocks = np.arange(N) // m
    for x in (0.05, 0.2, 0.5, 1.0):
        got = []
        for _ in range(5):
            perm = rng.permutation(N)
            mine = perm[0::n]  # node 0's ranks: every n-th sample of the sequence
            seen = np.unique(blocks[mine[:int(x * len(mine))]])
            got.append(len(seen) / (N // m))
        want = 1 - (1 - x / n) ** m
        assert np.mean(got) == pytest.approx(want, abs=0.01), x


def test_dataset_facts_from_files(tmp_path):
    arrs = [np.zeros((n, 5), np.float32) for n in (3, 4, 6)]
    for i, a in enumerate(arrs):
        np.save(tmp_path / f"x_{i}.npy", a)
        np.save(tmp_path / f"y_{i}.npy", np.zeros(len(a), np.int64))
    npyload.pack(str(tmp_path / "y_0.npy"), out=str(tmp_path / "z_0.npy.zst"))
    f = npyload.dataset_facts({"x": str(tmp_path / "x_*.npy"),
                               "y": [str(tmp_path / f"y_{i}.npy") for i in range(3)]})
    assert f["samples"] == 13
    assert f["fields"]["x"]["sizes"] == [os.path.getsize(tmp_path / f"x_{i}.npy")
                                         for i in range(3)]
    assert f["fields"]["x"]["probes"] == [1, 1, 1]
    with pytest.raises(ValueError, match="holds 3 samples"):
        npyload.dataset_facts({"x": str(tmp_path / "x_*.npy"), "z": str(tmp_path / "z_0*")})
    with pytest.raises(ValueError, match="nothing matches"):
        npyload.dataset_facts({"x": str(tmp_path / "nope_*.npy")})


def test_command_line(tmp_path):
    exe = [sys.executable, "-c", "import sys, npyload._model as m; sys.exit(m.main())"]
    r = subprocess.run(exe + ["--samples", "214464", "--bytes", "22G", "--objects", "10053",
                              "--packed", "--nodes", "125", "--ranks-per-node", "8",
                              "--samples-per-s", "10000", "--cache-bytes", "400G",
                              "--link", "100Gbit", "--json", str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "limited by GET rate" in r.stdout and "fed: epoch 1 on demand NO" in r.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["dataset"]["objects"] == 10053 and m["job"]["nodes"] == 125
    np.save(tmp_path / "a_0.npy", np.zeros((10, 3), np.float32))
    r = subprocess.run(exe + [f"a={tmp_path}/a_*.npy", "--nodes", "2"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "10 samples" in r.stdout, r.stderr
    r = subprocess.run(exe + ["--nodes", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--samples" in r.stderr
