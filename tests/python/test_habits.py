"""DataLoader habits (issue 24, item 4): a new iter() advances the epoch as
DataLoader(shuffle=True) reshuffles, set_epoch() always wins, resumes go on
where the saved loader would have; the loader starts at its first iter()
(construction checks, holds nothing); batch[name] for a missing field says
which fields there are; state_dict()/load_state_dict() through
torch.distributed.checkpoint and a torch.save trainer checkpoint.

Independent truths: the order of an epoch is the C library's (a pure
function of (seed, epoch)), so a loader whose epochs advance by themselves
is compared with a second loader told each epoch with set_epoch(e) (and
with npyload.order_indices, the library's order without a loader); resumed
runs are compared with the uninterrupted run; values with numpy's reading
of the files; threads with /proc/self/task.
"""
import gc
import os
import warnings

import numpy as np
import pytest

from conftest import N, check_values, collect, concat_indices, to_numpy, write_dataset

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

BS = 4
EPOCHS = 3


def make(globs, **kw):
    kw.setdefault("output", "numpy")
    kw.setdefault("batch_size", BS)
    return npyload.Loader(globs, **kw)


def loop(loader):
    """[(epoch, indices)] of one for-loop over the loader."""
    return [(b.epoch, tuple(to_numpy(b.indices).tolist())) for b in loader]


def threads():
    gc.collect()  # earlier tests' loaders (kept by tracebacks, cycles) go first
    return len(os.listdir("/proc/self/task"))


def fds():
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


# ---- 1. a new iter() advances the epoch; set_epoch() wins ----

@pytest.mark.parametrize("shuffle", [True, "local", False])
def test_iter_advances_like_set_epoch(dataset, shuffle):
    globs, ref = dataset
    kw = dict(shuffle=shuffle, seed=7, window=2, num_workers=2)
    auto, explicit = make(globs, **kw), make(globs, **kw)
    for e in range(EPOCHS):
        got = collect(auto)
        explicit.set_epoch(e)
        want = collect(explicit)
        check_values(got, ref)
        assert auto.epoch == e
        assert len(got) == len(want) == len(auto)
        for (i1, d1), (i2, d2) in zip(got, want):
            np.testing.assert_array_equal(i1, i2)
        if shuffle != "local":  # (the library's order without a loader)
            np.testing.assert_array_equal(concat_indices(got), npyload.order_indices(
                N, int(shuffle), 7, e, 0, 1, False, BS))
    if shuffle is True:  # the epochs do differ, so the comparison above could fail
        auto.set_epoch(0)
        e0 = concat_indices(collect(auto))
        assert not np.array_equal(e0, concat_indices(collect(auto)))


def test_batches_carry_the_advanced_epoch(dataset):
    globs, _ = dataset
    L = make(globs, shuffle=True, seed=1)
    for e in range(EPOCHS):
        assert {ep for ep, _ in loop(L)} == {e}
    assert L.epoch == EPOCHS - 1


def test_a_left_loop_advances_too(dataset):
    """break, or next(iter(loader)), also end that epoch: the next loop is
    the following epoch from its first batch (DataLoader reshuffles on every
    iter() too)."""
    globs, _ = dataset
    L = make(globs, shuffle=True, seed=2)
    ref = make(globs, shuffle=True, seed=2)
    for k, b in enumerate(L):
        if k == 2:
            break
    assert next(iter(L)).epoch == 1          # a peek: epoch 1, left at once
    got = loop(L)
    ref.set_epoch(2)
    assert got == loop(ref)
    assert {e for e, _ in got} == {2}


def test_set_epoch_wins(dataset):
    globs, _ = dataset
    L = make(globs, shuffle=True, seed=3)
    ref = make(globs, shuffle=True, seed=3)
    L.set_epoch(5)                            # before the first iter()
    ref.set_epoch(5)
    assert loop(L) == loop(ref)
    ref.set_epoch(6)
    assert loop(L) == loop(ref)               # advanced from 5
    L.set_epoch(0)                            # after a loop: not advanced past
    ref.set_epoch(0)
    assert loop(L) == loop(ref)
    # set_epoch every epoch (the DistributedSampler habit) is the same as not
    for e in (4, 4, 9):
        L.set_epoch(e)
        ref.set_epoch(e)
        assert loop(L) == loop(ref) and L.epoch == e
    # set_epoch during a loop: the loop is superseded, the next one runs e
    it = iter(L)
    next(it)
    L.set_epoch(2)
    with pytest.raises(RuntimeError, match="superseded"):
        next(it)
    ref.set_epoch(2)
    assert loop(L) == loop(ref)


