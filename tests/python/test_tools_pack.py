"""npyload-pack: the command line (ratio lines, -f, -o, --rm, exit codes),
the stock `zstd -d` round trip against numpy, and interrupted packs.

The tool is looked up in $NPYLOAD_BUILD_DIR/tools (default <repo>/build); a
missing binary is a failure, not a skip. Tests that need the `zstd` CLI skip
visibly without it.
"""
import io
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import built_tool as _tool


@pytest.fixture(scope="module")
def pack_exe():
    return _tool("npyload-pack")


def run(exe, *args, **kw):
    return subprocess.run([exe, *map(str, args)], capture_output=True,
                          text=True, timeout=120, **kw)


def need_zstd():
    if shutil.which("zstd") is None:
        pytest.skip("the zstd command-line tool is not installed "
                    "(apt-get install zstd)")


def zstd_decompress(path):
    return subprocess.run(["zstd", "-q", "-d", "-c", str(path)], check=True,
                          capture_output=True, timeout=60).stdout


LINE = re.compile(r"^(?P<file>.+): (?P<inb>\d+) -> (?P<outb>\d+) bytes, ratio "
                  r"(?P<ratio>[\d.]+)x, (?P<frames>\d+) frames \((?P<spf>\d+) "
                  r"samples/frame\), (?P<mbs>[\d.]+) MB/s -> (?P<out>.+)$")


def arrays():
    rng = np.random.default_rng(7)
    yield "f4_le", rng.standard_normal((50, 2, 16, 32)).astype("<f4")
    yield "f4_be", rng.standard_normal((9, 3, 5)).astype(">f4")
    yield "u1", rng.integers(0, 256, (300, 17), dtype=np.uint8)
    yield "i8_be", (np.arange(1000, dtype=">i8").reshape(100, 10) * 31 - 7)
    yield "c16", (rng.standard_normal((7, 4)) + 1j).astype("<c16")
    yield "bool", rng.integers(0, 2, (33,)).astype(bool)
    yield "heatmap", np.zeros((64, 2, 64, 128), dtype="<f4")
    yield "empty", np.zeros((0, 4), dtype="<f4")


@pytest.mark.parametrize("name,arr", list(arrays()), ids=[n for n, _ in arrays()])
def test_zstd_d_round_trip_matches_numpy(pack_exe, tmp_path, name, arr):
    need_zstd()
    src = tmp_path / f"{name}.npy"
    np.save(src, arr)
    r = run(pack_exe, src)
    assert r.returncode == 0, r.stderr
    m = LINE.match(r.stdout.strip())
    assert m, r.stdout
    out = tmp_path / f"{name}.npy.zst"
    assert m["out"] == str(out) and out.is_file()
    assert int(m["inb"]) == src.stat().st_size
    assert int(m["outb"]) == out.stat().st_size
    assert abs(float(m["ratio"]) - int(m["inb"]) / int(m["outb"])) < 0.01
    raw = zstd_decompress(out)
    assert raw == src.read_bytes()
    back = np.load(io.BytesIO(raw))
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    assert "\r" not in r.stderr  # no progress line when stderr is not a tty


def test_frame_size_and_samples_per_frame(pack_exe, tmp_path):
    need_zstd()
    arr = np.arange(100 * 16384, dtype="<f4").reshape(100, 16384)  # 64 KiB rows
    src = tmp_path / "h.npy"
    np.save(src, arr)
    r = run(pack_exe, src)
    m = LINE.match(r.stdout.strip())
    assert m and int(m["spf"]) == 2 and int(m["frames"]) == 1 + 50, r.stdout
    r = run(pack_exe, "-f", "--frame-size", "1M", src)
    m = LINE.match(r.stdout.strip())
    assert m and int(m["spf"]) == 16 and int(m["frames"]) == 1 + 7, r.stdout
    assert zstd_decompress(tmp_path / "h.npy.zst") == src.read_bytes()


def test_overwrite_needs_force(pack_exe, tmp_path):
    src = tmp_path / "a.npy"
    np.save(src, np.arange(10, dtype="<i4"))
    out = tmp_path / "a.npy.zst"
    out.write_bytes(b"keep me")
    r = run(pack_exe, src)
    assert r.returncode == 1
    assert str(out) in r.stderr and "already exists" in r.stderr
    assert out.read_bytes() == b"keep me"
    assert sorted(os.listdir(tmp_path)) == ["a.npy", "a.npy.zst"]
    r = run(pack_exe, "-f", src)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() != b"keep me"


