"""The whole public API of npyload, used as a user would, with the types a
user's type checker sees pinned down by assert_type.

tests/python/test_typing.py runs ``mypy --strict`` on this file (the package's
py.typed, inline annotations and the stub of the C extension must make it
pass: a missing stub or an Any where a type belongs fails) and runs it on a
tiny dataset (the uses must work as written). Not a pytest module (no test_
prefix); run it by hand with ``python tests/python/typed_api_use.py [DIR]``.

When the public API grows, use the new name or argument here:
test_typing.py checks that every name of ``npyload.__all__`` and every
argument of Loader, Transform, pack and write appears in this file.
"""
from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import numpy.typing as npt

import npyload

if TYPE_CHECKING:
    from typing_extensions import assert_type

    from npyload._npyload import BuildInfo, HeaderInfo, LoaderState, LoaderStats, PackResult
else:
    def assert_type(value, typ):
        return value

    # Only type checkers know these TypedDicts; at run time they are dicts.
    BuildInfo = HeaderInfo = LoaderState = LoaderStats = PackResult = dict

N, PER_FILE = 24, 8   # samples, samples per file: 3 files per field


class Samples:
    """A map-style dataset, as a user writes one (torch's Dataset protocol)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, npt.NDArray[Any]]:
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) + np.float32(100 * i)
        return {"x": x, "y": np.array(i, dtype=np.int64)}


def stream(n: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """An iterable source."""
    for i in range(n):
        yield {"x": np.full((2, 3, 4), i, np.float32), "y": np.array(i, dtype=np.int64)}


def write_all(root: str) -> dict[str, list[str]]:
    """npyload.write with each kind of source and every argument."""
    arrays = {"x": np.zeros((N, 2, 3, 4), np.float32), "y": np.arange(N, dtype=np.int64)}
    a = npyload.write(arrays, os.path.join(root, "arrays"))
    assert_type(a, dict[str, list[str]])
    assert sorted(a) == ["x", "y"] and len(a["x"]) == N // 64 + 1
    it = npyload.write(stream(N), os.path.join(root, "stream"), samples_per_file=PER_FILE,
                       layout="{field}-{split}-{id:03d}.npy", split="val", num_workers=2,
                       pack=True, narrow=False, overwrite=True, progress=False)
    assert all(p.endswith(".npy.zst") for p in it["x"]), it
    fields = npyload.write(Samples(N), os.path.join(root, "ds"), samples_per_file=PER_FILE,
                           layout={"x": "x/train_{id:04d}.npy",
                                   "y": "y/train_{id:04d}_y.npy"},
                           split="train", num_workers=None, pack=False, narrow=False,
                           overwrite=False, progress=False, remote=None)
    assert [len(v) for v in fields.values()] == [N // PER_FILE] * 2
    # a manifest (written last, beside the files) opens in Loader as fields
    manifest = npyload.Loader(os.path.join(root, "ds", "train.manifest.json"), batch_size=8)
    assert len(manifest) == N // 8
    manifest.close()
    facts = npyload.inspect_manifest(os.path.join(root, "ds", "train.manifest.json"),
                                     verify=True, remote=None)
    assert_type(facts, dict[str, Any])
    assert facts["samples"] == N
    return fields


def pack_and_inspect(fields: Mapping[str, list[str]], root: str) -> None:
    """pack, inspect, load and NpyloadError."""
    x0 = fields["x"][0]
    one = npyload.pack(x0, out=os.path.join(root, "x0.npy.zst"))
    assert_type(one, list[PackResult])
    r = one[0]
    assert_type(r["out"], str)
    assert_type(r["seconds"], float)
    assert_type(r["narrow_values"], int)
    assert r["in_bytes"] == os.path.getsize(x0) and r["frames"] >= 2
    y_copies: list[str] = []
    for p in fields["y"]:
        dst = os.path.join(root, os.path.basename(p))
        with open(p, "rb") as fi, open(dst, "wb") as fo:
            fo.write(fi.read())
        y_copies.append(dst)
    stored = npyload.pack(y_copies[0], narrow=True, store=True)
    assert stored[0]["out"].endswith(".narrow.npy") and stored[0]["frames"] == 0
    os.remove(stored[0]["out"])
    many = npyload.pack(y_copies, level=5, frame_size=64, threads=1, force=True,
                        remove=True, out=None, checksum=True, narrow=True, store=False)
    # 8 distinct int64 values per file: narrowed to one-byte codes
    assert [m["narrow_values"] for m in many] == [PER_FILE] * len(many)
    assert not any(os.path.exists(p) for p in y_copies)           # remove=True

    h = npyload.inspect(x0)
    assert_type(h, HeaderInfo)
    assert_type(h["shape"], tuple[int, ...])
    assert_type(h["version"], tuple[int, int])
    assert_type(h["descr"], str)
    assert h["shape"] == (PER_FILE, 2, 3, 4) and h["descr"] == "<f4"
    assert "ratio" not in h
    z = npyload.inspect(r["out"], verify=True)
    ratio = z.get("ratio")
    assert_type(ratio, Optional[float])
    assert ratio is not None and z.get("verified") is True and z["data_bytes"] == h["data_bytes"]

    a = npyload.load(x0)
    assert_type(a, npt.NDArray[Any])
    b = npyload.load(x0, mmap=False)
    assert np.array_equal(a, b) and b.shape == (PER_FILE, 2, 3, 4)

    try:
        npyload.inspect(os.path.join(root, "missing.npy"))
    except npyload.NpyloadError as e:
        assert_type(e.code, Optional[int])
        assert e.code is not None and e.code < 0
    else:
        raise AssertionError("no NpyloadError for a missing file")


def every_loader_argument(fields: Mapping[str, list[str]]) -> None:
    """Loader with every argument, iteration, the Batch mapping, epochs,
    state and stats."""
    # The augmentation arguments keep x's shape here: a crop of the whole
    # (unpadded) sample, and a vflip_sign that applies only with vflip > 0.
    t = npyload.Transform(dtype="float32", scale=0.5, mean=[1.0, 2.0], std=4.0,
                          channels_last=True, hflip=0.5, vflip=0.0, crop=(3, 4), pad=0,
                          hflip_sign=1.0, vflip_sign=[1.0, -1.0])
    assert_type(t.hflip, float)
    assert_type(t.crop, Optional[tuple[int, int]])
    assert_type(t.dtype, Optional[str])
    assert_type(t.mean, Optional[tuple[float, ...]])
    assert_type(t.scale, float)
    assert_type(t.channels_last, bool)
    assert t.mean == (1.0, 2.0) and t.std == (4.0,)
    keep = npyload.Transform(np.float16)     # numpy dtypes are accepted
    assert keep.dtype == "float16" and repr(keep).startswith("Transform(")

    loader = npyload.Loader(
        fields, PER_FILE, shuffle="local", seed=7, drop_last=False, num_workers=2,
        prefetch=2, device="cpu", rank=0, world_size=1, io="pread", output="numpy",
        copy=False, window=2, direct_io=False, pin_memory=False, align="names",
        on_error="skip", max_errors=None, transforms={"x": t}, as_tuple=False,
        transform=None, read_ahead=True, transform_workers=1, remote=None, cache_fill=None,
        memory_budget=None, auto_target=0.02)
    assert_type(loader, npyload.Loader[npyload.Batch])
    assert_type(loader.cache_fill, Optional[bool])
    auto = npyload.Loader(fields, PER_FILE, num_workers="auto", prefetch="auto",
                          memory_budget=1 << 30, auto_target=0.05)
    assert_type(auto.auto_history(), list[dict[str, Any]])
    assert auto.auto_history() == [] and auto.num_workers == "auto"
    auto.close()
    assert_type(len(loader), int)
    assert_type(loader.num_samples, int)
    assert_type(loader.field_names, tuple[str, ...])
    assert_type(loader.backend, str)
    assert_type(loader.field_engines(), dict[str, tuple[str, str]])
    assert loader.field_engines()["x"][0] == "host" and loader.field_engines()["y"][0] == "none"
    assert len(loader) == N // PER_FILE and loader.num_samples == N
    assert loader.field_names == ("x", "y") and loader.batch_size == PER_FILE

    loader.set_epoch(1)
    assert_type(loader.epoch, int)
    seen: list[int] = []
    it = iter(loader)
    assert_type(it, Iterator[npyload.Batch])
    for batch in it:
        assert_type(batch, npyload.Batch)
        x = batch["x"]
        assert x.shape == (PER_FILE, 2, 3, 4) and x.dtype == np.float32
        assert_type(batch.keys(), KeysView[str])
        assert_type(batch.items(), ItemsView[str, Any])
        assert_type(batch.values(), ValuesView[Any])
        assert list(batch.keys()) == ["x", "y"] and len(batch) == 2 and "y" in batch
        assert_type(batch.epoch, int)
        assert_type(batch.seq, int)
        assert_type(batch.num_samples, int)
        assert_type(batch.augment, dict[str, npyload.Augment])
        aug = batch.augment["x"]
        assert len(aug.hflip) == PER_FILE and int(aug.top.max()) == 0
        assert batch.epoch == 1 and batch.num_samples == PER_FILE
        seen += [int(i) for i in batch.indices]
        assert [int(v) for v in batch["y"]] == [int(i) for i in batch.indices]
        batch.wait_stream()          # a no-op on the host
        assert repr(batch).startswith("<npyload.Batch")
        break
    st = loader.state_dict()
    assert_type(st, LoaderState)
    assert_type(st["consumed"], int)
    assert st["epoch"] == 1 and st["consumed"] == PER_FILE

    s = loader.stats()
    assert_type(s, LoaderStats)
    assert_type(s["bytes_read"], int)
    assert_type(s["backend"], str)
    assert_type(s["pinned"], bool)
    assert_type(s["remote_requests"], int)
    assert s["remote_requests"] == 0 and s["cache_hits"] == 0
    assert s["batches_delivered"] >= 1 and s["backend"] == "pread" and s["samples_skipped"] == 0

    # Resume in a second loader (a dict from a checkpoint, like torch.load's).
    saved: dict[str, Any] = dict(st)
    with npyload.Loader(fields, PER_FILE, shuffle="local", seed=7, window=2,
                        num_workers=1, output="numpy", transforms={"x": t}) as resumed:
        assert_type(resumed, npyload.Loader[npyload.Batch])
        resumed.load_state_dict(saved)
        rest = [int(i) for b in resumed for i in b.indices]
    for b in it:                     # the rest of epoch 1
        seen += [int(i) for i in b.indices]
    assert seen[PER_FILE:] == rest and sorted(seen) == list(range(N))
    order = npyload.order_indices(N, 2, 7, 1, 0, 1, False,  # 2: local shuffle
                                  PER_FILE, file_sizes=[PER_FILE] * 3, window=2)
    assert_type(order, list[int])
    assert order == seen
    loader.close()


def mixture(fields: Mapping[str, list[str]]) -> None:
    """sources=, weights=, samples_per_epoch=, set_weights, batch.source,
    source_names and the mixture's stats."""
    halves = {"a": {k: v[:1] for k, v in fields.items()},
              "b": {k: v[1:] for k, v in fields.items()}}
    with npyload.Loader(sources=halves, weights={"a": 1.0, "b": 3}, samples_per_epoch=N,
                        batch_size=PER_FILE, shuffle=True, output="numpy") as mixed:
        assert_type(mixed.source_names, tuple[str, ...])
        assert mixed.source_names == ("a", "b") and len(mixed) == N // PER_FILE
        for batch in mixed:
            assert_type(batch.source, Any)
            assert [int(v) for v in batch["y"]] == [int(i) + (PER_FILE if int(s) else 0)
                                                    for s, i in zip(batch.source,
                                                                    batch.indices)]
            mixed.set_weights({"a": 1, "b": 1})
        s = mixed.stats()
        assert_type(s["source_samples"], dict[str, int])
        assert_type(s["digest"], int)
        assert sum(s["source_samples"].values()) == s["digest_rows"] == N
        st = mixed.state_dict()
        assert_type(st["_digest"], int)
        assert st["_digest"] == s["digest"]
    # A transform per source: {source: {field: Transform}}.
    own = {"a": {"y": npyload.Transform("float32", scale=2.0)},
           "b": {"y": npyload.Transform("float32")}}
    with npyload.Loader(sources=halves, transforms=own, batch_size=PER_FILE,
                        output="numpy") as per_source:
        for batch in per_source:
            assert [float(v) for v in batch["y"]] == [
                2.0 * int(i) if not int(s) else float(int(i) + PER_FILE)
                for s, i in zip(batch.source, batch.indices)]