def test_advance_with_transform_hook(dataset):
    globs, _ = dataset
    L = make(globs, shuffle=True, seed=4, transform=lambda b: (b.epoch, tuple(b.indices.tolist())))
    ref = make(globs, shuffle=True, seed=4)
    for e in range(EPOCHS):
        ref.set_epoch(e)
        assert list(L) == loop(ref)


# ---- 1b. resume: the same batches as the uninterrupted run ----

def _run(loader, loops):
    return [loop(loader) for _ in range(loops)]


def _epoch_from(globs, kw, epoch, k):
    """Epoch `epoch` without its first k batches, from a loader told the
    epoch with set_epoch."""
    ref = make(globs, **kw)
    ref.set_epoch(epoch)
    return loop(ref)[k:]


@pytest.mark.parametrize("hook", [False, True])
@pytest.mark.parametrize("where", ["start", "mid", "last-batch", "ran-out"])
def test_resume_then_advance_equals_uninterrupted(dataset, where, hook):
    """A state saved anywhere in epoch 1 and loaded into a fresh loader: its
    loops yield what the saved loader's loops yield from there on (the rest
    of the epoch while the loop was still going, the next epochs once it
    had run out)."""
    globs, _ = dataset
    kw = dict(shuffle=True, seed=8, num_workers=2)
    if hook:
        kw["transform"] = lambda b: b
    U = make(globs, **kw)
    loop(U)                                   # epoch 0, whole
    nb = len(U)
    k = {"start": 0, "mid": 3, "last-batch": nb, "ran-out": nb}[where]
    it = iter(U)                              # epoch 1
    for _ in range(k):
        next(it)
    if where == "ran-out":
        with pytest.raises(StopIteration):
            next(it)
    state = U.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == min(k * BS, N)
    assert state["loop_ended"] == (where == "ran-out")
    # The uninterrupted run from here: the live loop's rest, then 2 loops.
    want = [] if where == "ran-out" else [[(b.epoch, tuple(to_numpy(b.indices).tolist()))
                                          for b in it]]
    want += _run(U, 2)
    first_epochs = [w[0][0] for w in want if w]
    assert first_epochs == ([1] if where in ("start", "mid") else []) + [2, 3]
    R = make(globs, shuffle=False, seed=0, num_workers=1, prefetch=3,
             **({"transform": kw["transform"]} if hook else {}))
    R.load_state_dict(state)
    assert len(R) == len(want[0])
    assert _run(R, len(want)) == want


@pytest.mark.parametrize("hook", [False, True])
def test_a_state_saved_after_break_resumes_the_rest(dataset, hook):
    """A loop left with `break` (a preempted job's) is interrupted, not
    finished: its state resumes the rest of the epoch (nothing skipped),
    then the epochs advance. The saved loader itself moves on to the next
    epoch at its next iter() (the DataLoader habit)."""
    globs, _ = dataset
    kw = dict(shuffle=True, seed=8, num_workers=2)
    if hook:
        kw["transform"] = lambda b: b
    U = make(globs, **kw)
    for k, b in enumerate(U):
        if k == 2:
            break
    del b
    state = U.state_dict()
    assert state["loop_ended"] == 0 and state["consumed"] == 3 * BS and state["epoch"] == 0
    R = make(globs, **kw)
    R.load_state_dict(state)
    plain = dict(shuffle=True, seed=8)
    assert loop(R) == _epoch_from(globs, plain, 0, 3)
    assert loop(R) == _epoch_from(globs, plain, 1, 0)
    assert loop(U) == _epoch_from(globs, plain, 1, 0)


@pytest.mark.parametrize("how", ["mid", "after-break", "ran-out"])
def test_explicit_set_epoch_after_resume(dataset, how):
    """The trainer's own loop `for epoch in range(saved, E): set_epoch(epoch)`:
    set_epoch with the saved epoch keeps the saved position (also when its
    loop had run out: the rest is then empty), another epoch starts afresh."""
    globs, _ = dataset
    kw = dict(shuffle=True, seed=6)
    U = make(globs, **kw)
    U.set_epoch(2)
    it = iter(U)
    k = len(U) if how == "ran-out" else 3
    for _ in range(k):
        next(it)
    if how == "ran-out":
        assert next(it, None) is None
    if how == "after-break":
        del it
    state = U.state_dict()
    assert state["loop_ended"] == int(how == "ran-out")
    R = make(globs, **kw)
    R.load_state_dict(state)
    R.set_epoch(2)
    assert R.state_dict()["loop_ended"] == 0
    assert len(R) == len(U) - k
    assert loop(R) == _epoch_from(globs, kw, 2, k)
    R.set_epoch(3)
    assert loop(R) == _epoch_from(globs, kw, 3, 0)
    # Another epoch right after the load: that epoch, whole.
    R2 = make(globs, **kw)
    R2.load_state_dict(state)
    R2.set_epoch(7)
    assert loop(R2) == _epoch_from(globs, kw, 7, 0)


