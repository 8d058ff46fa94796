"""on_error='skip': a file truncated mid-epoch drops the affected samples
from their batches on every backend; every delivered row still equals
numpy's reading (the values are the sample indices), the epoch ends, and the
counts add up. Default 'raise' still raises; max_errors raises after the
limit. Independent truth: the files' own contents written with numpy."""
import os

import numpy as np
import pytest

import npyload

N, PER, BS = 60, 20, 8
BACKENDS = ["pread", "mmap", "io_uring"]


def write(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    x = np.arange(N, dtype=np.float32).repeat(64).reshape(N, 64)
    y = np.arange(N, dtype=np.int64).reshape(N, 1)
    for i in range(N // PER):
        np.save(d / f"x_{i:04d}.npy", x[i * PER:(i + 1) * PER])
        np.save(d / f"y_{i:04d}.npy", y[i * PER:(i + 1) * PER])
    return {"x": str(d / "x_*.npy"), "y": str(d / "y_*.npy")}, d


def truncate(path, rows_kept, row_bytes):
    off = npyload.inspect(str(path))["data_offset"]
    os.truncate(path, off + rows_kept * row_bytes)


def make(fields, io, **kw):
    try:
        return npyload.Loader(fields, batch_size=BS, shuffle=True, seed=3, num_workers=1,
                              prefetch=1, io=io, output="numpy", **kw)
    except npyload.NpyloadError as e:
        if io == "io_uring":
            pytest.skip(f"io_uring refused here: {e}")
        raise


@pytest.mark.parametrize("io", BACKENDS)
def test_truncated_file_skips_its_samples_and_the_epoch_ends(tmp_path, io):
    fields, d = write(tmp_path)
    L = make(fields, io, on_error="skip")
    it = iter(L)  # the loader starts at its first iter(): then the file shrinks
    truncate(d / "x_0001.npy", 5, 64 * 4)
    delivered, nb = [], 0
    for b in it:
        nb += 1
        idx = np.asarray(b.indices)
        assert b["x"].shape == (len(idx), 64) and b["y"].shape == (len(idx), 1)
        np.testing.assert_array_equal(b["x"][:, 0], idx.astype(np.float32))
        np.testing.assert_array_equal(b["x"][:, 63], idx.astype(np.float32))
        np.testing.assert_array_equal(b["y"][:, 0], idx)
        delivered.extend(idx.tolist())
    assert nb == len(L), "every batch of the epoch is handed out, short or not"
    lost = set(range(PER, 2 * PER))          # the changed file: every row fails its check
    assert set(delivered) | lost == set(range(N))
    st = L.stats()
    early = len(set(delivered) & lost)       # read before the truncation: correct bytes
    assert st["samples_skipped"] == len(lost) - early
    assert st["samples_skipped"] > 0 and st["errors"] >= 1
    assert "x_0001.npy" in st["last_error"]
    assert len(delivered) == len(set(delivered)) == N - st["samples_skipped"]


@pytest.mark.parametrize("io", BACKENDS)
def test_raise_is_the_default(tmp_path, io):
    fields, d = write(tmp_path)
    L = make(fields, io)
    it = iter(L)
    truncate(d / "y_0002.npy", 0, 8)
    with pytest.raises(npyload.NpyloadError, match="y_0002.npy"):
        for _ in it:
            pass


def test_max_errors_raises_after_the_limit(tmp_path):
    fields, d = write(tmp_path)
    L = make(fields, "pread", on_error="skip", max_errors=3)
    it = iter(L)
    truncate(d / "x_0000.npy", 0, 64 * 4)
    with pytest.raises(npyload.NpyloadError, match="x_0000.npy"):
        for _ in it:
            pass
    assert L.stats()["samples_skipped"] > 3
    with pytest.raises(ValueError, match="on_error"):
        npyload.Loader(fields, batch_size=2, on_error="ignore")


def test_an_epoch_of_failures_still_ends(tmp_path):
    fields, d = write(tmp_path)
    L = make(fields, "pread", on_error="skip")
    it = iter(L)
    for i in range(N // PER):
        truncate(d / f"y_{i:04d}.npy", 0, 8)
    sizes = [len(b.indices) for b in it]
    assert len(sizes) == len(L)
    assert sum(sizes) + L.stats()["samples_skipped"] == N
    L.set_epoch(1)                            # the next epoch ends too
    assert sum(len(b.indices) for b in L) == 0
