"""PyTorch ergonomics of npyload.Loader (issue 15, item 4): as_tuple, a Batch
iterated like a tuple, pin_memory=True without CUDA, len() after
load_state_dict (same and other world size), batch tensors edited in place
(the README's and the docs' examples: test_doc_examples.py). Independent truth:
numpy's reading of the files (conftest), DistributedSampler's split written
out (conftest.sampler_indices), and counting the batches a loop yields."""
import glob
import warnings
from collections.abc import Mapping

import numpy as np
import pytest

import npyload
from conftest import N, collect, sampler_indices, to_numpy, write_dataset

BACKENDS = ["pread", "mmap", "io_uring"]


def make(fields, **kw):
    kw.setdefault("num_workers", 2)
    return npyload.Loader(fields, **kw)


def make_io(fields, io, **kw):
    try:
        return make(fields, io=io, **kw)
    except npyload.NpyloadError as e:
        if io == "io_uring":
            pytest.skip(f"io_uring refused here: {e}")
        raise


# ---- a Batch iterated like a tuple; as_tuple ----

def test_batch_iterated_like_a_tuple_raises_naming_the_fix(dataset):
    globs, _ = dataset
    b = next(iter(make(globs, batch_size=4)))
    with pytest.raises(TypeError, match=r"as_tuple=True") as ei:
        images, labels, mask = b
    assert "'images', 'labels', 'mask'" in str(ei.value)
    with pytest.raises(TypeError):
        list(b)
    with pytest.raises(TypeError):
        for _ in b:
            pass


def test_batch_mapping_uses_keep_working(dataset, output):
    globs, ref = dataset
    b = next(iter(make(globs, batch_size=4, output=output)))
    idx = to_numpy(b.indices)
    assert isinstance(b, Mapping)
    assert list(b.keys()) == ["images", "labels", "mask"]
    assert len(b) == 3 and "images" in b and "nope" not in b
    d = dict(b)
    assert list(d) == ["images", "labels", "mask"]
    assert {**b}.keys() == d.keys()
    for name, v in b.items():
        np.testing.assert_array_equal(to_numpy(v), ref[name][idx])
    assert [to_numpy(v).shape for v in b.values()] == [to_numpy(d[k]).shape for k in d]
    assert b.get("nope") is None and b.get("labels") is b["labels"]

    def f(images, labels, mask):
        return labels
    assert f(**b) is b["labels"]


@pytest.fixture(params=["torch", "numpy"])
def output(request):
    if request.param == "torch":
        pytest.importorskip("torch")
    return request.param


@pytest.mark.parametrize("copy", [False, True])
def test_as_tuple_yields_fields_in_the_order_given(dataset, output, copy):
    globs, ref = dataset
    order = ["mask", "images", "labels"]              # not the files' order
    L = make({k: globs[k] for k in order}, batch_size=5, shuffle=True, seed=4,
             as_tuple=True, output=output, copy=copy)
    seen = []
    for seq, b in enumerate(L):
        assert isinstance(b, tuple) and isinstance(b, npyload.BatchTuple)
        assert b.field_names == tuple(order) and len(b) == 3
        assert b.seq == seq and b.epoch == 0 and b.num_samples == len(b.indices)
        idx = to_numpy(b.indices)
        mask, images, labels = b
        np.testing.assert_array_equal(to_numpy(mask), ref["mask"][idx])
        np.testing.assert_array_equal(to_numpy(images), ref["images"][idx])
        np.testing.assert_array_equal(to_numpy(labels), ref["labels"][idx])
        seen.extend(idx.tolist())
    assert sorted(seen) == list(range(N))
    # The same order as the mapping form.
    plain = collect(make(globs, batch_size=5, shuffle=True, seed=4, output=output))
    assert [i.tolist() for i, _ in plain] == [
        to_numpy(b.indices).tolist() for b in make(globs, batch_size=5, shuffle=True, seed=4,
                                                    as_tuple=True, output=output)]


# ---- pin_memory=True without CUDA ----

def test_pin_memory_without_cuda_warns_once_and_loads(dataset):
    ok, why = npyload.cuda_available()
    if ok:
        pytest.skip("CUDA is usable here: pin_memory=True really pins")
    globs, ref = dataset
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        L = make(globs, batch_size=8, pin_memory=True)
        batches = collect(L)
    mine = [x for x in w if "pin_memory" in str(x.message)]
    assert len(mine) == 1, [str(x.message) for x in w]
    assert issubclass(mine[0].category, RuntimeWarning)
    assert mine[0].filename == __file__, "the warning points at the caller"
    assert L.stats()["pinned"] in (0, False)
    assert sorted(np.concatenate([i for i, _ in batches]).tolist()) == list(range(N))
    for idx, data in batches:
        for name, arr in data.items():
            np.testing.assert_array_equal(arr, ref[name][idx])


