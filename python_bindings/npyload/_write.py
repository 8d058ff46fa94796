"""Writing datasets: any source of samples -> NPY shards that npyload.Loader
reads (npyload.write), in parallel, resumable and deterministic."""
from __future__ import annotations

import hashlib as _hashlib
import json as _json
import os as _os
import sys as _sys
import threading as _threading
import time as _time
from collections import deque
from functools import partial as _partial
from itertools import chain as _chain
from collections.abc import Mapping as _Mapping
from concurrent.futures import ThreadPoolExecutor as _Pool
from typing import TYPE_CHECKING, Any

from . import _manifest
from ._npyload import NpyloadError, __version__ as _version, inspect as _inspect
from ._options import _int_arg
from ._pack import pack as _pack
from ._write_store import FOREIGN as _FOREIGN, JOURNAL as _JOURNAL, Entry as _Entry, \
    LocalStore as _LocalStore

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from concurrent.futures import Future
    from typing import Callable, Protocol, Union

    class _Dataset(Protocol):
        """A map-style dataset (torch.utils.data.Dataset's protocol): samples
        by index, each a mapping from field name to array or tensor."""
        def __len__(self) -> int: ...
        def __getitem__(self, index: int, /) -> Mapping[str, Any]: ...

    _SampleSource = Union[Mapping[str, Any], _Dataset, Iterable[Mapping[str, Any]]]

_DEFAULT_LAYOUT = "{field}/{split}_{id:04d}.npy"


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
        ray_data = _sys.modules.get("ray.data")   # never imported here: a Dataset means it is
        if ray_data is not None and isinstance(source, ray_data.Dataset):
            from ._write_ray import RaySource
            self.kind, self.ray, self.n = "ray", RaySource(source), None
        elif isinstance(source, _Mapping):
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
        for k in self.fields:
            if not isinstance(k, str) or not k or "\0" in k:
                raise ValueError(f"write: sample 0 has the field name {k!r}: field names "
                                 "are non-empty strings")
        self.dtype = {k: v.dtype for k, v in first.items()}
        self.shape = {k: v.shape for k, v in first.items()}
        _check_dtypes(first)

    def check(self, s: dict[str, Any], i: int) -> None:
        if list(s) != self.fields:
            raise ValueError(f"write: sample {i} has fields {list(s)}, sample 0 had "
                             f"{self.fields}")
        for k, v in s.items():
            if v.shape != self.shape[k] or v.dtype != self.dtype[k]:
                raise ValueError(f"write: sample {i}, field {k!r}: {v.dtype.str} "
                                 f"{v.shape}, sample 0 had {self.dtype[k].str} "
                                 f"{self.shape[k]}")


def _check_dtypes(first: dict[str, Any]) -> None:
    """Refuses, at sample 0, a dtype that Loader refuses: the header of each
    field (no rows) goes through the library's own header parser, so the
    rules are the C library's, not a copy."""
    import tempfile
    np = _np()
    with tempfile.TemporaryDirectory(prefix="npyload-write-") as d:
        for i, (k, v) in enumerate(first.items()):
            p = _os.path.join(d, f"{i}.npy")
            np.save(p, np.empty((0,) + v.shape, v.dtype), allow_pickle=False)
            try:
                _inspect(p)
            except NpyloadError as e:
                why = str(e).split(": ", 2)[-1] if str(e).startswith(p) else str(e)
                raise TypeError(f"write: sample 0, field {k!r}: {why}; npyload.Loader "
                                "cannot read it (store numbers: e.g. codes or "
                                "int64 timestamps)") from None


def _template(layout: str | Mapping[str, str] | None, field: str) -> str:
    t = (layout or {}).get(field, _DEFAULT_LAYOUT) if isinstance(layout, _Mapping) \
        else (layout or _DEFAULT_LAYOUT)
    if not isinstance(t, str):
        raise TypeError(f"write: layout for {field!r} must be a str, got {type(t).__name__}")
    if "{id" not in t:
        raise ValueError(f"write: layout for {field!r} ({t!r}) has no {{id}}: every "
                         "file needs its own name")
    return t