def tuples_and_hooks(fields: Mapping[str, list[str]]) -> None:
    """as_tuple=True, transform= (typed by what it returns), TransformError."""
    tl = npyload.Loader(fields, 4, output="numpy", as_tuple=True)
    assert_type(tl, npyload.Loader[npyload.BatchTuple])
    for bt in tl:
        assert_type(bt, npyload.BatchTuple)
        x, y = bt                      # tuples unpack, in field order
        assert_type(bt.field_names, tuple[str, ...])
        assert bt.field_names == ("x", "y") and x.shape[0] == y.shape[0] == bt.num_samples
        assert [int(i) for i in bt.indices] == [int(v) for v in y]
        bt.wait_stream(None)
    tl.close()

    def rows(b: npyload.Batch) -> tuple[int, float]:
        return b.num_samples, float(b["x"].sum())

    hooked = npyload.Loader(fields, 6, output="numpy", transform=rows, transform_workers=2)
    assert_type(hooked, npyload.Loader[tuple[int, float]])
    assert_type(hooked.transform_workers, int)
    total = 0
    for n, _ in hooked:
        total += n
    assert total == N
    hooked.close()

    def first_field(b: npyload.BatchTuple) -> npt.NDArray[np.float32]:
        return np.asarray(b[0], dtype=np.float32)

    both = npyload.Loader(fields, 6, output="numpy", as_tuple=True, transform=first_field)
    assert_type(both, npyload.Loader[npt.NDArray[np.float32]])
    assert sum(a.shape[0] for a in both) == N
    both.close()

    def fail(b: npyload.Batch) -> None:
        raise KeyError("boom")

    failing = npyload.Loader(fields, 6, output="numpy", transform=fail)
    try:
        for _ in failing:
            pass
    except npyload.TransformError as e:
        assert_type(e.seq, int)
        assert_type(e.epoch, int)
        assert e.seq == 0 and isinstance(e.__cause__, KeyError)
    else:
        raise AssertionError("no TransformError")
    failing.close()
    # A flip the user means for one field only: said, and silenced by name.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=npyload.FlipMismatchWarning)
        assert issubclass(npyload.FlipMismatchWarning, UserWarning)


