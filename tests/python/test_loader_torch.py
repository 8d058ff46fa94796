"""npyload with torch: tensors through DLPack share the slot, values equal
numpy's reading, ranks equal DistributedSampler, lifetime with tensors,
CUDA output when a GPU is present."""
import gc
import glob

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI installs it)")

from conftest import N, check_values, collect, concat_indices, to_numpy, write_dataset

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

BS = 4


def make(globs, **kw):
    kw.setdefault("batch_size", BS)
    return npyload.Loader(globs, **kw)


def test_auto_output_is_torch(dataset):
    globs, ref = dataset
    loader = make(globs)
    b = next(iter(loader))
    assert isinstance(b["images"], torch.Tensor) and isinstance(b.indices, torch.Tensor)
    assert b["images"].dtype == torch.float32
    assert b["labels"].dtype == torch.int64
    assert b["mask"].dtype == torch.uint8
    assert b.indices.dtype == torch.int64
    assert b["images"].is_contiguous() and b["images"].device.type == "cpu"


@pytest.mark.parametrize("shuffle", [False, True])
def test_torch_values_equal_numpy(dataset, shuffle):
    globs, ref = dataset
    b = collect(make(globs, shuffle=shuffle, seed=1, num_workers=3))
    check_values(b, ref)
    assert sorted(concat_indices(b).tolist()) == list(range(N))


def test_tensor_shares_slot(dataset):
    globs, ref = dataset
    loader = make(globs)
    b = next(iter(loader))
    ptrs = b._raw.data_ptrs
    for i, name in enumerate(loader.field_names):
        t = b[name]
        assert t.data_ptr() == ptrs[i]
        a = np.asarray(b._raw.field(name))
        assert a.__array_interface__["data"][0] == t.data_ptr()
    # writes through the tensor are visible through a numpy view of the slot
    b["labels"][0, 0] = 12345
    assert np.asarray(b._raw.field("labels"))[0, 0] == 12345


def test_copy_true_does_not_share(dataset):
    globs, ref = dataset
    loader = make(globs, copy=True, prefetch=1)
    kept = list(loader)  # owned copies hold no slot
    assert len(kept) == len(loader)
    check_values([(to_numpy(b.indices), {k: to_numpy(v) for k, v in b.items()}) for b in kept], ref)
    assert kept[0]["images"].data_ptr() != kept[1]["images"].data_ptr()


def test_delete_loader_while_tensors_alive(dataset):
    globs, ref = dataset
    loader = make(globs, shuffle=True, prefetch=4)
    it = iter(loader)
    kept = [next(it) for _ in range(3)]
    tensors = [(b.indices.clone(), b["images"], b["mask"]) for b in kept]
    del it, loader, kept
    gc.collect()
    for idx, im, mask in tensors:
        np.testing.assert_array_equal(im.numpy(), ref["images"][idx.numpy()])
        np.testing.assert_array_equal(mask.numpy(), ref["mask"][idx.numpy()])
    del tensors
    gc.collect()


def test_legacy_and_versioned_dlpack(dataset):
    globs, ref = dataset
    loader = make(globs, output="numpy")
    b = next(iter(loader))
    raw = b._raw
    base = raw.live_views
    cap = raw.field("images").__dlpack__()
    t = torch.utils.dlpack.from_dlpack(cap)  # consumes the capsule
    assert "used_dltensor" in repr(cap)
    np.testing.assert_array_equal(t.numpy(), b["images"])
    assert raw.live_views == base + 1
    del cap
    gc.collect()
    assert raw.live_views == base + 1  # the tensor still holds the view
    del t
    gc.collect()
    assert raw.live_views == base
    t2 = torch.from_dlpack(raw.field("mask"))  # max_version=(1, 0) path
    assert t2.data_ptr() == b["mask"].__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", ["<f2", "<f8", "<i2", "<u2", "|b1", "|i1", "<c8"])
def test_dtypes_through_dlpack(tmp_path, dtype):
    a = (np.arange(6 * 3) % 5).reshape(6, 3).astype(dtype)
    np.save(tmp_path / "x_0.npy", a)
    loader = npyload.Loader({"x": str(tmp_path / "x_*.npy")}, batch_size=6)
    t = next(iter(loader))["x"]
    np.testing.assert_array_equal(t.numpy(), a)