def test_output_option(pack_exe, tmp_path):
    need_zstd()
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.arange(12, dtype="<f8").reshape(3, 4))
    np.save(b, np.arange(5, dtype="<f8"))
    out = tmp_path / "sub.zst"
    r = run(pack_exe, "-o", out, a)
    assert r.returncode == 0, r.stderr
    assert zstd_decompress(out) == a.read_bytes()
    assert not (tmp_path / "a.npy.zst").exists()
    r = run(pack_exe, "-o", out, a, b)
    assert r.returncode == 2 and "-o" in r.stderr


def test_rm_removes_input_only_after_success(pack_exe, tmp_path):
    need_zstd()
    a = tmp_path / "a.npy"
    np.save(a, np.arange(100, dtype="<u2"))
    data = a.read_bytes()
    r = run(pack_exe, "--rm", a)
    assert r.returncode == 0, r.stderr
    assert not a.exists()
    assert zstd_decompress(tmp_path / "a.npy.zst") == data
    # A failed pack (output exists) keeps its input.
    a.write_bytes(data)
    r = run(pack_exe, "--rm", a)
    assert r.returncode == 1 and a.exists()


def test_bad_inputs_named_others_still_packed(pack_exe, tmp_path):
    good1, good2 = tmp_path / "g1.npy", tmp_path / "g2.npy"
    np.save(good1, np.ones((4, 4), dtype="<f4"))
    np.save(good2, np.ones((5,), dtype="<i2"))
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00garbage")
    fort = tmp_path / "fortran.npy"
    np.save(fort, np.asfortranarray(np.ones((3, 4), dtype="<f4")))
    missing = tmp_path / "missing.npy"
    r = run(pack_exe, good1, bad, fort, missing, good2)
    assert r.returncode == 1
    for p in (bad, fort, missing):
        assert str(p) in r.stderr
    assert "Fortran" in r.stderr
    assert (tmp_path / "g1.npy.zst").is_file() and (tmp_path / "g2.npy.zst").is_file()
    for p in (bad, fort, missing):
        assert not os.path.exists(str(p) + ".zst")
    assert re.search(r"^total: 2 of 5 files, \d+ -> \d+ bytes, ratio [\d.]+x, "
                     r"[\d.]+ MB/s$", r.stdout, re.M), r.stdout
    assert not [n for n in os.listdir(tmp_path) if ".tmp." in n or ".npyl-" in n]


BAD_NUMBERS = [
    ("-l", "99999999999999999999", "-131072 .. 22"),
    ("-l", "23", "-131072 .. 22"),
    ("-l", "-131073", "-131072 .. 22"),
    ("--level", "1099511627776", "-131072 .. 22"),
    ("--frame-size", "18446744073709551615", "1 .. 1073741824"),
    ("--frame-size", "99999999999999999999", "1 .. 1073741824"),
    ("--frame-size", "16777216T", "1 .. 1073741824"),
    ("--frame-size", "2G", "1 .. 1073741824"),
    ("--frame-size", "0", "1 .. 1073741824"),
    ("--frame-size", "-1", "1 .. 1073741824"),
    ("-T", "1025", "0 .. 1024"),
    ("-T", "1099511627776", "0 .. 1024"),
    ("--threads", "-1", "0 .. 1024"),
    ("-T", "4x", "0 .. 1024"),
]


@pytest.mark.parametrize("opt,value,rng", BAD_NUMBERS,
                         ids=[f"{o}={v}" for o, v, _ in BAD_NUMBERS])
def test_numeric_options_out_of_range_are_named(pack_exe, tmp_path, opt, value, rng):
    src = tmp_path / "a.npy"
    np.save(src, np.arange(64, dtype="<f4").reshape(8, 8))
    r = run(pack_exe, opt, value, src)
    assert r.returncode == 2, (r.stdout, r.stderr)
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"npyload-pack: {opt} {value}: "), first
    assert first.endswith(f"({rng})"), first
    assert sorted(os.listdir(tmp_path)) == ["a.npy"]


def test_frame_size_limits_accepted(pack_exe, tmp_path):
    need_zstd()
    arr = np.arange(4 * 1000, dtype="<f4").reshape(1000, 4)
    src = tmp_path / "a.npy"
    np.save(src, arr)
    for fs, spf in (("1", 1), ("1G", 1000)):
        r = run(pack_exe, "-q", "-f", "--frame-size", fs, src)
        assert r.returncode == 0, r.stderr
        raw = zstd_decompress(str(src) + ".zst")
        assert raw == src.read_bytes()


