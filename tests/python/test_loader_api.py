"""npyload.Loader's public behaviour with numpy output: values, order, ranks,
resume, errors, arguments, torchrun environment, inspect/load."""
import glob
import os

import numpy as np
import pytest

from conftest import N, check_values, collect, concat_indices, sampler_indices, write_dataset

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
from npyload import NpyloadError

BS = 4


def make(globs, **kw):
    kw.setdefault("output", "numpy")
    kw.setdefault("batch_size", BS)
    return npyload.Loader(globs, **kw)


def expected_order(n, shuffle, seed=0, epoch=0, rank=0, world_size=1, drop_last=False, bs=BS):
    return np.array(npyload.order_indices(n, shuffle, seed, epoch, rank, world_size,
                                          drop_last, bs), dtype=np.int64)


# ---- inspect / load ----

def test_inspect_and_load_match_numpy(dataset):
    globs, _ = dataset
    for g in globs.values():
        for path in sorted(glob.glob(g)):
            ref = np.load(path)
            info = npyload.inspect(path)
            assert info["shape"] == ref.shape
            assert np.dtype(info["descr"]) == ref.dtype
            assert info["fortran_order"] is False
            assert info["data_bytes"] == ref.nbytes
            assert info["data_offset"] + info["data_bytes"] == os.path.getsize(path)
            assert info["version"][0] in (1, 2, 3)
            for mm in (True, False):
                arr = npyload.load(path, mmap=mm)
                assert arr.dtype == ref.dtype and arr.shape == ref.shape
                np.testing.assert_array_equal(arr, ref)


def test_load_fortran_and_scalar(tmp_path):
    a = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    np.save(tmp_path / "f.npy", a)
    np.save(tmp_path / "s.npy", np.float64(2.5))
    assert npyload.inspect(tmp_path / "f.npy")["fortran_order"] is True
    for mm in (True, False):
        np.testing.assert_array_equal(npyload.load(tmp_path / "f.npy", mmap=mm), a)
        assert npyload.load(tmp_path / "s.npy", mmap=mm) == 2.5


