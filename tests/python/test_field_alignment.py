"""Fields whose files pair up by name are checked at start (issue: silently
misaligned fields). Independent truth: the file names themselves."""
import os

import numpy as np
import pytest

import npyload


@pytest.fixture
def captcha_like(tmp_path):
    img, hm = tmp_path / "images", tmp_path / "labels"
    img.mkdir()
    hm.mkdir()
    for i in range(3):
        np.save(img / f"train_{i:04d}.npy", np.full((4, 2), i, np.float32))
        np.save(hm / f"train_{i:04d}_heatmaps.npy", np.full((4, 3), i, np.float32))
    return img, hm


def paths(d, pattern):
    return sorted(str(p) for p in d.glob(pattern))


def test_aligned_names_pass_and_values_pair(captcha_like):
    img, hm = captcha_like
    L = npyload.Loader({"images": str(img / "train_*.npy"),
                        "heatmaps": str(hm / "train_*_heatmaps.npy")},
                       batch_size=4, output="numpy", num_workers=1)
    for b in L:
        assert (b["images"][:, 0] == b["heatmaps"][:, 0]).all()


def test_misaligned_lists_are_refused_naming_both(captcha_like):
    img, hm = captcha_like
    a = paths(img, "train_*.npy")
    b = paths(hm, "*_heatmaps.npy")
    b = [b[1], b[0], b[2]]           # same sizes, wrong pairing: bytes would load fine
    with pytest.raises(npyload.NpyloadError) as e:
        npyload.Loader({"images": a, "heatmaps": b}, batch_size=4, num_workers=1)
    msg = str(e.value)
    assert os.path.basename(a[0]) in msg and os.path.basename(b[0]) in msg
    assert "misaligned" in msg
    # the check can be turned off
    L = npyload.Loader({"images": a, "heatmaps": b}, batch_size=4, num_workers=1,
                       align="none", output="numpy")
    assert len(L) == 3
    with pytest.raises(ValueError, match="align"):
        npyload.Loader({"images": a}, batch_size=4, align="bogus")


def test_different_file_counts_or_no_digits_are_not_paired(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "a" / "x_0005.npy", np.zeros((6, 1), np.int8))
    np.save(tmp_path / "b" / "y_0000.npy", np.zeros((3, 1), np.int8))
    np.save(tmp_path / "b" / "y_0001.npy", np.zeros((3, 1), np.int8))
    L = npyload.Loader({"a": str(tmp_path / "a" / "*.npy"), "b": str(tmp_path / "b" / "*.npy")},
                       batch_size=2, num_workers=1)
    assert len(L) == 3
    np.save(tmp_path / "a" / "alpha.npy", np.zeros((3, 1), np.int8))
    np.save(tmp_path / "b" / "beta.npy", np.zeros((3, 1), np.int8))
    L = npyload.Loader({"a": [str(tmp_path / "a" / "alpha.npy")],
                        "b": [str(tmp_path / "b" / "beta.npy")]}, batch_size=2, num_workers=1)
    assert len(L) == 2
