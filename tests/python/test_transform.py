"""npyload.Transform and Loader(transforms=...): values against numpy's
float32 reference within one ulp of the output dtype (bit exact for pure
casts) on every backend, shuffled, several workers; layouts (numpy strides,
torch channels_last, DLPack); bfloat16 as torch.bfloat16 and
ml_dtypes.bfloat16; errors; num_workers=0 (synchronous reads)."""
import numpy as np
import pytest

import npyload

try:
    import torch
except ImportError:  # pragma: no cover - torch is part of the test env
    torch = None

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

C, H, W = 3, 6, 5
N = 41
SPLITS = [17, 24]
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SCALE = 1.0 / 255.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tr")
    rng = np.random.default_rng(5)
    u8 = rng.integers(0, 256, size=(N, C, H, W), dtype=np.uint8)
    f16 = (rng.standard_normal((N, C, H, W)) * 50).astype(np.float16)
    lab = np.arange(N, dtype=np.int64)
    for name, arr in (("img", u8), ("h", f16), ("lab", lab)):
        at = 0
        for k, n in enumerate(SPLITS):
            np.save(d / f"{name}_{k:04d}.npy", arr[at:at + n])
            at += n
    return d, {"img": u8, "h": f16, "lab": lab}


def fields(d, *names):
    return {n: str(d / f"{n}_*.npy") for n in names}


def reference(x, t):
    """numpy float32: (x * scale - mean[c]) / std[c], one rounding each."""
    y = x.astype(np.float32)
    if t.scale != 1.0 or t.mean is not None or t.std is not None:
        y = y * np.float32(t.scale)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if t.mean is not None:
        m = np.asarray(t.mean, dtype=np.float32)
        y = y - (m.reshape(shape) if m.size > 1 else m[0])
    if t.std is not None:
        s = np.asarray(t.std, dtype=np.float32)
        y = y / (s.reshape(shape) if s.size > 1 else s[0])
    return y


def ordered(bits, nbits):
    """Two's-complement-like order of IEEE bit patterns: adjacent floats
    differ by 1."""
    bits = bits.astype(np.int64)
    sign = bits >> (nbits - 1)
    mag = bits & ((1 << (nbits - 1)) - 1)
    return np.where(sign == 1, -mag, mag)


def assert_ulp(got32_bits, ref, dtype):
    """got: the output's bit patterns; ref: the float32 reference."""
    if dtype == "float32":
        want = ref.view(np.uint32)
        np.testing.assert_array_equal(got32_bits, want)
        return
    if dtype == "float16":
        want = ref.astype(np.float16).view(np.uint16)
    else:
        want = ref.astype(ml_dtypes.bfloat16).view(np.uint16)
    d = np.abs(ordered(got32_bits, 16) - ordered(want, 16))
    assert d.max() <= 1, f"{dtype}: {int((d > 1).sum())} elements off by more than 1 ulp"


def make(d, io, t, **kw):
    try:
        return npyload.Loader(fields(d, "img", "lab"), batch_size=7, shuffle=True, seed=3,
                              num_workers=kw.pop("num_workers", 3), io=io,
                              transforms={"img": t}, **kw)
    except npyload.NpyloadError as e:
        if io == "uring" and "io_uring" in str(e):
            pytest.skip(f"io_uring is not usable here: {e}")
        raise


def np_bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.itemsize == 4 else np.uint16)


DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("io", ["pread", "mmap", "uring"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_values_numpy(data, io, dtype, channels_last):
    if dtype == "bfloat16" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not importable")
    d, arrs = data
    t = npyload.Transform(dtype=dtype, scale=SCALE, mean=MEAN, std=STD,
                          channels_last=channels_last)
    seen = []
    with make(d, io, t, output="numpy") as L:
        for b in L:
            a, idx = b["img"], b.indices
            assert a.shape == (len(idx), C, H, W)
            isz = a.dtype.itemsize
            want_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
            assert a.dtype == want_dt
            if channels_last:
                assert a.strides == (C * H * W * isz, isz, W * C * isz, C * isz)
            else:
                assert a.flags["C_CONTIGUOUS"]
            ref = reference(arrs["img"][idx], t)
            assert_ulp(np_bits(a), ref, dtype)
            np.testing.assert_array_equal(b["lab"], idx)  # untouched field
            seen.extend(idx.tolist())
    assert sorted(seen) == list(range(N))


@pytest.mark.skipif(torch is None, reason="torch is not importable")
@pytest.mark.parametrize("io", ["pread", "mmap", "uring"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_values_torch(data, io, dtype, channels_last):
    d, arrs = data
    t = npyload.Transform(dtype=dtype, scale=SCALE, mean=MEAN, std=STD,
                          channels_last=channels_last)
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    seen = 0
    with make(d, io, t, output="torch") as L:
        for b in L:
            x = b["img"]
            assert x.dtype == tdt[dtype]
            assert x.shape == (len(b.indices), C, H, W)
            if channels_last:
                assert x.is_contiguous(memory_format=torch.channels_last)
                assert not x.is_contiguous()
            else:
                assert x.is_contiguous()
            idx = b.indices.numpy()
            ref = reference(arrs["img"][idx], t)
            bits_dt = torch.int32 if dtype == "float32" else torch.int16
            bits = x.contiguous().view(bits_dt).numpy()
            bits = bits.view(np.uint32 if dtype == "float32" else np.uint16)
            if dtype == "bfloat16" and ml_dtypes is None:
                # independent of ml_dtypes: torch's own rounding of the reference
                want = torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16).numpy()
                d16 = np.abs(ordered(bits, 16) - ordered(want.view(np.uint16), 16))
                assert d16.max() <= 1
            else:
                assert_ulp(bits, ref, dtype)
            seen += len(idx)
    assert seen == N


@pytest.mark.parametrize("dtype", DTYPES)
def test_pure_casts_bit_exact(data, dtype):
    """A cast of float16 data (no arithmetic) is exact: float16 -> float32
    and -> float16 are exact, -> bfloat16 is one rounding (numpy/ml_dtypes
    round the same way)."""
    if dtype == "bfloat16" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not importable")
    d, arrs = data
    t = npyload.Transform(dtype=dtype, channels_last=True)
    with npyload.Loader(fields(d, "h"), batch_size=8, num_workers=2, output="numpy",
                        transforms={"h": t}) as L:
        for b in L:
            x = arrs["h"][b.indices]
            want_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
            np.testing.assert_array_equal(np_bits(b["h"]), np_bits(x.astype(want_dt)))


def test_keep_channels_last_only_permutes(data):
    d, arrs = data
    t = npyload.Transform(channels_last=True)
    with npyload.Loader(fields(d, "img"), batch_size=6, num_workers=2, output="numpy",
                        transforms={"img": t}) as L:
        for b in L:
            a = b["img"]
            assert a.dtype == np.uint8
            assert a.strides == (C * H * W, 1, W * C, C)
            np.testing.assert_array_equal(a, arrs["img"][b.indices])


def test_stats_transform_ns(data):
    """Worker time converting batches is counted; a loader without
    transforms counts none."""
    d, _ = data
    t = npyload.Transform(dtype="float16", scale=1 / 255, mean=0.5, std=0.25)
    with npyload.Loader(fields(d, "img"), batch_size=6, num_workers=2, output="numpy",
                        transforms={"img": t}) as L:
        n = sum(1 for _ in L)
        st = L.stats()
    assert n > 0 and st["transform_ns"] > 0
    with npyload.Loader(fields(d, "img"), batch_size=6, num_workers=2,
                        output="numpy") as L:
        assert sum(1 for _ in L) == n
        assert L.stats()["transform_ns"] == 0


def test_scalar_mean_std_and_scale_only(data):
    d, arrs = data
    for t in (npyload.Transform("float32", scale=0.5),
              npyload.Transform("float32", scale=2.0, mean=3.0, std=4.0)):
        with npyload.Loader(fields(d, "img"), batch_size=10, num_workers=2,
                            output="numpy", transforms={"img": t}) as L:
            for b in L:
                assert_ulp(np_bits(b["img"]), reference(arrs["img"][b.indices], t),
                           "float32")


@pytest.mark.skipif(torch is None, reason="torch is not importable")
def test_dlpack_strides(data):
    d, _ = data
    t = npyload.Transform("float16", channels_last=True)
    with npyload.Loader(fields(d, "img"), batch_size=4, num_workers=1, output="torch",
                        transforms={"img": t}) as L:
        b = next(iter(L))
        x = b["img"]
        assert x.stride() == (C * H * W, 1, W * C, C)
        # the DLPack export itself carries the strides (in elements)
        y = torch.from_dlpack(b._raw.field(0))
        assert y.stride() == (C * H * W, 1, W * C, C)


def test_errors_name_the_problem(data):
    d, _ = data
    with pytest.raises(ValueError, match="no field named 'nope'"):
        npyload.Loader(fields(d, "img"), batch_size=4,
                       transforms={"nope": npyload.Transform("float16")})
    with pytest.raises(ValueError, match="mean needs an output dtype"):
        npyload.Transform(mean=MEAN)
    with pytest.raises(ValueError, match="scale needs an output dtype"):
        npyload.Transform(scale=0.5)
    with pytest.raises(ValueError, match="dtype must be"):
        npyload.Transform("int8")
    with pytest.raises(ValueError, match="std must be nonzero"):
        npyload.Transform("float32", std=(1.0, 0.0, 1.0))
    with pytest.raises(TypeError, match="must be an npyload.Transform"):
        npyload.Loader(fields(d, "img"), batch_size=4, transforms={"img": {"dtype": "x"}})
    with pytest.raises(npyload.NpyloadError, match=r"img: transform mean has 2 values.*3 channels"):
        npyload.Loader(fields(d, "img"), batch_size=4,
                       transforms={"img": npyload.Transform("float32", mean=(1.0, 2.0))})
    with pytest.raises(npyload.NpyloadError, match=r"lab: transform channels_last.*scalars"):
        npyload.Loader(fields(d, "lab"), batch_size=4,
                       transforms={"lab": npyload.Transform(channels_last=True)})
    with npyload.Loader(fields(d, "img"), batch_size=4) as L:
        with pytest.raises(npyload.NpyloadError, match="after start"):
            L._started().set_transform("img", 1, 1.0, None, None, False)


def test_dtype_spellings():
    assert npyload.Transform(np.float16).dtype == "float16"
    if torch is not None:
        assert npyload.Transform(torch.bfloat16).dtype == "bfloat16"
    if ml_dtypes is not None:
        assert npyload.Transform(ml_dtypes.bfloat16).dtype == "bfloat16"
    assert "channels_last=True" in repr(npyload.Transform("float32", channels_last=True))


@pytest.mark.parametrize("with_transform", [False, True])
@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_num_workers_0_same_batches(data, with_transform, output):
    if output == "torch" and torch is None:
        pytest.skip("torch is not importable")
    d, _ = data
    tr = {"img": npyload.Transform("bfloat16" if ml_dtypes or output == "torch" else "float16",
                                   scale=SCALE, mean=MEAN, std=STD, channels_last=True)} \
        if with_transform else None
    runs = []
    for nw in (2, 0):
        L = npyload.Loader(fields(d, "img", "lab"), batch_size=6, shuffle=True, seed=9,
                           num_workers=nw, output=output, transforms=tr)
        assert L.num_workers == nw
        L.set_epoch(2)
        got = []
        for b in L:
            x = b["img"]
            if output == "torch":
                x = x.contiguous().view(torch.uint8).numpy().copy()
                idx = b.indices.numpy().copy()
            else:
                x = np.ascontiguousarray(x).view(np.uint8).copy()
                idx = b.indices.copy()
            got.append((idx, x))
        L.close()
        runs.append(got)
    assert len(runs[0]) == len(runs[1]) == -(-N // 6)
    for (i0, x0), (i1, x1) in zip(*runs):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(x0, x1)


def test_num_workers_negative_refused(data):
    d, _ = data
    with pytest.raises(ValueError, match="num_workers"):
        npyload.Loader(fields(d, "img"), batch_size=4, num_workers=-1)


# 0 would zero the field (and the library's struct once read 0.0 as "unset",
# delivering x unscaled); inf/nan poison it; 1e-300 and 1e39 become 0 and inf
# in float32, where the library computes.
@pytest.mark.parametrize("scale", [0, 0.0, -0.0, float("nan"), float("inf"), -float("inf"),
                                   1e-300, 1e39, -1e39, 2 ** 1100])
def test_scale_must_be_a_finite_nonzero_float32(scale):
    with pytest.raises(ValueError, match=r"^Transform: scale = .* out of range: a finite "
                       r"nonzero float32") as ei:
        npyload.Transform("float32", scale=scale)
    assert repr(scale) in str(ei.value)


@pytest.mark.parametrize("scale", [1.0, 0.5, -3.0, 1e-30, 3e38, 7])
def test_scale_delivers_x_times_scale_like_numpy(data, scale):
    """The scale the caller gives is the one applied (bit exact against
    numpy's float32 x * scale), the default 1.0 included: the library gets
    1.0, never a 0 meaning "default"."""
    d, arrs = data
    t = npyload.Transform("float32", scale=scale) if scale != 1.0 else \
        npyload.Transform("float32")
    assert t.scale == float(scale)
    with npyload.Loader(fields(d, "img"), batch_size=10, num_workers=2, output="numpy",
                        transforms={"img": t}) as L:
        n = 0
        for b in L:
            with np.errstate(over="ignore"):  # 3e38 * 255 is inf, in C too
                want = arrs["img"][b.indices].astype(np.float32) * np.float32(scale)
            np.testing.assert_array_equal(np_bits(b["img"]), want.view(np.uint32))
            n += len(b.indices)
    assert n == N
