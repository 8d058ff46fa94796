"""``npyload.write(ds, out)`` for a ``ray.data.Dataset``: the same files as
the single-process writer, written by Ray tasks on the cluster's nodes
(``pip install 'npyload[ray]'``).

Why Ray tasks and not a ``Datasink``: a Datasink's ``write()`` gets the
blocks of one task with no global row index, so a shard of S rows that
spans blocks written by different tasks cannot be made there. Here the
driver streams the dataset's blocks *in the dataset's order* and cuts
that stream into shards: shard k is rows [k*S, (k+1)*S) whatever the
nodes, workers and blocks.

The global row index: the driver runs the dataset with Ray Data's
``preserve_order`` (on a copy of the dataset, with a DataContext of its
own; without it the streaming executor hands blocks out as they complete,
and no order exists to match), takes its blocks with
``Dataset.iter_internal_ref_bundles()`` (references and metadata, not the
data), and adds the row counts of the blocks (their slices, when a bundle
holds part of a block) in that order. A shard is a list of (block, start,
stop) pieces, possibly across blocks.

One task per shard (1 CPU; Ray places it by its blocks' locality) reads
its pieces from the object store, encodes every field with the thread
writer's ``_write.encode`` and writes each file with the store's placer
(``LocalPlacer``: temporary name, fsync, rename; ``S3Placer``: one PUT or
a multipart upload, visible only when complete). The task returns facts
(content sha256, size, sha256 of the stored file); only the driver
journals them and writes the manifest, so a task that Ray retries after
its worker died writes the same bytes again, under a new temporary name,
and returns the same facts. At most ``num_workers`` tasks are in flight
(default: the cluster's CPUs), which also bounds how many blocks the
driver keeps referenced.

A local ``out`` must be a filesystem that every node mounts at the same
path (the driver checks that each file is there after its task);
``s3://`` needs nothing shared. npyload must be installed on every node.
"""
from __future__ import annotations

from itertools import chain as _chain
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Generator, Iterator

    from ._write import _Plan, _Progress, _Spec

_RETRIES = 3   # a task whose worker (or node) died is run again, at most this often


def _np() -> Any:
    import numpy
    return numpy


def _ray() -> Any:
    """The ray module (untyped here: typed with or without ray installed)."""
    import importlib
    ray = importlib.import_module("ray")
    importlib.import_module("ray.data.block")
    return ray


def _pieces_of(bundles: Any) -> Generator[tuple[Any, int, int], None, None]:
    """(block ref, start, stop) of every non-empty block piece, in order."""
    ray = _ray()
    for bundle in bundles:
        slices = getattr(bundle, "slices", None) or [None] * len(bundle.blocks)
        for entry, sl in zip(bundle.blocks, slices):
            ref, meta = (entry.ref, entry.metadata) if hasattr(entry, "ref") else entry
            if sl is not None:
                a, b = int(sl.start_offset), int(sl.end_offset)
            else:
                n = meta.num_rows
                a, b = 0, int(n if n is not None else
                              ray.get(_remote("rows", _rows, num_cpus=0).remote(ref)))
            if b > a:
                yield ref, a, b


def _rows(block: Any) -> int:
    BlockAccessor = _ray().data.block.BlockAccessor
    return int(BlockAccessor.for_block(block).num_rows())


def _columns(block: Any, a: int, b: int, spec_fields: list[str], where: str) -> dict[str, Any]:
    """Rows [a, b) of a block as numpy arrays, one per field."""
    BlockAccessor = _ray().data.block.BlockAccessor
    acc = BlockAccessor.for_block(BlockAccessor.for_block(block).slice(a, b, copy=False))
    try:
        cols = acc.to_numpy(list(spec_fields))
    except (ValueError, KeyError) as e:
        raise ValueError(f"write: {where}: {e}; row 0 had the fields {spec_fields}") from None
    assert isinstance(cols, dict)
    return cols


def _first_row(block: Any, a: int) -> dict[str, Any]:
    BlockAccessor = _ray().data.block.BlockAccessor
    cols = BlockAccessor.for_block(BlockAccessor.for_block(block).slice(a, a + 1, copy=False))
    out = cols.to_numpy()
    assert isinstance(out, dict)
    return {k: v[0] for k, v in out.items()}


