"""npyload's Python path with CUDA torch, on a real GPU (tests/gpu/device-check.sh
runs it; without a usable GPU every test skips, visibly).

Truth is independent of npyload: the files are written here with numpy, and
every value a CUDA batch holds is compared with numpy's reading of the same
rows (and with the host loader's batch for the same seed).

    python -m pytest -v tests/gpu/test_gpu_python.py
"""
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
npyload = pytest.importorskip("npyload", reason="npyload is not installed (pip install .)")

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
_ok, _why = npyload.cuda_available(0)
if not _ok:
    pytest.skip(f"npyload cannot use CUDA device 0: {_why}", allow_module_level=True)

ROWS = [64, 64, 40]          # a short last file
SHAPES = {"images": (2, 64, 128), "heatmaps": (2, 16, 32), "offsets": (4, 16, 32)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_py")
    rng = np.random.default_rng(17)
    globs, ref = {}, {}
    for name, shape in SHAPES.items():
        parts = []
        for k, n in enumerate(ROWS):
            a = rng.standard_normal((n,) + shape, dtype=np.float32)
            np.save(d / f"{name}_{k:04d}.npy", a)
            parts.append(a)
        globs[name] = str(d / f"{name}_*.npy")
        ref[name] = np.concatenate(parts)
    return globs, ref


def test_cuda_values_equal_host_loader_and_numpy(data):
    globs, ref = data
    kw = dict(batch_size=48, shuffle=True, seed=5, num_workers=2, prefetch=3)
    host = npyload.Loader(globs, device="cpu", **kw)
    dev = npyload.Loader(globs, device="cuda:0", **kw)
    for epoch in (0, 1):
        host.set_epoch(epoch)
        dev.set_epoch(epoch)
        n = 0
        for bh, bd in zip(host, dev):
            ih, idd = np.asarray(bh.indices), bd.indices.cpu().numpy()
            np.testing.assert_array_equal(ih, idd)
            for k in SHAPES:
                t = bd[k]
                assert t.device.type == "cuda" and t.device.index == 0
                got = t.cpu().numpy()
                np.testing.assert_array_equal(got, np.asarray(bh[k]))
                np.testing.assert_array_equal(got, ref[k][idd])
            n += 1
        assert n == len(dev) == len(host)
    assert dev.stats()["h2d_bytes"] > 0


def _slow(ms, stream):
    """A kernel that keeps `stream` busy for about `ms` ms (clock cycles at
    the device's clock rate; torch.cuda._sleep spins on clock64)."""
    rate_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_500_000
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(ms * rate_khz))


def test_slow_consumer_on_side_stream_sees_no_overwrite(data):
    """The consumer works on a non-default stream and is much slower than the
    loader; the host never waits. Every checksum, computed on the GPU after a
    slow kernel, must equal numpy's: no slot was overwritten while read."""
    globs, ref = data
    loader = npyload.Loader(globs, batch_size=16, shuffle=True, seed=3, num_workers=2,
                            prefetch=2, device="cuda:0")
    s = torch.cuda.Stream()
    sums, idx = [], []
    with torch.cuda.stream(s):
        for epoch in range(2):
            loader.set_epoch(epoch)
            for b in loader:
                _slow(5, s)
                sums.append(torch.stack([b[k].double().sum() for k in SHAPES]))
                idx.append(b.indices.cpu().numpy())
    torch.cuda.synchronize()
    for got, i in zip(sums, idx):
        want = np.array([ref[k][i].astype(np.float64).sum() for k in SHAPES])
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-9, atol=1e-6)


def test_two_fields_on_two_streams_see_no_overwrite(data):
    """Issue 17 item 2b: two fields of one batch consumed on two different
    streams, each slow; both must stay ordered against the slot's reuse."""
    globs, ref = data
    loader = npyload.Loader(globs, batch_size=16, shuffle=True, seed=4, num_workers=2,
                            prefetch=2, device="cuda:0")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    out = []
    for b in loader:
        with torch.cuda.stream(s1):
            _slow(5, s1)
            a = b["images"].double().sum()
        with torch.cuda.stream(s2):
            _slow(2, s2)
            h = b["heatmaps"].double().sum()
        out.append((a, h, b.indices.cpu().numpy()))
    torch.cuda.synchronize()
    for a, h, i in out:
        np.testing.assert_allclose(a.item(), ref["images"][i].astype(np.float64).sum(),
                                   rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(h.item(), ref["heatmaps"][i].astype(np.float64).sum(),
                                   rtol=1e-9, atol=1e-6)


def test_batch_outlives_loader(data):
    globs, ref = data
    loader = npyload.Loader(globs, batch_size=32, num_workers=1, prefetch=2,
                            device="cuda:0")
    it = iter(loader)
    b = next(it)
    t = b["offsets"]
    i = b.indices.cpu().numpy()
    del it, loader, b
    gc.collect()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), ref["offsets"][i])
    del t
    gc.collect()
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_device_transforms_equal_host_transforms(data, dtype, channels_last):
    """Transform(...) on the GPU (after the copy) equals the host workers'
    bit for bit (same three roundings), keeps torch's channels_last layout,
    and copies the stored float32 only."""
    globs, _ = data
    t = npyload.Transform(dtype, scale=0.5, mean=(0.1, -0.2), std=(2.0, 3.0),
                          channels_last=channels_last)
    kw = dict(batch_size=48, shuffle=True, seed=5, num_workers=2,
              transforms={"images": t})
    g = {"images": globs["images"]}
    with npyload.Loader(g, device="cpu", **kw) as host, \
            npyload.Loader(g, device="cuda:0", **kw) as dev:
        for bh, bd in zip(host, dev):
            x, y = bh["images"], bd["images"]
            assert y.device.type == "cuda" and y.dtype == x.dtype
            assert y.stride() == x.stride()
            if channels_last:
                assert y.is_contiguous(memory_format=torch.channels_last)
            ib = torch.int32 if dtype == "float32" else torch.int16
            assert torch.equal(y.cpu().contiguous().view(ib), x.contiguous().view(ib))
        # one epoch of the stored float32 crossed PCIe
        assert dev.stats()["h2d_bytes"] == sum(ROWS) * 4 * 2 * 64 * 128


