"""npyload.pack(): the same C code as npyload-pack (npyload_pack_file) from
Python — round trip through the stock `zstd -d` and numpy, the options
mirrored from the CLI, refusing to overwrite, bad inputs named in
NpyloadError, and agreement with the CLI's output byte for byte.

Tests that need the `zstd` CLI skip visibly without it.
"""
import errno
import os
from pathlib import Path
import shutil
import socket
import stat
import subprocess

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
from conftest import built_tool as _tool


def need_zstd():
    if shutil.which("zstd") is None:
        pytest.skip("the zstd command-line tool is not installed "
                    "(apt-get install zstd)")


def zstd_d(path):
    return subprocess.run(["zstd", "-q", "-d", "-c", str(path)], check=True,
                          capture_output=True, timeout=60).stdout


def arrays():
    rng = np.random.default_rng(11)
    yield "f4_le", rng.standard_normal((50, 2, 16, 32)).astype("<f4")
    yield "f8_be", rng.standard_normal((9, 3, 5)).astype(">f8")
    yield "u1", rng.integers(0, 256, (300, 17), dtype=np.uint8)
    yield "i8_be", np.arange(1000, dtype=">i8").reshape(100, 10) * 31 - 7
    yield "c16", (rng.standard_normal((7, 4)) + 1j).astype("<c16")
    yield "bool", rng.integers(0, 2, (33,)).astype(bool)
    yield "heatmap", np.zeros((64, 2, 64, 128), dtype="<f4")
    yield "empty", np.zeros((0, 4), dtype="<f4")
    yield "scalar", np.array(7, dtype="<i4")


@pytest.mark.parametrize("name,arr", list(arrays()), ids=[n for n, _ in arrays()])
def test_round_trip_zstd_d_and_numpy(tmp_path, name, arr):
    need_zstd()
    npy = tmp_path / f"{name}.npy"
    np.save(npy, arr)
    (r,) = npyload.pack(npy)
    zst = tmp_path / f"{name}.npy.zst"
    assert r["out"] == str(zst) and zst.is_file()
    assert r["in_bytes"] == os.path.getsize(npy)
    assert r["out_bytes"] == os.path.getsize(zst)
    raw = zstd_d(zst)
    assert raw == npy.read_bytes()
    back = tmp_path / "back.npy"
    back.write_bytes(raw)
    got = np.load(back)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert np.array_equal(got, arr)
    # inspect agrees with the result's frame facts
    rows = arr.shape[0] if arr.ndim else 1
    if rows:
        assert r["frames"] >= 2 and r["samples_per_frame"] >= 1