def batches_of(loader: npyload.Loader) -> int:
    """A plain `npyload.Loader` annotation means Loader[Batch]."""
    n = 0
    for b in loader:
        assert_type(b, npyload.Batch)
        n += b.num_samples
    return n


def remote_planning(fields: Mapping[str, list[str]], root: str) -> None:
    """npyload.dataset_facts and cost_model on the local files; prefetch
    against a server that is not there (an error naming the URL)."""
    facts = npyload.dataset_facts(fields)
    assert_type(facts, dict[str, Any])
    assert facts["samples"] == N
    m = npyload.cost_model(samples=facts["samples"], fields=facts["fields"], nodes=2,
                           ranks_per_node=2, samples_per_s=1000.0, batch_size=8, workers=2,
                           cache_bytes=1 << 30, shuffle="global", epochs=2, get_rate=5500.0,
                           prefixes=1, link=125e6, rtt=0.01, server_s=0.0,
                           cache_block=4096, request_bytes=1 << 20, inflight=4,
                           max_inflight=8, local_samples_per_s=1e6)
    assert_type(m, dict[str, Any])
    assert m["fill"]["time_to_warm_s"] > 0 and m["dataset"]["samples"] == N
    seen: list[dict[str, Any]] = []
    try:
        npyload.prefetch(["http://127.0.0.1:9/nothing.npy"], remote={"retries": 0},
                         cache_dir=os.path.join(root, "pcache"), cache_bytes=1 << 30,
                         cache_block=4096, max_bytes=1 << 20, inflight=2,
                         request_bytes=1 << 16, progress=seen.append, interval=0.05)
    except npyload.NpyloadError as e:
        assert "127.0.0.1:9" in str(e)
    else:
        raise AssertionError("prefetch from a closed port succeeded")