class _Names:
    """Relative file names from the layout: always inside `out` (no absolute
    path, no '..', never the writer's own journal or lock), and never one
    name for two files (checked for every file id, not only the first)."""

    def __init__(self, out: str, templates: dict[str, str], split: str) -> None:
        self.out, self.templates, self.split = out, templates, split
        self.seen: dict[str, tuple[str, int]] = {}

    def rel(self, field: str, fid: int) -> str:
        t = self.templates[field]
        try:
            r = t.format(field=field, split=self.split, id=fid)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"write: layout {t!r} for {field!r}: {type(e).__name__}: {e} "
                             "(it may use {field}, {split} and {id})") from None
        n = _os.path.normpath(r) if r else ""
        parts = n.split(_os.sep)
        if (not n or n == "." or _os.path.isabs(r) or ".." in r.split("/") or
                ".." in parts or parts[-1].startswith(".npyload-write") or
                n.endswith(_manifest.SUFFIX)):
            raise ValueError(f"write: layout {t!r} with field {field!r} and split "
                             f"{self.split!r} gives {r!r}, which is not a file name inside "
                             f"{self.out}")
        return n

    def claim(self, field: str, fid: int) -> str:
        """rel(field, fid), refused when another (field, file) has that name."""
        r = self.rel(field, fid)
        other = self.seen.setdefault(r, (field, fid))
        if other != (field, fid):
            raise ValueError(f"write: the layout gives field {field!r} file {fid} and field "
                             f"{other[0]!r} file {other[1]} the same name {r!r}")
        return r


def encode(arr: Any, dtype: Any) -> tuple[str, bytes]:
    """(sha256, NPY bytes) of one file of one field: the rows of arr, in
    the source's dtype (np.stack and Arrow may give the native byte
    order), as np.save writes them. Every writer (threads, Ray tasks) goes
    through here, so their files are byte for byte the same."""
    data = _npy_bytes(_np().ascontiguousarray(arr.astype(dtype, copy=False)))
    return _hashlib.sha256(data).hexdigest(), data


def _npy_bytes(arr: Any) -> bytes:
    """The bytes np.save writes for arr (np.save is the reference)."""
    import io
    b = io.BytesIO()
    _np().save(b, arr, allow_pickle=False)
    return b.getvalue()


class _Progress:
    """What the writer tells on stderr when progress is on: a progress line
    redrawn in place (on a terminal only), and notes, a line each (resume:
    which files a previous run finished and this one keeps). The rate
    counts only the samples this run wrote, not those of kept files."""

    def __init__(self, total: int | None, enabled: bool) -> None:
        self.total, self.done, self.wrote, self.t0 = total, 0, 0, _time.monotonic()
        self.enabled = enabled
        self.on = enabled and _sys.stderr.isatty()
        self.last = 0.0

    def add(self, n: int, wrote: bool = True, final: bool = False) -> None:
        """n more samples: written by this run (wrote) or kept."""
        self.done += n
        self.wrote += n if wrote else 0
        now = _time.monotonic()
        if not self.on or (now - self.last < 0.2 and not final):
            return
        self.last = now
        took = max(now - self.t0, 1e-9)
        rate = self.wrote / took
        of = f"/{self.total}" if self.total else ""
        kept = f" ({self.done - self.wrote} kept)" if self.done > self.wrote else ""
        if final:
            _sys.stderr.write(f"\rnpyload.write: {self.done}{of} samples{kept}; wrote "
                              f"{self.wrote} in {took:.2f} s, {rate:.0f} samples/s   \n")
        else:
            eta = f", ETA {(self.total - self.done) / rate:.0f} s" \
                if self.total and rate else ""
            _sys.stderr.write(f"\rnpyload.write: {self.done}{of} samples{kept}, "
                              f"{rate:.0f} samples/s written{eta}   ")
        _sys.stderr.flush()

    def say(self, line: str) -> None:
        """A note, on its own line (terminal or not)."""
        if self.enabled:
            _sys.stderr.write(f"npyload.write: {line}\n")
            _sys.stderr.flush()


