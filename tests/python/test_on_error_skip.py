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


# ---- a file already short when the loader is built (issue 35, item 16) ----

def _epoch(L):
    """(delivered indices, rows checked against the values)."""
    delivered = []
    for b in L:
        idx = np.asarray(b.indices)
        np.testing.assert_array_equal(b["x"][:, 0], idx.astype(np.float32))
        np.testing.assert_array_equal(b["x"][:, 63], idx.astype(np.float32))
        np.testing.assert_array_equal(b["y"][:, 0], idx)
        delivered.extend(idx.tolist())
    return delivered


@pytest.mark.parametrize("io", BACKENDS + ["direct"])
def test_file_short_at_start_is_skipped_counted_and_named_once(tmp_path, io):
    """A failed copy among the files: x_0001.npy holds 5 whole rows and half
    of the 6th of its 20. With on_error='skip' the loader is built (the
    other fields' counts still agree), warns once naming the file, and
    every epoch delivers all other samples (numpy's values) while the 15
    missing ones are skipped and counted, as a truncation after start is;
    the default policy refuses it at construction, naming it."""
    fields, d = write(tmp_path)
    truncate(d / "x_0001.npy", 5, 64 * 4)
    with open(d / "x_0001.npy", "ab") as f:
        f.write(b"\0" * (64 * 2))          # half of row 6
    with pytest.raises(npyload.NpyloadError, match="x_0001.npy"):
        make(fields, "pread")
    kw = {"on_error": "skip"}
    if io == "direct":
        io, kw["direct_io"] = "pread", True
    with pytest.warns(RuntimeWarning) as w:
        L = make(fields, io, **kw)
    msgs = [str(x.message) for x in w if "x_0001.npy" in str(x.message)]
    assert len(msgs) == 1 and "5 of the 20" in msgs[0], [str(x.message) for x in w]
    lost = set(range(PER + 5, 2 * PER))
    assert len(L) == -(-N // BS)
    for epoch in range(2):
        L.set_epoch(epoch)
        got = _epoch(L)
        assert sorted(got) == sorted(set(range(N)) - lost), epoch
        assert L.stats()["samples_skipped"] == len(lost) * (epoch + 1)
    assert "x_0001.npy" in L.stats()["last_error"]
    L.close()


def test_file_short_at_start_over_http(tmp_path):
    """The same over http:// (the tests' own file server): the missing rows
    are skipped and counted; the rest equals numpy's reading."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from weed_server import FileServer
    fields, d = write(tmp_path)
    truncate(d / "y_0002.npy", 3, 8)
    with FileServer(d) as fs:
        urls = {k: [fs.url(f"{k}_{i:04d}.npy") for i in range(N // PER)] for k in ("x", "y")}
        with pytest.warns(RuntimeWarning, match="y_0002.npy"):
            L = npyload.Loader(urls, batch_size=BS, shuffle=True, seed=3, num_workers=2,
                               output="numpy", on_error="skip")
        got = _epoch(L)
        lost = set(range(2 * PER + 3, 3 * PER))
        assert sorted(got) == sorted(set(range(N)) - lost)
        assert L.stats()["samples_skipped"] == len(lost)
        L.close()


def _inotify_opens(directory):
    """A counter of IN_OPEN events per file name in `directory` (the
    kernel's own count, through inotify); None where inotify is refused."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(str(directory)), 0x20) < 0:  # IN_OPEN
        os.close(fd)
        return None
    counts = {}

    def drain():
        while True:
            try:
                buf = os.read(fd, 65536)
            except BlockingIOError:
                return dict(counts)
            i = 0
            while i < len(buf):
                _, mask, _, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
                if name:  # (not the directory itself: a glob lists it)
                    counts[name] = counts.get(name, 0) + 1
                i += 16 + n

    return drain, lambda: os.close(fd)


def test_lazy_start_reads_each_header_once(tmp_path):
    """Loader() checks the fields with a scratch start; the first iter()
    then starts without reading any header again (the kernel's count of
    opens, by inotify: during the first epoch of a loader with no worker
    thread each file is opened once, for its data, where it was opened
    three times when the headers were read again)."""
    fields, d = write(tmp_path)
    watch = _inotify_opens(d)
    if watch is None:
        pytest.skip("inotify is not available here: cannot count the opens")
    drain, close = watch
    try:
        L = npyload.Loader(fields, batch_size=BS, num_workers=0, read_ahead=False,
                           io="pread", output="numpy")
        built = drain()
        assert all(built.get(f"{k}_{i:04d}.npy", 0) >= 1 for k in "xy" for i in range(3)), built
        got = _epoch(L)
        first = {k: v - built.get(k, 0) for k, v in drain().items()}
        assert sorted(got) == list(range(N))
        assert first == {f"{k}_{i:04d}.npy": 1 for k in "xy" for i in range(3)}, first
        L.close()
    finally:
        close()
