"""Shared fixtures for the Python tests of npyload (the loader tests).

The tests import the *installed* package (``pip install .`` first). Datasets
are tiny and built with numpy in a temporary directory: several files per
field, different splits per field, several dtypes and shapes.
"""
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def built_tool(name, subdir="tools"):
    """Path of a tool in $NPYLOAD_BUILD_DIR/tools (default <repo>/build), or
    of a test driver with subdir="tests". A missing binary fails the test:
    it is never a reason to skip."""
    build = Path(os.environ.get("NPYLOAD_BUILD_DIR", REPO / "build"))
    if not build.is_absolute() and not build.exists():
        build = REPO / build
    exe = build / subdir / name
    if not exe.is_file() or not os.access(exe, os.X_OK):
        pytest.fail(
            f"{exe} not found: build it first (ninja -C {build} {name}) or "
            f"point NPYLOAD_BUILD_DIR at the build directory",
            pytrace=False,
        )
    return str(exe.resolve())

# rows per file for each field: the fields are split differently on purpose
# (a field is the concatenation of its files; only the totals must agree).
N = 37
SPLITS = {
    "images": [7, 5, 9, 16],
    "labels": [10, 27],
    "mask": [37],
}


def _field_arrays(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "images": rng.standard_normal((n, 2, 8, 16)).astype(np.float32),
        "labels": (np.arange(n * 3, dtype=np.int64).reshape(n, 3) * 7 - 5),
        "mask": rng.integers(0, 256, size=(n, 5), dtype=np.uint8),
    }


def write_dataset(root, n=N, splits=None, seed=0):
    """Writes fields under root/<field>/<field>_NNNN.npy and returns
    (globs, full) where full[name] is numpy's reading of the concatenation."""
    splits = splits or SPLITS
    full = _field_arrays(n, seed)
    globs = {}
    for name, sizes in splits.items():
        assert sum(sizes) == n
        d = os.path.join(str(root), name)
        os.makedirs(d, exist_ok=True)
        start = 0
        for i, k in enumerate(sizes):
            np.save(os.path.join(d, f"{name}_{i:04d}.npy"), full[name][start:start + k])
            start += k
        globs[name] = os.path.join(d, f"{name}_*.npy")
    # numpy's own reading of the files, concatenated: the reference values
    import glob as _glob
    ref = {name: np.concatenate([np.load(p) for p in sorted(_glob.glob(g))])
           for name, g in globs.items()}
    for name in ref:
        assert np.array_equal(ref[name], full[name])
    return globs, ref


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return write_dataset(root)


@pytest.fixture(scope="session")
def many_batches(tmp_path_factory):
    """A dataset with many one-sample batches (for interrupt tests)."""
    root = tmp_path_factory.mktemp("many")
    return write_dataset(root, n=400, splits={"images": [200, 200], "labels": [400], "mask": [400]})


def to_numpy(x):
    """An owned numpy copy of a numpy array or a torch tensor."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy().copy()
    return np.array(x, copy=True)


def collect(loader):
    """[(indices, {field: owned copy})] for one pass over the loader."""
    out = []
    for b in loader:
        out.append((to_numpy(b.indices), {k: to_numpy(v) for k, v in b.items()}))
    return out


def check_values(batches, ref):
    for idx, data in batches:
        assert idx.dtype == np.int64
        for name, arr in data.items():
            assert arr.dtype == ref[name].dtype, name
            assert arr.shape == (len(idx),) + ref[name].shape[1:], name
            np.testing.assert_array_equal(arr, ref[name][idx], err_msg=name)


def file_digests(root):
    """sha256 of every file under root but the writer's journal and lock
    (they hold inodes and pids), by relative path."""
    import hashlib
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.startswith(".npyload-write."):
                continue
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def by_index(loader, like):
    """One pass over the loader, each row put back at its global index:
    {field: array shaped like like[field]} (then compare with the source)."""
    got = {k: np.zeros_like(v) for k, v in like.items()}
    for b in loader:
        for r, i in enumerate(b.indices):
            for k in like:
                got[k][int(i)] = to_numpy(b[k][r])
    loader.close()
    return got


def concat_indices(batches):
    if not batches:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([i for i, _ in batches])


def sampler_indices(n, world_size, rank, drop_last):
    """torch.utils.data.DistributedSampler(range(n), world_size, rank,
    shuffle=False, drop_last=drop_last), written out."""
    idx = list(range(n))
    num = n // world_size if drop_last else -(-n // world_size)
    total = num * world_size
    if not drop_last:
        pad = total - n
        if pad <= len(idx):
            idx += idx[:pad]
        else:
            idx += (idx * -(-pad // len(idx)))[:pad]
    else:
        idx = idx[:total]
    return idx[rank:total:world_size]