def main(root: str) -> None:
    assert_type(npyload.__version__, str)
    ok, why = npyload.cuda_available()
    assert_type(ok, bool)
    assert_type(why, str)
    info = npyload.build_info()
    assert_type(info, BuildInfo)
    assert_type(info["uring_usable"], bool)
    assert_type(info["default_prefetch"], int)
    assert_type(info["torch"], Optional[str])
    assert info["version"] == npyload.__version__ and info["cuda_devices"] >= 0
    fields = write_all(root)
    pack_and_inspect(fields, root)
    every_loader_argument(fields)
    tuples_and_hooks(fields)
    mixture(fields)
    remote_planning(fields, root)
    with npyload.Loader(fields, 5, output="numpy") as ld:
        assert batches_of(ld) == N
        c = npyload.copy_ceiling(ld, "gather", threads=1, seconds=0.2)
        assert_type(c, dict[str, Any])
        assert c["gbps"] > 0 and c["threads"] == 1
    if ok:
        assert_type(npyload.h2d_ceiling(0, nbytes=1 << 20, iters=2), float)
    # DataLoader's keywords that carry over are typed: a ported call checks.
    ported = npyload.Loader(fields, 5, output="numpy", persistent_workers=True,
                            in_order=True)
    assert_type(ported, npyload.Loader[npyload.Batch])
    with ported:
        assert batches_of(ported) == N


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
    print("typed_api_use: ok")
