"""Random flips and crops in the loader (Transform(hflip, vflip, crop, pad,
hflip_sign, vflip_sign)): every delivered row equals the stored row (numpy's
reading of the file) with exactly the exposed decisions applied by numpy, and
the decisions equal an independent Python rendering of the formula
documented in npyload.h ("Augmentation"), so they are a pure function of
(seed, epoch, sample index): the same for every backend, worker count, rank
split and resume."""
import math
import os

import numpy as np
import pytest

import npyload

M64 = (1 << 64) - 1
G = 0x9E3779B97F4A7C15
N = 41
C, H, W = 2, 8, 12
P, CH, CW = 2, 6, 10


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def decide(seed, epoch, i, t, hw):
    """The documented draws, written from npyload.h's text (not the C)."""
    x = mix64(mix64((seed + G) & M64) ^ epoch) ^ (i & M64)
    d = [mix64((x + j * G) & M64) for j in (1, 2, 3, 4)]
    th = math.ceil(float(np.float32(t.hflip)) * 2**24)
    tv = math.ceil(float(np.float32(t.vflip)) * 2**24)
    hf, vf = (d[0] >> 40) < th, (d[1] >> 40) < tv
    top = left = 0
    if hw is not None:
        h0, w0 = hw
        ch, cw = t.crop if t.crop else (h0 + 2 * t.pad, w0 + 2 * t.pad)
        top = ((d[2] >> 32) * (h0 + 2 * t.pad - ch + 1)) >> 32
        left = ((d[3] >> 32) * (w0 + 2 * t.pad - cw + 1)) >> 32
    return hf, vf, top, left


def augment_row(x, t, hf, vf, top, left):
    """numpy's own rendering of the documented geometry and signs."""
    if x.ndim >= 2:
        p = t.pad
        xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p, p), (p, p)])
        ch, cw = t.crop if t.crop else xp.shape[-2:]
        x = xp[..., top:top + ch, left:left + cw]
        if vf:
            x = x[..., ::-1, :]
        if hf:
            x = x[..., ::-1]
    x = np.array(x)
    nch = x.shape[0] if x.ndim else 1
    s = np.ones(nch, dtype=x.dtype)
    for flip, sign in ((hf, t.hflip_sign), (vf, t.vflip_sign)):
        if flip and sign is not None:
            s = s * np.broadcast_to(np.array(sign, dtype=x.dtype), (nch,))
    if x.ndim:
        x = x * s.reshape((nch,) + (1,) * (x.ndim - 1))
    return x


def transform_row(x, t):
    if t.dtype is None:
        return x
    y = x.astype(np.float32) * np.float32(t.scale)
    if t.mean is not None or t.std is not None:
        shp = (-1,) + (1,) * (x.ndim - 1) if x.ndim else ()
        m = np.array(t.mean or (0.0,), np.float32).reshape(shp if t.mean and len(t.mean) > 1 else ())
        sd = np.array(t.std or (1.0,), np.float32).reshape(shp if t.std and len(t.std) > 1 else ())
        y = (y - m) / sd
    return y.astype(np.float32)