def _shard(fid: int, row0: int, spans: list[tuple[int, int]], refs: list[Any], spec: _Spec,
           fields: list[tuple[str, str]], write: list[str] | None, placer: Any,
           pack: Any, split: str) -> tuple[int, list[tuple[str, str, str, int, str]]]:
    """One shard, in a Ray task: the rows of its pieces (spans[i] of
    blocks[i]), checked against row 0's fields, dtypes and shapes, encoded
    as the thread writer encodes them. write None: only the content
    sha256 of each field (resume checks them before anything is written);
    else the fields in `write` are written by placer. Returns (rows, [(field,
    relative name, content sha256, stored size, stored sha256)]).

    The blocks come as a list of references that the task gets itself, not
    as top-level arguments: Ray 2.60's driver aborts in its reference
    counter (reference_counter.cc, "submitted_task_ref_count") when tasks
    whose small top-level arguments it inlines are submitted after a task
    was retried (a worker killed); nested references take another path."""
    ray = _ray()
    from ._write import encode
    np = _np()
    blocks = ray.get(refs)
    parts: dict[str, list[Any]] = {k: [] for k in spec.fields}
    row = row0
    for (a, b), block in zip(spans, blocks):
        where = f"rows {row}..{row + b - a - 1} of the Ray dataset"
        for k, v in _columns(block, a, b, spec.fields, where).items():
            if v.dtype.hasobject:   # Ray's column of arrays of different shapes, or objects
                raise ValueError(f"write: {where}, field {k!r}: values of different shapes "
                                 f"or objects; row 0 had {spec.dtype[k].str} "
                                 f"{spec.shape[k]} (NPY stores one dtype and shape)")
            if v.shape[1:] != spec.shape[k] or v.dtype != spec.dtype[k]:
                raise ValueError(f"write: {where}, field {k!r}: {v.dtype.str} "
                                 f"{v.shape[1:]}, row 0 had {spec.dtype[k].str} "
                                 f"{spec.shape[k]}")
            parts[k].append(v)
        row += b - a
    out = []
    for k, rel in fields:
        arr = parts[k][0] if len(parts[k]) == 1 else np.concatenate(parts[k])
        content, data = encode(arr, spec.dtype[k])
        if write is None:
            out.append((k, rel, content, -1, ""))
        elif k in write:
            size, digest = placer.place(rel, split, fid, k, content, data, pack)
            out.append((k, rel, content, size, digest))
    return row - row0, out


_REMOTE: dict[str, Any] = {}   # the remote functions, made once per process


def _remote(name: str, fn: Any, **opts: Any) -> Any:
    ray = _ray()
    if name not in _REMOTE:
        _REMOTE[name] = ray.remote(**opts)(fn)
    return _REMOTE[name]