def test_device_cuda_without_cuda_still_fails(dataset):
    ok, _ = npyload.cuda_available()
    if ok:
        pytest.skip("CUDA is usable here")
    pytest.importorskip("torch")
    globs, _ = dataset
    with pytest.raises((npyload.NpyloadError, RuntimeError, ValueError)):
        make(globs, batch_size=8, device="cuda")


# ---- len() ----

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 4, 7, 37, 50])
def test_len_is_the_batches_a_loop_yields(dataset, drop_last, world_size, batch_size):
    globs, _ = dataset
    for rank in range(world_size):
        L = make(globs, batch_size=batch_size, drop_last=drop_last, rank=rank,
                 world_size=world_size, num_workers=1, output="numpy")
        got = collect(L)
        assert len(L) == len(got)
        n_rank = len(sampler_indices(N, world_size, rank, drop_last))
        expect = n_rank // batch_size if drop_last else -(-n_rank // batch_size)
        assert len(L) == expect


def _consume(L, k):
    it = iter(L)
    for _ in range(k):
        next(it)
    return L.state_dict()


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("k", [0, 3, 9])
def test_len_after_load_state_dict_same_world_size(dataset, drop_last, k):
    globs, _ = dataset
    kw = dict(batch_size=4, shuffle=True, seed=2, drop_last=drop_last, output="numpy")
    full = len(make(globs, **kw))
    state = _consume(make(globs, **kw), k)
    L = make(globs, **kw)
    L.load_state_dict(state)
    assert len(L) == full - k
    n = 0
    for _ in L:
        n += 1
        assert len(L) == full - k, "constant during the resumed loop"
    assert n == full - k
    assert len(L) == full, "after the resumed epoch, full epochs again"
    assert sum(1 for _ in L) == full
    # set_epoch after a resume (without looping) also means a full epoch.
    L2 = make(globs, **kw)
    L2.load_state_dict(state)
    L2.set_epoch(1)
    assert len(L2) == full == sum(1 for _ in L2)


@pytest.mark.parametrize("w_from,w_to", [(1, 2), (2, 3), (3, 1)])
def test_len_after_elastic_load_state_dict(dataset, w_from, w_to):
    globs, _ = dataset
    kw = dict(batch_size=3, shuffle=True, seed=5, output="numpy")
    state = _consume(make(globs, rank=0, world_size=w_from, **kw), 2)
    for rank in range(w_to):
        L = make(globs, rank=rank, world_size=w_to, **kw)
        full = len(L)
        L.load_state_dict(state)
        resumed = len(L)
        # What is left of the epoch, split DistributedSampler-style.
        left = N - 2 * 3 * w_from
        per_rank = -(-left // w_to)
        assert resumed == -(-per_rank // 3)
        assert sum(1 for _ in L) == resumed
        assert len(L) == full
        assert sum(1 for _ in L) == full


def test_len_after_load_state_dict_at_the_epochs_end(dataset):
    globs, _ = dataset
    kw = dict(batch_size=4, output="numpy")
    # Saved inside the loop, after its last batch: the resumed loop is empty.
    L0 = make(globs, **kw)
    it = iter(L0)
    for _ in range(len(L0)):
        next(it)
    L = make(globs, **kw)
    L.load_state_dict(L0.state_dict())
    assert len(L) == 0 and sum(1 for _ in L) == 0
    assert len(L) == len(L0)
    # Saved once the loop had run out: the resumed loader goes on with the
    # next epoch, as L0 would, and len() says a full epoch.
    assert next(it, None) is None
    L = make(globs, **kw)
    L.load_state_dict(L0.state_dict())
    assert len(L) == len(L0) and sum(1 for _ in L) == len(L0) and L.epoch == 1


# ---- in-place edits ----

@pytest.mark.parametrize("io", BACKENDS)
def test_in_place_edits_are_allowed_and_do_not_leak_into_later_batches(dataset, output, io):
    globs, ref = dataset
    # prefetch=1: two slots, so every slot is reused many times per epoch.
    L = make_io(globs, io, batch_size=3, shuffle=True, seed=9, prefetch=1, num_workers=1,
                output=output)
    for epoch in range(2):
        L.set_epoch(epoch)
        for b in L:
            idx = to_numpy(b.indices)
            for name, v in b.items():
                np.testing.assert_array_equal(to_numpy(v), ref[name][idx], err_msg=name)
                v[...] = 0                                    # numpy and torch alike
                assert not to_numpy(b[name]).any(), "the edit is visible through the batch"
            if output == "torch":
                b["images"].add_(5).mul_(2)
                np.testing.assert_array_equal(to_numpy(b["images"]), 10)
    # The files are untouched.
    for name, g in globs.items():
        got = np.concatenate([np.load(p) for p in sorted(glob.glob(g))])
        np.testing.assert_array_equal(got, ref[name])
