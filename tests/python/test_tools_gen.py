"""npyload-gen: the captcha reference layout (paths, shapes, dtypes, content
properties), determinism, the generic mode, argument errors.

The tool is looked up in $NPYLOAD_BUILD_DIR/tools (default <repo>/build); a
missing binary is a failure, not a skip. Datasets stay tiny (2-3 samples per
file).
"""
import hashlib
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, built_tool as _tool


@pytest.fixture(scope="module")
def gen_exe():
    return _tool("npyload-gen")


def run(exe, *args):
    return subprocess.run([exe, *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def tree(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*")
                  if p.is_file())


def digests(root):
    return {name: hashlib.sha256((Path(root) / name).read_bytes()).hexdigest()
            for name in tree(root)}


LEVELS = np.arange(256, dtype=np.float32) / np.float32(255)


@pytest.fixture(scope="module")
def captcha2(gen_exe, tmp_path_factory):
    out = tmp_path_factory.mktemp("captcha2")
    r = run(gen_exe, "--preset", "captcha", "--out", out, "--files", 3,
            "--samples-per-file", 3, "--seed", 7)
    assert r.returncode == 0, r.stderr
    return out, r


def test_captcha_layout(captcha2):
    out, r = captcha2
    want = []
    for i in range(3):
        want += [f"images/train/train_{i:04d}.npy",
                 f"labels/train/train_{i:04d}_heatmaps.npy",
                 f"labels/train/train_{i:04d}_offsets.npy"]
    assert tree(out) == sorted(want)
    for i in range(3):
        img = np.load(out / f"images/train/train_{i:04d}.npy")
        hm = np.load(out / f"labels/train/train_{i:04d}_heatmaps.npy")
        off = np.load(out / f"labels/train/train_{i:04d}_offsets.npy")
        assert img.dtype == np.dtype("<f4") and img.shape == (3, 2, 256, 512)
        assert hm.dtype == np.dtype("<f4") and hm.shape == (3, 2, 64, 128)
        assert off.dtype == np.dtype("<f4") and off.shape == (3, 4, 64, 128)
        for a in (img, hm, off):
            assert a.flags.c_contiguous


def test_captcha_summary_line(captcha2):
    out, r = captcha2
    m = re.search(r"wrote (\d+) files, (\d+) samples, (\d+) bytes .* "
                  r"([\d.]+) s, ([\d.]+) MB/s", r.stdout)
    assert m, r.stdout
    assert int(m[1]) == 9 and int(m[2]) == 9
    total = sum((out / n).stat().st_size for n in tree(out))
    assert int(m[3]) == total


def check_captcha_content(out, split, channels, nfiles, samples):
    for i in range(nfiles):
        img = np.load(out / f"images/{split}/{split}_{i:04d}.npy")
        hm = np.load(out / f"labels/{split}/{split}_{i:04d}_heatmaps.npy")
        off = np.load(out / f"labels/{split}/{split}_{i:04d}_offsets.npy")
        assert img.shape == (samples, channels, 256, 512)
        # image channels: 8-bit levels k/255 (a photo / 255 in float32);
        # the last channel: an all-ones mask
        colour = img[:, :channels - 1]
        vals = np.unique(colour)
        assert np.isin(vals, LEVELS).all(), vals
        assert len(vals) >= 64  # a texture, not a flat image
        assert (img[:, channels - 1] == 1.0).all()
        for s in range(samples):
            peaks = []
            for c in range(2):
                h = hm[s, c]
                assert h.max() == np.float32(1.0)
                (ys, xs) = np.nonzero(h == h.max())
                assert len(ys) == 1, (i, s, c)
                py, px = int(ys[0]), int(xs[0])
                nz_y, nz_x = np.nonzero(h)
                assert (np.abs(nz_y - py) <= 4).all()
                assert (np.abs(nz_x - px) <= 4).all()
                assert len(nz_y) <= 81
                assert (h >= 0).all()
                # a gaussian of sigma 1.5 around the peak cell
                if 4 <= py < 60 and 4 <= px < 124:
                    win = h[py - 4:py + 5, px - 4:px + 5]
                    yy, xx = np.mgrid[-4:5, -4:5]
                    g = np.exp(-(yy ** 2 + xx ** 2) / (2 * 1.5 ** 2))
                    np.testing.assert_allclose(win, g, rtol=1e-5, atol=1e-7)
                # offsets: (du, dv) at channels 2c, 2c+1, one cell, the peak
                for k in (2 * c, 2 * c + 1):
                    o = off[s, k]
                    oy, ox = np.nonzero(o)
                    assert len(oy) == 1, (i, s, k)
                    assert (int(oy[0]), int(ox[0])) == (py, px)
                    v = o[py, px]
                    assert -0.5 <= v < 0.5 and v != 0
                peaks.append((py, px))
            # gap (channel 0) to the right of the slider (channel 1)
            assert peaks[0][1] > peaks[1][1]


def test_captcha_content(captcha2):
    out, _ = captcha2
    check_captcha_content(out, "train", 2, 3, 3)


def test_captcha_gap_is_visible(captcha2):
    """The gap region (around the gap peak) differs from the background: a
    darker body, so the image is not label-independent noise."""
    out, _ = captcha2
    img = np.load(out / "images/train/train_0000.npy")
    hm = np.load(out / "labels/train/train_0000_heatmaps.npy")
    for s in range(img.shape[0]):
        py, px = np.unravel_index(np.argmax(hm[s, 0]), hm[s, 0].shape)
        cy, cx = 4 * py + 2, 4 * px + 2
        inside = img[s, 0, cy - 8:cy + 8, cx - 8:cx + 8].mean()
        assert inside < img[s, 0].mean(), s


def test_captcha_four_channels(gen_exe, tmp_path):
    r = run(gen_exe, "--preset", "captcha", "--out", tmp_path, "--files", 1,
            "--samples-per-file", 2, "--channels", 4, "--split", "val")
    assert r.returncode == 0, r.stderr
    assert tree(tmp_path) == ["images/val/val_0000.npy",
                              "labels/val/val_0000_heatmaps.npy",
                              "labels/val/val_0000_offsets.npy"]
    check_captcha_content(tmp_path, "val", 4, 1, 2)
    img = np.load(tmp_path / "images/val/val_0000.npy")
    assert img.shape == (2, 4, 256, 512)
    # RGB: the colour channels are not copies of one another
    assert not np.array_equal(img[:, 0], img[:, 1])
    assert not np.array_equal(img[:, 1], img[:, 2])


def test_captcha_defaults(gen_exe, tmp_path):
    """Defaults: 4 files, split train, 2 channels (samples kept small)."""
    r = run(gen_exe, "--preset", "captcha", "--out", tmp_path / "x",
            "--samples-per-file", 1)
    assert r.returncode == 0, r.stderr
    files = tree(tmp_path / "x")
    assert len(files) == 12
    assert "images/train/train_0003.npy" in files
    assert np.load(tmp_path / "x/images/train/train_0000.npy").shape == \
        (1, 2, 256, 512)


def test_captcha_determinism(gen_exe, captcha2, tmp_path):
    out, _ = captcha2
    again = tmp_path / "again"
    r = run(gen_exe, "--preset", "captcha", "--out", again, "--files", 3,
            "--samples-per-file", 3, "--seed", 7)
    assert r.returncode == 0, r.stderr
    assert digests(again) == digests(out)

    other = tmp_path / "other"
    r = run(gen_exe, "--preset", "captcha", "--out", other, "--files", 3,
            "--samples-per-file", 3, "--seed", 8)
    assert r.returncode == 0, r.stderr
    d_out, d_other = digests(out), digests(other)
    assert d_out.keys() == d_other.keys()
    for name in d_out:
        assert d_out[name] != d_other[name], name


def test_captcha_first_id_shards(gen_exe, captcha2, tmp_path):
    """--first-id writes the same files as one run would: shards compose."""
    out, _ = captcha2
    r = run(gen_exe, "--preset", "captcha", "--out", tmp_path, "--files", 2,
            "--first-id", 1, "--samples-per-file", 3, "--seed", 7)
    assert r.returncode == 0, r.stderr
    d = digests(tmp_path)
    ref = digests(out)
    assert len(d) == 6
    for name, h in d.items():
        assert ref[name] == h, name


# ---- generic mode ---------------------------------------------------------

GENERIC_DTYPES = ["|b1", "|i1", "|u1", "<i2", ">i2", "<i4", ">i4", "<i8",
                  ">i8", "<u2", ">u2", "<u4", ">u4", "<u8", ">u8", "<f2",
                  ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c8", "<c16",
                  ">c16"]


@pytest.mark.parametrize("dtype", GENERIC_DTYPES)
def test_generic_dtypes(gen_exe, tmp_path, dtype):
    r = run(gen_exe, "--generic", "--out", tmp_path, "--prefix", "d",
            "--files", 2, "--samples-per-file", 5, "--shape", "3,4",
            "--dtype", dtype, "--seed", 3)
    assert r.returncode == 0, r.stderr
    assert tree(tmp_path) == ["d_0000.npy", "d_0001.npy"]
    a = np.load(tmp_path / "d_0000.npy")
    b = np.load(tmp_path / "d_0001.npy")
    assert a.dtype == np.dtype(dtype) and a.dtype.str == dtype
    assert a.shape == (5, 3, 4)
    assert not np.array_equal(a, b) or dtype == "|b1"
    if a.dtype.kind in "fc":
        assert np.isfinite(a).all()
        assert (np.abs(a.real) <= 1).all() and (np.abs(a.imag) <= 1).all()
        assert len(np.unique(a)) > 30
    if a.dtype.kind == "b":
        assert a.any() and not a.all()


def test_generic_byte_orders_hold_same_values(gen_exe, tmp_path):
    """'<' and '>' differ only in byte order: same values for one seed."""
    for t in ("i4", "u8", "f2", "f8", "c8"):
        got = {}
        for order in "<>":
            out = tmp_path / (t + order.replace("<", "le").replace(">", "be"))
            r = run(gen_exe, "--generic", "--out", out, "--files", 1,
                    "--samples-per-file", 4, "--shape", "8", "--dtype",
                    order + t, "--seed", 5)
            assert r.returncode == 0, r.stderr
            got[order] = np.load(out / "data_0000.npy")
            assert got[order].dtype.str == order + t
        assert np.array_equal(got["<"], got[">"]), t


def test_generic_shapes(gen_exe, tmp_path):
    cases = {"s3": ("3,32,32", (7, 3, 32, 32)),
             "scalar": ("", (7,)),
             "one": ("1", (7, 1)),
             "empty": ("0,5", (7, 0, 5))}
    for prefix, (shape, want) in cases.items():
        r = run(gen_exe, "--generic", "--out", tmp_path, "--prefix", prefix,
                "--files", 1, "--samples-per-file", 7, "--shape", shape)
        assert r.returncode == 0, (prefix, r.stderr)
        a = np.load(tmp_path / f"{prefix}_0000.npy")
        assert a.shape == want and a.dtype == np.dtype("<f4")


def test_generic_zero_samples_and_fortran(gen_exe, tmp_path):
    r = run(gen_exe, "--generic", "--out", tmp_path, "--prefix", "z",
            "--files", 1, "--samples-per-file", 0, "--shape", "2")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "z_0000.npy").shape == (0, 2)
    r = run(gen_exe, "--generic", "--out", tmp_path, "--prefix", "f",
            "--files", 1, "--samples-per-file", 3, "--shape", "4",
            "--fortran")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "f_0000.npy").flags.f_contiguous