def test_options_mirror_the_cli(tmp_path):
    need_zstd()
    arr = np.arange(64 * 2 * 64 * 128, dtype="<f4").reshape(64, 2, 64, 128) % 7
    src = tmp_path / "h.npy"
    np.save(src, arr)
    (r,) = npyload.pack(str(src), level=1, frame_size=65536 * 4, threads=2)
    assert r["samples_per_frame"] == 4 and r["frames"] == 1 + 64 // 4
    # the same bytes as npyload-pack with the same options
    cli = tmp_path / "cli.npy.zst"
    p = subprocess.run([_tool("npyload-pack"), "-q", "-l", "1", "--frame-size",
                        "256K", "-T", "1", "-o", str(cli), str(src)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert cli.read_bytes() == (tmp_path / "h.npy.zst").read_bytes()
    # out=, checksum=False, remove=True
    out = tmp_path / "sub.npy.zst"
    (r,) = npyload.pack(src, level=1, frame_size=65536 * 4, out=out,
                        checksum=False, remove=True)
    assert r["out"] == str(out) and not src.exists()
    assert zstd_d(out) == zstd_d(tmp_path / "h.npy.zst")
    # no checksums: 4 bytes less per frame and per seek table entry
    assert out.stat().st_size == (tmp_path / "h.npy.zst").stat().st_size - 8 * r["frames"]


def test_refuses_overwrite_without_force(tmp_path):
    a = tmp_path / "a.npy"
    np.save(a, np.arange(10, dtype="<f4"))
    zst = tmp_path / "a.npy.zst"
    zst.write_bytes(b"keep me")
    with pytest.raises(npyload.NpyloadError) as e:
        npyload.pack(a)
    assert str(a) + ".zst" in str(e.value)
    assert e.value.code == -errno.EEXIST
    assert zst.read_bytes() == b"keep me"
    npyload.pack([a], force=True)
    assert zst.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
    assert a.exists()


def test_bad_inputs_are_named(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.arange(12, dtype="<f4").reshape(3, 4))
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00garbage")
    fortran = tmp_path / "fortran.npy"
    np.save(fortran, np.asfortranarray(np.ones((3, 4), dtype="<f4")))
    missing = tmp_path / "missing.npy"
    for p in (bad, fortran, missing):
        with pytest.raises(npyload.NpyloadError) as e:
            npyload.pack(p)
        assert str(p) in str(e.value)
        assert not os.path.exists(str(p) + ".zst")
    # a list stops at the first failure, naming it; earlier files are packed
    with pytest.raises(npyload.NpyloadError, match="bad.npy"):
        npyload.pack([good, bad, tmp_path / "never.npy"])
    assert (tmp_path / "good.npy.zst").exists()
    assert sorted(p.name for p in tmp_path.iterdir()
                  if ".tmp" in p.name) == []


def test_argument_errors(tmp_path):
    a = tmp_path / "a.npy"
    np.save(a, np.arange(4, dtype="<f4"))
    with pytest.raises(ValueError, match="exactly one"):
        npyload.pack([a, a], out=tmp_path / "x.npy.zst")
    with pytest.raises(ValueError):
        npyload.pack([])
    with pytest.raises(ValueError):
        npyload.pack(a, frame_size=0)
    with pytest.raises(ValueError):
        npyload.pack(a, threads=-1)
    with pytest.raises(TypeError):
        npyload.pack(a, level="3")
    with pytest.raises(ValueError, match="level=99 out of range"):
        npyload.pack(a, level=99)
    with pytest.raises(npyload.NpyloadError, match="a.npy"):
        npyload.pack(a, out=a)  # out naming the input
    assert not (tmp_path / "a.npy.zst").exists()


def test_ctrl_c_cancels_and_leaves_nothing(tmp_path):
    # SIGALRM's handler raises KeyboardInterrupt as SIGINT's would: the pack
    # (level 19, one thread: many seconds) stops at the next chunk.
    import signal
    rng = np.random.default_rng(1)
    src = tmp_path / "slow.npy"
    np.save(src, rng.integers(0, 16, (256, 64 * 1024), dtype=np.uint8))

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            npyload.pack(src, level=19, threads=1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.npy"]


# ---- numeric arguments: named, with their range, before anything is written

BAD_NUMBERS = [
    ("level", 2**40, "-131072 .. 22"),
    ("level", -2**40, "-131072 .. 22"),
    ("level", 23, "-131072 .. 22"),
    ("level", -131073, "-131072 .. 22"),
    ("frame_size", 2**64 - 1, "1 .. 1073741824"),
    ("frame_size", 2**64, "1 .. 1073741824"),
    ("frame_size", 2**30 + 1, "1 .. 1073741824"),
    ("frame_size", 0, "1 .. 1073741824"),
    ("frame_size", -1, "1 .. 1073741824"),
    ("threads", 2**40, "0 .. 1024"),
    ("threads", 2**31, "0 .. 1024"),
    ("threads", 1025, "0 .. 1024"),
    ("threads", -1, "0 .. 1024"),
]


@pytest.mark.parametrize("name,value,rng", BAD_NUMBERS,
                         ids=[f"{n}={v}" for n, v, _ in BAD_NUMBERS])
def test_numbers_out_of_range_are_named(tmp_path, name, value, rng):
    a = tmp_path / "a.npy"
    np.save(a, np.arange(400, dtype="<f4").reshape(100, 4))
    with pytest.raises(ValueError) as e:
        npyload.pack(a, **{name: value})
    msg = str(e.value)
    assert f"{name}={value} out of range ({rng}" in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]


@pytest.mark.parametrize("name,value", [("level", 2**40), ("frame_size", 2**64),
                                        ("threads", -2**40)])
def test_pack_file_narrowing_is_named(tmp_path, name, value):
    a = tmp_path / "a.npy"
    np.save(a, np.arange(4, dtype="<f4"))
    from npyload import _npyload
    with pytest.raises(ValueError, match=f"{name}={value} out of range"):
        _npyload.pack_file(str(a), **{name: value})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]


def test_number_limits_accepted(tmp_path):
    need_zstd()
    arr = np.arange(4 * 300, dtype="<f4").reshape(300, 4)
    a = tmp_path / "a.npy"
    np.save(a, arr)
    for kw, spf in ((dict(frame_size=1), 1), (dict(frame_size=2**30), 300),
                    (dict(level=-131072, threads=1024), None),
                    (dict(level=22, threads=0), None)):
        (r,) = npyload.pack(a, force=True, **kw)
        if spf is not None:
            assert r["samples_per_frame"] == spf
        assert zstd_d(r["out"]) == a.read_bytes()


# ---- force replaces regular files only ----------------------------------

def _special(tmp_path, kind):
    """A non-regular file (or link) named `kind` in tmp_path, or a skip."""
    p = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "symlink":
        (tmp_path / "target.npy.zst").write_bytes(b"keep me")
        os.symlink("target.npy.zst", p)
    elif kind == "dangling_symlink":
        os.symlink("nowhere", p)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(p))
        except OSError as e:
            pytest.skip(f"cannot bind a unix socket at {p}: {e}")
        finally:
            s.close()
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("not root: cannot mknod a character device")
        try:  # a /dev/null twin (1, 3) in the test's own directory
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError as e:
            pytest.skip(f"mknod refused here: {e}")
    return p