class RaySource:
    """A ray.data.Dataset as the writer's source: row 0 (the fields), then
    its shards, each a list of block pieces, in the dataset's order."""

    def __init__(self, ds: Any) -> None:
        import warnings
        with warnings.catch_warnings():   # copying a DataContext reads its deprecated names
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                own = type(ds).copy(ds, _deep_copy=True)   # a DataContext of its own
            except (AttributeError, TypeError):
                own = ds
        own.context.execution_options.preserve_order = True
        self._gen = _pieces_of(own.iter_internal_ref_bundles())
        self._pieces: Iterator[tuple[Any, int, int]] = self._gen

    def close(self) -> None:
        """Ends the dataset's execution now (a write that stops early)."""
        self._gen.close()   # frees the executor's iterator, which shuts it down

    def first(self) -> dict[str, Any]:
        """Row 0, read on the cluster."""
        ray = _ray()
        try:
            p = next(self._pieces)
        except StopIteration:
            raise ValueError("write: the source has no samples (an empty Ray dataset)") \
                from None
        self._pieces = _chain([p], self._pieces)
        return dict(ray.get(_remote("first", _first_row, num_cpus=0).remote(p[0], p[1])))

    def shards(self, spf: int) -> Iterator[tuple[int, int, list[tuple[Any, int, int]]]]:
        """(file number, its first row, its pieces) for every file: the
        blocks' row counts summed in order give each row's global index."""
        cur: list[tuple[Any, int, int]] = []
        filled = fid = 0
        for ref, a, b in self._pieces:
            while a < b:
                take = min(spf - filled, b - a)
                cur.append((ref, a, a + take))
                filled, a = filled + take, a + take
                if filled == spf:
                    yield fid, fid * spf, cur
                    cur, filled, fid = [], 0, fid + 1
        if cur:
            yield fid, fid * spf, cur

    def run(self, plan: _Plan, spf: int, num_workers: int | None,
            bar: _Progress) -> tuple[int, int]:
        """Every shard through Ray tasks, at most num_workers in flight
        (None: the cluster's CPUs). Files that a previous run finished
        (resume) are checked first, and nothing is written until they all
        are; the facts of each written file are journaled as its task
        returns. Returns (files, samples)."""
        ray = _ray()
        if num_workers is None:
            num_workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = _remote("shard", _shard, num_cpus=1, max_retries=_RETRIES,
                       retry_exceptions=False)
        placer, packer = plan.store.placer(), plan.packer()
        spec = plan.spec
        inflight: dict[Any, tuple[int, str]] = {}   # task -> (file, "check" | "write")
        held: list[tuple[int, int, list[tuple[Any, int, int]], list[str]]] = []
        pieces_of: dict[int, tuple[int, list[tuple[Any, int, int]]]] = {}
        checking = 0
        nfiles = samples = 0

        def submit(fid: int, row0: int, pieces: list[tuple[Any, int, int]],
                   write: list[str] | None) -> None:
            fields = plan.claim(fid)
            if write is not None:
                plan._begin()
                for k, rel in fields:
                    if k in write:
                        plan.store.intend(rel, plan.split, fid, k, packer is not None)
            ref = task.remote(fid, row0, [(a, b) for _, a, b in pieces],
                              [r for r, _, _ in pieces], spec, fields, write, placer, packer,
                              plan.split)
            inflight[ref] = (fid, "check" if write is None else "write")

        def settle(block: bool) -> None:
            """Handles finished tasks (one at least when block)."""
            nonlocal checking, samples
            done, _ = ray.wait(list(inflight), num_returns=1 if block else len(inflight),
                               timeout=None if block else 0)
            for ref in done:
                fid, mode = inflight.pop(ref)
                try:
                    count, facts = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, (ValueError, TypeError, OSError)):
                        raise cause from None
                    raise
                if mode == "check":
                    checking -= 1
                    todo = [k for k, rel, content, _, _ in facts
                            if not plan._keep(fid, k, rel, content)]
                    row0, pieces = pieces_of.pop(fid)
                    if todo:
                        held.append((fid, row0, pieces, todo))
                    else:
                        samples += count
                        bar.add(count, wrote=False)
                    continue
                for k, rel, content, size, digest in facts:
                    final = rel + ".zst" if packer is not None else rel
                    plan.store.record(final, plan.split, fid, k, content, size, digest)
                samples += count
                bar.add(count)

        try:
            for fid, row0, pieces in self.shards(spf):
                nfiles = fid + 1
                if fid <= plan.last_checked:
                    pieces_of[fid] = (row0, pieces)
                    checking += 1
                    submit(fid, row0, pieces, None)
                else:
                    while checking:      # nothing is written before every check is in
                        settle(True)
                    for h in held:
                        submit(*h)
                    held.clear()
                    submit(fid, row0, pieces, list(spec.fields))
                while len(inflight) >= num_workers:
                    settle(True)
            while inflight:
                settle(True)
            n_all = samples + sum(b - a for h in held for _, a, b in h[2])
            if plan.old_samples is not None and n_all != plan.old_samples:
                raise ValueError(f"write: {plan.names.out} holds a completed write of split "
                                 f"{plan.split!r} of {plan.old_samples} samples; the source "
                                 f"has {n_all}: overwrite=True replaces it")
            for h in held:
                submit(*h)
                while len(inflight) >= num_workers:
                    settle(True)
            held.clear()
            while inflight:
                settle(True)
        except BaseException:
            for ref in inflight:
                ray.cancel(ref, force=False)
            raise
        finally:
            self.close()
        return nfiles, samples