TRANSFORMS = {
    # float32 images: flips, pad + crop, normalise per channel, channels-last
    "img": npyload.Transform("float32", scale=0.5, mean=(0.1, -0.2), std=(2.0, 0.5),
                             channels_last=True, hflip=0.5, vflip=0.3, crop=(CH, CW), pad=P),
    # uint8 images kept as stored: the same decisions (same probabilities and size)
    "u8": npyload.Transform(hflip=0.5, vflip=0.3, crop=(CH, CW), pad=P),
    # a 2-D heatmap: same probabilities and size, float16 output
    "heat": npyload.Transform("float16", hflip=0.5, vflip=0.3, crop=(CH, CW), pad=P),
    # offsets (du, dv): never moved, signed when flipped
    "off": npyload.Transform(hflip=0.5, vflip=0.3, hflip_sign=(-1, 1), vflip_sign=(1, -1)),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("aug")
    rng = np.random.default_rng(5)
    arrs = {
        "img": rng.standard_normal((N, C, H, W)).astype(np.float32),
        "u8": rng.integers(1, 256, size=(N, 1, H, W), dtype=np.uint8),
        "heat": rng.random((N, H, W)).astype(np.float32),
        "off": rng.standard_normal((N, 2)).astype(np.float32),
        "lab": np.arange(N, dtype=np.int64),
    }
    globs = {}
    for name, a in arrs.items():
        d = root / name
        d.mkdir()
        cut = [0, 13, 29, N]  # several files per field
        for k in range(3):
            np.save(d / f"{name}_{k}.npy", a[cut[k]:cut[k + 1]])
        globs[name] = str(d / f"{name}_*.npy")
    return globs, arrs


def make(globs, io="pread", transforms=TRANSFORMS, **kw):
    kw.setdefault("batch_size", 6)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 11)
    kw.setdefault("output", "numpy")
    try:
        return npyload.Loader(globs, io=io, transforms=transforms, **kw)
    except npyload.NpyloadError as e:
        if io == "uring" and "io_uring" in str(e):
            pytest.skip(f"io_uring is not usable here: {e}")
        raise


def check_batch(b, arrs, seed, transforms=TRANSFORMS):
    """Every row of every field against numpy; returns the rows' decisions."""
    idx = np.asarray(b.indices)
    assert set(b.augment) == set(transforms)
    for name, t in transforms.items():
        got = np.asarray(b[name])
        stored = arrs[name]
        hw = stored.shape[-2:] if stored.ndim >= 3 else None
        aug = b.augment[name]
        for r, i in enumerate(idx.tolist()):
            hf, vf, top, left = decide(seed, b.epoch, i, t, hw)
            assert (bool(aug.hflip[r]), bool(aug.vflip[r]), int(aug.top[r]),
                    int(aug.left[r])) == (hf, vf, top, left), (name, i)
            want = transform_row(augment_row(stored[i], t, hf, vf, top, left), t)
            if t.dtype == "float16":
                want = want.astype(np.float16)
            assert got[r].shape == want.shape, name
            assert got[r].dtype == want.dtype, name
            np.testing.assert_array_equal(got[r], want, err_msg=f"{name} row {i}")
    np.testing.assert_array_equal(b["lab"], idx)  # an untouched field
    return idx


@pytest.mark.parametrize("io", ["pread", "mmap", "uring"])
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_rows_equal_numpy_with_the_exposed_decisions(data, io, workers):
    globs, arrs = data
    seen = []
    with make(globs, io, num_workers=workers) as L:
        for epoch in range(2):  # the second iteration is epoch 1
            for b in L:
                assert b.epoch == epoch
                seen.extend(check_batch(b, arrs, 11).tolist())
    assert sorted(seen) == sorted(list(range(N)) * 2)


def test_fields_of_a_sample_share_their_decisions(data):
    globs, arrs = data
    flips = 0
    with make(globs) as L:
        for b in L:
            a = b.augment
            for name in ("u8", "heat", "off"):
                np.testing.assert_array_equal(a[name].hflip, a["img"].hflip)
                np.testing.assert_array_equal(a[name].vflip, a["img"].vflip)
            for name in ("u8", "heat"):
                np.testing.assert_array_equal(a[name].top, a["img"].top)
                np.testing.assert_array_equal(a[name].left, a["img"].left)
            np.testing.assert_array_equal(a["off"].top, 0)
            flips += int(a["img"].hflip.sum())
    assert 0 < flips < N  # both outcomes occur at p = 0.5 over 41 samples


def test_offsets_sign_rule(data):
    globs, arrs = data
    with make(globs) as L:
        for b in L:
            a = b.augment["off"]
            for r, i in enumerate(np.asarray(b.indices).tolist()):
                du, dv = arrs["off"][i]
                want = (-du if a.hflip[r] else du, -dv if a.vflip[r] else dv)
                assert tuple(b["off"][r].tolist()) == pytest.approx(want, abs=0)