def test_inspect_malformed_names_file(tmp_path):
    p = tmp_path / "bad.npy"
    p.write_bytes(b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(NpyloadError) as ei:
        npyload.inspect(p)
    assert "bad.npy" in str(ei.value)
    assert isinstance(ei.value, RuntimeError)
    assert isinstance(ei.value.code, int) and ei.value.code < 0


# ---- values and order ----

@pytest.mark.parametrize("io", ["auto", "pread", "mmap"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_values_equal_numpy(dataset, io, shuffle):
    globs, ref = dataset
    loader = make(globs, io=io, shuffle=shuffle, seed=3, num_workers=2)
    assert loader.backend in ("io_uring", "uring", "pread", "mmap")
    assert loader.num_samples == N
    batches = collect(loader)
    assert len(batches) == len(loader) == -(-N // BS)
    check_values(batches, ref)
    order = concat_indices(batches)
    assert sorted(order.tolist()) == list(range(N))
    np.testing.assert_array_equal(order, expected_order(N, int(shuffle), seed=3))
    if not shuffle:
        np.testing.assert_array_equal(order, np.arange(N))
    assert [b[0].shape[0] for b in batches] == [BS] * (N // BS) + [N % BS]


def test_batch_is_a_mapping(dataset):
    globs, ref = dataset
    loader = make(globs)
    b = next(iter(loader))
    assert list(b.keys()) == list(globs.keys())
    assert len(b) == 3 and "images" in b and "nope" not in b
    assert b.epoch == 0 and b.seq == 0 and b.num_samples == BS
    assert isinstance(b["images"], np.ndarray)
    assert b.indices.dtype == np.int64
    with pytest.raises(KeyError):
        b["nope"]
    with pytest.raises(TypeError):
        b["images"] = 1
    assert "images" in repr(b)


@pytest.mark.parametrize("shuffle", [False, True, "local"])
def test_order_independent_of_workers_prefetch_io(dataset, shuffle):
    globs, ref = dataset
    runs = []
    for nw, pf, io in [(1, 1, "pread"), (3, 4, "mmap"), (2, None, "auto"), (3, 1, "auto")]:
        b = collect(make(globs, shuffle=shuffle, seed=11, num_workers=nw, prefetch=pf, io=io, window=2))
        check_values(b, ref)
        runs.append(concat_indices(b))
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    assert sorted(runs[0].tolist()) == list(range(N))


def test_epochs_and_set_epoch(dataset):
    globs, ref = dataset
    loader = make(globs, shuffle=True, seed=5)
    e0 = concat_indices(collect(loader))
    np.testing.assert_array_equal(e0, expected_order(N, 1, seed=5, epoch=0))
    e1_auto = concat_indices(collect(loader))  # new iter: the next epoch
    assert loader.epoch == 1
    loader.set_epoch(0)                          # set_epoch wins: epoch 0 again
    e0_again = concat_indices(collect(loader))
    np.testing.assert_array_equal(e0, e0_again)
    loader.set_epoch(1)
    e1 = concat_indices(collect(loader))
    np.testing.assert_array_equal(e1, e1_auto)
    assert not np.array_equal(e0, e1)
    np.testing.assert_array_equal(e1, expected_order(N, 1, seed=5, epoch=1))
    assert sorted(e1.tolist()) == list(range(N))
    b = next(iter(loader))  # another iter(): the epoch after
    assert b.epoch == 2 and loader.epoch == 2
    # another loader, other seed: another order
    other = concat_indices(collect(make(globs, shuffle=True, seed=6)))
    assert not np.array_equal(e0, other)


def test_break_and_iterate_again(dataset):
    globs, ref = dataset
    loader = make(globs, prefetch=2)
    first = collect(loader)
    for i, b in enumerate(loader):
        if i == 2:
            break
    again = collect(loader)
    assert len(again) == len(first)
    for (i1, d1), (i2, d2) in zip(first, again):
        np.testing.assert_array_equal(i1, i2)
    check_values(again, ref)
    # an iterator superseded by a newer one refuses to go on
    it1 = iter(loader)
    next(it1)
    it2 = iter(loader)
    assert next(it2).seq == 0
    with pytest.raises(RuntimeError):
        next(it1)


def test_fields_as_path_lists(dataset):
    globs, ref = dataset
    fields = {k: sorted(glob.glob(g)) for k, g in globs.items()}
    b = collect(make(fields))
    check_values(b, ref)
    # explicit order is kept (not re-sorted): reverse the image files
    rev = dict(fields, images=list(reversed(fields["images"])))
    imgs = np.concatenate([np.load(p) for p in rev["images"]])
    got = collect(make({"images": rev["images"]}))
    for idx, data in got:
        np.testing.assert_array_equal(data["images"], imgs[idx])


def test_drop_last(dataset):
    globs, ref = dataset
    loader = make(globs, drop_last=True)
    b = collect(loader)
    assert len(loader) == len(b) == N // BS
    assert all(len(i) == BS for i, _ in b)
    check_values(b, ref)


# ---- ranks ----

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_cover_and_agree(dataset, drop_last, shuffle):
    globs, ref = dataset
    for W in range(1, 5):
        seen, lens = [], set()
        for r in range(W):
            loader = make(globs, rank=r, world_size=W, drop_last=drop_last, shuffle=shuffle, seed=2)
            b = collect(loader)
            check_values(b, ref)
            lens.add(len(loader))
            assert len(b) == len(loader)
            idx = concat_indices(b)
            np.testing.assert_array_equal(
                idx, expected_order(N, int(shuffle), 2, 0, r, W, drop_last))
            if not shuffle:
                exp = sampler_indices(N, W, r, drop_last)
                if drop_last:
                    exp = exp[:len(exp) // BS * BS]
                assert idx.tolist() == exp
            seen.append(idx)
        assert len(lens) == 1, f"world_size {W}: ranks disagree on len(loader): {lens}"
        union = set(np.concatenate(seen).tolist())
        if not drop_last:
            assert union == set(range(N))
        else:
            # only the dropped tail is missing
            assert len(union) == sum(len(s) for s in seen)


def test_torchrun_environment(dataset, monkeypatch):
    globs, ref = dataset
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = make(globs)
    assert (loader.rank, loader.world_size) == (2, 3)
    idx = concat_indices(collect(loader))
    assert idx.tolist() == sampler_indices(N, 3, 2, False)
    # explicit arguments win over the environment
    loader = make(globs, rank=0, world_size=1)
    assert (loader.rank, loader.world_size) == (0, 1)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="rank"):
        make(globs)


def test_device_string_parsing(monkeypatch):
    from npyload._options import _parse_device
    assert _parse_device("cpu") == -1
    assert _parse_device(None) == -1
    assert _parse_device("cuda:3") == 3
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert _parse_device("cuda") == 0
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert _parse_device("cuda") == 5
    for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""]:
        with pytest.raises(ValueError, match="device"):
            _parse_device(bad)
    with pytest.raises(TypeError):
        _parse_device(1.5)


# ---- resume ----

@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [0, 1, 3, 9])
def test_resume_mid_epoch(dataset, shuffle, k):
    globs, ref = dataset
    full = collect(make(globs, shuffle=shuffle, seed=9, num_workers=1))
    loader = make(globs, shuffle=shuffle, seed=9, num_workers=1)
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = loader.state_dict()
    assert all(isinstance(v, int) for v in state.values())
    assert state["consumed"] == min(k * BS, N)
    del it, loader
    resumed = make(globs, shuffle=shuffle, seed=0, num_workers=3, prefetch=5, io="pread")
    resumed.load_state_dict(dict(state))
    resumed.set_epoch(state["epoch"])  # the usual epoch loop: keeps the position
    rest = collect(resumed)
    assert len(rest) == len(full) - k
    for (i1, d1), (i2, d2) in zip(full[k:], rest):
        np.testing.assert_array_equal(i1, i2)
        for name in d1:
            np.testing.assert_array_equal(d1[name], d2[name])
    # the next iter() starts the next epoch from its beginning
    again = collect(resumed)
    explicit = make(globs, shuffle=shuffle, seed=9, num_workers=1)
    explicit.set_epoch(state["epoch"] + 1)
    np.testing.assert_array_equal(concat_indices(again), concat_indices(collect(explicit)))
    assert resumed.epoch == state["epoch"] + 1


def test_resume_in_later_epoch_with_ranks(dataset):
    globs, ref = dataset
    loader = make(globs, shuffle=True, seed=4, rank=1, world_size=2)
    loader.set_epoch(3)
    it = iter(loader)
    next(it), next(it)
    st = loader.state_dict()
    assert st["epoch"] == 3 and st["rank"] == 1
    ref_rest = concat_indices(collect_from(it))
    other = make(globs, shuffle=True, seed=4, rank=1, world_size=2, num_workers=1)
    other.load_state_dict(st)
    np.testing.assert_array_equal(concat_indices(collect(other)), ref_rest)


def collect_from(it):
    from conftest import to_numpy
    return [(to_numpy(b.indices), {}) for b in it]


def test_resume_mismatch_raises(dataset):
    globs, _ = dataset
    st = make(globs).state_dict()
    other = make(globs, batch_size=BS + 1)
    with pytest.raises(NpyloadError):
        other.load_state_dict(st)
    with pytest.raises((ValueError, TypeError)):
        other.load_state_dict({"epoch": 0})


# ---- errors ----

def test_truncated_file_names_it(tmp_path):
    globs, _ = write_dataset(tmp_path)
    victim = sorted(glob.glob(globs["images"]))[1]
    data = open(victim, "rb").read()
    with open(victim, "wb") as f:
        f.write(data[: len(data) - 100])
    with pytest.raises(NpyloadError) as ei:
        collect(make(globs))
    assert os.path.basename(victim) in str(ei.value)


def test_malformed_file_names_it(tmp_path):
    globs, _ = write_dataset(tmp_path)
    victim = sorted(glob.glob(globs["labels"]))[0]
    with open(victim, "r+b") as f:
        f.write(b"\x93NUMPX")
    with pytest.raises(NpyloadError) as ei:
        make(globs)
    assert os.path.basename(victim) in str(ei.value)


def test_mismatched_sample_counts_name_files(tmp_path):
    globs, _ = write_dataset(tmp_path)
    extra = os.path.join(os.path.dirname(globs["mask"]), "mask_0001.npy")
    np.save(extra, np.zeros((3, 5), np.uint8))
    with pytest.raises(NpyloadError) as ei:
        make(globs)
    msg = str(ei.value)
    assert "mask" in msg and ("37" in msg or "40" in msg), msg


def test_mismatched_shape_within_field(tmp_path):
    globs, _ = write_dataset(tmp_path)
    victim = sorted(glob.glob(globs["images"]))[2]
    np.save(victim, np.zeros((9, 2, 8, 15), np.float32))
    with pytest.raises(NpyloadError) as ei:
        make(globs)
    assert os.path.basename(victim) in str(ei.value)


def test_no_files_matched(tmp_path):
    with pytest.raises(NpyloadError) as ei:
        make({"x": str(tmp_path / "nothing_*.npy")})
    assert ei.value.code == npyload._npyload.ENOFILES


@pytest.mark.parametrize("kw, exc", [
    (dict(batch_size=0), ValueError),
    (dict(batch_size=-3), ValueError),
    (dict(batch_size=2.5), TypeError),
    (dict(batch_size=True), TypeError),
    (dict(batch_size="4"), TypeError),
    (dict(num_workers=-1), ValueError),  # 0 = synchronous reads (test_transform.py)
    (dict(prefetch=0), ValueError),
    (dict(shuffle="sometimes"), ValueError),
    (dict(io="floppy"), ValueError),
    (dict(device="gpu"), ValueError),
    (dict(device="cuda:x"), ValueError),
    (dict(rank=2, world_size=2), ValueError),
    (dict(rank=-1, world_size=2), ValueError),
    (dict(world_size=0), ValueError),
    (dict(output="jax"), ValueError),
    (dict(window=0), ValueError),
])
def test_bad_arguments(dataset, kw, exc):
    globs, _ = dataset
    kw.setdefault("batch_size", BS)
    kw.setdefault("output", "numpy")
    with pytest.raises(exc) as ei:
        npyload.Loader(globs, **kw)
    assert str(ei.value)


# Every numeric argument, just outside its range and far beyond it (2**64,
# 2**100: never a bare OverflowError). The range is in the caller's units:
# prefetch counts batches ahead (the library's slots - 1, or - 2 with
# transform=), num_workers=0 is "no thread". (name, kwargs, range).
P = 2 ** 64
OUT_OF_RANGE = [
    ("batch_size", dict(batch_size=0), "1 .. 2147483648"),
    ("batch_size", dict(batch_size=2 ** 31 + 1), "1 .. 2147483648"),
    ("batch_size", dict(batch_size=P), "1 .. 2147483648"),
    ("num_workers", dict(num_workers=-1), "0 .. 256"),
    ("num_workers", dict(num_workers=257), "0 .. 256"),
    ("num_workers", dict(num_workers=2 ** 100), "0 .. 256"),
    ("prefetch", dict(prefetch=0), "1 .. 1023"),
    ("prefetch", dict(prefetch=1024), "1 .. 1023"),
    ("prefetch", dict(prefetch=P), "1 .. 1023"),
    ("prefetch", dict(prefetch=1023, transform=lambda b: b), "1 .. 1022"),
    ("seed", dict(seed=2 ** 63), "-2**63 .. 2**63-1"),
    ("seed", dict(seed=-2 ** 63 - 1), "-2**63 .. 2**63-1"),
    ("seed", dict(seed=-2 ** 100), "-2**63 .. 2**63-1"),
    ("rank", dict(rank=-1, world_size=2), "0 .. 1"),
    ("rank", dict(rank=2, world_size=2), "0 .. 1"),
    ("rank", dict(rank=P, world_size=2), "0 .. 1"),
    ("world_size", dict(world_size=0), "1 .. 16777216"),
    ("world_size", dict(world_size=2 ** 24 + 1), "1 .. 16777216"),
    ("world_size", dict(world_size=P), "1 .. 16777216"),
    ("window", dict(window=0), "1 .. 2147483648"),
    ("window", dict(window=2 ** 100), "1 .. 2147483648"),
    ("max_errors", dict(max_errors=0), "1 .. 2**63-1"),
    ("max_errors", dict(max_errors=2 ** 63), "1 .. 2**63-1"),
    ("device", dict(device=-2), "-1 (cpu) or a CUDA device index 0 .. 1024"),
    ("device", dict(device=1025), "-1 (cpu) or a CUDA device index 0 .. 1024"),
    ("device", dict(device=P), "-1 (cpu) or a CUDA device index 0 .. 1024"),
    ("device", dict(device="cuda:" + str(P)), "-1 (cpu) or a CUDA device index 0 .. 1024"),
]


@pytest.mark.parametrize("name, kw, span", OUT_OF_RANGE,
                         ids=[f"{n}={next(iter(k.values()))}"[:40] for n, k, _ in OUT_OF_RANGE])
def test_out_of_range_arguments_name_argument_value_and_range(dataset, name, kw, span):
    globs, _ = dataset
    kw = dict(kw)
    kw.setdefault("batch_size", BS)
    with pytest.raises(ValueError) as ei:
        make(globs, **kw)
    value = kw[name] if name != "device" or not isinstance(kw[name], str) else P
    assert str(ei.value).startswith(f"{name} = {value} out of range: {span}"), str(ei.value)


@pytest.mark.parametrize("epoch", [-1, 2 ** 63, P, 2 ** 100])
def test_set_epoch_out_of_range(dataset, epoch):
    globs, _ = dataset
    with make(globs) as L:
        with pytest.raises(ValueError, match=rf"^epoch = {epoch} out of range: 0 \.\. 2\*\*63-1"):
            L.set_epoch(epoch)
        L.set_epoch(2 ** 63 - 1)  # the largest is accepted
        assert L.state_dict()["epoch"] == 2 ** 63 - 1


@pytest.mark.parametrize("name, opt, hi", [
    ("batch_size", "BATCH_SIZE", 2 ** 31), ("num_workers", "NUM_WORKERS", 256),
    ("world_size", "WORLD_SIZE", 2 ** 24), ("window", "SHUFFLE_WINDOW", 2 ** 31),
    ("max_errors", "MAX_ERRORS", 2 ** 63 - 1)])
def test_python_limits_are_the_librarys(name, opt, hi):
    """The ranges Python checks are those npyload_loader_set enforces (the
    C setter is the truth): the top of each is accepted there, one more
    refused."""
    from npyload import _npyload
    c = _npyload.Loader()
    o = getattr(_npyload, "OPT_" + opt)
    c.set(o, hi)
    if hi < 2 ** 63 - 1:
        with pytest.raises(NpyloadError, match=f"{opt} = {hi + 1} out of range"):
            c.set(o, hi + 1)
    assert _npyload.Loader.option_ranges()[o][1] == hi
    c.close()


@pytest.mark.parametrize("hook", [False, True])
def test_largest_prefetch_uses_every_slot_the_library_allows(dataset, hook):
    """prefetch's top (1023, or 1022 with transform=) builds a loader with
    the library's largest slot count; one more is refused by Python, naming
    prefetch (the library itself refuses one slot more)."""
    globs, _ = dataset
    from npyload import _npyload
    top = 1022 if hook else 1023
    kw = dict(transform=lambda b: b) if hook else {}
    with make(globs, prefetch=top, num_workers=1, **kw) as L:
        assert L.prefetch == top
        assert L.num_slots == 1024
        assert sum(len(b.indices) if not hook else len(b.indices) for b in L) == N
    c = _npyload.Loader()
    with pytest.raises(NpyloadError, match="PREFETCH = 1025 out of range"):
        c.set(_npyload.OPT_PREFETCH, 1025)
    c.close()


@pytest.mark.parametrize("fields, exc", [
    ({}, ValueError), ([], TypeError), ("a/*.npy", TypeError),
    ({"x": 3}, TypeError), ({"x": []}, ValueError), ({"": "a"}, TypeError),
])
def test_bad_fields(fields, exc):
    with pytest.raises((exc, TypeError, ValueError)) as ei:
        npyload.Loader(fields, batch_size=2, output="numpy")
    assert "field" in str(ei.value)


def test_stats_and_backend(dataset):
    globs, _ = dataset
    loader = make(globs, io="pread")
    collect(loader)
    s = loader.stats()
    assert s["backend"] == loader.backend == "pread"
    assert s["batches_delivered"] >= len(loader)
    assert s["samples_delivered"] >= N
    assert s["device"] == -1
    assert "pread" in repr(loader)


@pytest.mark.parametrize("hook", [False, True])
def test_default_prefetch_is_asked_of_the_library(dataset, hook):
    """prefetch=None is 'auto' (issue 37): the library's controller starts
    with at most the slots a C loader gets with PREFETCH 0
    (npyload_default_prefetch for the worker count: the workers' fill plus
    the held slot, the ready one added when the loop waits), for every
    worker count; Python asks rather than recompute. With transform=, the
    hook's depth follows from the library's default."""
    globs, _ = dataset
    from npyload import _npyload
    from npyload._hook import _hook_depth
    for w in range(0, 9):
        c = _npyload.Loader()
        for name, g in globs.items():
            c.add_field(name, g)
        c.set(_npyload.OPT_BATCH_SIZE, BS)
        c.set(_npyload.OPT_NUM_WORKERS, w if w else -1)
        c.start()
        c_slots = c.get(_npyload.OPT_PREFETCH)
        c.close()
        kw = dict(transform=lambda b: b) if hook else {}
        with make(globs, num_workers=w, **kw) as L:
            assert L.prefetch == "auto"
            if w == 0:  # synchronous: no controller, the default slots
                assert L.num_slots == _npyload.AUTO
            default = _npyload.default_prefetch(w if w else -1)
            assert c_slots <= default, (w, c_slots, default)
            if hook:
                assert L._hook_prefetch == max(1, default - 1), (w, L._hook_prefetch)
                continue
            it = iter(L)
            next(it)  # one batch: no window has closed, the first count holds
            assert L.stats()["num_slots"] == c_slots, (w, L.stats()["num_slots"], c_slots)
            del it


@pytest.mark.parametrize("transform", [False, True])
@pytest.mark.parametrize("read_ahead", [True, False])
def test_read_ahead_bytes_and_overlap(dataset, read_ahead, transform):
    """read_ahead=True (the default) and False deliver numpy's values in the
    documented order. With one worker and a slot for every batch, every
    batch after the first is read ahead (counted by the loader, not timed)
    when batches have work after their reads (here a host transform), and
    none without read-ahead or when batches are delivered as stored: there
    the read-ahead would only hand the reads to the read thread and back,
    which cost small rows a quarter of their rate (issue 37)."""
    globs, ref = dataset
    kw = {}
    if transform:
        kw["transforms"] = {"images": npyload.Transform("float32", scale=2.0)}
        ref = dict(ref, images=ref["images"] * np.float32(2))  # exact
    with make(globs, num_workers=1, prefetch=16, shuffle=True, seed=3,
              read_ahead=read_ahead, **kw) as L:
        assert L.read_ahead is read_ahead
        batches = collect(L)
        check_values(batches, ref)
        got = np.concatenate([i for i, _ in batches])
        np.testing.assert_array_equal(got, expected_order(N, True, seed=3))
        st = L.stats()
        ahead = len(batches) - 1 if read_ahead and transform else 0
        assert st["read_ahead_batches"] == ahead, st
    with pytest.raises(TypeError, match="read_ahead must be a bool"):
        make(globs, read_ahead="yes")
