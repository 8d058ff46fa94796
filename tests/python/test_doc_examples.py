"""Every python block of README.md and of the documentation site (docs/**.md)
runs as written, and the README stays short.

Each ```python block runs in a fresh directory holding a small dataset in the
README's layout (data/images/train/train_NNNN.npy, the labels beside it,
data/x_NNNN.npy with 3 uint8 channels for the transform example, a.npy and
b.npy for pack), with the names the prose around the blocks assumes (epochs,
step, dataset, device, the torch imports). A block that cannot run here says
why on the line before it, which the test shows as its skip reason:

    <!-- doc-test: skip: REASON -->   never run here
    <!-- doc-test: cuda -->           runs where torch sees a CUDA device

A block that names torch needs it and skips without it (the README's test
command installs no torch; CI runs these again with the "ci" profile), the
others run with numpy alone. Independent truth for the README's migration
block: the batch shapes of the fixture and the number of steps an epoch of
192 samples gives with drop_last."""
import re
from pathlib import Path

import numpy as np
import pytest

import npyload

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
MARK = re.compile(r"<!-- doc-test: (skip: (?P<why>.+?)|(?P<cuda>cuda)) -->")


def doc_files():
    """README.md and the site's Markdown pages (not the generated parts)."""
    pages = sorted(p for p in (REPO / "docs").rglob("*.md")
                   if "_generated" not in p.parts and "_build" not in p.parts)
    return [REPO / "README.md"] + pages


def python_blocks(path):
    """[(code, mark, "file:line")] of the ```python blocks of a Markdown file."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            blocks.append(("\n".join(lines[i + 1:j]) + "\n", mark,
                           f"{path.relative_to(REPO)}:{i + 1}"))
            i = j
        i += 1
    return blocks


ALL_BLOCKS = [b for f in doc_files() for b in python_blocks(f)]


def doc_fixture(root):
    rng = np.random.default_rng(0)
    shapes = {"images": (2, 8, 16), "heatmaps": (2, 4, 8), "offsets": (4, 4, 8)}
    for name, shape in shapes.items():
        d = root / "data" / ("images" if name == "images" else "labels") / "train"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            suffix = "" if name == "images" else f"_{name}"
            np.save(d / f"train_{i:04d}{suffix}.npy",
                    rng.standard_normal((64,) + shape).astype(np.float32))
    for i in range(2):
        np.save(root / "data" / f"x_{i:04d}.npy",
                rng.integers(0, 256, (128, 3, 8, 8), dtype=np.uint8))
    for name in ("a", "b"):
        np.save(root / f"{name}.npy", rng.standard_normal((10, 4)).astype(np.float32))
    return {"images": rng.standard_normal((128, 2, 8, 16)).astype(np.float32),
            "heatmaps": rng.standard_normal((128, 2, 4, 8)).astype(np.float32)}


def test_readme_is_short():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move the detail into a "
        f"page of docs/ and link it")


def test_the_blocks_are_found():
    files = {b[2].split(":")[0] for b in ALL_BLOCKS}
    assert "README.md" in files, "README.md: no python block found"
    assert len(files) >= 6 and len(ALL_BLOCKS) >= 10, sorted(files)


def test_no_marker_of_another_spelling():
    """A misspelt marker would silently run (or fail) a block meant to skip."""
    for f in doc_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.match(r"<!--\s*(doc|readme)[-_ ]?test", line.strip()):
                assert MARK.fullmatch(line.strip()), f"{f.relative_to(REPO)}:{n}: {line!r}"


def _env(tmp_path, monkeypatch, needs_torch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    dataset = doc_fixture(tmp_path)
    monkeypatch.chdir(tmp_path)
    steps = []
    env = {"npyload": npyload, "np": np, "epochs": 2, "dataset": dataset, "device": "cpu",
           "step": lambda *a, **k: steps.append(1)}
    if needs_torch:
        torch = pytest.importorskip(
            "torch", reason="the block uses torch, which the 'test' profile does not "
                            "install (pip install torch==2.13.0: the 'ci' extra)")
        env["torch"] = torch
        env["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return env, steps


@pytest.mark.parametrize("code,mark,where", [pytest.param(*b, id=b[2]) for b in ALL_BLOCKS])
def test_doc_python_block_runs(code, mark, where, tmp_path, monkeypatch):
    if mark is not None and mark["why"]:
        pytest.skip(f"{where} says: {mark['why']}")
    needs_torch = re.search(r"\btorch\b", code) is not None or \
        (mark is not None and mark["cuda"])
    env, steps = _env(tmp_path, monkeypatch, needs_torch)
    if mark is not None and mark["cuda"] and not env["torch"].cuda.is_available():
        pytest.skip(f"{where} says: needs a CUDA device (device=\"cuda\"); torch sees none")
    if not needs_torch:
        env["npyload"] = npyload
    try:
        exec(compile(code, where, "exec"), env)
    except Exception as e:
        raise AssertionError(
            f"{where}: this block fails ({type(e).__name__}: {e}); fix the block, or mark "
            f"why it cannot run here on the line before it: "
            f"<!-- doc-test: skip: REASON --> (or <!-- doc-test: cuda -->)\n{code}") from e
    if "step(" in code:
        assert steps, f"{where}: the block's loop ran no step"


def _readme_block(marker):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    hits = [b for b in blocks if b.startswith(marker)]
    assert len(hits) == 1, f"README.md: one python block starting with {marker!r} expected"
    return hits[0]


def test_readme_migration_example_runs_as_written(tmp_path, monkeypatch):
    code = _readme_block("# After: npyload")
    assert 'torch.cuda.is_available()' in code, "the device= line works with and without a GPU"
    env, _ = _env(tmp_path, monkeypatch, needs_torch=True)
    torch = env["torch"]
    calls = []

    def step(images, heatmaps, offsets):        # the trainer's, as in "Before"
        assert images.shape == (128, 2, 8, 16) and heatmaps.shape == (128, 2, 4, 8)
        assert offsets.shape == (128, 4, 4, 8)
        assert images.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        calls.append(1)

    env = {"epochs": 2, "step": step}
    exec(compile(code, "README.md (After: npyload)", "exec"), env)
    assert len(calls) == 2, "one batch of 128 per epoch (192 samples, drop_last)"