def test_big_endian_is_refused_by_dlpack_but_numpy_works(tmp_path):
    a = np.arange(8, dtype=">f4").reshape(4, 2)
    np.save(tmp_path / "x_0.npy", a)
    loader = npyload.Loader({"x": str(tmp_path / "x_*.npy")}, batch_size=4, output="numpy")
    b = next(iter(loader))
    np.testing.assert_array_equal(b["x"], a)
    with pytest.raises(BufferError, match="byte order"):
        b._raw.field("x").__dlpack__()


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_equal_distributed_sampler(dataset, drop_last):
    from torch.utils.data import DistributedSampler
    globs, ref = dataset
    for W in range(1, 5):
        lens = set()
        union = set()
        for r in range(W):
            loader = make(globs, rank=r, world_size=W, drop_last=drop_last)
            b = collect(loader)
            check_values(b, ref)
            lens.add(len(loader))
            exp = list(DistributedSampler(range(N), num_replicas=W, rank=r, shuffle=False,
                                          drop_last=drop_last))
            if drop_last:
                exp = exp[:len(exp) // BS * BS]  # DataLoader(drop_last=True)
            assert concat_indices(b).tolist() == exp
            union |= set(exp)
        assert len(lens) == 1
        if not drop_last:
            assert union == set(range(N))


def test_resume_with_torch(dataset):
    globs, ref = dataset
    full = collect(make(globs, shuffle=True, seed=7, num_workers=2))
    loader = make(globs, shuffle=True, seed=7, num_workers=2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    st = loader.state_dict()
    other = make(globs, shuffle=True, seed=7, num_workers=1, prefetch=1)
    other.load_state_dict(st)
    rest = collect(other)
    assert len(rest) == len(full) - 4
    for (i1, d1), (i2, d2) in zip(full[4:], rest):
        np.testing.assert_array_equal(i1, i2)
        for k in d1:
            np.testing.assert_array_equal(d1[k], d2[k])


cuda = pytest.mark.skipif(not torch.cuda.is_available() or not npyload.cuda_available(0)[0],
                          reason="needs a CUDA GPU usable by torch and npyload")


@cuda
@pytest.mark.parametrize("copy", [False, True])
def test_cuda_output(dataset, copy):
    globs, ref = dataset
    loader = make(globs, device="cuda:0", shuffle=True, copy=copy, prefetch=2)
    n = 0
    for b in loader:
        assert b["images"].device.type == "cuda"
        idx = b.indices.cpu().numpy()
        for k in loader.field_names:
            np.testing.assert_array_equal(b[k].cpu().numpy(), ref[k][idx])
        n += 1
    assert n == len(loader)
    assert loader.stats()["h2d_bytes"] > 0


@cuda
def test_cuda_side_stream_and_lifetime(dataset):
    globs, ref = dataset
    loader = make(globs, device="cuda:0", prefetch=2)
    s = torch.cuda.Stream()
    kept = []
    with torch.cuda.stream(s):
        for b in loader:
            kept.append((b.indices.cpu().numpy(), (b["images"] * 2).sum().item()))
    for idx, total in kept:
        assert np.isclose(total, (ref["images"][idx] * 2).sum(), rtol=1e-4)
    it = iter(loader)
    b = next(it)
    t = b["labels"]
    del it, loader, b
    gc.collect()
    torch.cuda.synchronize()
    assert t.device.type == "cuda" and t.shape[1] == 3


@cuda
def test_cuda_two_consumer_streams_both_recorded(dataset):
    """Two fields consumed on two streams: the slot is reused only after
    both streams' work. The second stream is kept busy (torch.cuda._sleep)
    before it reads its field; with only the first stream recorded the slot
    would be overwritten under it by the copies of the following batches."""
    globs, ref = dataset
    loader = make(globs, device="cuda:0", prefetch=1)  # two slots: quick reuse
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    sums = []
    it = iter(loader)
    for _ in range(len(loader)):
        with torch.cuda.stream(s1):
            b = next(it)  # fields exported on s1
        b.wait_stream(s2)
        assert b._raw._streams == (s1.cuda_stream, s2.cuda_stream)
        idx = b.indices.cpu().numpy()
        with torch.cuda.stream(s1):
            im = b["images"].sum()
        with torch.cuda.stream(s2):
            torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time
            lab = b["labels"].sum()
        sums.append((idx, im, lab))
        del b
    torch.cuda.synchronize()
    for idx, im, lab in sums:
        assert np.isclose(im.item(), ref["images"][idx].sum(), rtol=1e-4)
        assert lab.item() == ref["labels"][idx].sum()