def test_generic_determinism(gen_exe, tmp_path):
    args = ["--generic", "--prefix", "g", "--files", 2, "--samples-per-file",
            3, "--shape", "5,5", "--dtype", "<i4"]
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        r = run(gen_exe, *args, "--out", tmp_path / name, "--seed", seed)
        assert r.returncode == 0, r.stderr
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    da, dc = digests(tmp_path / "a"), digests(tmp_path / "c")
    assert all(da[k] != dc[k] for k in da)


def test_generic_mkdir_p(gen_exe, tmp_path):
    out = tmp_path / "a" / "b" / "c"
    r = run(gen_exe, "--generic", "--out", out, "--files", 1,
            "--samples-per-file", 1, "--shape", "2")
    assert r.returncode == 0, r.stderr
    assert (out / "data_0000.npy").is_file()


# ---- command line ---------------------------------------------------------

BAD_ARGS = [
    [],
    ["--out", "X"],
    ["--preset", "captcha"],
    ["--preset", "nope", "--out", "X"],
    ["--preset", "captcha", "--generic", "--out", "X", "--shape", "2"],
    ["--preset", "captcha", "--out", "X", "--channels", "3"],
    ["--preset", "captcha", "--out", "X", "--files", "0"],
    ["--preset", "captcha", "--out", "X", "--files", "abc"],
    ["--preset", "captcha", "--out", "X", "--files", "-1"],
    ["--preset", "captcha", "--out", "X", "--samples-per-file", "0"],
    ["--preset", "captcha", "--out", "X", "--seed", "x1"],
    ["--preset", "captcha", "--out", "X", "--split", "a/b"],
    ["--preset", "captcha", "--out", "X", "--shape", "2"],
    ["--preset", "captcha", "--out", "X", "--bogus"],
    ["--preset", "captcha", "--out"],
    ["--generic", "--out", "X"],
    ["--generic", "--out", "X", "--shape", "3,x"],
    ["--generic", "--out", "X", "--shape", "3,,4"],
    ["--generic", "--out", "X", "--shape", "-3"],
    ["--generic", "--out", "X", "--shape", "2", "--dtype", "<f3"],
    ["--generic", "--out", "X", "--shape", "2", "--dtype", "|f4"],
    ["--generic", "--out", "X", "--shape", "2", "--dtype", "<O8"],
    ["--generic", "--out", "X", "--shape", "2", "--dtype", "<U4"],
    ["--generic", "--out", "X", "--shape", "2", "--channels", "4"],
    ["--generic", "--out", "X", "--shape", "2", "--prefix", ""],
    ["--generic", "--out", "X", "--shape", "100000,100000,100000,100000,100000"],
]


