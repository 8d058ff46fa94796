"""Writing datasets: any source of samples -> NPY shards that npyload.Loader
reads (npyload.write), in parallel, resumable and deterministic."""
from __future__ import annotations

import hashlib as _hashlib
import json as _json
import os as _os
import re as _re
import sys as _sys
import threading as _threading
import time as _time
from collections.abc import Mapping as _Mapping
from concurrent.futures import ThreadPoolExecutor as _Pool
from typing import TYPE_CHECKING, Any

from ._npyload import NpyloadError, inspect as _inspect
from ._options import _int_arg
from ._pack import pack as _pack

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from concurrent.futures import Future
    from typing import Callable, Protocol, Union

    class _Dataset(Protocol):
        """A map-style dataset (torch.utils.data.Dataset's protocol): samples
        by index, each a mapping from field name to array or tensor."""
        def __len__(self) -> int: ...
        def __getitem__(self, index: int, /) -> Mapping[str, Any]: ...

    _SampleSource = Union[Mapping[str, Any], _Dataset, Iterable[Mapping[str, Any]]]
    _Store = Callable[[int, list[dict[str, Any]]], None]
    _Finished = Callable[[int, int], bool]
    _Note = Callable[[int], None]

_DEFAULT_LAYOUT = "{field}/{split}_{id:04d}.npy"
_STATE = ".npyload-write-{split}.json"   # the call's fingerprint, beside the files


def _np() -> Any:
    import numpy
    return numpy


def _as_array(v: Any, where: str) -> Any:
    """A sample's value as a numpy array: numpy arrays, torch tensors (through
    .numpy(), on the CPU), scalars and nested lists."""
    np = _np()
    if hasattr(v, "detach") and hasattr(v, "cpu"):
        v = v.detach().cpu().numpy()
    a = np.asarray(v)
    if a.dtype.hasobject:
        raise TypeError(f"write: {where}: object values cannot be stored in NPY "
                        "(give arrays of numbers)")
    return a


class _Source:
    """Samples by index (map-style: a Dataset or a dict of arrays) or in order
    (an iterable of dicts). `n` is None when the length is unknown."""

    def __init__(self, source: Any) -> None:
        self.kind: str | None = None
        self.n: int | None
        if isinstance(source, _Mapping):
            lens = {k: len(v) for k, v in source.items()}
            if not lens:
                raise ValueError("write: the dict of arrays is empty")
            if len(set(lens.values())) != 1:
                raise ValueError(f"write: the arrays have different lengths: {lens}")
            self.kind, self.arrays, self.n = "arrays", source, next(iter(lens.values()))
        elif hasattr(source, "__getitem__") and hasattr(source, "__len__") and \
                not isinstance(source, (str, bytes)):
            self.kind, self.ds, self.n = "dataset", source, len(source)
        elif hasattr(source, "__iter__"):
            self.kind, self.it, self.n = "iterable", iter(source), None
        else:
            raise TypeError("write: source must be a dict of arrays, a map-style "
                            "Dataset (__len__ and __getitem__) or an iterable of dicts, "
                            f"got {type(source).__name__}")

    def get(self, i: int) -> Any:
        if self.kind == "arrays":
            return {k: v[i] for k, v in self.arrays.items()}
        return self.ds[i]


def _sample_dict(s: Any, i: int) -> dict[str, Any]:
    if not isinstance(s, _Mapping):
        raise TypeError(f"write: sample {i} is a {type(s).__name__}, expected a dict "
                        "of field name -> array")
    return {k: _as_array(v, f"sample {i}, field {k!r}") for k, v in s.items()}