SPECIAL = {"fifo": "a FIFO", "directory": "a directory",
           "symlink": "a symbolic link", "dangling_symlink": "a symbolic link",
           "socket": "a socket", "chardev": "a character device"}


@pytest.mark.parametrize("force", [True, False], ids=["force", "noforce"])
@pytest.mark.parametrize("kind", list(SPECIAL))
def test_force_replaces_regular_files_only(tmp_path, kind, force):
    a = tmp_path / "a.npy"
    np.save(a, np.arange(40, dtype="<f4").reshape(10, 4))
    out = _special(tmp_path, kind)
    before = os.lstat(out)
    names = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(npyload.NpyloadError) as e:
        npyload.pack(a, out=out, force=force)
    assert f"{out}: is {SPECIAL[kind]}" in str(e.value), str(e.value)
    after = os.lstat(out)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    if kind == "symlink":
        assert (tmp_path / "target.npy.zst").read_bytes() == b"keep me"


def test_force_replaces_a_regular_file_and_a_hard_link(tmp_path):
    need_zstd()
    a = tmp_path / "a.npy"
    np.save(a, np.arange(40, dtype="<f4").reshape(10, 4))
    other = tmp_path / "other"
    other.write_bytes(b"keep me")
    out = tmp_path / "a.npy.zst"
    os.link(other, out)  # replacing the name leaves the other link's data
    (r,) = npyload.pack(a, force=True)
    assert zstd_d(out) == a.read_bytes()
    assert other.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "a.npy.zst",
                                                          "other"]


# ---- a temporary name that always fits ------------------------------------

@pytest.mark.parametrize("n", [250, 255])
def test_long_output_names(tmp_path, n):
    need_zstd()
    a = tmp_path / "a.npy"
    np.save(a, np.arange(400, dtype="<f4").reshape(100, 4))
    out = tmp_path / ("x" * (n - 8) + ".npy.zst")
    assert len(out.name) == n
    (r,) = npyload.pack(a, out=out)
    assert r["out"] == str(out) and zstd_d(out) == a.read_bytes()
    with pytest.raises(npyload.NpyloadError) as e:
        npyload.pack(a, out=out)
    assert e.value.code == -errno.EEXIST
    (r,) = npyload.pack(a, out=out, force=True)
    assert zstd_d(out) == a.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.npy", out.name])


def _loaded(glob_, n):
    """Every sample of one field, in index order, as npyload delivers it."""
    L = npyload.Loader({"x": glob_}, batch_size=5, shuffle=True, seed=2,
                       num_workers=2, output="numpy")
    out = [None] * n
    for b in L:
        for r, i in enumerate(b.indices):
            out[int(i)] = np.array(b["x"][r], copy=True)
    L.close()
    return np.stack(out)


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "<i2", ">f4"])
def test_narrow_round_trip_bit_for_bit(tmp_path, dtype):
    """narrow=True: 8-bit levels stored wider (the captcha images are k/255
    as float32) load back bit for bit through the loader, next to a plain
    file in the same field; the pack reports the codes and reads fewer
    bytes than plain packing."""
    rng = np.random.default_rng(1)
    levels = (np.arange(256) / 255).astype(dtype) if dtype[1] == "f" else \
        (np.arange(256) * 97 - 12000).astype(dtype)
    a = levels[rng.integers(0, 256, size=(30, 2, 16, 8))]
    b = a[::-1].copy()
    np.save(tmp_path / "x_0000.npy", a)
    np.save(tmp_path / "x_0001.npy", b)
    (r,) = npyload.pack(tmp_path / "x_0000.npy", narrow=True)
    assert r["narrow_values"] == 256
    facts = npyload.inspect(tmp_path / "x_0000.npy.zst")
    assert facts["descr"] == "|u1" and facts["shape"] == a.shape  # the codes' header
    assert facts["narrow_values"] == 256 and facts["value_descr"] == np.dtype(dtype).str
    (plain,) = npyload.pack(tmp_path / "x_0001.npy")
    assert plain["narrow_values"] == 0
    got = _loaded(str(tmp_path / "x_*.npy.zst"), 60)
    want = np.concatenate([a, b])
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()
    assert r["out_bytes"] < plain["out_bytes"]


