"""The gather path (issue 13): rows from 64 B to 4 MiB, several files per
field, shuffled and not, two ranks, every io backend — each batch byte-exact
against numpy's reading of the same files, and the stats saying which path
served them (small rows of cached files: copied from a mapping; large rows:
read)."""
import os

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

GATHER_MAX = 32 * 1024  # NPYL_GATHER_MAX_DEFAULT in lib/io/npyload_io.h
BACKENDS = ["io_uring", "pread", "mmap"]
# row bytes -> samples (the dataset stays a few tens of MiB at most)
SIZES = {64: 3001, 1024: 1201, 3072: 901, 32 * 1024: 203, 64 * 1024: 131,
         1 << 20: 23, 4 << 20: 9}


def write_field(root, name, arr, splits):
    d = os.path.join(str(root), name)
    os.makedirs(d, exist_ok=True)
    start = 0
    for k, n in enumerate(splits):
        np.save(os.path.join(d, f"{name}_{k:04d}.npy"), arr[start:start + n])
        start += n
    return os.path.join(d, f"{name}_*.npy")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    out = {}
    rng = np.random.default_rng(13)
    for row, n in SIZES.items():
        root = tmp_path_factory.mktemp(f"rows{row}")
        x = rng.integers(0, 256, size=(n, row), dtype=np.uint8)
        y = np.arange(n, dtype=np.int64) * 3 - 7
        # uneven files, differently split per field
        xs = [n // 3, n // 3 + 1, n - 2 * (n // 3) - 1]
        ys = [n // 2, n - n // 2]
        out[row] = ({"x": write_field(root, "x", x, xs), "y": write_field(root, "y", y, ys)},
                    {"x": x, "y": y})
    return out


def loader_or_skip(globs, io, **kw):
    try:
        return npyload.Loader(globs, io=io, output="numpy", **kw)
    except npyload.NpyloadError as e:
        if io == "io_uring" and "io_uring" in str(e):
            pytest.skip(f"io_uring refused here: {e}")
        raise


def run_epochs(loader, ref, epochs=2):
    seen = []
    for e in range(epochs):
        loader.set_epoch(e)
        idx_all = []
        for b in loader:
            idx = np.asarray(b.indices)
            for name in ref:
                np.testing.assert_array_equal(np.asarray(b[name]), ref[name][idx],
                                              err_msg=f"field {name}, epoch {e}")
            idx_all.append(idx)
        seen.append(np.concatenate(idx_all) if idx_all else np.zeros(0, np.int64))
    return seen


@pytest.mark.parametrize("io", BACKENDS)
@pytest.mark.parametrize("row", list(SIZES))
def test_rows_byte_exact_two_ranks(datasets, row, io):
    globs, ref = datasets[row]
    n = len(ref["y"])
    bs = 256 if row <= 3072 else 4
    per_rank = []
    stats = []
    for rank in range(2):
        L = loader_or_skip(globs, io, batch_size=bs, shuffle=True, seed=5, rank=rank,
                           world_size=2, num_workers=2)
        per_rank.append(run_epochs(L, ref))
        stats.append(L.stats())
        L.close()
    for e in range(2):
        union = np.union1d(per_rank[0][e], per_rank[1][e])
        np.testing.assert_array_equal(union, np.arange(n))
    for st in stats:
        total = st["gather_requests"] + st["read_requests"]
        assert total > 0
        if io == "mmap":
            assert st["read_requests"] == 0 and st["gather_bytes"] == st["bytes_read"]
        elif row > GATHER_MAX:
            # large rows stay on the configured backend (the labels, 8 B
            # each, may still be gathered)
            assert st["read_requests"] > 0
            assert st["gather_bytes"] < st["bytes_read"]


@pytest.mark.parametrize("shuffle", [False, True, "local"])
@pytest.mark.parametrize("io", BACKENDS)
def test_small_rows_every_order(datasets, io, shuffle):
    globs, ref = datasets[3072]
    L = loader_or_skip(globs, io, batch_size=64, shuffle=shuffle, seed=1, num_workers=3,
                       drop_last=False)
    seen = run_epochs(L, ref)
    for s in seen:
        np.testing.assert_array_equal(np.sort(s), np.arange(len(ref["y"])))
    st = L.stats()
    assert st["gather_requests"] + st["read_requests"] > 0
    L.close()


def test_small_rows_of_cached_files_are_gathered(datasets):
    """pread backend, 3 KiB rows just written (cached): the stats show the
    gather path, not a read per row."""
    globs, ref = datasets[3072]
    L = loader_or_skip(globs, "pread", batch_size=256, shuffle=True, num_workers=2)
    run_epochs(L, ref, epochs=1)
    st = L.stats()
    L.close()
    if st["gather_requests"] == 0:
        pytest.skip("the residency check found the freshly written files uncached "
                    "(memory pressure): nothing to check")
    assert st["gather_bytes"] > st["bytes_read"] // 2, st


@pytest.mark.parametrize("dtype", ["<f4", ">i4", "|b1", "<c8", ">f8", "<u2"])
def test_numpy_views_every_dtype(tmp_path, dtype):
    """numpy views a field through __array_struct__ (plain dtypes, byte
    order included) or __array_interface__ (the rest): same values and
    dtype as np.load, and the array keeps its batch alive."""
    rng = np.random.default_rng(3)
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=40 * 6 * dt.itemsize, dtype=np.uint8)
    if dtype == "|b1":
        raw &= 1
    x = np.frombuffer(raw.tobytes(), dtype=dt).reshape(40, 6).copy()
    np.save(tmp_path / "a_0000.npy", x[:17])
    np.save(tmp_path / "a_0001.npy", x[17:])
    L = npyload.Loader({"a": str(tmp_path / "a_*.npy")}, batch_size=8, shuffle=True,
                       output="numpy", num_workers=2, prefetch=8)
    kept = []
    for b in L:
        a = b["a"]
        assert a.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(a, x[np.asarray(b.indices)])
        kept.append((a, np.asarray(b.indices).copy()))
    del b
    for a, idx in kept:  # the slots are still held by the arrays
        np.testing.assert_array_equal(a, x[idx])
    L.close()


@pytest.mark.parametrize("read_ahead", [True, False])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("io", BACKENDS)
def test_fields_split_alike_share_the_plan(tmp_path, io, shuffle, read_ahead):
    """Fields whose files split the samples alike are planned once per
    batch (their runs are shared): a and b split alike, c differently, d
    like a again (after c: the runs are planned again), e like a but
    .npy.zst; f, g, h: files of one count but the last (a sample's file
    found by a division), the last as large, smaller, larger. Every batch
    byte-exact against numpy, in order and shuffled (runs of consecutive
    samples across file boundaries)."""
    rng = np.random.default_rng(37)
    n = 1000
    ref = {"a": rng.integers(0, 256, size=(n, 3, 4, 4), dtype=np.uint8),
           "b": np.arange(n, dtype=np.int64) * 5 + 1,
           "c": rng.standard_normal((n, 7)).astype(np.float32),
           "d": rng.integers(-30000, 30000, size=(n, 2), dtype=np.int16),
           "e": rng.integers(0, 256, size=(n, 5), dtype=np.uint8),
           "f": np.arange(n, dtype=np.int32) * 7,
           "g": np.arange(n, dtype=np.uint16) + 3,
           "h": -np.arange(n, dtype=np.int64)}
    splits = {"c": [500, 500], "f": [250] * 4, "g": [300, 300, 300, 100],
              "h": [200, 200, 600]}
    globs = {k: write_field(tmp_path, k, v, splits.get(k, [333, 1, 400, 266]))
             for k, v in ref.items()}
    npyload.pack(sorted(str(p) for p in (tmp_path / "e").glob("e_*.npy")), frame_size=64)
    globs["e"] = str(tmp_path / "e" / "e_*.npy.zst")
    L = loader_or_skip(globs, io, batch_size=64, shuffle=shuffle, seed=2, num_workers=2,
                       drop_last=False, read_ahead=read_ahead)
    seen = run_epochs(L, ref)
    L.close()
    for s in seen:
        np.testing.assert_array_equal(np.sort(s), np.arange(n))


def mappings_of(paths):
    """How many areas of /proc/self/maps map each of `paths` (real paths)."""
    real = {os.path.realpath(p): p for p in paths}
    n = dict.fromkeys(paths, 0)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() in real:
                n[real[parts[5].strip()]] += 1
    return n


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc/self/maps here")
@pytest.mark.parametrize("read_ahead", [False, True])
@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_workers_share_one_mapping_per_file(datasets, io, read_ahead):
    """Issue 37 item 5: the workers (and their read-ahead contexts) of one
    loader copy small rows from one mapping per file, not one each (each
    mapping faults every cached page in again: most of the small-rows
    benchmark's kernel time); the bytes stay numpy's. The mappings go with
    the loader."""
    import glob
    globs, ref = datasets[3072]
    files = sorted(glob.glob(globs["x"])) + sorted(glob.glob(globs["y"]))
    L = loader_or_skip(globs, io, batch_size=64, shuffle=True, seed=3, num_workers=3,
                       read_ahead=read_ahead)
    run_epochs(L, ref, epochs=2)
    st = L.stats()
    n = mappings_of(files)
    L.close()
    if io == "pread" and st["gather_requests"] == 0:
        pytest.skip("the residency check found the freshly written files uncached "
                    "(memory pressure): nothing mapped")
    assert all(v <= 1 for v in n.values()), n
    if io == "mmap":
        assert all(v == 1 for v in n.values()), n
    assert all(v == 0 for v in mappings_of(files).values()), "mappings outlived the loader"
