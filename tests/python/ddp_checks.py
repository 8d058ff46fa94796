"""The checks of the torchrun tests (test_elastic_torchrun.py,
test_multinode.py) against torch's own DistributedSampler: one copy. torch
is imported when a check runs (the callers skip without it)."""


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
