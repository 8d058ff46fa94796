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