def test_state_dict_before_start_is_what_the_started_loader_reports(dataset):
    """state_dict() and len() of a loader that has not started (fresh, after
    set_epoch, after load_state_dict of a same-size or an elastic state)
    equal those of the same loader once started (the library's get_state)."""
    globs, _ = dataset
    saver = make(globs, shuffle=True, seed=5, rank=0, world_size=2)
    saver.set_epoch(3)
    it = iter(saver)
    next(it), next(it)
    saved = saver.state_dict()
    cases = [(1, 0, None, None), (1, 0, 4, None), (2, 1, None, saved),
             (2, 0, None, saved), (3, 2, None, saved), (1, 0, None, saved)]
    for world_size, rank, epoch, state in cases:
        L = make(globs, shuffle=True, seed=5, rank=rank, world_size=world_size)
        if epoch is not None:
            L.set_epoch(epoch)
        if state is not None:
            L.load_state_dict(state)
        before, n_before = L.state_dict(), len(L)
        assert L.stats()["num_slots"] == 0, "state_dict()/len() must not start it"
        it = iter(L)                          # starts, nothing consumed yet
        assert L.stats()["num_slots"] > 0
        after = L.state_dict()
        assert before == after, (world_size, rank, epoch)
        assert n_before == len(L) == sum(1 for _ in it)
    # A state saved before the first iter() resumes like one saved after.
    L = make(globs, shuffle=True, seed=5, rank=1, world_size=3)
    L.load_state_dict(saved)
    R = make(globs, shuffle=True, seed=5, rank=1, world_size=3)
    R.load_state_dict(L.state_dict())
    assert loop(R) == loop(L)


def test_load_state_dict_before_start_checks_now(dataset, tmp_path):
    globs, _ = dataset
    st = make(globs).state_dict()
    started = make(globs, batch_size=BS + 1)
    iter(started)
    with pytest.raises(npyload.NpyloadError) as e_started:
        started.load_state_dict(st)
    L = make(globs, batch_size=BS + 1)
    with pytest.raises(npyload.NpyloadError) as e_lazy:
        L.load_state_dict(st)
    assert str(e_lazy.value) == str(e_started.value) and e_lazy.value.code == e_started.value.code
    # Another sample count: the library's message, raised before the start.
    other, _ = write_dataset(tmp_path / "other", n=N + 3,
                             splits={"images": [N + 3], "labels": [N + 3], "mask": [N + 3]})
    started = make(other)
    iter(started)
    with pytest.raises(npyload.NpyloadError) as e_started:
        started.load_state_dict(st)
    L = make(other)
    with pytest.raises(npyload.NpyloadError) as e_lazy:
        L.load_state_dict(st)
    assert str(e_lazy.value) == str(e_started.value) and e_lazy.value.code == e_started.value.code
    assert L.stats()["num_slots"] == 0
    with pytest.raises(ValueError, match="loop_ended"):
        make(globs).load_state_dict(dict(st, loop_ended=2))
    # A state without loop_ended (saved before it existed) resumes its position.
    old = {k: v for k, v in make(globs).state_dict().items() if k != "loop_ended"}
    L = make(globs)
    L.load_state_dict(old)
    assert len(loop(L)) == len(L)


# ---- 2. lazy start ----