class _Spec:
    """Field names, dtypes and shapes, from the first sample; every other
    sample is checked against them."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.fields = list(first)
        if not self.fields:
            raise ValueError("write: sample 0 has no fields")
        self.dtype = {k: v.dtype for k, v in first.items()}
        self.shape = {k: v.shape for k, v in first.items()}

    def check(self, s: dict[str, Any], i: int) -> None:
        if list(s) != self.fields:
            raise ValueError(f"write: sample {i} has fields {list(s)}, sample 0 had "
                             f"{self.fields}")
        for k, v in s.items():
            if v.shape != self.shape[k] or v.dtype != self.dtype[k]:
                raise ValueError(f"write: sample {i}, field {k!r}: {v.dtype.str} "
                                 f"{v.shape}, sample 0 had {self.dtype[k].str} "
                                 f"{self.shape[k]}")


def _template(layout: str | Mapping[str, str] | None, field: str) -> str:
    t = (layout or {}).get(field, _DEFAULT_LAYOUT) if isinstance(layout, _Mapping) \
        else (layout or _DEFAULT_LAYOUT)
    if "{id" not in t:
        raise ValueError(f"write: layout for {field!r} ({t!r}) has no {{id}}: every "
                         "file needs its own name")
    return t


def _npy_bytes(arr: Any) -> bytes:
    """The bytes np.save writes for arr (np.save is the reference)."""
    import io
    b = io.BytesIO()
    _np().save(b, arr, allow_pickle=False)
    return b.getvalue()


def _fsync_dir(d: str) -> None:
    fd = _os.open(d, _os.O_RDONLY | _os.O_DIRECTORY)
    try:
        _os.fsync(fd)
    finally:
        _os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    """data to path through a temporary name in its directory: written,
    fsynced, renamed, the directory fsynced (npyload-pack's rules): a killed
    write never leaves a partial file under the final name."""
    d = _os.path.dirname(path) or "."
    _os.makedirs(d, exist_ok=True)
    tmp = _os.path.join(d, f".{_os.path.basename(path)}.tmp-{_os.getpid()}-"
                           f"{_threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        _os.fsync(f.fileno())
    _os.replace(tmp, path)
    _fsync_dir(d)


def _finished(path: str, packed: bool, dtype: Any, shape: tuple[int, ...],
              rows: int) -> bool:
    """Whether a finished file for these rows is already at path (or, packed,
    at path + '.zst'): size and header agree (the resume check)."""
    np = _np()
    p = path + ".zst" if packed else path
    if not _os.path.isfile(p):
        return False
    try:
        h = _inspect(p)
    except NpyloadError:
        return False
    want = (rows,) + tuple(shape)
    descr = h.get("value_descr", h["descr"])
    if tuple(h["shape"]) != want or np.dtype(descr) != dtype:
        return False
    if not packed:
        return bool(_os.path.getsize(p) == h["data_offset"] + rows * dtype.itemsize *
                    int(np.prod(shape, dtype=np.int64)))
    return True


class _Progress:
    def __init__(self, total: int | None, enabled: bool) -> None:
        self.total, self.done, self.t0 = total, 0, _time.monotonic()
        self.on = enabled and _sys.stderr.isatty()
        self.last = 0.0

    def add(self, n: int, final: bool = False) -> None:
        self.done += n
        now = _time.monotonic()
        if not self.on or (now - self.last < 0.2 and not final):
            return
        self.last = now
        rate = self.done / max(now - self.t0, 1e-9)
        eta = f", ETA {(self.total - self.done) / rate:.0f} s" if self.total and rate else ""
        of = f"/{self.total}" if self.total else ""
        _sys.stderr.write(f"\rnpyload.write: {self.done}{of} samples, {rate:.0f} samples/s"
                          f"{eta}   ")
        if final:
            _sys.stderr.write("\n")
        _sys.stderr.flush()


def _fingerprint(spec: _Spec, spf: int, templates: dict[str, str], split: str,
                 n: int | None, pack: bool, narrow: bool) -> str:
    d = {"fields": spec.fields, "dtype": {k: spec.dtype[k].str for k in spec.fields},
         "shape": {k: list(spec.shape[k]) for k in spec.fields}, "samples_per_file": spf,
         "layout": templates, "split": split, "samples": n,
         "pack": bool(pack), "narrow": bool(narrow)}
    return _json.dumps(d, sort_keys=True)


def write(source: _SampleSource, out: str | _os.PathLike[str], *, samples_per_file: int = 64,
          layout: str | Mapping[str, str] | None = None, split: str = "train",
          num_workers: int | None = None, pack: bool = False, narrow: bool = False,
          overwrite: bool = False, progress: bool = True) -> dict[str, list[str]]:
    """Writes `source` as NPY shards under `out` and returns the ``fields``
    mapping ``npyload.Loader`` takes (field -> the list of its files, in
    order).

    Parameters
    ----------
    source
        A dict of arrays (field -> array, one sample per row), a
        map-style Dataset (``__len__`` and ``__getitem__`` returning a dict of
        arrays or tensors), or an iterable of such dicts. Field names, dtypes
        and shapes come from sample 0; every sample is checked against them (a
        mismatch raises ValueError naming the sample index, the field and both
        shapes).
    samples_per_file
        Samples per file (the last file may be shorter).
    layout
        A path template (or a mapping field -> template) relative
        to ``out`` with ``{field}``, ``{split}`` and ``{id}`` (the file
        number, e.g. ``{id:04d}``); default ``"{field}/{split}_{id:04d}.npy"``.
        The reference layout is ``{"images": "images/{split}/{split}_{id:04d}.npy",
        "heatmaps": "labels/{split}/{split}_{id:04d}_heatmaps.npy", ...}``.
    split
        The ``{split}`` of the layout (default ``"train"``).
    num_workers
        Threads producing samples (map-style sources) and
        writing files; None: the cores. Files are written in sample order; at
        most ``num_workers`` + 1 files per field are in memory. An iterable is
        consumed by one thread (its order is its own), files are written by
        the others.
    pack, narrow
        ``pack``: each finished file is packed (``npyload.pack``, the C packer
        of ``npyload-pack``) and the ``.npy`` removed; ``narrow``: packed with
        lossless narrowing where the data allow (at most 256 distinct values,
        see ``npyload.pack``), plainly where they do not (implies ``pack``).
    overwrite
        False (default) keeps the files a previous run of the
        same call finished (checked by size and header) and writes the rest:
        an interrupted write (Ctrl-C, kill, crash) resumes with the same call
        and gives the same bytes as an uninterrupted one. A different call
        over the same ``out`` (other fields, shapes, layout...) raises
        ValueError unless ``overwrite=True``, which rewrites every file.
    progress
        A progress line on stderr when it is a terminal.

    Notes
    -----
    Every file goes through a temporary name that is fsynced and renamed
    (npyload-pack's durability rules), so a file under its final name is
    always complete. Writing the same source twice gives identical bytes
    (``np.save``'s, byte for byte).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> out = tempfile.mkdtemp()
    >>> fields = npyload.write({"x": np.zeros((100, 3), np.float32), "y": np.arange(100)},
    ...                        out, samples_per_file=64, progress=False)
    >>> {k: [os.path.relpath(p, out) for p in v] for k, v in fields.items()}
    {'x': ['x/train_0000.npy', 'x/train_0001.npy'], 'y': ['y/train_0000.npy', 'y/train_0001.npy']}
    >>> len(npyload.Loader(fields, batch_size=10))
    10
    """
    np = _np()
    out = _os.fspath(out)
    spf = _int_arg("samples_per_file", samples_per_file, 1, maximum=2 ** 31,
                   what="samples per file")
    nw = _int_arg("num_workers", num_workers, 1, allow_none=True, maximum=256,
                  what="threads") or max(1, _os.cpu_count() or 1)
    pack = bool(pack) or bool(narrow)
    src = _Source(source)
    if src.n == 0:
        raise ValueError("write: the source has no samples")

    # Sample 0 fixes the fields; iterables are consumed from here on.
    first = _sample_dict(src.get(0) if src.kind != "iterable" else next(src.it), 0)
    spec = _Spec(first)
    templates = {k: _template(layout, k) for k in spec.fields}

    def paths_of(field: str, fid: int) -> str:
        return _os.path.join(out, templates[field].format(field=field, split=split, id=fid))

    names = {paths_of(k, 0) for k in spec.fields}
    if len(names) != len(spec.fields):
        raise ValueError("write: the layout gives two fields the same file name")
    _os.makedirs(out, exist_ok=True)
    state = _os.path.join(out, _STATE.format(split=split))
    fp = _fingerprint(spec, spf, templates, split, src.n, pack, narrow)
    if _os.path.exists(state) and not overwrite:
        with open(state) as f:
            if f.read() != fp:
                raise ValueError(f"write: {out} holds files of a different write (see "
                                 f"{state}); overwrite=True replaces them")
    _write_atomic(state, fp.encode())

    bar = _Progress(src.n, progress)
    files: dict[str, list[str]] = {k: [] for k in spec.fields}

    def store(fid: int, rows: list[dict[str, Any]]) -> None:
        """Writes file fid of every field from rows (a list of sample dicts)."""
        for k in spec.fields:
            p = paths_of(k, fid)
            # np.stack may return the native byte order: keep the source's dtype
            arr = np.stack([r[k] for r in rows]).astype(spec.dtype[k], copy=False) \
                if rows else np.empty((0,) + spec.shape[k], spec.dtype[k])
            _write_atomic(p, _npy_bytes(np.ascontiguousarray(arr)))
            if pack:
                _pack_one(p, narrow)

    def finished(fid: int, rows: int) -> bool:
        return not overwrite and all(
            _finished(paths_of(k, fid), pack, spec.dtype[k], spec.shape[k], rows)
            for k in spec.fields)

    def note(fid: int) -> None:
        for k in spec.fields:
            files[k].append(paths_of(k, fid) + (".zst" if pack else ""))

    with _Pool(max_workers=nw) as pool:
        if src.kind == "iterable":
            _write_stream(src, first, spec, spf, pool, nw, store, finished, note, bar)
        else:
            _write_indexed(src, first, spec, spf, pool, nw, store, finished, note, bar)
    bar.add(0, final=True)
    _tidy(files, pack, state)
    return files


def _tidy(files: dict[str, list[str]], pack: bool, state: str) -> None:
    """Leftovers of an interrupted run: temporary files of ours (of the data
    files and of the call's fingerprint file `state`), and .npy files whose
    packed twin is finished."""
    import glob as _glob

    def remove_temps(final: str) -> None:
        d, base = _os.path.split(final)
        for t in _glob.glob(_os.path.join(_glob.escape(d or "."),
                                          "." + _glob.escape(base) + ".tmp-*")):
            _os.unlink(t)
    remove_temps(state)
    for paths in files.values():
        for p in paths:
            npy = p[:-4] if pack else p
            remove_temps(npy)
            if pack and _os.path.exists(npy) and _os.path.exists(p):
                _os.unlink(npy)


def _pack_one(path: str, narrow: bool) -> None:
    if narrow:
        try:
            _pack(path, narrow=True, force=True, remove=True)
            return
        except NpyloadError as e:
            if "narrow" not in str(e):
                raise
    _pack(path, force=True, remove=True)


def _write_indexed(src: _Source, first: dict[str, Any], spec: _Spec, spf: int, pool: _Pool,
                   nw: int, store: _Store, finished: _Finished, note: _Note,
                   bar: _Progress) -> None:
    """Map-style sources: file fid holds samples [fid*spf, ...); samples are
    produced by the pool, files written in order, at most nw in flight."""
    n = src.n
    assert n is not None
    nfiles = (n + spf - 1) // spf

    def produce(i: int) -> dict[str, Any]:
        s = first if i == 0 else _sample_dict(src.get(i), i)
        spec.check(s, i)
        return s

    def one(fid: int) -> int:
        lo, hi = fid * spf, min(n, (fid + 1) * spf)
        if finished(fid, hi - lo):
            return hi - lo
        rows = [produce(i) for i in range(lo, hi)]
        store(fid, rows)
        return hi - lo

    pending: list[Future[int]] = []
    for fid in range(nfiles):
        pending.append(pool.submit(one, fid))
        note(fid)
        if len(pending) >= nw:
            bar.add(pending.pop(0).result())
    for f in pending:
        bar.add(f.result())


def _write_stream(src: _Source, first: dict[str, Any], spec: _Spec, spf: int, pool: _Pool,
                  nw: int, store: _Store, finished: _Finished, note: _Note,
                  bar: _Progress) -> None:
    """Iterables: one thread (this one) consumes the source in order; full
    files are handed to the pool (at most nw in flight). A file finished by
    an earlier run is skipped after its samples are consumed (the iterable
    must give the same samples again: resume needs a deterministic source)."""
    rows, fid, i = [first], 0, 1
    pending: list[Future[int]] = []

    def flush(rows: list[dict[str, Any]], fid: int) -> Future[int]:
        note(fid)
        k = len(rows)
        if finished(fid, k):
            return pool.submit(lambda: k)

        def write_file() -> int:
            store(fid, rows)
            return k
        return pool.submit(write_file)

    for s in src.it:
        s = _sample_dict(s, i)
        spec.check(s, i)
        rows.append(s)
        i += 1
        if len(rows) == spf:
            pending.append(flush(rows, fid))
            rows, fid = [], fid + 1
            if len(pending) >= nw:
                bar.add(pending.pop(0).result())
    if rows:
        pending.append(flush(rows, fid))
    for f in pending:
        bar.add(f.result())
