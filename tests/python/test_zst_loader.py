"""The loader over .npy.zst (zstd seekable, packed by npyload-pack) yields
the same batches as over the .npy files: same indices, bytes equal to
numpy's reading, on every backend, sequential and shuffled, with several
worker counts and ranks, a field mixing .npy and .npy.zst, and resume via
state_dict. stats() counts the compressed bytes read and their decoding.
Independent truth: numpy's np.load of the .npy files."""
import glob
import os
import shutil
import subprocess

import numpy as np
import pytest

import npyload
from conftest import built_tool, write_dataset, collect, check_values

BACKENDS = ["pread", "mmap", "io_uring"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("zst")
    globs, ref = write_dataset(root)
    pack = built_tool("npyload-pack")
    files = sorted(p for g in globs.values() for p in glob.glob(g))
    # Small frames: several samples per frame for the small fields, so rows
    # are picked out of frames as well as decoded straight into the batch.
    subprocess.run([pack, "-q", "--frame-size", "200", "-T", "1", *files], check=True)
    zglobs = {k: g + ".zst" for k, g in globs.items()}
    return globs, zglobs, ref


def make(fields, io, **kw):
    try:
        return npyload.Loader(fields, io=io, output="numpy", **kw)
    except npyload.NpyloadError as e:
        if io == "io_uring":
            pytest.skip(f"io_uring refused here: {e}")
        raise


@pytest.mark.parametrize("io", BACKENDS)
@pytest.mark.parametrize("shuffle", [False, True, "local"])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("direct", [False, True])
def test_same_batches_as_npy(packed, io, shuffle, workers, direct):
    globs, zglobs, ref = packed
    if direct and io == "mmap":
        pytest.skip("O_DIRECT is for pread and io_uring")
    kw = dict(batch_size=5, shuffle=shuffle, seed=9, num_workers=workers)
    if direct:
        kw["direct_io"] = True
    a = collect(make(globs, io, **kw))
    zl = make(zglobs, io, **kw)
    b = collect(zl)
    assert [i.tolist() for i, _ in a] == [i.tolist() for i, _ in b]
    for (_, x), (_, y) in zip(a, b):
        for k in x:
            assert x[k].tobytes() == y[k].tobytes(), k
    check_values(b, ref)
    s = zl.stats()
    assert s["compressed_bytes_read"] > 0
    assert s["decompressed_bytes"] >= sum(r.nbytes for r in ref.values())
    assert s["decode_ns"] > 0


@pytest.mark.parametrize("world", [2, 3])
def test_ranks(packed, world):
    globs, zglobs, ref = packed
    for rank in range(world):
        kw = dict(batch_size=4, shuffle=True, seed=1, rank=rank, world_size=world)
        a = collect(make(globs, "pread", **kw))
        b = collect(make(zglobs, "pread", **kw))
        assert [i.tolist() for i, _ in a] == [i.tolist() for i, _ in b]
        check_values(b, ref)


def test_mixed_field_and_resume(packed):
    globs, zglobs, ref = packed
    mixed = {}
    for k, g in globs.items():
        files = sorted(glob.glob(g))
        mixed[k] = [f + ".zst" if i % 2 else f for i, f in enumerate(files)]
    kw = dict(batch_size=3, shuffle=True, seed=4, num_workers=2)
    full = collect(make(mixed, "pread", **kw))
    check_values(full, ref)
    assert [i.tolist() for i, _ in full] == [i.tolist() for i, _ in collect(make(globs, "pread", **kw))]
    a = make(mixed, "pread", **kw)
    it = iter(a)
    for _ in range(4):
        next(it)
    st = a.state_dict()
    b = make(zglobs, "mmap", **kw)
    b.load_state_dict(st)
    rest = collect(b)
    assert [i.tolist() for i, _ in rest] == [i.tolist() for i, _ in full[4:]]
    check_values(rest, ref)


def test_damaged_frame_raises_naming_file_and_frame(packed, tmp_path):
    globs, zglobs, ref = packed
    d = tmp_path / "dmg"
    shutil.copytree(os.path.dirname(os.path.dirname(zglobs["images"])), d)
    z = {k: str(d / os.path.relpath(g, os.path.dirname(os.path.dirname(g)))) for k, g in zglobs.items()}
    victim = sorted(glob.glob(z["images"]))[1]
    size = os.path.getsize(victim)
    with open(victim, "r+b") as f:  # a byte in the middle of the data frames
        f.seek(size // 2)
        c = f.read(1)
        f.seek(size // 2)
        f.write(bytes([c[0] ^ 0x20]))
    with pytest.raises(npyload.NpyloadError) as e:
        collect(make(z, "pread", batch_size=5))
    msg = str(e.value)
    assert os.path.basename(victim) in msg and "frame" in msg and "at byte" in msg, msg


def test_plain_zstd_refused_with_advice(tmp_path):
    zstd = shutil.which("zstd")
    if not zstd:
        pytest.skip("the zstd CLI is not installed")
    np.save(tmp_path / "a.npy", np.arange(40, dtype=np.float32).reshape(10, 4))
    subprocess.run([zstd, "-q", str(tmp_path / "a.npy")], check=True)
    with pytest.raises(npyload.NpyloadError, match=r"a\.npy\.zst.*npyload-pack"):
        npyload.Loader({"a": str(tmp_path / "a.npy.zst")}, batch_size=2)