def test_construction_holds_no_threads_and_no_slots(dataset):
    globs, _ = dataset
    t0, f0 = threads(), fds()
    L = make(globs, num_workers=3, prefetch=4, io="pread")
    assert threads() == t0, "no worker thread before the first iter()"
    assert fds() == f0, "no file left open by the construction's check"
    st = L.stats()
    assert st["num_slots"] == 0 and st["slot_bytes"] == 0 and st["bytes_read"] == 0
    assert st["backend"] == L.backend == "pread"
    assert L.num_slots == 5                   # what it will have: prefetch + 1
    assert len(L) == -(-N // BS) and L.num_samples == N
    assert L.field_names == ("images", "labels", "mask")
    assert "not started" in repr(L)
    it = iter(L)
    assert threads() >= t0 + 3, "the workers start at the first iter()"
    st = L.stats()
    assert st["num_slots"] == L.num_slots and st["slot_bytes"] > 0
    assert "not started" not in repr(L)
    assert sum(1 for _ in it) == len(L)
    L.close()
    assert threads() == t0


def test_a_loader_never_iterated_closes_and_is_collected(dataset):
    globs, _ = dataset
    t0 = threads()
    L = make(globs, num_workers=2)
    L.close()
    L.close()
    with pytest.raises(ValueError, match="closed"):
        iter(L)
    with pytest.raises(ValueError, match="closed"):
        L.stats()
    assert repr(L) == "<npyload.Loader closed>"
    del L
    with make(globs, num_workers=2) as L:
        assert L.stats()["num_slots"] == 0
    assert threads() == t0


def _bad_datasets(tmp_path):
    """(name, fields, message pattern): what a start refuses."""
    d = tmp_path / "bad"
    d.mkdir()
    np.save(d / "a_0000.npy", np.zeros((6, 3), np.float32))
    np.save(d / "a_0001.npy", np.zeros((4, 3), np.float32))
    np.save(d / "b_0000.npy", np.zeros((9, 2), np.int64))
    np.save(d / "c_0000.npy", np.zeros((10, 2), np.int64))
    np.save(d / "e_0005.npy", np.zeros((10, 2), np.int64))
    (d / "g_0000.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    np.save(d / "s_0000.npy", np.zeros((6, 4), np.float32))
    np.save(d / "s_0001.npy", np.zeros((4, 5), np.float32))
    return [
        ("missing", {"a": str(d / "nothing_*.npy")}, "nothing_"),
        ("counts", {"a": str(d / "a_*.npy"), "b": str(d / "b_*.npy")}, "9|10"),
        ("header", {"g": str(d / "g_*.npy")}, "g_0000.npy"),
        ("shape", {"s": str(d / "s_*.npy")}, "s_0001.npy"),
        ("names", {"c": [str(d / "c_0000.npy")], "e": [str(d / "e_0005.npy")]}, "e_0005"),
    ]


def test_construction_still_raises_what_start_would(tmp_path):
    t0, f0 = threads(), fds()
    for name, fields, pattern in _bad_datasets(tmp_path):
        with pytest.raises(npyload.NpyloadError, match=pattern):
            npyload.Loader(fields, batch_size=2, num_workers=2, output="numpy")
    with pytest.raises(npyload.NpyloadError, match="transform mean has 2 values"):
        npyload.Loader({"a": str(tmp_path / "bad" / "a_*.npy")}, batch_size=2, output="numpy",
                       transforms={"a": npyload.Transform("float32", mean=(1.0, 2.0))})
    assert threads() == t0 and fds() == f0


def test_a_file_changed_before_the_first_iter_raises_there_and_can_retry(tmp_path):
    globs, ref = write_dataset(tmp_path / "ds")
    L = make(globs, num_workers=2)
    victim = sorted(__import__("glob").glob(globs["labels"]))[0]
    saved = open(victim, "rb").read()
    off = npyload.inspect(victim)["data_offset"]
    os.truncate(victim, off + 8)
    with pytest.raises(npyload.NpyloadError, match=os.path.basename(victim)):
        iter(L)
    assert L.stats()["num_slots"] == 0, "a failed start leaves it unstarted"
    with open(victim, "wb") as f:
        f.write(saved)
    got = collect(L)
    check_values(got, ref)
    assert len(got) == len(L) and L.epoch == 0


# ---- 3. a missing field names the fields there are ----

def test_missing_field_keyerror_lists_fields(dataset):
    globs, _ = dataset
    b = next(iter(make(globs)))
    with pytest.raises(KeyError) as ei:
        b["image"]
    msg = str(ei.value)
    for name in ("'images'", "'labels'", "'mask'"):
        assert name in msg, msg
    assert "did you mean 'images'" in msg
    with pytest.raises(KeyError, match="'mask'") as ei:
        b["zzz"]
    assert "did you mean" not in str(ei.value)
    assert b.get("image") is None and "image" not in b
    assert b["images"].shape[0] == len(b.indices)


# ---- 4. torch: Stateful, DCP and a trainer checkpoint ----

try:
    import torch
except ImportError:  # the rest of the module runs without torch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed: the "
                                 "torch checkpoint tests need it")


@needs_torch
def test_loader_is_stateful():
    from torch.distributed.checkpoint.stateful import Stateful
    assert issubclass(npyload.Loader, Stateful)


def _dcp_roundtrip(globs, ckpt, where):
    import torch.distributed.checkpoint as dcp
    U = make(globs, shuffle=True, seed=11, num_workers=2)
    loop(U)
    it = iter(U)
    for _ in range(3):
        next(it)
    if where == "ran-out":
        for _ in it:
            pass
    saved = U.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        dcp.save({"loader": U}, checkpoint_id=str(ckpt))
    want = ([] if where == "ran-out" else
            [[(b.epoch, tuple(to_numpy(b.indices).tolist())) for b in it]]) + _run(U, 2)
    R = make(globs, shuffle=True, seed=11, num_workers=1, prefetch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"loader": R}, checkpoint_id=str(ckpt))
    assert R.stats()["num_slots"] == 0, "dcp.load does not start the loader"
    assert R.state_dict() == saved
    return _run(R, len(want)), want


