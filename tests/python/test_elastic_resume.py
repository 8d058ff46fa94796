"""Elastic resume without processes: W loaders (one per rank) consume c
batches each, rank 0's state_dict() is saved, W' loaders load it and finish
the epoch. Checked for every (W, W') in 1..4 x 1..4, drop_last both ways,
against DistributedSampler's rule applied to the rest of the epoch's global
sequence (written out in conftest.sampler_indices), and by the guarantees:
nothing lost, nothing repeated beyond the new split's padding, equal batch
counts on every rank, the next epoch the normal split."""
import numpy as np
import pytest

import npyload
from conftest import N, check_values, collect, concat_indices, sampler_indices

BS = 3


def make(globs, rank, world, drop_last, **kw):
    return npyload.Loader(globs, batch_size=BS, shuffle=True, seed=4, drop_last=drop_last,
                          num_workers=1, prefetch=2, rank=rank, world_size=world,
                          output="numpy", **kw)


def global_sequence(epoch):
    return [int(i) for i in npyload.order_indices(N, 1, 4, epoch, 0, 1, False, 1)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("world2", [1, 2, 3, 4])
def test_resume_at_another_world_size(dataset, world, world2, drop_last):
    globs, ref = dataset
    seq = global_sequence(0)
    nb = len(make(globs, 0, world, drop_last))
    for c in sorted({0, 1, nb // 2, nb - 1, nb}):
        if c < 0:
            continue
        consumed, state = [], None
        for r in range(world):
            L = make(globs, r, world, drop_last)
            it = iter(L)
            for _ in range(c):
                consumed.extend(int(i) for i in next(it).indices)
            if r == 0:
                state = L.state_dict()
            L.close()
        pos = min(N, len(consumed))          # every rank consumed the same count
        assert sorted(consumed) == sorted(seq[:pos]) or pos == N
        rest = seq[pos:]
        after, lens = [], set()
        for r in range(world2):
            L = make(globs, r, world2, drop_last)
            L.load_state_dict(state)
            resumed_len = len(L)
            lens.add(resumed_len)
            got = collect(L)
            check_values(got, ref)
            idx = concat_indices(got).tolist()
            if world2 == world:
                # the same split, continued exactly (its own padding)
                exp = [seq[i] for i in sampler_indices(N, world, r, drop_last)]
                if drop_last:
                    exp = exp[:len(exp) - len(exp) % BS]
                exp = exp[c * BS:]
            else:
                exp = [rest[i] for i in sampler_indices(len(rest), world2, r, drop_last)] if rest else []
                if drop_last:
                    exp = exp[:len(exp) - len(exp) % BS]
            assert idx == exp, f"W={world} W'={world2} c={c} rank {r}"
            after.extend(idx)
            # after a resume len(loader) counts the batches the resumed loop
            # yields (the new split's at another world size); once that loop
            # has ended, the full epoch's at W' again
            assert len(got) == resumed_len
            assert len(L) == len(make(globs, r, world2, drop_last))
            # the next epoch is the normal split at W'
            L.set_epoch(1)
            nxt = concat_indices(collect(L)).tolist()
            exp1 = [global_sequence(1)[i] for i in sampler_indices(N, world2, r, drop_last)]
            if drop_last:
                exp1 = exp1[:len(exp1) - len(exp1) % BS]
            assert nxt == exp1
            L.close()
        assert len(lens) == 1, f"ranks disagree on the batch count after resume: {lens}"
        if not drop_last:
            delivered = consumed + after
            assert set(delivered) == set(range(N)), "samples lost across the resume"
            # repeats: padding of the first split (only once its end was
            # consumed) plus the new split's padding
            assert len(delivered) - N <= (world - 1) + (world2 - 1)
            if pos < N and world2 != world:
                assert len(after) - len(set(after)) <= world2 - 1
        else:
            assert not set(consumed) & set(after), "drop_last never repeats"


def test_state_dict_has_base_and_old_dicts_still_load(dataset):
    globs, ref = dataset
    L = make(globs, 0, 2, False)
    it = iter(L)
    next(it)
    st = L.state_dict()
    assert st["version"] == 2 and st["base"] == 0
    L2 = make(globs, 0, 3, False)
    L2.load_state_dict(st)
    assert L2.state_dict()["base"] == 2 * BS
    old = {k: v for k, v in st.items() if k != "base"}
    old["version"] = 1
    L3 = make(globs, 0, 2, False)
    L3.load_state_dict(old)
    L4 = make(globs, 0, 2, False)
    L4.load_state_dict(st)
    rest3 = concat_indices(collect(L3)).tolist()
    assert rest3 == concat_indices(collect(L4)).tolist()   # version 1 reads as base 0
    assert len(rest3) > 0
    bad = dict(st, base=N + 1)
    with pytest.raises(npyload.NpyloadError, match="base"):
        make(globs, 0, 2, False).load_state_dict(bad)
