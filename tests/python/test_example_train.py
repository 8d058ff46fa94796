"""examples/captcha_train.py on a tiny generated captcha-layout split, on the
CPU: a short run, a run stopped mid-epoch and resumed from its checkpoint
(the same batches, flips and losses as the uninterrupted run, step for
step), and two ranks under torchrun. Skipped visibly without torch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the example needs it")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "captcha_train.py"
N, PER_FILE = 48, 16


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("captcha")
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    rng = np.random.default_rng(3)
    for k in range(N // PER_FILE):
        imgs = rng.random((PER_FILE, 2, 32, 64), dtype=np.float32)
        hm = np.zeros((PER_FILE, 2, 8, 16), np.float32)
        off = np.zeros((PER_FILE, 4, 8, 16), np.float32)
        for i in range(PER_FILE):
            for c in range(2):
                v, u = rng.integers(0, 8), rng.integers(0, 16)
                hm[i, c, v, u] = 1.0
                off[i, 2 * c:2 * c + 2, v, u] = rng.random(2) - 0.5
        np.save(root / "images" / "train" / f"train_{k:04d}.npy", imgs)
        np.save(root / "labels" / "train" / f"train_{k:04d}_heatmaps.npy", hm)
        np.save(root / "labels" / "train" / f"train_{k:04d}_offsets.npy", off)
    return root


def run(args, cwd, torchrun=0):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable]
    if torchrun:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"]
    cmd += [str(EXAMPLE), *map(str, args)]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def steps(log):
    return [json.loads(line) for line in Path(log).read_text().splitlines()]


def test_exact_resume_mid_epoch(split, tmp_path):
    common = ["--data", split, "--epochs", 2, "--batch-size", 8, "--workers", 2]
    run([*common, "--steps-log", tmp_path / "a.jsonl", "--ckpt", tmp_path / "a.pt"], tmp_path)
    run([*common, "--steps-log", tmp_path / "b.jsonl", "--ckpt", tmp_path / "b.pt",
         "--stop-after", 4], tmp_path)
    assert len(steps(tmp_path / "b.jsonl")) == 4
    run([*common, "--steps-log", tmp_path / "b.jsonl", "--ckpt", tmp_path / "b.pt", "--resume"],
        tmp_path)
    a, b = steps(tmp_path / "a.jsonl"), steps(tmp_path / "b.jsonl")
    assert len(a) == 2 * N // 8
    assert [s["step"] for s in b] == [s["step"] for s in a]
    for sa, sb in zip(a, b):
        assert sa["indices"] == sb["indices"], sa["step"]
        assert sa["hflip"] == sb["hflip"], sa["step"]
        # Same weights, batches and flips: the same loss (CPU, one thread).
        assert sb["loss"] == pytest.approx(sa["loss"], rel=1e-5), sa["step"]
    flips = [f for s in a for f in s["hflip"]]
    assert 0 < sum(flips) < len(flips)  # p = 0.5: both outcomes occur
    per_epoch = [sorted(i for s in a if s["epoch"] == e for i in s["indices"]) for e in (0, 1)]
    assert per_epoch[0] == per_epoch[1] == list(range(N))


def test_two_ranks_under_torchrun(split, tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    out = run(["--data", split, "--epochs", 1, "--batch-size", 8, "--workers", 1,
               "--steps-log", tmp_path / "r.jsonl"], tmp_path, torchrun=2)
    log = steps(tmp_path / "r.jsonl")
    assert len(log) == N // (2 * 8)  # rank 0's share of the epoch
    assert "epoch 0:" in out
