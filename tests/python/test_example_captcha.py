"""examples/captcha_preprocess.py on a few generated images: the reference
layout, images against Pillow's decoding, heatmaps and offsets against an
independent computation of the documented rule, readable by the loader."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (pip install pillow)")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "captcha_preprocess.py"


def expected_labels(points):
    """The rule in the example's docstring, written independently."""
    hm = np.zeros((2, 64, 128), np.float32)
    off = np.zeros((4, 64, 128), np.float32)
    for c, (x, y) in enumerate(points):
        u, v = int(x // 4), int(y // 4)
        for yy in range(64):
            for xx in range(128):
                if abs(yy - v) <= 4 and abs(xx - u) <= 4:
                    hm[c, yy, xx] = np.float32(np.exp(-((yy - v) ** 2 + (xx - u) ** 2) / 4.5))
        off[2 * c, v, u] = x / 4 - u - 0.5
        off[2 * c + 1, v, u] = y / 4 - v - 0.5
    return hm, off


@pytest.mark.parametrize("pack", [False, True])
def test_captcha_preprocess(tmp_path, pack):
    rng = np.random.default_rng(4)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    pos = {}
    for i in range(5):
        a = rng.integers(0, 256, (128, 256), dtype=np.uint8)  # half size: scale 2
        Image.fromarray(a).save(imgs / f"c{i}.png")
        pos[f"c{i}.png"] = {"gap": [float(rng.uniform(20, 230)), float(rng.uniform(10, 110))],
                            "slider": [float(rng.uniform(5, 60)), float(rng.uniform(10, 110))]}
    (tmp_path / "pos.json").write_text(json.dumps(pos))
    args = [sys.executable, str(EXAMPLE), "--images", str(imgs), "--positions",
            str(tmp_path / "pos.json"), "--out", str(tmp_path / "data"),
            "--samples-per-file", "2"] + (["--pack"] if pack else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ext = ".npy.zst" if pack else ".npy"
    fields = {"images": str(tmp_path / f"data/images/train/train_*{ext}"),
              "heatmaps": str(tmp_path / f"data/labels/train/train_*_heatmaps{ext}"),
              "offsets": str(tmp_path / f"data/labels/train/train_*_offsets{ext}")}
    L = npyload.Loader(fields, batch_size=5, output="numpy", num_workers=1)
    (b,) = list(L)
    names = sorted(pos)
    for r, i in enumerate(b.indices):
        name = names[int(i)]
        with Image.open(imgs / name) as im:
            g = np.asarray(im.convert("L").resize((512, 256), Image.BILINEAR))
        np.testing.assert_array_equal(b["images"][r][0], g.astype(np.float32) / np.float32(255))
        assert (b["images"][r][1] == 1).all()
        pts = [(pos[name]["gap"][0] * 2, pos[name]["gap"][1] * 2),
               (pos[name]["slider"][0] * 2, pos[name]["slider"][1] * 2)]
        hm, off = expected_labels(pts)
        np.testing.assert_allclose(b["heatmaps"][r], hm, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b["offsets"][r], off, rtol=1e-6, atol=1e-7)
    L.close()