def _fingerprint(spec: _Spec, spf: int, templates: dict[str, str], split: str,
                 pack: bool, narrow: bool) -> str:
    d = {"fields": spec.fields, "dtype": {k: spec.dtype[k].str for k in spec.fields},
         "shape": {k: list(spec.shape[k]) for k in spec.fields}, "samples_per_file": spf,
         "layout": templates, "split": split, "pack": bool(pack), "narrow": bool(narrow)}
    return _json.dumps(d, sort_keys=True)


def _differences(old: str, new: str) -> str:
    try:
        a, b = _json.loads(old), _json.loads(new)
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        return ", ".join(f"{k}: {a.get(k)!r} there, {b.get(k)!r} now" for k in keys)
    except (ValueError, AttributeError):
        return "unreadable"


def write(source: _SampleSource, out: str | _os.PathLike[str], *, samples_per_file: int = 64,
          layout: str | Mapping[str, str] | None = None, split: str = "train",
          num_workers: int | None = None, pack: bool = False, narrow: bool = False,
          overwrite: bool = False, progress: bool = True,
          remote: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
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
        shapes). A dtype ``Loader`` cannot read (strings, datetime64,
        structured, object...) is refused at sample 0, by the library's own
        header rules.

        A ``ray.data.Dataset`` whose rows are such dicts is written by Ray
        tasks on the cluster (``pip install 'npyload[ray]'``; npyload
        installed on every node): the same files, byte for byte, as this
        writer gives for the same rows, whatever the nodes, workers and
        blocks. File k holds rows [k*S, (k+1)*S) of the dataset's order:
        the dataset is run with Ray Data's ``preserve_order`` (on a copy:
        the caller's dataset is not changed) and the row counts of its
        blocks, in order, give each row's index. One task per file (1 CPU)
        writes it atomically and returns its facts; only this process
        keeps the journal and the manifest, so a task that Ray retries
        after its worker died leaves the same files. A local ``out`` must be
        a filesystem every node mounts at the same path; ``s3://`` needs
        nothing shared. As for an iterable, the length is known only at the
        end, so each file's name is checked when the file comes.
    samples_per_file
        Samples per file (the last file may be shorter).
    layout
        A path template (or a mapping field -> template) relative
        to ``out`` with ``{field}``, ``{split}`` and ``{id}`` (the file
        number, e.g. ``{id:04d}``); default ``"{field}/{split}_{id:04d}.npy"``.
        The reference layout is ``{"images": "images/{split}/{split}_{id:04d}.npy",
        "heatmaps": "labels/{split}/{split}_{id:04d}_heatmaps.npy", ...}``.
        Every name must stay inside ``out`` (no absolute path, no ``..``,
        no symbolic link leading out) and name one file only (ValueError).
    split
        The ``{split}`` of the layout (default ``"train"``).
    num_workers
        Threads producing samples (map-style sources) and
        writing files; None: the cores. Files are written in sample order; at
        most ``num_workers`` + 1 files per field are in memory. An iterable is
        consumed by one thread (its order is its own), files are written by
        the others. A Ray dataset: the Ray tasks in flight at once (None:
        the cluster's CPUs).
    pack, narrow
        ``pack``: each finished file is packed (``npyload.pack``, the C packer
        of ``npyload-pack``) and the ``.npy`` removed; ``narrow``: packed with
        lossless narrowing where the data allow (at most 256 distinct values,
        see ``npyload.pack``), plainly where they do not (implies ``pack``).
    overwrite
        False (default): resume. A file a previous run of the same call
        finished is kept when the new data for it are the same (the sha256
        of its NPY bytes, recorded when it was written, equals the new one's)
        and the file is as written (size, inode, mtime); the rest is written.
        An interrupted write (Ctrl-C, kill, crash) resumes with the same call
        and gives the same bytes as an uninterrupted one. Data that differ,
        another call over the same split (other fields, shapes, layout...),
        another sample count than a completed write, or files of another
        split's write at this write's names (a layout without ``{split}``)
        raise ValueError and change nothing. True: the split's previous
        write is removed first (every file the writer made for it, also those
        a shorter rewrite would not replace), as is any other split's write
        whose names this write takes; then every file is written.
        Either way, a file the writer did not make (not in its journal,
        ``out/.npyload-write.journal``) is never replaced, removed or adopted:
        ValueError names it.
    progress
        A progress line on stderr when it is a terminal.
    remote
        For ``out="s3://bucket/prefix"``: ``Loader``'s ``remote=`` mapping
        (endpoint, region, credentials...); without it the AWS environment
        and ``~/.aws``, as for reading. Needs boto3
        (``pip install npyload[s3]``); objects of 64 MiB and more go up in parts. Each
        object carries the writer's facts in its metadata (who made it, the
        sha256 of its data), which resume and the ownership rule read;
        there is no lock on object storage (one writer per prefix).

    Notes
    -----
    Last, the split's manifest is written beside the files
    (``OUT/SPLIT.manifest.json``: fields, dtype, per-sample shape, the files
    in order with their samples, sizes and sha256, the writer's version);
    ``npyload.Loader("OUT/train.manifest.json", ...)`` opens it without
    listing and checks every file's size at start. A write that changes
    anything removes the split's manifest first.

    Every file goes through a temporary name that is fsynced and renamed
    (npyload-pack's durability rules), so a file under its final name is
    always complete; a failed write (a full disk) leaves no temporary file.
    Writing the same source twice gives identical bytes (``np.save``'s,
    byte for byte). One writer at a time per ``out``: a second raises
    BlockingIOError naming the one that holds ``out/.npyload-write.lock``.

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
    return _write(_Report(), source, out, samples_per_file=samples_per_file, layout=layout,
                  split=split, num_workers=num_workers, pack=pack, narrow=narrow,
                  overwrite=overwrite, progress=progress, remote=remote)


class _Report:
    """What a write has done so far, for npyload-write's own messages (the
    line an interrupted run ends with): its plan once made, None before."""

    def __init__(self) -> None:
        self.plan: _Plan | None = None
        self.nfiles: int | None = None   # the files of the write, when known

    def changed(self) -> bool:
        """Whether the write changed anything in out (with overwrite, the
        previous write is gone from then on: a resume must not overwrite)."""
        return self.plan is not None and self.plan._begun

    def finished(self) -> int:
        return self.plan.finished() if self.plan is not None else 0


def _write(report: _Report, source: _SampleSource, out: str | _os.PathLike[str], *,
           samples_per_file: int, layout: str | Mapping[str, str] | None, split: str,
           num_workers: int | None, pack: bool, narrow: bool, overwrite: bool,
           progress: bool, remote: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """write(), telling `report` what it has done as it goes."""
    out_s: str = _os.fspath(out)
    out = out_s
    spf = _int_arg("samples_per_file", samples_per_file, 1, maximum=2 ** 31,
                   what="samples per file")
    nw = _int_arg("num_workers", num_workers, 1, allow_none=True, maximum=256,
                  what="threads") or max(1, _os.cpu_count() or 1)
    pack = bool(pack) or bool(narrow)
    if not isinstance(split, str) or not split or "\0" in split:
        raise ValueError(f"write: split must be a non-empty str, got {split!r}")
    src = _Source(source)
    if src.n == 0:
        raise ValueError("write: the source has no samples")

    # Sample 0 fixes the fields; iterables are consumed from here on.
    if src.kind == "iterable":
        try:
            s0 = next(src.it)
        except StopIteration:
            raise ValueError("write: the source has no samples") from None
    elif src.kind == "ray":
        s0 = src.ray.first()
    else:
        s0 = src.get(0)
    first = _sample_dict(s0, 0)
    spec = _Spec(first)
    templates = {k: _template(layout, k) for k in spec.fields}
    names = _Names(out, templates, split)
    if src.n is not None:   # every name, before anything is touched
        for fid in range((src.n + spf - 1) // spf):
            for k in spec.fields:
                names.claim(k, fid)
    else:
        for k in spec.fields:
            names.claim(k, 0)
    store: Any
    if out.lower().startswith("s3://"):
        from ._write_s3 import S3Store
        store = S3Store(out_s, remote)
        names.out = store.out
    elif remote is not None:
        raise ValueError(f"write: remote= applies to out='s3://...', not {out!r}")
    else:
        store = _LocalStore(out)
    store.open()
    try:
        plan = _Plan(store, spec, names, split, overwrite, pack, narrow,
                     _fingerprint(spec, spf, templates, split, pack, narrow))
        plan.start(src.n)
        report.plan = plan
        report.nfiles = None if src.n is None else (src.n + spf - 1) // spf
        if src.n is not None:   # a user's file anywhere is refused before any write
            for fid in range((src.n + spf - 1) // spf):
                plan.claim(fid)
        bar = _Progress(src.n, progress)
        if plan.previous:
            of = f" of {report.nfiles}" if report.nfiles is not None else ""
            article = "an" if plan.previous == "interrupted" else "a"
            bar.say(f"{out} holds {article} {plan.previous} write of split {split!r}: "
                    f"{plan.finished()}{of} files finished, kept where their data are "
                    "the same")
        if src.kind == "ray":
            nfiles, samples = src.ray.run(plan, spf, num_workers, bar)
        else:
            with _Pool(max_workers=nw) as pool:
                if src.kind == "iterable":
                    jobs = _stream_jobs(src, first, spec, spf, plan)
                else:
                    jobs = _indexed_jobs(src, first, spec, spf)
                nfiles, samples = plan.run(jobs, pool, nw, bar)
        bar.add(0, final=True)
        fields = plan.finish(nfiles, samples)
        if plan.kept_note():
            bar.say(plan.kept_note())
        return fields
    finally:
        store.close()


def _indexed_jobs(src: _Source, first: dict[str, Any], spec: _Spec,
                  spf: int) -> Iterator[tuple[int, Callable[[], list[dict[str, Any]]]]]:
    """Map-style sources: file fid holds samples [fid*spf, ...), produced by
    the pool's thread that writes the file."""
    n = src.n
    assert n is not None

    def produce(i: int) -> dict[str, Any]:
        s = first if i == 0 else _sample_dict(src.get(i), i)
        spec.check(s, i)
        return s

    for fid in range((n + spf - 1) // spf):
        lo, hi = fid * spf, min(n, (fid + 1) * spf)
        yield fid, _partial(lambda a, b: [produce(i) for i in range(a, b)], lo, hi)


def _stream_jobs(src: _Source, first: dict[str, Any], spec: _Spec, spf: int,
                 plan: _Plan) -> Iterator[tuple[int, Callable[[], list[dict[str, Any]]]]]:
    """Iterables: this thread consumes the source in order; a full file's
    rows are handed over as they are."""
    rows: list[dict[str, Any]] = []
    fid = 0
    for i, s in enumerate(_chain([first], src.it)):
        if i:
            s = _sample_dict(s, i)
            spec.check(s, i)
        rows.append(s)
        if len(rows) == spf:
            yield fid, _partial(list, rows)
            rows, fid = [], fid + 1
    if rows:
        yield fid, _partial(list, rows)


class _Plan:
    """What this call does with each file, decided against the store: write
    it, keep it (resume: the same data, intact), or refuse; and, at the end,
    what of the split's previous write goes."""

    def __init__(self, store: Any, spec: _Spec, names: _Names, split: str,
                 overwrite: bool, pack: bool, narrow: bool, fp: str) -> None:
        self.store, self.spec, self.names, self.split = store, spec, names, split
        self.overwrite, self.pack, self.narrow, self.fp = overwrite, pack, narrow, fp
        self.old_samples: int | None = None
        self.old_nfiles = 0
        self.last_checked = -1   # files up to this one are only checked until all are
        self.claimed: dict[int, list[tuple[str, str]]] = {}
        self.to_drop: set[str] = set()     # other splits' writes whose names we take
        self.kept: dict[str, list[int]] = {k: [] for k in spec.fields}   # resume
        self.previous = ""   # "complete" / "interrupted": a previous write to resume
        self._begun = False
        self._mu = _threading.Lock()
        self.manifest = _manifest.name(split)

    def where(self, rel: str) -> str:
        return _os.path.join(self.names.out, rel)

    def _drop(self, split: str) -> None:
        """Removes every file of split's write, then forgets it."""
        rec = self.store.records.get(split)
        if rec is not None:
            for e in list(rec.files.values()):
                self.store.remove(e)
        self.store.drop(split)

    def start(self, n: int | None) -> None:
        """Checks this call against the split's previous write; changes
        nothing (a refused call leaves out as it was)."""
        rec = self.store.records.get(self.split)
        out = self.names.out
        if self.store.entry(self.manifest) == _FOREIGN:
            raise ValueError(f"write: {self.where(self.manifest)} exists and was not made by "
                             "npyload.write: the writer puts the split's manifest there; "
                             "move it away")
        if rec is not None and not self.overwrite:
            if rec.spec and rec.spec != self.fp:
                raise ValueError(f"write: {out} holds a different write of split "
                                 f"{self.split!r} ({_differences(rec.spec, self.fp)}); "
                                 "overwrite=True replaces it")
            if rec.samples is not None and n is not None and n != rec.samples:
                raise ValueError(f"write: {out} holds a completed write of split "
                                 f"{self.split!r} of {rec.samples} samples; the source has "
                                 f"{n}: overwrite=True replaces it")
            self.old_samples = rec.samples
            kept = [e.fid for e in rec.files.values() if not e.pending]
            self.last_checked = max(kept, default=-1)
            if kept:
                self.previous = "interrupted" if rec.samples is None else "complete"
            self.old_nfiles = max((e.fid + 1 for e in rec.files.values()), default=0)

    def _begin(self) -> None:
        """Before the first change this call makes: with overwrite=True the
        split's previous write goes (and other splits' writes whose names it
        takes), then the split's record is started."""
        with self._mu:
            if self._begun:
                return
            m = self.store.entry(self.manifest)
            if isinstance(m, _Entry):   # written last, gone first: never a half-changed write
                self.store.remove(m)
            if self.overwrite and self.split in self.store.records:
                self._drop(self.split)
            for other in sorted(self.to_drop):
                self._drop(other)
            self.to_drop.clear()
            rec = self.store.records.get(self.split)
            if rec is None or rec.spec != self.fp or rec.samples is not None:
                self.store.begin(self.split, self.fp)
            self._begun = True

    def claim(self, fid: int) -> list[tuple[str, str]]:
        """(field, relative name) of file fid for every field, in the
        consumer's thread before any of them is written: a name taken twice,
        a file the writer did not make, or another split's file is refused
        (another split's write is removed first with overwrite=True)."""
        if fid in self.claimed:
            return self.claimed[fid]
        out = []
        for k in self.spec.fields:
            rel = self.names.claim(k, fid)
            final = rel + ".zst" if self.pack else rel
            e = self.store.entry(final)
            twin = self.store.entry(rel) if self.pack and e is None else None
            for p, x in ((final, e), (rel, twin)):
                if x == _FOREIGN:
                    raise ValueError(
                        f"write: {self.where(p)} exists and was not made by npyload.write "
                        f"(it is not in {self.where(_JOURNAL)}); the writer never replaces "
                        "or adopts a file it did not make: move it away, or write to "
                        "another out or layout")
                if isinstance(x, _Entry) and x.split != self.split:
                    if not self.overwrite:
                        raise ValueError(
                            f"write: {self.where(p)} belongs to the write of split "
                            f"{x.split!r} in {self.names.out} (the layout "
                            f"{self.names.templates[k]!r} gives both splits the same "
                            "names); put {split} in the layout, or overwrite=True to "
                            "replace that write")
                    self.to_drop.add(x.split)
                    if self._begun:
                        self._drop(x.split)
            out.append((k, rel))
        self.claimed[fid] = out
        if self.old_samples is not None and fid >= self.old_nfiles:
            raise ValueError(f"write: {self.names.out} holds a completed write of split "
                             f"{self.split!r} of {self.old_samples} samples; the source has "
                             "more: overwrite=True replaces it")
        return out

    def _keep(self, fid: int, k: str, rel: str, content: str) -> bool:
        """True to keep the file at rel as it is (resume), False to write it;
        ValueError when it holds other data of this split's write."""
        e = self.store.entry(rel + ".zst" if self.pack else rel)
        if not isinstance(e, _Entry) or e.pending:
            return False
        if e.content != content or e.fid != fid or e.field != k:
            raise ValueError(
                f"write: {self.where(e.path)} holds other data than file {fid} of field "
                f"{k!r} of this source (its recorded sha256 differs): {self.names.out} holds a "
                f"different write of split {self.split!r}; overwrite=True replaces it")
        if not self.store.intact(e):
            return False
        with self._mu:
            self.kept[k].append(fid)
        return True

    def finished(self) -> int:
        """How many files of this write are finished for every field, as the
        journal has it (what a resume keeps when the data are the same)."""
        rec = self.store.records.get(self.split)
        if rec is None or rec.spec != self.fp:
            return 0
        done: dict[int, int] = {}
        for e in rec.files.values():
            if not e.pending and e.fid >= 0:
                done[e.fid] = done.get(e.fid, 0) + 1
        return sum(1 for c in done.values() if c == len(self.spec.fields))

    def kept_note(self) -> str:
        """Which files this call kept from the previous write, e.g. "kept
        the interrupted write's files 0-11 of images, labels (12 per
        field): ..."; "" when none."""
        runs = {k: _ranges(sorted(v)) for k, v in self.kept.items() if v}
        if not runs:
            return ""
        counts = {len(v) for v in self.kept.values()}
        if len(set(runs.values())) == 1 and len(runs) == len(self.kept):
            which = (f"files {next(iter(runs.values()))} of {', '.join(runs)} "
                     f"({counts.pop()} per field)")
        else:
            which = "; ".join(f"{k} files {r}" for k, r in runs.items())
        return (f"kept the {self.previous} write's {which}: its journal "
                f"{self.where(_JOURNAL)} lists them and their data are the same")

    def shard(self, fid: int, fields: list[tuple[str, str]],
              make: Callable[[], list[dict[str, Any]]]) -> tuple[int, list[Any] | None]:
        """Produces file fid's rows, serialises each field and writes what is
        not kept. A file up to `last_checked` is only checked: what it needs
        written is returned and written once every such file has been
        checked, so that data that differ are refused before anything is
        written."""
        np = _np()
        rows = make()
        todo = []
        for k, rel in fields:
            content, data = encode(np.stack([r[k] for r in rows]), self.spec.dtype[k])
            if not self.overwrite and self._keep(fid, k, rel, content):
                continue
            todo.append((k, rel, content, data))
        if todo and fid <= self.last_checked:
            return len(rows), [(fid, todo, len(rows))]
        if todo:
            self.put(fid, todo)
        return len(rows), [] if todo else None

    def packer(self) -> Callable[[str], None] | None:
        """What packs a written .npy (picklable: Ray tasks run it), or None."""
        return _partial(_pack_one, narrow=self.narrow) if self.pack else None

    def put(self, fid: int, todo: list[tuple[str, str, str, bytes]]) -> None:
        self._begin()
        packer = self.packer()
        for k, rel, content, data in todo:
            self.store.put(rel, self.split, fid, k, content, data, packer)

    def run(self, jobs: Iterator[tuple[int, Callable[[], list[dict[str, Any]]]]],
            pool: _Pool, nw: int, bar: _Progress) -> tuple[int, int]:
        """Every file through the pool, in order, at most nw in flight.
        Returns (files, samples). A file to write among those a previous
        run finished is held until every one of them is checked (shard)."""
        inflight: deque[tuple[int, Future[tuple[int, list[Any] | None]]]] = deque()
        held: list[Any] = []
        nfiles = samples = 0

        def done_one() -> None:
            nonlocal samples
            fid, fut = inflight.popleft()
            count, later = fut.result()
            samples += count
            bar.add(count, wrote=later == [])
            held.extend(later or [])
            if fid >= self.last_checked and held:
                for h, f in [(h, pool.submit(self.put, h[0], h[1])) for h in held]:
                    f.result()
                    bar.wrote += h[2]
                held.clear()

        try:
            for fid, make in jobs:
                fields = self.claim(fid)
                inflight.append((fid, pool.submit(self.shard, fid, fields, make)))
                nfiles = fid + 1
                if len(inflight) >= nw:
                    done_one()
            while inflight:
                done_one()
        except BaseException:
            for _, f in inflight:
                f.cancel()
            raise
        if self.old_samples is not None and samples != self.old_samples:
            raise ValueError(f"write: {self.names.out} holds a completed write of split "
                             f"{self.split!r} of {self.old_samples} samples; the source has "
                             f"{samples}: overwrite=True replaces it")
        for h in held:
            self.put(h[0], h[1])
            bar.wrote += h[2]
        return nfiles, samples

    def finish(self, nfiles: int, samples: int) -> dict[str, list[str]]:
        """The split's previous files beyond this write's go (the writer's
        own only), leftovers are tidied, the write is recorded complete."""
        self._begin()
        rec = self.store.records[self.split]
        for e in list(rec.files.values()):
            if e.fid >= nfiles:
                self.store.remove(e)
        files: dict[str, list[str]] = {k: [] for k in self.spec.fields}
        listed: dict[str, list[tuple[str, int, int, str]]] = {k: [] for k in self.spec.fields}
        spf = _json.loads(self.fp)["samples_per_file"]
        for fid in range(nfiles):
            for k in self.spec.fields:
                rel = self.names.rel(k, fid)
                self.store.tidy(rel, self.pack)
                final = rel + (".zst" if self.pack else "")
                files[k].append(self.where(final))
                e = rec.files[final]
                listed[k].append((final.replace(_os.sep, "/"),
                                  min(spf, samples - fid * spf), e.size, e.sha256))
        fields = {k: {"dtype": self.spec.dtype[k].str, "shape": list(self.spec.shape[k]),
                      "packed": self.pack} for k in self.spec.fields}
        data = _manifest.build(self.split, samples, spf, fields, listed, _version)
        self.store.put(self.manifest, self.split, -1, "", _hashlib.sha256(data).hexdigest(),
                       data, None)
        self.store.complete(self.split, samples)
        return files


def _pack_one(path: str, narrow: bool) -> None:
    if narrow:
        try:
            _pack(path, narrow=True, force=True, remove=True)
            return
        except NpyloadError as e:
            if "narrow" not in str(e):
                raise
    _pack(path, force=True, remove=True)


def _ranges(ids: list[int]) -> str:
    """Sorted file numbers as runs: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out: list[str] = []
    for i in ids:
        if out and int(out[-1].rsplit("-", 1)[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)
