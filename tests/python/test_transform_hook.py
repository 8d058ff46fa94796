"""Loader(transform=fn): the per-batch Python hook (issue 15, item 3).

fn runs on one background thread, overlapping the loop body; results come
out in order; an exception reaches the loop with the batch's seq and the
original chained; break/close/del/set_epoch/load_state_dict stop the thread
without hanging and give every slot back; state_dict() counts what the loop
received. No timed assertions: overlap and read-ahead are shown with events
(each wait has a generous timeout that only turns a hang into a failure).
Independent truth: numpy's reading of the files and the plain loader's order.
"""
import gc
import threading
import weakref

import numpy as np
import pytest

import npyload
from conftest import N, to_numpy

HANG = 60  # seconds: only a hang ever reaches it


def hook_threads():
    return [t for t in threading.enumerate() if t.name == "npyload-transform" and t.is_alive()]


@pytest.fixture(autouse=True)
def no_thread_left():
    yield
    gc.collect()
    assert hook_threads() == [], "a transform thread outlived its loader"


def make(fields, **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("batch_size", 4)
    return npyload.Loader(fields, **kw)


def plain_order(globs, **kw):
    return [to_numpy(b.indices).tolist() for b in make(globs, **kw)]


@pytest.mark.parametrize("output", ["torch", "numpy"])
@pytest.mark.parametrize("as_tuple", [False, True])
def test_results_in_order_and_values_equal_numpy(dataset, output, as_tuple):
    if output == "torch":
        pytest.importorskip("torch")
    globs, ref = dataset
    seen_threads = set()

    def fn(b):
        seen_threads.add(threading.current_thread().name)
        if as_tuple:
            d = dict(zip(b.field_names, b))
        else:
            d = dict(b)
        return ("result", b.seq, to_numpy(b.indices), {k: to_numpy(v) for k, v in d.items()})

    kw = dict(shuffle=True, seed=6, output=output, prefetch=2)
    L = make(globs, transform=fn, as_tuple=as_tuple, **kw)
    for epoch in range(2):
        L.set_epoch(epoch)
        got = list(L)
        assert [r[1] for r in got] == list(range(len(L)))
        order = [r[2].tolist() for r in got]
        ref_loader = make(globs, **kw)
        ref_loader.set_epoch(epoch)
        assert order == [to_numpy(b.indices).tolist() for b in ref_loader]
        for tag, seq, idx, data in got:
            assert tag == "result"
            for name, arr in data.items():
                np.testing.assert_array_equal(arr, ref[name][idx], err_msg=name)
    assert seen_threads == {"npyload-transform"}


def test_fn_may_return_anything_even_none(dataset):
    globs, _ = dataset
    L = make(globs, transform=lambda b: None)
    assert list(L) == [None] * len(L)
    L = make(globs, transform=lambda b: b.seq * 10)
    assert list(L) == [10 * i for i in range(len(L))]


def test_fn_must_be_callable(dataset):
    globs, _ = dataset
    with pytest.raises(TypeError, match="transform"):
        make(globs, transform=3)


def test_fn_runs_while_the_loop_body_holds_a_batch(dataset):
    """The hook prepares batch k+1 while the loop body still works on batch
    k: the body waits for fn(k+1) to have run, which would hang (and fail
    after HANG seconds) if the hook ran on the consuming thread."""
    globs, _ = dataset
    ran = [threading.Event() for _ in range(N)]

    def fn(b):
        ran[b.seq].set()
        return b

    L = make(globs, transform=fn, prefetch=1)
    for b in L:
        if b.seq + 1 < len(L):
            assert ran[b.seq + 1].wait(HANG), "fn did not run ahead of the loop body"


def test_exception_reaches_the_loop_with_seq_and_cause(dataset):
    globs, _ = dataset

    def fn(b):
        if b.seq == 2:
            raise ValueError("bad augmentation")
        return b.seq

    L = make(globs, transform=fn, shuffle=True)
    L.set_epoch(3)
    it = iter(L)
    assert next(it) == 0 and next(it) == 1
    with pytest.raises(npyload.TransformError, match=r"seq=2 of epoch 3.*bad augmentation") as ei:
        next(it)
    assert ei.value.seq == 2 and ei.value.epoch == 3
    assert isinstance(ei.value.__cause__, ValueError)
    assert str(ei.value.__cause__) == "bad augmentation"
    del ei
    with pytest.raises(StopIteration):
        next(it)
    gc.collect()
    assert hook_threads() == []
    # The state points at the failed batch: resuming retries it.
    assert L.state_dict()["consumed"] == 2 * 4
    # The loader stays usable: the next loop runs the epoch again.
    L2 = make(globs, transform=lambda b: b.seq)
    assert list(L2) == list(range(len(L2)))


def test_caught_transform_errors_do_not_pin_slots_without_the_cyclic_gc(dataset):
    """A TransformError caught by the loop gives its batch's slot back as
    soon as the caller drops it, by reference counting alone (the cyclic GC
    is off here): after more caught errors than the loader has slots, a
    clean epoch still delivers every batch, equal to numpy."""
    globs, ref = dataset
    L = make(globs, transform=lambda b: fn(b), shuffle=True, seed=2, prefetch=1,
             output="numpy")
    failing = L.num_slots + 2  # epochs 0 .. failing-1 fail on batch 1

    def fn(b):
        if b.epoch < failing and b.seq == 1:
            raise ValueError(f"bad batch of epoch {b.epoch}")
        return b

    def run_epoch(e):
        # In a function: its locals (the last batch) die when it returns.
        L.set_epoch(e)
        got = []
        try:
            for b in L:
                got.append(b.seq)
        except npyload.TransformError as err:
            return got, (err.seq, err.epoch, str(err.__cause__))
        return got, None

    was = gc.isenabled()
    gc.disable()
    try:
        for e in range(failing):
            assert run_epoch(e) == ([0], (1, e, f"bad batch of epoch {e}"))
        L.set_epoch(failing)
        rows = []
        for b in L:
            idx = np.asarray(b.indices)
            for name in b.keys():
                np.testing.assert_array_equal(b[name], ref[name][idx], err_msg=name)
            rows += idx.tolist()
        del b
    finally:
        if was:
            gc.enable()
    assert rows == list(npyload.order_indices(N, 1, 2, failing, 0, 1, False, 4))
    L.close()


def test_read_error_arrives_as_npyload_error_in_order(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for i in range(3):
        np.save(d / f"x_{i:04d}.npy", np.arange(i * 8, i * 8 + 8, dtype=np.float32).reshape(8, 1))
    # Batch 4 must be read after the truncate: fn (which returns a copy,
    # giving the slot back) waits for it, so until then the hook holds batch
    # 0 and the 3 other slots hold batches 1..3; read_ahead=False: a worker
    # reads a batch only into a slot (read-ahead could read batch 4 early).
    truncated = threading.Event()

    def fn(b):
        assert truncated.wait(HANG)
        return to_numpy(b["x"])

    L = npyload.Loader({"x": str(d / "x_*.npy")}, batch_size=4, num_workers=1, prefetch=1,
                       io="pread", output="numpy", transform=fn, read_ahead=False)
    off = npyload.inspect(str(d / "x_0002.npy"))["data_offset"]
    import os
    it = iter(L)  # started (the loader starts at its first iter()), then the file shrinks
    os.truncate(d / "x_0002.npy", off + 4)       # batch 4 (rows 16..19) fails
    truncated.set()
    got = []
    with pytest.raises(npyload.NpyloadError, match="x_0002.npy"):
        for x in it:
            got.append(x[:, 0].tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def test_break_stops_the_thread_and_gives_every_slot_back(dataset):
    torch = pytest.importorskip("torch")
    globs, ref = dataset
    refs = []

    def fn(b):
        refs.append(weakref.ref(b["images"]))    # torch tensors take weakrefs
        return b

    # prefetch=1: 3 slots. A leaked batch would make the next loop fail
    # ("every slot is held") instead of yielding the epoch.
    L = make(globs, transform=fn, prefetch=1, num_workers=1, output="torch")
    for i, b in enumerate(L):
        if i == 2:
            break
    del b
    gc.collect()
    assert hook_threads() == []
    assert refs and all(r() is None for r in refs), "a batch the hook made is still alive"
    assert L.state_dict()["consumed"] == 3 * 4
    for _ in range(3):
        got = [to_numpy(b.indices) for b in L]
        assert np.concatenate(got).tolist() == list(range(N))
    assert isinstance(torch.zeros(1), torch.Tensor)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("how", ["close", "del", "set_epoch", "load_state_dict", "new_iter"])
def test_stopping_mid_epoch_does_not_hang(dataset, how, workers):
    globs, _ = dataset
    L = make(globs, transform=lambda b: b, prefetch=2, batch_size=1,
             transform_workers=workers)
    saved = make(globs, batch_size=1).state_dict()
    it = iter(L)
    next(it)
    next(it)
    if how == "close":
        L.close()
        with pytest.raises(ValueError, match="closed"):
            next(it)
    elif how == "del":
        del it, L
    elif how == "set_epoch":
        L.set_epoch(1)
        with pytest.raises(RuntimeError, match="superseded"):
            next(it)
        assert sum(1 for _ in L) == len(L) == N
    elif how == "load_state_dict":
        L.load_state_dict(saved)
        with pytest.raises(RuntimeError, match="superseded"):
            next(it)
        assert sum(1 for _ in L) == N
    else:
        assert sum(1 for _ in L) == N
    gc.collect()
    assert hook_threads() == []


def test_state_dict_counts_what_the_loop_received(dataset):
    """fn runs ahead (up to prefetch batches); state_dict() still counts the
    batches the loop received, and resuming from it yields exactly the rest."""
    globs, ref = dataset
    kw = dict(shuffle=True, seed=8, batch_size=3)
    ahead = threading.Event()

    def fn(b):
        if b.seq == 4:
            ahead.set()
        return b

    L = make(globs, transform=fn, prefetch=3, **kw)
    it = iter(L)
    first = [to_numpy(next(it).indices).tolist() for _ in range(2)]
    assert ahead.wait(HANG), "the hook never ran ahead"
    st = L.state_dict()
    plain = make(globs, **kw)
    pit = iter(plain)
    for _ in range(2):
        next(pit)
    assert st == plain.state_dict()
    # stats(), len() and backend work while the thread runs.
    assert L.stats()["num_slots"] == 3 + 2
    assert len(L) == len(plain) and L.backend == plain.backend
    rest = [to_numpy(b.indices).tolist() for b in it]
    full = plain_order(globs, **kw)
    assert first + rest == full
    # Resume, with the hook, from the state saved mid-epoch.
    R = make(globs, transform=lambda b: to_numpy(b.indices).tolist(), **kw)
    R.load_state_dict(st)
    assert len(R) == len(full) - 2
    assert list(R) == full[2:]
    assert R.state_dict()["consumed"] == N


def test_cuda_stream_of_the_consumer_is_current_in_fn(dataset):
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and npyload.cuda_available()[0]):
        pytest.skip("no usable CUDA device")
    globs, ref = dataset
    s = torch.cuda.Stream()
    streams = []

    def fn(b):
        streams.append(torch.cuda.current_stream().cuda_stream)
        return b["images"].float() * 2

    L = make(globs, transform=fn, device="cuda")
    with torch.cuda.stream(s):
        got = [(x.cpu().numpy(), None) for x in L]
    assert set(streams) == {s.cuda_stream}
    idx = np.concatenate([to_numpy(b.indices) for b in make(globs, device="cuda")])
    np.testing.assert_array_equal(np.concatenate([g for g, _ in got]), ref["images"][idx] * 2)