@pytest.mark.parametrize("args", BAD_ARGS, ids=lambda a: " ".join(a) or "none")
def test_bad_arguments_exit_2(gen_exe, tmp_path, args):
    args = [str(tmp_path / "out") if a == "X" else a for a in args]
    r = run(gen_exe, *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip(), "a message is expected on stderr"
    assert not (tmp_path / "out").exists() or not any(
        (tmp_path / "out").rglob("*.npy"))


BAD_NUMBERS = [
    ("--files", "99999999999999999999", "out of range", "1 .. 100000000"),
    ("--files", "100000001", "out of range", "1 .. 100000000"),
    ("--files", "0", "out of range", "1 .. 100000000"),
    ("--files", " 5", "not an integer", "1 .. 100000000"),
    ("--files", "5 ", "not an integer", "1 .. 100000000"),
    ("--files", "1e3", "not an integer", "1 .. 100000000"),
    ("--samples-per-file", "99999999999999999999", "out of range", "0 .. 2147483647"),
    ("--samples-per-file", "-1", "out of range", "0 .. 2147483647"),
    ("--first-id", "2147483648", "out of range", "0 .. 2147483647"),
    ("--seed", "18446744073709551616", "out of range", "0 .. 18446744073709551615"),
    ("--seed", "-9223372036854775809", "out of range",
     "-9223372036854775808 .. -1"),
    ("--seed", "0x10", "not an integer", "0 .. 18446744073709551615"),
    ("--channels", "99999999999999999999", "out of range", "2 .. 4"),
    ("--channels", "1", "out of range", "2 .. 4"),
]


@pytest.mark.parametrize("opt,value,why,rng", BAD_NUMBERS,
                         ids=[f"{o}={v}" for o, v, _, _ in BAD_NUMBERS])
def test_numbers_out_of_range_are_named(gen_exe, tmp_path, opt, value, why, rng):
    r = run(gen_exe, "--preset", "captcha", "--out", tmp_path / "out",
            "--samples-per-file", 1, opt, value)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.splitlines()[0] == f"npyload-gen: {opt} {value}: {why} ({rng})"
    assert not (tmp_path / "out").exists()


def test_shape_dimension_out_of_range_is_named(gen_exe, tmp_path):
    r = run(gen_exe, "--generic", "--out", tmp_path / "out", "--shape",
            "3,99999999999999999999")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert ("npyload-gen: --shape dimension 99999999999999999999: out of range "
            "(0 .. 9223372036854775807)") in r.stderr
    assert "'3,99999999999999999999'" in r.stderr


def test_negative_seed_is_taken_modulo_2_64(gen_exe, tmp_path):
    args = ["--generic", "--files", 1, "--samples-per-file", 2, "--shape", "3"]
    for name, seed in (("neg", "-1"), ("pos", "18446744073709551615")):
        r = run(gen_exe, *args, "--out", tmp_path / name, "--seed", seed)
        assert r.returncode == 0, r.stderr
    assert digests(tmp_path / "neg") == digests(tmp_path / "pos")


def test_help_and_version(gen_exe):
    r = run(gen_exe, "--help")
    assert r.returncode == 0
    assert "--preset captcha" in r.stdout and "--generic" in r.stdout
    r = run(gen_exe, "--version")
    assert r.returncode == 0
    assert re.fullmatch(r"npyload-gen \d+\.\d+\.\d+\n", r.stdout)


def test_option_equals_form(gen_exe, tmp_path):
    r = run(gen_exe, "--generic", f"--out={tmp_path}", "--shape=2,2",
            "--files=1", "--samples-per-file=2", "--dtype=>i2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    a = np.load(tmp_path / "data_0000.npy")
    assert a.shape == (2, 2, 2) and a.dtype.str == ">i2"


def test_no_temporary_files_left(captcha2):
    out, _ = captcha2
    assert not [p for p in Path(out).rglob("*.tmp")]


# ---- free space and interruption -------------------------------------------

def run_on_small_fs(gen_exe, out, *args):
    """Runs npyload-gen with --out on a fresh 1 MiB tmpfs mounted at `out`, in
    a private mount namespace (unshare -rm: nothing is left mounted, even if
    the test dies). Prints what is left in `out` after the run on stdout, after
    a '--- left:' line. Skips visibly where tmpfs cannot be mounted."""
    import shutil
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) is not installed: cannot mount a small tmpfs")
    script = ('mount -t tmpfs -o size=1m npyload-test "$1" || exit 77; shift; '
              '"$@"; rc=$?; echo "--- left:"; ls -A "$0"; exit $rc')
    out.mkdir()
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(out), str(out),
                        gen_exe, *map(str, args)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 77 or "unshare:" in r.stderr:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {r.stderr.strip()}")
    return r


def test_refuses_when_space_is_short(gen_exe, tmp_path):
    out = tmp_path / "small"
    # 300 files of 64 x 16 float32 (4 KiB of data + a 128-byte header, so two
    # 4 KiB blocks each on tmpfs): about 2.3 MiB, more than the 1 MiB there.
    r = run_on_small_fs(gen_exe, out, "--generic", "--out", out, "--shape", "16",
                        "--files", 300, "--samples-per-file", 64)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    m = re.search(r"need ([\d.]+) MiB in (.+), ([\d.]+) MiB free", r.stderr)
    assert m, r.stderr
    assert m[2] == str(out)
    need, free = float(m[1]), float(m[3])
    assert need == pytest.approx(300 * 8192 / 2**20, abs=0.05)
    assert 0 < free <= 1.0 and free < need
    assert r.stdout.split("--- left:")[1].split() == []  # nothing was written


def test_small_dataset_fits_small_fs(gen_exe, tmp_path):
    """The same check lets a dataset that fits through (3 files x 8 KiB)."""
    out = tmp_path / "small"
    r = run_on_small_fs(gen_exe, out, "--generic", "--out", out, "--shape", "16",
                        "--files", 3, "--samples-per-file", 64)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    left = r.stdout.split("--- left:")[1].split()
    assert left == ["data_0000.npy", "data_0001.npy", "data_0002.npy"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupt_removes_temporary_file(gen_exe, tmp_path, sig):
    """A signal in the middle of a large dataset: the temporary files are
    removed, every file under a final name is complete, and the process ends
    by that signal (the shell sees 128 + signal)."""
    import signal
    import time
    signum = getattr(signal, sig)
    out = tmp_path / "big"
    # 40 ids x 16 samples: about 760 MiB if it ran to the end; it is
    # interrupted while the second id is being written.
    p = subprocess.Popen([gen_exe, "--preset", "captcha", "--out", str(out),
                          "--files", "40", "--samples-per-file", "16"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = out / "images/train/train_0001.npy.tmp"
    deadline = time.monotonic() + 60  # a bound on the wait, not a timing check
    while not second.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert p.poll() is None, ("finished before it could be interrupted", p.communicate())
    assert second.exists(), "the second file was never started"
    p.send_signal(signum)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode in (-signum, 128 + signum), (p.returncode, stdout, stderr)
    files = tree(out)
    assert not [f for f in files if f.endswith(".tmp")], files
    assert files, "the first id was complete and must stay"
    want_shape = {"images": (16, 2, 256, 512)}
    for f in files:
        a = np.load(out / f)  # a half-written file would not load
        if f.startswith("images/"):
            assert a.shape == want_shape["images"], f
        elif f.endswith("_heatmaps.npy"):
            assert a.shape == (16, 2, 64, 128), f
        else:
            assert a.shape == (16, 4, 64, 128), f
    assert "labels/train/train_0039_offsets.npy" not in files
