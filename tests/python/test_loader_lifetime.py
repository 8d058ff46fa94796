"""Zero-copy views and their lifetime: shared memory, slot release, deleting
the loader while arrays live, the bounded slot ring, DLPack capsules,
Ctrl-C while iterating."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import N, check_values, collect, to_numpy

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
from npyload import NpyloadError

BS = 4


def make(globs, **kw):
    kw.setdefault("output", "numpy")
    kw.setdefault("batch_size", BS)
    return npyload.Loader(globs, **kw)


def test_views_share_slot_memory(dataset):
    globs, ref = dataset
    loader = make(globs)
    b = next(iter(loader))
    raw = b._raw
    ptrs = raw.data_ptrs
    for i, name in enumerate(loader.field_names):
        a = b[name]
        assert a.__array_interface__["data"][0] == ptrs[i]
        again = np.asarray(raw.field(name))
        assert np.shares_memory(a, again)
        assert a.base is not None  # the View keeps the slot
        assert a.flags.c_contiguous
    np.testing.assert_array_equal(b["labels"], ref["labels"][b.indices])


def test_copy_does_not_share(dataset):
    globs, ref = dataset
    loader = make(globs, copy=True, prefetch=1)
    got = []
    for b in loader:
        assert b._raw is None
        for name in loader.field_names:
            assert b[name].flags.owndata
        got.append(b)  # keeping copies holds no slot
    assert len(got) == len(loader)
    check_values([(b.indices, dict(b)) for b in got], ref)
    assert not np.shares_memory(got[0]["images"], got[1]["images"])


def test_slot_released_when_last_view_dies(dataset):
    globs, ref = dataset
    loader = make(globs, prefetch=1)  # 2 slots
    it = iter(loader)
    b0 = next(it)
    keep = b0["images"]  # an array alone keeps the slot
    raw = b0._raw
    del b0
    gc.collect()
    assert not raw.released and raw.live_views >= 1
    b1 = next(it)
    with pytest.raises(NpyloadError, match="slot"):
        next(it)  # both slots held: an error, not a hang
    with pytest.raises(RuntimeError, match="live view"):
        raw.release()  # refused: memory still exported
    np.testing.assert_array_equal(keep, ref["images"][:BS])
    del keep, raw, b1
    gc.collect()
    # the loader recovers once slots come back (a new pass starts cleanly)
    check_values(collect(loader), ref)


def test_bounded_ring_error_message(dataset):
    globs, _ = dataset
    loader = make(globs, prefetch=2)
    held = []
    with pytest.raises(NpyloadError) as ei:
        for b in loader:
            held.append(b)
    assert len(held) == loader.num_slots
    assert "slot" in str(ei.value)


def test_delete_loader_while_arrays_alive(dataset):
    globs, ref = dataset
    loader = make(globs, prefetch=4, num_workers=3)
    it = iter(loader)
    kept = [next(it) for _ in range(3)]
    arrays = [(b.indices.copy(), b["images"], b["labels"], b["mask"]) for b in kept]
    del it, loader, kept
    gc.collect()
    for idx, im, lab, mask in arrays:
        np.testing.assert_array_equal(im, ref["images"][idx])
        np.testing.assert_array_equal(lab, ref["labels"][idx])
        np.testing.assert_array_equal(mask, ref["mask"][idx])
    arrays[0][1][...] = 0  # writable, and still ours
    del arrays
    gc.collect()


def test_close_then_use(dataset):
    globs, ref = dataset
    with make(globs) as loader:
        b = next(iter(loader))
    with pytest.raises(ValueError, match="closed"):
        len(loader)
    with pytest.raises(ValueError, match="closed"):
        iter(loader)
    np.testing.assert_array_equal(b["images"], ref["images"][b.indices])
    assert "closed" in repr(loader)


def test_dlpack_capsules(dataset):
    globs, ref = dataset
    loader = make(globs)
    b = next(iter(loader))
    raw = b._raw
    base = raw.live_views
    v = raw.field("labels")
    assert v.__dlpack_device__() == (1, 0)
    # unconsumed capsules (legacy and versioned) free their reference
    c1 = v.__dlpack__()
    c2 = v.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(c1) and "dltensor_versioned" in repr(c2)
    del c1, c2, v
    gc.collect()
    assert raw.live_views == base
    # numpy as a DLPack consumer (versioned protocol)
    if hasattr(np, "from_dlpack"):
        a = np.from_dlpack(raw.field("labels"))
        assert np.shares_memory(a, b["labels"])
        np.testing.assert_array_equal(a, ref["labels"][b.indices])
        a2 = np.from_dlpack(raw.field("mask"), copy=True) if np.__version__ >= "2" else None
        if a2 is not None:
            assert not np.shares_memory(a2, b["mask"])
            np.testing.assert_array_equal(a2, ref["mask"][b.indices])
    with pytest.raises(BufferError):
        raw.field("labels").__dlpack__(dl_device=(2, 0))


def _capsule_words(cap, name, n):
    """The first n uint64 words of a capsule's struct, read with ctypes (an
    independent view of the DLPack layout: version, manager_ctx, deleter,
    flags for DLManagedTensorVersioned)."""
    import ctypes
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    p = get(cap, name)
    return (ctypes.c_uint64 * n).from_address(p)


def test_versioned_capsule_layout(dataset):
    """The versioned capsule follows upstream dlpack.h 1.x: version {1, minor}
    first, flags after manager_ctx and deleter, IS_COPIED (bit 1) set for
    copy=True only, and the DLTensor's data/ndim/shape after the flags."""
    import ctypes
    globs, ref = dataset
    loader = make(globs)
    b = next(iter(loader))
    v = b._raw.field("labels")
    for copy, flag in ((None, 0), (True, 2)):
        cap = v.__dlpack__(max_version=(1, 0), copy=copy)
        w = _capsule_words(cap, b"dltensor_versioned", 8)
        major, minor = w[0] & 0xFFFFFFFF, w[0] >> 32
        assert major == 1 and minor >= 0
        assert w[3] & 3 == flag
        data, ndim = w[4], ctypes.c_int32.from_address(
            ctypes.addressof(w) + 6 * 8).value  # DLTensor: data, device(8), ndim
        assert ndim == 2
        if copy is None:
            assert data == v.data_ptr
        shape = (ctypes.c_int64 * 2).from_address(w[7])
        assert tuple(shape) == tuple(np.asarray(b["labels"]).shape)
        del cap, w
    del v
    gc.collect()