def test_narrow_refuses_more_than_256_values_and_zstd_d_gives_the_codes(tmp_path):
    a = np.arange(257, dtype=np.float32).reshape(257, 1)
    np.save(tmp_path / "w.npy", a)
    with pytest.raises(npyload.NpyloadError, match="more than 256 distinct values"):
        npyload.pack(tmp_path / "w.npy", narrow=True)
    assert not (tmp_path / "w.npy.zst").exists()
    need_zstd()
    c = np.array([0.5, -0.0, np.nan, 1e-45], dtype=np.float32)[np.arange(40) % 4]
    np.save(tmp_path / "c.npy", c.reshape(10, 4))
    npyload.pack(tmp_path / "c.npy", narrow=True)
    codes_npy = tmp_path / "codes.npy"
    codes_npy.write_bytes(zstd_d(tmp_path / "c.npy.zst"))
    codes = np.load(codes_npy)
    assert codes.dtype == np.uint8 and codes.shape == (10, 4)
    table = np.unique(c.view(np.uint32))  # code k: the k-th smallest bit pattern
    assert (table[codes].view(np.float32).view(np.uint32) ==
            c.reshape(10, 4).view(np.uint32)).all()


def test_cli_narrow(tmp_path):
    a = (np.arange(64) % 7 / 7).astype(np.float32).reshape(16, 4)
    np.save(tmp_path / "n.npy", a)
    p = subprocess.run([str(_tool("npyload-pack")), "--narrow", str(tmp_path / "n.npy")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "narrowed to 7 codes" in p.stdout, p.stdout
    assert _loaded(str(tmp_path / "n.npy.zst"), 16).tobytes() == a.tobytes()


def _loaded_with(glob_, n, **kw):
    """Every sample of one field in index order, with the loader options kw."""
    out = [None] * n
    with npyload.Loader({"x": glob_}, batch_size=5, shuffle=True, seed=2,
                        output="numpy", **kw) as L:
        for b in L:
            for r, i in enumerate(b.indices):
                out[int(i)] = np.array(b["x"][r], copy=True)
    return np.stack(out)


@pytest.mark.parametrize("dtype", ["<f4", "<f8", ">f4"])
def test_narrow_store_round_trip_every_backend(tmp_path, dtype):
    """narrow=True, store=True: FILE.narrow.npy is a plain .npy of the codes
    (numpy reads the codes: the k-th smallest bit pattern is code k) plus
    a trailer; npyload delivers the original values bit for bit (NaN, -0.0,
    a denormal and infinities among them) through every backend, O_DIRECT,
    0-3 workers, next to a plain file and a packed narrowed file in the
    same field."""
    rng = np.random.default_rng(5)
    special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45 if dtype[1:] == "f4"
                        else 5e-324], dtype=dtype)
    levels = np.concatenate([special, (np.arange(250) / 251).astype(dtype)])
    a = levels[rng.integers(0, len(levels), size=(23, 2, 9, 5))]
    b = levels[rng.integers(0, len(levels), size=(11, 2, 9, 5))]
    c = levels[rng.integers(0, len(levels), size=(7, 2, 9, 5))]
    for k, arr in enumerate((a, b, c)):
        np.save(tmp_path / f"src_{k}.npy", arr)
    (r,) = npyload.pack(tmp_path / "src_0.npy", narrow=True, store=True)
    assert r["out"] == str(tmp_path / "src_0.narrow.npy")
    assert r["frames"] == 0 and r["narrow_values"] == len(np.unique(a.view(f"u{a.itemsize}")))
    codes = np.load(r["out"])
    assert codes.dtype == np.uint8 and codes.shape == a.shape
    table = np.unique(a.view(f"u{a.itemsize}"))
    assert (table[codes] == a.view(f"u{a.itemsize}")).all()
    assert r["out_bytes"] < a.nbytes / a.itemsize + 4096  # codes + a small trailer
    d = tmp_path / "field"
    d.mkdir()
    os.replace(r["out"], d / "x_0.npy")
    np.save(d / "x_1.npy", b)                      # plain
    np.save(tmp_path / "c.npy", c)
    npyload.pack(tmp_path / "c.npy", narrow=True, out=d / "x_2.npy.zst")  # packed
    want = np.concatenate([a, b, c])
    n = len(want)
    for io in ("pread", "uring", "mmap"):
        for direct in (False, True):
            if io == "mmap" and direct:
                continue
            for w in (0, 1, 3):
                got = _loaded_with(str(d / "x_*"), n, io=io, direct_io=direct,
                                   num_workers=w)
                assert got.dtype == want.dtype
                assert got.tobytes() == want.tobytes(), (io, direct, w)
    # Resume mid-epoch: the rest equals an uninterrupted epoch's rest.
    with npyload.Loader({"x": str(d / "x_*")}, batch_size=4, shuffle=True, seed=9,
                        output="numpy") as L:
        it = iter(L)
        next(it)
        st = L.state_dict()
        rest = [np.array(bt["x"], copy=True) for bt in it]
    with npyload.Loader({"x": str(d / "x_*")}, batch_size=4, shuffle=True, seed=9,
                        output="numpy") as L2:
        L2.load_state_dict(st)
        again = [np.array(bt["x"], copy=True) for bt in L2]
    assert len(rest) == len(again) and all(x.tobytes() == y.tobytes()
                                           for x, y in zip(rest, again))