def test_ranks_and_elastic_resume_keep_the_decisions(data):
    """Decisions follow the sample, not the rank or the position: rows from
    two ranks, and from a job resumed mid-epoch at another world size, all
    equal numpy's rendering."""
    globs, arrs = data
    for rank in range(2):
        with make(globs, rank=rank, world_size=2) as L:
            for b in L:
                check_batch(b, arrs, 11)
    with make(globs, rank=0, world_size=2) as L:
        it = iter(L)
        next(it)
        state = L.state_dict()
    resumed = []
    for rank in range(3):
        with make(globs, rank=rank, world_size=3) as L:
            L.load_state_dict(state)
            for b in L:
                resumed.extend(check_batch(b, arrs, 11).tolist())
    assert resumed  # the rest of the epoch was delivered and checked


def test_epoch_and_seed_change_the_decisions(data):
    globs, _ = data
    t = {"off": TRANSFORMS["off"]}
    def flips(seed, epoch):
        with make({"off": globs["off"]}, transforms=t, shuffle=False, seed=seed,
                  batch_size=N) as L:
            L.set_epoch(epoch)
            b = next(iter(L))
            return b.augment["off"].hflip.copy()
    a = flips(11, 0)
    np.testing.assert_array_equal(a, flips(11, 0))
    assert (a != flips(11, 1)).any()
    assert (a != flips(12, 0)).any()


def test_flip_fraction_within_binomial_bounds(tmp_path):
    n, p = 4000, 0.3
    np.save(tmp_path / "v.npy", np.zeros((n, 2), np.float32))
    t = {"v": npyload.Transform(hflip=p, vflip=1.0)}
    with npyload.Loader({"v": str(tmp_path / "v.npy")}, batch_size=500, transforms=t,
                        output="numpy", seed=7) as L:
        hf = np.concatenate([b.augment["v"].hflip for b in L])
        L.set_epoch(0)
        vf = np.concatenate([b.augment["v"].vflip for b in L])
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(int(hf.sum()) - n * p) < 5 * sigma
    assert vf.all()  # probability 1: always


def test_pad_without_crop_keeps_the_size_and_crop_alone(data):
    globs, arrs = data
    ts = {"img": npyload.Transform(pad=3), "u8": npyload.Transform(crop=4)}
    with make({k: globs[k] for k in ("img", "u8", "lab")}, transforms=ts) as L:
        for b in L:
            assert np.asarray(b["img"]).shape[1:] == (C, H + 6, W + 6)
            assert np.asarray(b["u8"]).shape[1:] == (1, 4, 4)
            check_batch(b, arrs, 11, ts)


def test_torch_output_and_augment(data):
    torch = pytest.importorskip("torch")
    globs, arrs = data
    with make(globs, output="torch") as L:
        for b in L:
            assert isinstance(b["img"], torch.Tensor)
            assert b["img"].is_contiguous(memory_format=torch.channels_last)
            check_batch(b, arrs, 11)


@pytest.mark.parametrize("kw, msg", [
    ({"hflip": 1.5}, r"hflip = 1.5 out of range: a probability in \[0, 1\]"),
    ({"crop": (0, 3)}, r"crop = \(0, 3\) out of range: ints > 0"),
    ({"pad": -1}, "pad = -1 out of range: an int >= 0"),
    ({"hflip_sign": (2,)}, r"\+1 or -1"),
])
def test_bad_arguments_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        npyload.Transform(**kw)


