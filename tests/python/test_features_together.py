"""The features of issues 13-15 together, as a user combines them: .npy.zst
shards (alone and mixed with .npy in one field) read through every backend
and the gather path, converted by transforms= in the workers or on the
calling thread (num_workers=0), with the transform= hook and as_tuple on top.
Truth: numpy's own reading of the .npy files and numpy's float32 formula."""
import numpy as np
import pytest

import npyload

C, H, W = 3, 8, 6
N = 57
SPLITS = [20, 37]
MEAN = (0.5, 0.25, 0.125)
STD = (0.2, 0.3, 0.4)
SCALE = 1.0 / 255.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("together")
    rng = np.random.default_rng(11)
    img = rng.integers(0, 256, size=(N, C, H, W), dtype=np.uint8)
    lab = rng.integers(0, 1000, size=(N,), dtype=np.int64)
    paths = {"img": [], "lab": []}
    for name, arr in (("img", img), ("lab", lab)):
        at = 0
        for k, n in enumerate(SPLITS):
            p = d / f"{name}_{k:04d}.npy"
            np.save(p, arr[at:at + n])
            paths[name].append(str(p))
            at += n
    # small frames: several samples per frame, so rows are picked from frames
    npyload.pack(paths["img"] + paths["lab"], frame_size=300)
    return d, img, lab


def reference_f16(x):
    y = x.astype(np.float32) * np.float32(SCALE)
    y = y - np.asarray(MEAN, np.float32).reshape(1, -1, 1, 1)
    y = y / np.asarray(STD, np.float32).reshape(1, -1, 1, 1)
    return y


def within_one_f16_ulp(got, ref32):
    def ordered(b):
        b = b.astype(np.int64)
        return np.where(b & 0x8000, -(b & 0x7FFF), b)
    want = ref32.astype(np.float16).view(np.uint16)
    d = np.abs(ordered(got.view(np.uint16)) - ordered(want))
    assert d.max() <= 1


def field_globs(d, img_zst, lab_zst):
    img = [str(d / "img_0000.npy.zst"), str(d / "img_0001.npy.zst")] if img_zst == "all" else \
        [str(d / "img_0000.npy"), str(d / "img_0001.npy.zst")]  # mixed
    lab = str(d / "lab_*.npy.zst") if lab_zst else str(d / "lab_*.npy")
    return {"img": img, "lab": lab}


@pytest.mark.parametrize("io", ["pread", "mmap", "io_uring"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("img_zst", ["all", "mixed"])
def test_zst_transform_values(data, io, workers, img_zst):
    d, img, lab = data
    t = npyload.Transform(dtype="float16", scale=SCALE, mean=MEAN, std=STD,
                          channels_last=True)
    try:
        L = npyload.Loader(field_globs(d, img_zst, True), batch_size=8, shuffle=True,
                           seed=2, num_workers=workers, io=io, output="numpy",
                           transforms={"img": t})
    except npyload.NpyloadError as e:
        if io == "io_uring" and "io_uring" in str(e):
            pytest.skip(f"io_uring is not usable here: {e}")
        raise
    seen = []
    with L:
        for b in L:
            idx = np.asarray(b.indices)
            a = b["img"]
            assert a.shape == (len(idx), C, H, W) and a.dtype == np.float16
            assert a.strides == (C * H * W * 2, 2, W * C * 2, C * 2)  # NHWC
            within_one_f16_ulp(a, reference_f16(img[idx]))
            np.testing.assert_array_equal(b["lab"], lab[idx])
            seen.extend(idx.tolist())
        st = L.stats()
    assert sorted(seen) == list(range(N))
    assert st["compressed_bytes_read"] > 0 and st["transform_ns"] > 0


def test_zst_hook_as_tuple_torch(data):
    torch = pytest.importorskip("torch")
    d, img, lab = data
    t = npyload.Transform(dtype="float32", scale=SCALE, mean=MEAN, std=STD)

    def hook(batch):
        images, labels = batch
        return images * 2, labels, batch.indices

    with npyload.Loader(field_globs(d, "mixed", True), batch_size=5, shuffle=True, seed=4,
                        num_workers=2, transforms={"img": t}, as_tuple=True,
                        transform=hook) as L:
        n = 0
        for images, labels, idx in L:
            idx = idx.numpy()
            np.testing.assert_array_equal(images.numpy(), reference_f16(img[idx]) * 2)
            np.testing.assert_array_equal(labels.numpy(), lab[idx])
            n += len(idx)
    assert n == N