def test_narrow_store_damage_is_named(tmp_path):
    """A stored narrowed file whose table is damaged, whose trailer lies
    about its length, or whose codes are outside the table fails naming
    the file, never delivering wrong values; store without narrow is
    refused."""
    a = (np.arange(60) % 5 / 5).astype(np.float32).reshape(12, 5)
    np.save(tmp_path / "s.npy", a)
    with pytest.raises(npyload.NpyloadError, match="store needs narrow"):
        npyload.pack(tmp_path / "s.npy", store=True)
    (r,) = npyload.pack(tmp_path / "s.npy", narrow=True, store=True)
    good = Path(r["out"]).read_bytes()
    data_end = len(good) - (len(good) - (128 + a.size))  # header 128 + codes
    assert np.load(r["out"]).shape == (12, 5)

    def load_err(blob):
        p = tmp_path / "bad.npy"
        p.write_bytes(blob)
        with pytest.raises(npyload.NpyloadError) as e:
            with npyload.Loader({"x": str(p)}, batch_size=4, output="numpy") as L:
                for _ in L:
                    pass
        assert str(p) in str(e.value), str(e.value)
        return str(e.value)

    table = bytearray(good)
    table[data_end + 20] ^= 0x40                   # inside the table's frame
    assert "damaged" in load_err(bytes(table))
    length = bytearray(good)
    length[-12] ^= 0x01                            # the trailer's length field
    assert "trailer" in load_err(bytes(length))
    code = bytearray(good)
    code[128 + 7] = 250                            # a code beyond the 5 values
    assert "not in the file's table" in load_err(bytes(code))


def _file_server(root):
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from weed_server import FileServer
    return FileServer(root)


def test_narrow_store_twin_is_refused(tmp_path):
    """Issue 35, item 8: '*.npy' matches FILE.npy and FILE.narrow.npy (packed
    with --narrow --store, no --rm), which would deliver every sample
    twice. Refused at start naming both files, as the FILE.npy.zst twin
    is, for a glob, a list and http:// URLs; '*.narrow.npy' alone loads the
    values (numpy's reading of the sources)."""
    arrs = [((np.arange(24) + 7 * i) % 5 / 4).astype(np.float32).reshape(6, 4)
            for i in range(2)]
    for i, a in enumerate(arrs):
        np.save(tmp_path / f"x_{i}.npy", a)
        npyload.pack(tmp_path / f"x_{i}.npy", narrow=True, store=True)

    def refused(spec):
        with pytest.raises(npyload.NpyloadError) as e:
            npyload.Loader({"x": spec}, batch_size=4, output="numpy")
        msg = str(e.value)
        assert "twice" in msg and "narrow" in msg, msg
        return msg

    msg = refused(str(tmp_path / "x_*.npy"))
    assert str(tmp_path / "x_0.npy") in msg and str(tmp_path / "x_0.narrow.npy") in msg, msg
    refused([str(tmp_path / "x_1.narrow.npy"), str(tmp_path / "x_1.npy")])
    with _file_server(tmp_path) as fs:
        urls = [fs.url("x_0.npy"), fs.url("x_1.npy"), fs.url("x_0.narrow.npy")]
        msg = refused(urls)
        assert fs.url("x_0.npy") in msg and fs.url("x_0.narrow.npy") in msg, msg
    got = _loaded(str(tmp_path / "x_*.narrow.npy"), 12)
    assert got.tobytes() == np.concatenate(arrs).tobytes()