def test_numpy_scalars_are_numbers(data):
    """Issue 35, item 20: numpy scalars wherever Transform takes a number
    (np.float32(0.5) was refused with "hflip is a probability in [0, 1],
    got np.float32(0.5)"). The same Transform as with Python numbers, and
    the same batches; wrong types and values out of range are told apart,
    naming the value and the range it is outside of."""
    globs, _ = data
    py = npyload.Transform("float32", scale=1 / 255, mean=0.5, std=0.25, channels_last=True,
                           hflip=0.5, vflip=0.25, crop=(4, 6), pad=1)
    f32, i64 = np.float32, np.int64
    nps = npyload.Transform("float32", scale=np.float64(1 / 255), mean=f32(0.5),
                            std=np.float16(0.25), channels_last=np.bool_(True),
                            hflip=f32(0.5), vflip=np.float64(0.25), crop=(i64(4), np.int32(6)),
                            pad=np.uint8(1))
    assert repr(nps) == repr(py)
    assert npyload.Transform(crop=i64(5)).crop == (5, 5)
    assert npyload.Transform("float32", mean=np.array([0.5, 0.25], np.float32)).mean == \
        (0.5, 0.25)
    assert npyload.Transform(hflip=0.5, hflip_sign=np.array([1, -1])).hflip_sign == (1.0, -1.0)
    got = []
    for t in (py, nps):
        with make({"img": globs["img"]}, transforms={"img": t}, output="numpy") as L:
            got.append([np.array(b["img"]) for b in L])
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*got))
    for kw, exc, msg in [
            ({"hflip": f32(1.5)}, ValueError, "hflip = 1.5 out of range"),
            ({"hflip": f32("nan")}, ValueError, "hflip = nan out of range"),
            ({"hflip": "0.5"}, TypeError, "hflip must be a probability, a number in"),
            ({"hflip": np.bool_(True)}, TypeError, "hflip must be"),
            ({"scale": np.float64(0)}, ValueError, r"scale = (np\.float64\()?0\.0\)? out of"),
            ({"scale": "2"}, TypeError, "scale must be a number"),
            ({"pad": i64(-2)}, ValueError, "pad = -2 out of range"),
            ({"pad": f32(2)}, TypeError, "pad must be an int >= 0"),
            ({"crop": (i64(0), 3)}, ValueError, r"crop = \(0, 3\) out of range"),
            ({"crop": 2.5}, TypeError, "crop must be None, an int or"),
            ({"mean": ["a"]}, TypeError, "mean must be None, a number or a sequence")]:
        with pytest.raises(exc, match=msg):
            npyload.Transform("float32", **kw)


@pytest.mark.parametrize("field, t, msg", [
    ("img", npyload.Transform(crop=(H + 1, W)), "larger than the padded sample"),
    ("off", npyload.Transform(crop=2), "last two axes"),
    ("lab", npyload.Transform(hflip=0.5, hflip_sign=-1), "float stored dtype"),
    ("off", npyload.Transform(hflip=0.5, hflip_sign=(1, 1, -1)), "channels"),
])
def test_bad_fields_are_refused_naming_the_field(data, field, t, msg):
    globs, _ = data
    with pytest.raises(npyload.NpyloadError, match=msg) as e:
        with make({field: globs[field]}, transforms={field: t}) as L:
            next(iter(L))
    assert field in str(e.value)


def test_field_engines_say_where_each_field_runs(data):
    """Loader.field_engines() (npyload_loader_field_engine): host mode runs
    an augmentation in the host engine, an untouched field runs nothing;
    the same before the first iter() (the constructor's check) and after,
    with the reason in words; closed: refused."""
    globs, _ = data
    L = make({k: globs[k] for k in ("img", "lab")}, transforms={"img": TRANSFORMS["img"]})
    before = L.field_engines()
    assert list(before) == ["img", "lab"]
    assert before["img"][0] == "host" and "host mode" in before["img"][1], before
    assert before["lab"] == ("none", "none: the stored rows are delivered")
    next(iter(L))
    assert L.field_engines() == before
    L.close()
    with pytest.raises(ValueError, match="closed"):
        L.field_engines()


def test_repr_names_the_augmentation():
    r = repr(TRANSFORMS["off"])
    assert "hflip=0.5" in r and "hflip_sign=(-1.0, 1.0)" in r
    assert "crop" not in repr(npyload.Transform("float32"))