@pytest.fixture(scope="module")
def gray(tmp_path_factory):
    """uint8 images (2, 32, 48) in two files, and float32 images of 256
    gray levels (NaN, -0.0, a denormal and infinities among them) packed
    narrowed: .npy.zst and the stored form."""
    d = tmp_path_factory.mktemp("gpu_py_aug")
    rng = np.random.default_rng(23)
    u8 = [rng.integers(0, 256, (n, 2, 32, 48), dtype=np.uint8) for n in (40, 27)]
    for k, a in enumerate(u8):
        np.save(d / f"u8_{k}.npy", a)
    levels = (np.arange(256, dtype=np.float32) / 255).view(np.uint32)
    levels[:6] = [0x7FC00001, 0xFFC00123, 0x80000000, 0x00000001, 0x7F800000, 0xFF800000]
    vals = []
    for k, n in enumerate((40, 27)):
        v = levels[rng.integers(0, 256, (n, 2, 32, 48))].view(np.float32)
        np.save(d / f"f4_{k}.npy", v)
        vals.append(v)
    npyload.pack([str(d / "f4_0.npy")], narrow=True, threads=1)
    npyload.pack([str(d / "f4_1.npy")], narrow=True, store=True, threads=1)
    narrowed = sorted(str(p) for p in d.glob("f4_*") if p.name != "f4_0.npy"
                      and p.name != "f4_1.npy")
    return str(d / "u8_*.npy"), narrowed, np.concatenate(vals)


def _bits(t):
    t = t.cpu().contiguous()
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def _same(y, x):
    """Bit for bit, except that a NaN may come out with another payload
    (the device may write its canonical NaN, as documented)."""
    y, x = y.cpu().contiguous(), x.cpu().contiguous()
    nan = torch.isnan(x.float())
    assert torch.equal(torch.isnan(y.float()), nan)
    assert torch.equal(_bits(y)[~nan], _bits(x)[~nan])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_device_augmentation_equals_host(gray, dtype):
    """Transform(hflip=..., crop=..., pad=...) on the GPU: the stored uint8
    crosses PCIe (plus a 16-byte record per row) and the kernel's output
    equals the host engine's bit for bit, the decisions (batch.augment)
    the same."""
    u8, _, _ = gray
    t = npyload.Transform(dtype, scale=1 / 255, mean=(0.5, 0.25), std=(0.2, 0.3),
                          channels_last=True, hflip=0.5, vflip=0.25, crop=(24, 40), pad=3)
    kw = dict(batch_size=16, shuffle=True, seed=3, num_workers=2, transforms={"images": t})
    g = {"images": u8}
    with npyload.Loader(g, device="cpu", **kw) as host, \
            npyload.Loader(g, device="cuda:0", **kw) as dev:
        n = 0
        for bh, bd in zip(host, dev):
            x, y = bh["images"], bd["images"]
            assert y.device.type == "cuda" and tuple(y.shape) == tuple(x.shape)
            _same(y, x)
            np.testing.assert_array_equal(bd.augment["images"].hflip, bh.augment["images"].hflip)
            n += len(bh.indices)
        assert n == 67
        assert dev.stats()["h2d_bytes"] == 67 * (2 * 32 * 48 + 16)
        assert dev.field_engines()["images"][0] == "device", dev.field_engines()
        assert host.field_engines()["images"][0] == "host"


@pytest.mark.parametrize("transform", [None, "float16"])
def test_device_expands_narrowed_codes(gray, transform):
    """Narrowed files on the GPU: one byte per value crosses PCIe (plus a
    record per row) and the kernel expands each file's table: values bit
    for bit numpy's (NaN payloads, -0.0, denormals), fused with a
    transform when there is one."""
    _, narrowed, ref = gray
    kw = dict(batch_size=16, shuffle=True, seed=4, num_workers=2)
    if transform:
        kw["transforms"] = {"x": npyload.Transform(transform, scale=2.0, hflip=0.5)}
    with npyload.Loader({"x": narrowed}, device="cpu", **kw) as host, \
            npyload.Loader({"x": narrowed}, device="cuda:0", **kw) as dev:
        for bh, bd in zip(host, dev):
            y = bd["x"]
            _same(y, bh["x"])
            if not transform:
                want = ref[np.asarray(bh.indices)].view(np.uint32)
                np.testing.assert_array_equal(_bits(y).numpy().view(np.uint32), want)
        assert dev.stats()["h2d_bytes"] == 67 * (2 * 32 * 48 + 16)
        engine, why = dev.field_engines()["x"]
        assert engine == "device" and "codes" in why, why