def test_narrow_store_that_lost_its_last_bytes_is_refused(tmp_path):
    """Issue 35, item 7: a stored narrowed file that lost its last 1..12
    bytes (the trailer's tag or length) used to load silently as its uint8
    codes. Refused naming the file, locally and over http:// (the tests'
    own server), for every such cut; whole, it loads the values."""
    a = (np.arange(60) % 6 / 5).astype(np.float32).reshape(12, 5)
    np.save(tmp_path / "s.npy", a)
    (r,) = npyload.pack(tmp_path / "s.npy", narrow=True, store=True)
    good = Path(r["out"]).read_bytes()
    d = tmp_path / "cut"
    d.mkdir()
    for lost in range(1, 13):
        (d / f"cut_{lost:02d}.npy").write_bytes(good[:-lost])
    with _file_server(d) as fs:
        for lost in range(1, 13):
            name = f"cut_{lost:02d}.npy"
            for path in (str(d / name), fs.url(name)):
                with pytest.raises(npyload.NpyloadError) as e:
                    npyload.Loader({"x": [path]}, batch_size=4, output="numpy")
                assert path in str(e.value) and "trailer" in str(e.value), str(e.value)
    assert _loaded(r["out"], 12).tobytes() == a.tobytes()


def test_inspect_reports_a_stored_narrowed_file_like_the_packed_form(tmp_path):
    """Issue 35, item 18: inspect() of FILE.narrow.npy said '|u1' and no
    more, while the loader delivers '<f4'. It now reports narrow_values and
    value_descr (the delivered dtype) as for the packed form, locally, over
    http:// and in npyload-inspect's text and JSON; a cut trailer raises
    naming the file."""
    import json
    a = (np.arange(60) % 7 / 6).astype(np.float32).reshape(12, 5)
    np.save(tmp_path / "s.npy", a)
    (stored,) = npyload.pack(tmp_path / "s.npy", narrow=True, store=True)
    (packed,) = npyload.pack(tmp_path / "s.npy", narrow=True)
    want = {k: npyload.inspect(packed["out"])[k] for k in ("narrow_values", "value_descr",
                                                            "descr", "shape")}
    assert want == {"narrow_values": 7, "value_descr": "<f4", "descr": "|u1",
                    "shape": (12, 5)}
    with _file_server(tmp_path) as fs:
        for where in (stored["out"], fs.url("s.narrow.npy")):
            info = npyload.inspect(where)
            assert {k: info[k] for k in want} == want, (where, info)
    exe = _tool("npyload-inspect")
    r = subprocess.run([exe, stored["out"]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "narrow_values=7 value_descr=<f4" in r.stdout, r.stdout
    r = subprocess.run([exe, "--json", stored["out"]], capture_output=True, text=True,
                       timeout=60)
    doc = json.loads(r.stdout)
    assert doc["narrow_values"] == 7 and doc["value_descr"] == "<f4" and doc["descr"] == "|u1"
    np.save(tmp_path / "plain.npy", a)  # a plain file has no such keys
    assert "narrow_values" not in npyload.inspect(tmp_path / "plain.npy")
    cut = tmp_path / "cut.npy"
    cut.write_bytes(Path(stored["out"]).read_bytes()[:-3])
    with pytest.raises(npyload.NpyloadError, match="cut.npy"):
        npyload.inspect(cut)


def test_cli_narrow_store(tmp_path):
    a = (np.arange(64) % 7 / 7).astype(np.float32).reshape(16, 4)
    np.save(tmp_path / "n.npy", a)
    p = subprocess.run([str(_tool("npyload-pack")), "--narrow", "--store",
                        str(tmp_path / "n.npy")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "n.narrow.npy" in p.stdout and "narrowed to 7 codes" in p.stdout, p.stdout
    assert _loaded(str(tmp_path / "n.narrow.npy"), 16).tobytes() == a.tobytes()
