"""Distributed training with torchrun: real processes, the gloo backend on CPU.

Each scenario launches `torchrun --standalone --nproc_per_node=W` on a small
worker script (written below) that iterates npyload.Loader on its rank and
all_gathers what every rank received. The assertions compare against torch's
own DistributedSampler applied to the epoch's global sequence (the loader's
permutation for the epoch, from npyload.order_indices with world_size 1):
equal batch counts, disjoint ranks, full coverage; and, for a state saved at
one world size and resumed at another, the elastic guarantees (nothing lost,
nothing repeated except the new split's padding, equal batch counts).

Skipped visibly without torch or torch.distributed.
"""
import os
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torchrun tests need it")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
import npyload  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import ddp_checks  # noqa: E402
from ddp_checks import check_resume, sampler_split  # noqa: E402

N = 103          # samples: not a multiple of any world size or batch size used
BS = 4
SEED = 11
TIMEOUT = 240    # seconds per torchrun launch (2-core CI machines are slow to import torch)

WORKER = textwrap.dedent(r'''
    import json, os, sys
    import torch
    import torch.distributed as dist
    import npyload
    from ddp_checks import end_of_epoch, write_out

    cfg = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = npyload.Loader(cfg["fields"], batch_size=cfg["bs"], shuffle=True,
                            seed=cfg["seed"], drop_last=cfg["drop_last"],
                            num_workers=1, prefetch=2, output="numpy")
    out = {"world": world, "epochs": []}
    if cfg.get("resume"):
        with open(cfg["resume"]) as f:
            loader.load_state_dict(json.load(f))
    for epoch in cfg["epochs"]:
        if not cfg.get("resume") or epoch != cfg["epochs"][0]:
            loader.set_epoch(epoch)
        got, nb = [], 0
        stop = cfg.get("stop_after") if epoch == cfg["epochs"][0] else None
        for b in loader:
            got.extend(int(i) for i in b.indices)
            assert b["x"].shape[0] == len(b.indices)
            # the values are the sample indices: wrong bytes would show here
            assert (b["x"][:, 0] == b.indices).all(), "values do not match indices"
            nb += 1
            if stop is not None and nb == stop:
                break
        lens = end_of_epoch(loader, {"rank": rank, "indices": got, "batches": nb,
                                     "len": len(loader)}, stop is not None and cfg["save"])
        out["epochs"].append({"epoch": epoch, "ranks": lens})
    write_out(out, cfg["out"])
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    x = np.arange(N, dtype=np.int64).repeat(3).reshape(N, 3)
    for i, (a, b) in enumerate([(0, 40), (40, 41), (41, N)]):
        np.save(root / f"x_{i:04d}.npy", x[a:b])
    script = root / "worker.py"
    script.write_text(WORKER)
    return {"fields": {"x": str(root / "x_*.npy")}, "script": str(script), "root": root}


def torchrun(data, nproc, cfg, tag):
    cfg = dict(cfg, fields=data["fields"], bs=BS, seed=SEED,
               out=str(data["root"] / f"out_{tag}.json"))
    return ddp_checks.torchrun(data["script"], nproc, cfg, TIMEOUT)


def global_sequence(epoch):
    """The epoch's permutation of 0..N-1 (world size 1, no padding)."""
    return [int(i) for i in npyload.order_indices(N, 1, SEED, epoch, 0, 1, False, 1)]


def check_epoch_against_sampler(ep, world, drop_last, seq):
    ranks = sorted(ep["ranks"], key=lambda r: r["rank"])
    assert len(ranks) == world
    batches = {r["batches"] for r in ranks}
    assert len(batches) == 1, f"unequal batch counts across ranks: {batches}"
    assert {r["len"] for r in ranks} == batches, "len(loader) disagrees with the batches"
    for r in ranks:
        exp = sampler_split(seq, world, r["rank"], drop_last)
        if drop_last:
            exp = exp[:len(exp) - len(exp) % BS]
        assert r["indices"] == exp, f"rank {r['rank']} differs from DistributedSampler"
    union = [i for r in ranks for i in r["indices"]]
    if drop_last:
        assert len(set(union)) == len(union), "ranks overlap"
    else:
        assert set(union) == set(range(N)), "samples missing"
        assert len(union) - len(set(union)) <= world - 1, "more repeats than padding"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_match_distributed_sampler(data, world, drop_last):
    out = torchrun(data, world, {"epochs": [0, 1], "drop_last": drop_last},
                   f"split_{world}_{int(drop_last)}")
    assert out["world"] == world
    for ep in out["epochs"]:
        check_epoch_against_sampler(ep, world, drop_last, global_sequence(ep["epoch"]))
    # set_epoch changes the order
    assert out["epochs"][0]["ranks"][0]["indices"] != out["epochs"][1]["ranks"][0]["indices"]


@pytest.mark.parametrize("resume_world", [3, 1])
def test_state_saved_at_two_ranks_resumes_elsewhere(data, resume_world):
    stop = 5
    save = str(data["root"] / f"state_2_to_{resume_world}.json")
    before = torchrun(data, 2, {"epochs": [0], "drop_last": False, "stop_after": stop,
                                "save": save}, f"save_{resume_world}")
    after = torchrun(data, resume_world, {"epochs": [0, 1], "drop_last": False,
                                          "resume": save}, f"resume_{resume_world}")
    consumed = [i for r in before["epochs"][0]["ranks"] for i in r["indices"]]
    # the saved global position: the first stop*BS*2 positions of the sequence
    check_resume(global_sequence(0), consumed, after["epochs"][0]["ranks"], resume_world, N,
                 2 * stop * BS)
    # the next epoch is the normal split at the new world size
    check_epoch_against_sampler(after["epochs"][1], resume_world, False, global_sequence(1))
