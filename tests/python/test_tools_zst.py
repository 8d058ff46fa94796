"""The tools around .npy.zst: npyload-gen's compressibility (issue 14 item
7), npyload-inspect on .npy.zst (item 4) and npyload-bench's decode ceiling
and packing estimate (item 5).

Ratios are sizes, not timings: npyload-gen is seeded, so the band checks
below are deterministic. Tools are looked up in $NPYLOAD_BUILD_DIR/tools
(default <repo>/build); a missing binary is a failure, not a skip; tests
that need the `zstd` CLI skip visibly without it.
"""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import built_tool as _tool


def run(exe, *args, **kw):
    return subprocess.run([exe, *map(str, args)], capture_output=True,
                          text=True, timeout=300, **kw)


def need_zstd():
    if shutil.which("zstd") is None:
        pytest.skip("the zstd command-line tool is not installed "
                    "(apt-get install zstd)")


def zstd3_bytes(path):
    return len(subprocess.run(["zstd", "-3", "-q", "-c", str(path)], check=True,
                              capture_output=True, timeout=120).stdout)


@pytest.fixture(scope="module")
def captcha(tmp_path_factory):
    """Two captcha files of 16 samples each (seed 0), packed with the
    defaults (level 3, default frame size)."""
    out = tmp_path_factory.mktemp("captcha_zst")
    r = run(_tool("npyload-gen"), "--preset", "captcha", "--out", out,
            "--files", 2, "--samples-per-file", 16, "--seed", 0)
    assert r.returncode == 0, r.stderr
    npys = sorted(str(p) for p in out.rglob("*.npy"))
    assert len(npys) == 6
    r = run(_tool("npyload-pack"), *npys)
    assert r.returncode == 0, r.stderr
    return out, npys


def sizes(npys, suffix=""):
    return sum(os.path.getsize(p + suffix) for p in npys)


def test_gen_captcha_compresses_like_natural_photos(captcha):
    # Natural 8-bit gray photos as float32 + the all-ones mask: about 8x at
    # zstd -3 in per-sample frames (the gray plane about 4x); heatmaps and
    # offsets hundreds of times. The preset as a whole must land in 7-10x,
    # never the 16x that 16-level textures gave.
    out, npys = captcha
    total = sizes(npys) / sizes(npys, ".zst")
    assert 7.0 <= total <= 10.0, total
    images = [p for p in npys if "/images/" in p]
    img = sizes(images) / sizes(images, ".zst")
    assert 6.0 <= img <= 9.0, img
    # the gray plane alone, one sample per frame as npyload-pack does
    a = np.load(images[0])
    gray = [a[i, 0].tobytes() for i in range(4)]
    need_zstd()
    packed = sum(len(subprocess.run(["zstd", "-3", "-q", "-c"], input=g,
                                    capture_output=True, check=True).stdout)
                 for g in gray)
    plane = sum(len(g) for g in gray) / packed
    assert 3.0 <= plane <= 5.0, plane


def test_gen_captcha_ratio_with_stock_zstd(captcha):
    # the same band with the stock CLI on the whole files (one frame each)
    need_zstd()
    out, npys = captcha
    total = sizes(npys) / sum(zstd3_bytes(p) for p in npys)
    assert 7.0 <= total <= 10.0, total