@needs_torch
@pytest.mark.parametrize("where", ["mid", "ran-out"])
def test_dcp_save_load_single_process(dataset, tmp_path, where):
    import torch.distributed as dist
    assert not (dist.is_available() and dist.is_initialized())
    globs, _ = dataset
    got, want = _dcp_roundtrip(globs, tmp_path / "ckpt", where)
    assert got == want


@needs_torch
def test_dcp_save_load_gloo_world_size_1(dataset, tmp_path):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    globs, _ = dataset
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                            rank=0, world_size=1)
    try:
        got, want = _dcp_roundtrip(globs, tmp_path / "ckpt", "mid")
    finally:
        dist.destroy_process_group()
    assert got == want


def _trainer(globs, epochs, explicit, stop, ckpt_path, resume=None):
    """A StatefulDataLoader-style trainer: one loader, `for epoch in
    range(start, epochs)`, set_epoch(epoch) when `explicit`; the checkpoint
    (torch.save of the loader's state_dict with the trainer's own counters)
    is written at global step `stop` (inside the loop), with stop =
    ("break", t) after leaving the loop at step t (a preempted job), or with
    stop = ("end", e) after epoch e's loop; then it "crashes" (returns).
    Returns the (epoch, indices) it trained on."""
    loader = make(globs, shuffle=True, seed=21, drop_last=True, num_workers=2,
                  output="torch")
    start, step = 0, 0
    if resume is not None:
        ck = torch.load(resume, weights_only=True)
        loader.load_state_dict(ck["loader"])
        start, step = ck["epoch"], ck["step"]
    seen = []
    for epoch in range(start, epochs):
        if explicit:
            loader.set_epoch(epoch)
        for b in loader:
            seen.append((int(b.epoch), tuple(b.indices.tolist())))
            step += 1
            if step == stop:
                torch.save({"loader": loader.state_dict(), "epoch": epoch, "step": step,
                            "model": torch.zeros(2)}, ckpt_path)
                return seen
            if stop == ("break", step):
                break
        if stop == ("break", step):
            torch.save({"loader": loader.state_dict(), "epoch": epoch, "step": step,
                        "model": torch.zeros(2)}, ckpt_path)
            return seen
        if stop == ("end", epoch):
            torch.save({"loader": loader.state_dict(), "epoch": epoch + 1, "step": step,
                        "model": torch.zeros(2)}, ckpt_path)
            return seen
    return seen


@needs_torch
@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("stop", [1, 5, 9, 13, ("end", 0), ("end", 1), ("break", 3),
                                  ("break", 9), ("break", 14)])
def test_trainer_checkpoint_resume_equals_uninterrupted(dataset, tmp_path, explicit, stop):
    """9 batches per epoch (37 samples, batch 4, drop_last): step 9 is the
    last batch of epoch 0 (saved inside its loop), ("end", 0) is after that
    loop. The run before the crash plus the resumed run is the uninterrupted
    run, batch for batch, with or without set_epoch in the trainer."""
    globs, _ = dataset
    full = _trainer(globs, 4, explicit, None, None)
    assert len(full) == 4 * 9 and len({e for e, _ in full}) == 4
    ck = tmp_path / "ck.pt"
    head = _trainer(globs, 4, explicit, stop, ck)
    tail = _trainer(globs, 4, explicit, None, None, resume=ck)
    assert head + tail == full
    if isinstance(stop, int):
        assert len(head) == stop
    else:
        assert len(head) == (stop[1] if stop[0] == "break" else 9 * (stop[1] + 1))
