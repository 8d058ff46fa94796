"""The checks of the torchrun tests (test_elastic_torchrun.py,
test_multinode.py, test_mix_torchrun.py) against torch's own
DistributedSampler, their launcher and what their worker scripts share
(worker_env puts this directory on the workers' PYTHONPATH, so they
`import ddp_checks` for end_of_epoch and write_out): one copy. torch is
imported when a check runs (the callers skip without it)."""
import json
import os
import subprocess
import sys


def torchrun(script, nproc, cfg, timeout):
    """Runs `script` under `torchrun --standalone --nproc_per_node=nproc`
    (its one argument: cfg as JSON) without the caller's rank variables,
    one OpenMP thread per rank; returns the JSON the script wrote to
    cfg["out"]. A non-zero exit or a run past `timeout` seconds (a hang)
    fails the test with the end of its output."""
    import pytest
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(script), json.dumps(cfg)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=worker_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun with {nproc} ranks did not finish in {timeout}s "
                    f"(a hang?): {e.stderr!r}"[-3000:])
    assert r.returncode == 0, f"torchrun failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    with open(cfg["out"]) as f:
        return json.load(f)


def worker_env(**extra):
    """A torchrun launch's environment: the caller's without its rank
    variables, one OpenMP thread per rank, this directory on PYTHONPATH
    (the workers import ddp_checks), and `extra`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def end_of_epoch(loader, record, save=None):
    """In a torchrun worker, after an epoch (or the batches it stopped
    after): every rank's `record` (JSON-able), in rank order; with `save`,
    rank 0 writes loader.state_dict() there as JSON and every rank waits
    for it."""
    import torch.distributed as dist
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, record)
    if save:
        if dist.get_rank() == 0:
            with open(save, "w") as f:
                json.dump(loader.state_dict(), f)
        dist.barrier()
    return got


def write_out(out, path):
    """In a torchrun worker: rank 0 writes `out` as JSON to `path`, which
    the launcher returns."""
    import torch.distributed as dist
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(out, f)


def sampler_split(seq, world, rank, drop_last=False):
    """torch's DistributedSampler over a dataset that lists `seq` in order."""
    from torch.utils.data import DistributedSampler
    s = DistributedSampler(seq, num_replicas=world, rank=rank, shuffle=False,
                           drop_last=drop_last)
    return [seq[i] for i in s]


def check_resume(seq, consumed, ranks, world, n, saved):
    """A state saved after `saved` positions of the epoch's sequence `seq`
    (the samples `consumed` before it, by every rank) resumed at `world`
    ranks (each {"rank", "indices", "batches"}): the saved position is the
    sequence's first `saved` samples, the rest split as DistributedSampler
    splits it, equal batch counts, nothing lost, nothing repeated beyond
    the new split's padding."""
    assert len(consumed) == saved
    assert sorted(consumed) == sorted(seq[:saved])
    rest = seq[saved:]
    ranks = sorted(ranks, key=lambda r: r["rank"])
    assert len(ranks) == world
    assert len({r["batches"] for r in ranks}) == 1, "unequal batch counts after resume"
    for r in ranks:
        assert r["indices"] == sampler_split(rest, world, r["rank"]), \
            f"rank {r['rank']} differs from DistributedSampler after resume"
    delivered = consumed + [i for r in ranks for i in r["indices"]]
    assert set(delivered) == set(range(n)), "samples lost across the resume"
    assert len(delivered) - n <= world - 1, "repeats beyond the new split's padding"
