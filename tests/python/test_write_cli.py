"""npyload-write: a folder of PNGs (flat, and in class subfolders) against
Pillow's own decoding, uint8 and float32, the console script as installed,
and its errors."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (pip install pillow)")


def cli(*args):
    exe = Path(sys.executable).parent / "npyload-write"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "npyload._write_cli"]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                          timeout=120)


def pngs(root, n, classes=None, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        d = root / classes[i % len(classes)] if classes else root
        d.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(6, 20)), int(rng.integers(6, 20))  # resized by the CLI
        p = d / f"img_{i:03d}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return sorted(paths)


def pillow(p, size, mode="RGB"):
    with Image.open(p) as im:
        a = np.asarray(im.convert(mode).resize((size[1], size[0]), Image.BILINEAR))
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def test_flat_folder_uint8_and_the_installed_script(tmp_path):
    exe = Path(sys.executable).parent / "npyload-write"
    assert exe.exists(), "pip install puts the npyload-write console script beside python"
    paths = pngs(tmp_path / "imgs", 7)
    p = cli("--images", tmp_path / "imgs", "--size", "8,12", "--out", tmp_path / "out",
            "--samples-per-file", "3")
    assert p.returncode == 0, p.stderr
    assert "images: 3 files" in p.stdout
    files = sorted((tmp_path / "out" / "images").glob("*.npy"))
    got = np.concatenate([np.load(f) for f in files])
    assert got.dtype == np.uint8 and got.shape == (7, 3, 8, 12)
    for i, path in enumerate(paths):
        np.testing.assert_array_equal(got[i], pillow(path, (8, 12)))


def test_class_folders_float32_gray_packed(tmp_path):
    paths = pngs(tmp_path / "imgs", 9, classes=["cat", "dog", "emu"], seed=1)
    p = cli("--images", tmp_path / "imgs", "--size", "5,7", "--dtype", "float32", "--mode", "L",
            "--out", tmp_path / "out", "--samples-per-file", "4", "--narrow", "--quiet")
    assert p.returncode == 0, p.stderr
    L = npyload.Loader({"images": str(tmp_path / "out/images/*.npy.zst"),
                        "labels": str(tmp_path / "out/labels/*.npy.zst")},
                       batch_size=9, output="numpy", num_workers=1)
    (b,) = list(L)
    for r, i in enumerate(b.indices):
        want = pillow(paths[int(i)], (5, 7), "L").astype(np.float32) / np.float32(255)
        assert b["images"][r].tobytes() == want.tobytes()
        assert b["labels"][r] == ["cat", "dog", "emu"].index(paths[int(i)].parent.name)
    L.close()


def test_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    p = cli("--images", tmp_path / "empty", "--size", "4,4", "--out", tmp_path / "o")
    assert p.returncode == 1 and "no images" in p.stderr
    p = cli("--images", tmp_path / "empty", "--out", tmp_path / "o")
    assert p.returncode == 2 and "--size" in p.stderr
    p = cli("--images", tmp_path / "empty", "--size", "4x4", "--out", tmp_path / "o")
    assert p.returncode == 2 and "H,W" in p.stderr


def test_source_module_function(tmp_path):
    (tmp_path / "mysrc.py").write_text(
        "import numpy as np\n"
        "def make():\n"
        "    return {'x': np.arange(10, dtype=np.int16).reshape(5, 2)}\n")
    exe = Path(sys.executable).parent / "npyload-write"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "npyload._write_cli"]
    p = subprocess.run(cmd + ["--source", "mysrc:make", "--out", str(tmp_path / "o"),
                              "--samples-per-file", "2", "--quiet"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    got = np.concatenate([np.load(f) for f in sorted((tmp_path / "o/x").glob("*.npy"))])
    np.testing.assert_array_equal(got, np.arange(10, dtype=np.int16).reshape(5, 2))


# ---- Ctrl-C and resume (issue 40 item 7) -------------------------------------

SLOW_SOURCE = """\
import time
import numpy as np

class Slow:
    def __init__(self, a):
        self.a = a
    def __len__(self):
        return len(self.a)
    def __getitem__(self, i):
        time.sleep(0.02)
        return {"x": self.a[i], "y": np.int64(i)}

def make():
    return Slow(np.load("src.npy"))
