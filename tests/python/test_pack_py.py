"""npyload.pack(): the same C code as npyload-pack (npyload_pack_file) from
Python — round trip through the stock `zstd -d` and numpy, the options
mirrored from the CLI, refusing to overwrite, bad inputs named in
NpyloadError, and agreement with the CLI's output byte for byte.

Tests that need the `zstd` CLI skip visibly without it.
"""
import errno
import os
import shutil
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
    with pytest.raises(npyload.NpyloadError, match="a.npy"):
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