def test_force_refuses_a_fifo_and_a_directory(pack_exe, tmp_path):
    src = tmp_path / "a.npy"
    np.save(src, np.arange(64, dtype="<f4").reshape(8, 8))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    d = tmp_path / "dir.npy.zst"
    d.mkdir()
    for out, kind in ((fifo, "a FIFO"), (d, "a directory")):
        r = run(pack_exe, "-q", "-f", "-o", out, src)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"{out}: is {kind}" in r.stderr, r.stderr
    assert os.path.isdir(d) and not os.listdir(d)
    import stat as st
    assert st.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["a.npy", "dir.npy.zst", "fifo"]


def test_long_output_name(pack_exe, tmp_path):
    need_zstd()
    src = tmp_path / "a.npy"
    np.save(src, np.arange(640, dtype="<f4").reshape(64, 10))
    for n in (250, 255):
        out = tmp_path / ("n" * (n - 8) + ".npy.zst")
        assert len(out.name) == n
        r = run(pack_exe, "-q", "-o", out, src)
        assert r.returncode == 0, r.stderr
        assert zstd_decompress(out) == src.read_bytes()
        r = run(pack_exe, "-q", "-f", "-o", out, src)  # replacing it too
        assert r.returncode == 0, r.stderr
        assert zstd_decompress(out) == src.read_bytes()
    assert len(os.listdir(tmp_path)) == 3


def test_usage_errors(pack_exe, tmp_path):
    assert run(pack_exe).returncode == 2
    assert run(pack_exe, "-l", "99", "x.npy").returncode == 2
    assert run(pack_exe, "--frame-size", "0", "x.npy").returncode == 2
    assert run(pack_exe, "-T", "-1", "x.npy").returncode == 2
    assert run(pack_exe, "--bogus").returncode == 2
    r = run(pack_exe, "--help")
    assert r.returncode == 0 and "--frame-size" in r.stdout


def _writing_in(pid, directory, src):
    """Whether process `pid` holds a file in `directory` other than `src`
    open: the output, nameless (O_TMPFILE: "DIR/#123 (deleted)") or under a
    short temporary name where the filesystem refuses O_TMPFILE."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for n in names:
        try:
            t = os.readlink(os.path.join(fds, n))
        except OSError:
            continue
        if t.startswith(str(directory) + "/") and t != str(src):
            return True
    return False


def _slow_pack(pack_exe, tmp_path):
    """Starts a pack that takes seconds (level 19, one thread, 16 MiB of
    noise) and returns (proc, final path) once its temporary file exists."""
    src = tmp_path / "big.npy"
    rng = np.random.default_rng(1)
    np.save(src, rng.standard_normal((16, 256, 1024)).astype("<f4"))
    final = tmp_path / "big.npy.zst"
    proc = subprocess.Popen([pack_exe, "-l", "19", "-T", "1", "--frame-size",
                             "256K", str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _writing_in(proc.pid, tmp_path, src):
            break
        assert proc.poll() is None, "pack ended before it could be interrupted"
        time.sleep(0.01)
    time.sleep(0.3)  # some frames written
    assert proc.poll() is None, "pack too fast to interrupt: enlarge the input"
    assert not final.exists()
    return proc, final


def test_sigint_leaves_nothing(pack_exe, tmp_path):
    proc, final = _slow_pack(pack_exe, tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert b"interrupted" in err
    assert sorted(os.listdir(tmp_path)) == ["big.npy"]


def test_sigterm_leaves_nothing(pack_exe, tmp_path):
    proc, final = _slow_pack(pack_exe, tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert sorted(os.listdir(tmp_path)) == ["big.npy"]


def test_sigkill_never_leaves_a_final_name(pack_exe, tmp_path):
    proc, final = _slow_pack(pack_exe, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # The final name must not exist at all. The output was nameless
    # (O_TMPFILE), so nothing remains; a filesystem without O_TMPFILE may
    # keep a short temporary name (nothing runs after SIGKILL).
    assert not final.exists()
    left = [n for n in os.listdir(tmp_path) if n != "big.npy"]
    assert all(n.startswith(".npyl-") for n in left), left