"""
N, SPF = 600, 10


def journal_finished(out):
    """File numbers that the writer's journal lists as finished for both
    fields (read here, independently of the writer)."""
    import json
    seen = {}
    for line in (out / ".npyload-write.journal").read_text().splitlines():
        d = json.loads(line)
        if d["op"] == "file":
            seen.setdefault(d["fid"], set()).add(d["field"])
    return sorted(f for f, ks in seen.items() if ks == {"x", "y"})


def interrupted_write(tmp_path, *extra):
    """A real npyload-write of a slow --source, sent SIGINT (what Ctrl-C
    sends) once its journal lists 3 finished files. Returns (returncode,
    stderr, source array)."""
    import signal
    import time
    src = np.random.default_rng(3).standard_normal((N, 5, 7)).astype("<f4")
    np.save(tmp_path / "src.npy", src)
    (tmp_path / "slowsrc.py").write_text(SLOW_SOURCE)
    exe = Path(sys.executable).parent / "npyload-write"
    assert exe.exists(), "pip install puts npyload-write beside python"
    p = subprocess.Popen([str(exe), "--source", "slowsrc:make", "--out", "out",
                          "--samples-per-file", str(SPF), "--workers", "2", *extra],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    journal = tmp_path / "out" / ".npyload-write.journal"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if journal.exists() and len(journal_finished(tmp_path / "out")) >= 3:
            break
        assert p.poll() is None, p.communicate()
        time.sleep(0.01)
    assert p.poll() is None, "the write ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    return p.returncode, err, src


def npy_bytes(a):
    import io
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_ctrl_c_says_in_one_line_how_to_resume_and_the_command_resumes(tmp_path, extra):
    # --overwrite: the interrupted run had begun writing (the previous write
    # was gone), so the resume must not overwrite again.
    rc, err, src = interrupted_write(tmp_path, *extra)
    assert rc == 130, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    finished = journal_finished(tmp_path / "out")
    assert f"{len(finished)} of {N // SPF} files are finished" in err, err
    cmd = err.split("to resume: ", 1)[1].strip()
    assert "--overwrite" not in cmd and str(tmp_path / "out") in cmd
    stamps = {f: (tmp_path / "out/x" / f"train_{f:04d}.npy").stat() for f in finished}

    # The printed command, run from elsewhere, resumes the same write.
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd="/",
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lo, hi = finished[0], finished[-1]
    runs = f"{lo}-{hi}" if finished == list(range(lo, hi + 1)) else None
    if runs:   # the journal's finished files, as the resumed run names them
        assert f"files {runs} of x, y ({len(finished)} per field)" in r.stderr, r.stderr
    assert "kept the interrupted write's" in r.stderr, r.stderr
    for f, st in stamps.items():   # kept, not written again
        now = (tmp_path / "out/x" / f"train_{f:04d}.npy").stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), f
    # Byte for byte what np.save gives for numpy's reading of the source.
    for f in range(N // SPF):
        rows = slice(f * SPF, (f + 1) * SPF)
        assert (tmp_path / "out/x" / f"train_{f:04d}.npy").read_bytes() == \
            npy_bytes(np.load(tmp_path / "src.npy")[rows]), f
        assert (tmp_path / "out/y" / f"train_{f:04d}.npy").read_bytes() == \
            npy_bytes(np.arange(N, dtype=np.int64)[rows]), f
    np.testing.assert_array_equal(
        np.concatenate([np.load(p) for p in sorted((tmp_path / "out/x").glob("*.npy"))]), src)


def test_a_resumed_write_rates_only_what_it_wrote(tmp_path, monkeypatch):
    import importlib
    import io
    import re
    interrupted_write(tmp_path)   # its line is checked above
    kept = len(journal_finished(tmp_path / "out")) * SPF

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "stderr", term)
    source = importlib.import_module("slowsrc").make()
    npyload.write(source, "out", samples_per_file=SPF, num_workers=2)
    monkeypatch.undo()
    lines = term.getvalue().replace("\r", "\n").splitlines()
    final = [ln for ln in lines if "wrote" in ln]
    assert len(final) == 1, term.getvalue()
    m = re.search(r"(\d+)/(\d+) samples \((\d+) kept\); wrote (\d+) in ([\d.]+) s, "
                  r"(\d+) samples/s", final[0])
    assert m, final[0]
    done, total, k, wrote, took, rate = (float(g) for g in m.groups())
    assert (done, total, k, wrote) == (N, N, kept, N - kept)
    # The rate is this run's writing: what it wrote over its time, kept
    # files' samples not counted (they would give N / took).
    assert abs(rate - wrote / took) <= 0.5 + wrote / took * 0.01, final[0]
