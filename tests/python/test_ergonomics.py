"""PyTorch ergonomics of npyload.Loader (issue 15, item 4): as_tuple, a Batch
iterated like a tuple, pin_memory=True without CUDA, len() after
load_state_dict (same and other world size), batch tensors edited in place,
the README's migration example run as written, and every other python block
of the README run (or skipped with the reason the README gives). Independent truth:
numpy's reading of the files (conftest), DistributedSampler's split written
out (conftest.sampler_indices), and counting the batches a loop yields."""
import glob
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import npyload
from conftest import N, collect, sampler_indices, to_numpy, write_dataset

REPO = Path(__file__).resolve().parents[2]
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


# ---- the README's migration example ----

def _readme_block(marker):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    hits = [b for b in blocks if b.startswith(marker)]
    assert len(hits) == 1, f"README.md: one python block starting with {marker!r} expected"
    return hits[0]


def test_readme_migration_example_runs_as_written(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    code = _readme_block("# After: npyload")
    assert 'torch.cuda.is_available()' in code, "the device= line works with and without a GPU"
    # The captcha layout of the example, tiny: 3 files of 64 samples per field.
    _readme_fixture(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    calls = []

    def step(images, heatmaps, offsets):        # the trainer's, as in "Before"
        assert images.shape == (128, 2, 8, 16) and heatmaps.shape == (128, 2, 4, 8)
        assert offsets.shape == (128, 4, 4, 8)
        assert images.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        calls.append(1)

    env = {"epochs": 2, "step": step}
    exec(compile(code, "README.md (After: npyload)", "exec"), env)
    assert len(calls) == 2, "one batch of 128 per epoch (192 samples, drop_last)"


# ---- every python block of the README runs ----
#
# Each ```python block of README.md runs in a fresh directory holding a small
# dataset in the README's layout (data/images/train/train_NNNN.npy, the
# labels beside it, data/x_NNNN.npy with 3 uint8 channels for the transform
# example, a.npy and b.npy for pack), with the names the prose around the
# blocks assumes (epochs, step, dataset, device, the torch imports). A block
# that cannot run here says why on the line before it, which the test shows
# as its skip reason:
#   <!-- readme-test: skip: REASON -->   never run here
#   <!-- readme-test: cuda -->           runs where torch sees a CUDA device

_MARK = re.compile(r"<!-- readme-test: (skip: (?P<why>.+?)|(?P<cuda>cuda)) -->")


def _readme_python_blocks():
    lines = (REPO / "README.md").read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            mark = _MARK.fullmatch(lines[i - 1].strip()) if i else None
            blocks.append(pytest.param("\n".join(lines[i + 1:j]) + "\n", mark,
                                       id=f"README.md:{i + 1}"))
            i = j
        i += 1
    return blocks


def _readme_fixture(root):
    rng = np.random.default_rng(0)
    shapes = {"images": (2, 8, 16), "heatmaps": (2, 4, 8), "offsets": (4, 4, 8)}
    for name, shape in shapes.items():
        d = root / "data" / ("images" if name == "images" else "labels") / "train"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            suffix = "" if name == "images" else f"_{name}"
            np.save(d / f"train_{i:04d}{suffix}.npy",
                    rng.standard_normal((64,) + shape).astype(np.float32))
    for i in range(2):
        np.save(root / "data" / f"x_{i:04d}.npy",
                rng.integers(0, 256, (128, 3, 8, 8), dtype=np.uint8))
    for name in ("a", "b"):
        np.save(root / f"{name}.npy", rng.standard_normal((10, 4)).astype(np.float32))
    return {"images": rng.standard_normal((128, 2, 8, 16)).astype(np.float32),
            "heatmaps": rng.standard_normal((128, 2, 4, 8)).astype(np.float32)}


def test_readme_has_python_blocks():
    assert len(_readme_python_blocks()) >= 5, "README.md: the python blocks were not found"


@pytest.mark.parametrize("code,mark", _readme_python_blocks())
def test_readme_python_block_runs(code, mark, tmp_path, monkeypatch):
    if mark is not None and mark["why"]:
        pytest.skip(f"README marks it: {mark['why']}")
    torch = pytest.importorskip("torch")
    if mark is not None and mark["cuda"] and not torch.cuda.is_available():
        pytest.skip("README marks it: needs a CUDA device (device=\"cuda\"); torch sees none")
    dataset = _readme_fixture(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    steps = []
    env = {"npyload": npyload, "np": np, "torch": torch, "epochs": 2, "dataset": dataset,
           "device": "cuda" if torch.cuda.is_available() else "cpu",
           "step": lambda *a, **k: steps.append(1)}
    try:
        exec(compile(code, "README.md block", "exec"), env)
    except Exception as e:
        raise AssertionError(
            f"this README block fails ({type(e).__name__}: {e}); fix the block, or mark "
            f"why it cannot run here on the line before it: "
            f"<!-- readme-test: skip: REASON --> (or <!-- readme-test: cuda -->)\n{code}") from e
    if "step(" in code:
        assert steps, "the block's loop ran no step"