def test_indices_view(dataset):
    globs, _ = dataset
    loader = make(globs, shuffle=True)
    b = next(iter(loader))
    iv = np.asarray(b._raw.indices_view())
    np.testing.assert_array_equal(iv, b.indices)
    assert b._raw.indices_list() == b.indices.tolist()


SIGINT_SCRIPT = textwrap.dedent("""
    import sys, time, npyload
    globs = dict(images=sys.argv[1], labels=sys.argv[2], mask=sys.argv[3])
    loader = npyload.Loader(globs, batch_size=1, prefetch=1, num_workers=1, output="numpy")
    print("started", flush=True)
    e = 0
    while True:
        loader.set_epoch(e)
        for b in loader:
            pass
        e += 1
""")


def test_ctrl_c_interrupts_promptly(many_batches, tmp_path):
    globs, _ = many_batches
    script = tmp_path / "spin.py"
    script.write_text(SIGINT_SCRIPT)
    p = subprocess.Popen([sys.executable, str(script), globs["images"], globs["labels"], globs["mask"]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=5)
        assert time.monotonic() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0
    assert "KeyboardInterrupt" in err, err


WAIT_SCRIPT = textwrap.dedent("""
    import sys, threading, time, npyload
    globs = dict(images=sys.argv[1], labels=sys.argv[2], mask=sys.argv[3])
    loader = npyload.Loader(globs, batch_size=1, prefetch=1, num_workers=1, output="numpy")
    it = iter(loader)
    a = next(it)
    b = next(it)   # both slots held now: next() must refuse, not hang
    try:
        next(it)
    except npyload.NpyloadError as e:
        print("refused:", e, flush=True)
    # a second thread runs Python while the main thread iterates: the GIL is
    # released during waits
    n = [0]
    def spin():
        while n[0] >= 0:
            n[0] += 1
            time.sleep(0.001)
    t = threading.Thread(target=spin, daemon=True)
    t.start()
    del a, b
    for _ in loader:
        pass
    print("ok", n[0] > 0, flush=True)
""")


def test_refusal_and_gil_release(many_batches, tmp_path):
    globs, _ = many_batches
    script = tmp_path / "wait.py"
    script.write_text(WAIT_SCRIPT)
    r = subprocess.run([sys.executable, str(script), globs["images"], globs["labels"], globs["mask"]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "slot" in r.stdout
    assert "ok True" in r.stdout


# ---- every consumer stream is recorded (issue 17 item 2b) ----
# Host batches ignore streams; these tests record them through the private
# hook that __dlpack__ and wait_stream use for device batches, and replace
# the torch-based joiner with a fake, so the bookkeeping is checked without
# CUDA. The CUDA path itself is in test_loader_torch.py (skips without GPU).

def test_streams_recorded_distinct_in_order(dataset):
    globs, _ = dataset
    loader = make(globs)
    b = next(iter(loader))
    raw = b._raw
    assert raw._streams == ()
    for s in (5, 7, 5, None, 7, 11):
        raw._note_stream(s)
    assert raw._streams == (5, 7, 0, 11)


def _loader_with_fake_joiner(globs, calls, result=9, fail=False):
    loader = make(globs, prefetch=1)

    def joiner(device, handles):
        calls.append((device, list(handles)))
        if fail:
            raise RuntimeError("joiner failed on purpose")
        return result

    loader._started()._set_stream_joiner(joiner)  # (the C loader, started now)
    return loader


def test_release_joins_every_recorded_stream(dataset):
    globs, ref = dataset
    calls = []
    loader = _loader_with_fake_joiner(globs, calls)
    it = iter(loader)
    b = next(it)
    b._raw._note_stream(5)
    b._raw._note_stream(7)
    kept, idx = b["labels"], np.array(b.indices)
    del b
    gc.collect()
    assert calls == []                 # the array still holds the slot
    del kept
    gc.collect()
    assert calls == [(-1, [5, 7])]     # released: ordered after both streams
    # one stream needs no join; none neither
    b = next(it)
    b._raw._note_stream(5)
    del b
    b = next(it)
    del b
    gc.collect()
    assert calls == [(-1, [5, 7])]
    rest = collect(it)
    assert len(rest) == len(loader) - 3
    check_values(rest, ref)


def test_failing_joiner_is_reported_and_slot_still_released(dataset, monkeypatch):
    globs, ref = dataset
    calls, seen = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    loader = _loader_with_fake_joiner(globs, calls, fail=True)
    it = iter(loader)
    b = next(it)
    b._raw._note_stream(1)
    b._raw._note_stream(2)
    del b
    gc.collect()
    assert len(calls) == 1
    assert len(seen) == 1 and "on purpose" in str(seen[0])
    # prefetch=1: two slots, so the loader goes on only if the slot came back
    rest = collect(it)
    assert len(rest) == len(loader) - 1
    check_values(rest, ref)


def test_joiner_runs_inside_a_pending_exception(dataset):
    """A batch freed while an exception propagates keeps that exception."""
    globs, _ = dataset
    calls = []
    loader = _loader_with_fake_joiner(globs, calls)
    b = next(iter(loader))
    b._raw._note_stream(3)
    b._raw._note_stream(4)

    def boom(batch):
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        try:
            boom(b)
        finally:
            del b
    assert calls == [(-1, [3, 4])]
