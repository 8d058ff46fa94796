"""Loader: the drop-in for torch.utils.data.DataLoader, and its iterator."""
from __future__ import annotations

import functools as _functools
import os as _os
import threading as _threading
import time as _time
import warnings as _warnings
from collections.abc import Mapping as _Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from . import _habits, _npyload
from ._npyload import cuda_available
from ._transform import Transform
from ._hook import _EOF
from ._options import _EPOCH_MAX
from ._hook import _HookPipe
from ._hook import _LoopClock
from ._hook import _check_hook_workers
from ._hook import _hook_prefetch
from ._hook import _rng_key
from ._options import _INT64_MAX
from ._options import _IO
from ._transform import _TDTYPES
from ._batch import _bfloat16_numpy
from ._options import _dist_rank_world
from ._options import _kernel_paths
from ._options import _env_int
from ._hook import _hook_depth
from ._options import _int_arg
from ._torch import _join_streams
from ._options import _opt_max
from ._options import _parse_device
from ._options import _parse_shuffle
from ._torch import _torch_or_none
from ._batch import _wrap_raw
from . import _habits, _manifest, _remote

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Literal, Protocol, Union

    from typing_extensions import Self
    from typing_extensions import TypeVar as _TypeVarDefault

    from ._batch import Batch, BatchTuple
    from ._npyload import LoaderState, LoaderStats, _Path

    class _TorchDevice(Protocol):
        """torch.device (read through str())."""
        @property
        def type(self) -> str: ...

    _Fields = Union[Mapping[str, Union[_Path, Sequence[_Path]]], _Path]  # or a manifest
    _Shuffle = Union[bool, Literal["full", "local", "none"]]
    _Device = Union[str, int, _TorchDevice, None]
    _IOName = Literal["auto", "uring", "io_uring", "pread", "mmap"]
    _Output = Literal["auto", "torch", "numpy"]
    _Align = Literal["names", "none"]
    _OnError = Literal["raise", "skip"]
    # What iterating a Loader yields: Batch by default, BatchTuple with
    # as_tuple=True, what transform= returns with a hook (see the overloads
    # of Loader.__init__). The default lets `loader: npyload.Loader` mean
    # Loader[Batch].
    _B = _TypeVarDefault("_B", default=Batch)
    _T = TypeVar("_T")
else:
    _B = TypeVar("_B")

# What the next iter() of a Loader runs (Loader._next).
_START = "start"      # epoch Loader._epoch from its first batch
_RESUME = "resume"    # the position load_state_dict() restored
_ADVANCE = "advance"  # epoch Loader._epoch + 1 from its first batch


class _InUse:
    """A Loader's in-use guard: one call at a time. ``with guard("set_epoch()"):``
    runs the body if no call is in progress, else raises RuntimeError naming
    both calls (never waits: an overlap is a bug in the caller). The C object
    has the same guard, with the same message, for its own state; this one
    also keeps the Python-level state (generation counter, hook thread, the C
    object itself, which load_state_dict may replace) whole."""

    __slots__ = ("_mu", "call")

    def __init__(self) -> None:
        self._mu = _threading.Lock()  # held for a few bytecodes only
        self.call: str | None = None

    def __call__(self, call: str) -> _InUse:
        with self._mu:
            busy = self.call
            if busy is None:
                self.call = call
                return self
        raise RuntimeError(f"npyload loader is in use: {call} was called while {busy} is "
                           "running (on another thread, or below this call); calls on one "
                           "loader must not overlap, only stats() and len() may run during "
                           "a next()")

    def __enter__(self) -> _InUse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.call = None


def _field_specs(fields: object) -> list[tuple[str, str | None, list[str] | None]]:
    """[(name, glob or None, paths or None)] from Loader's `fields`."""
    if not isinstance(fields, _Mapping) or len(fields) == 0:
        raise TypeError("fields must be a non-empty mapping from field name "
                        "to a glob string or a list of paths"
                        if not isinstance(fields, _Mapping) else
                        "fields must be a non-empty mapping (got an empty one)")
    specs: list[tuple[str, str | None, list[str] | None]] = []
    for name, spec in fields.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"field names must be non-empty strings, got {name!r}")
        if isinstance(spec, (str, bytes, _os.PathLike)):
            specs.append((name, _os.fsdecode(spec), None))
        elif isinstance(spec, (list, tuple)):
            if not spec:
                raise ValueError(f"field {name!r}: the list of paths is empty")
            paths = []
            for p in spec:
                if not isinstance(p, (str, bytes, _os.PathLike)):
                    raise TypeError(f"field {name!r}: paths must be str, bytes or os.PathLike, got {p!r}")
                paths.append(_os.fsdecode(p))
            specs.append((name, None, paths))
        else:
            raise TypeError(f"field {name!r}: expected a glob string or a list of "
                            f"paths, got {type(spec).__name__}")
    return specs


def _check_counts(batch_size: int, seed: int, num_workers: int | None, prefetch: int | None,
                  window: int, max_errors: int | None,
                  transform: object) -> tuple[int, int, int, int | None, int, int]:
    """The numeric arguments, in Loader's units, against the library's
    limits: num_workers=0 is the library's WORKERS_SYNC, prefetch counts the
    batches ahead of the one the loop holds (slots - 1, or slots - 2 with
    transform=; see _slots_for), window=0 is not "default" here."""
    batch_size = _int_arg("batch_size", batch_size, 1, maximum=_opt_max(
        _npyload.OPT_BATCH_SIZE), what="samples per batch")
    seed = _int_arg("seed", seed, -_INT64_MAX - 1, maximum=_INT64_MAX,
                    what="an int64")
    num_workers = _int_arg("num_workers", num_workers, 0, maximum=_opt_max(
        _npyload.OPT_NUM_WORKERS), what="worker threads; 0 = none, batches "
        "are read inside next()")
    max_slots = _opt_max(_npyload.OPT_PREFETCH)
    if transform is None:
        prefetch = _int_arg("prefetch", prefetch, 1, allow_none=True,
                            maximum=max_slots - 1, what="batches read ahead; the "
                            f"loader has prefetch + 1 slots, at most {max_slots}")
    else:
        prefetch = _int_arg("prefetch", prefetch, 1, allow_none=True,
                            maximum=max_slots - 2, what="batches read ahead; with "
                            f"transform= the loader has prefetch + 2 slots, at most "
                            f"{max_slots}")
    window = _int_arg("window", window, 1, maximum=_opt_max(
        _npyload.OPT_SHUFFLE_WINDOW), what="files per window")
    max_errors = 0 if max_errors is None else _int_arg(
        "max_errors", max_errors, 1, maximum=_opt_max(_npyload.OPT_MAX_ERRORS),
        what="skipped samples; None = no limit")
    return batch_size, seed, num_workers, prefetch, window, max_errors


def _check_choices(shuffle: object, drop_last: object, direct_io: object, read_ahead: object,
                   io: object, device: object, output: object, pin_memory: object,
                   align: object, on_error: object,
                   transform: object) -> tuple[int, int, bool | None]:
    """The other arguments; returns (shuffle mode, device index, pin_memory)."""
    if align not in ("names", "none"):
        raise ValueError(f"align must be 'names' or 'none', got {align!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    shuffle_mode = _parse_shuffle(shuffle)
    if not isinstance(drop_last, (bool, int)):
        raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
    if not isinstance(direct_io, (bool, int)):
        raise TypeError(f"direct_io must be a bool, got {direct_io!r}")
    if not isinstance(read_ahead, (bool, int)):
        raise TypeError(f"read_ahead must be a bool, got {read_ahead!r}")
    if not isinstance(io, str) or io.lower() not in _IO:
        raise ValueError(f"io must be one of 'auto', 'uring', 'pread', 'mmap', got {io!r}")
    dev = _parse_device(device)
    if output not in ("auto", "torch", "numpy"):
        raise ValueError(f"output must be 'auto', 'torch' or 'numpy', got {output!r}")
    if pin_memory not in (None, True, False):
        raise TypeError(f"pin_memory must be None, True or False, got {pin_memory!r}")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be a callable (batch -> anything) or None, "
                        f"got {transform!r}")
    if pin_memory and dev < 0:
        ok, why = cuda_available(0)
        if not ok:
            # DataLoader warns and carries on without pinning; so do we
            # (pinning only speeds up a later copy to a GPU there is none of).
            _warnings.warn(f"npyload: pin_memory=True but CUDA is unusable ({why}); "
                           "the slots stay in pageable memory", RuntimeWarning,
                           stacklevel=3)
            pin_memory = None
    return shuffle_mode, dev, pin_memory


def _resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """rank and world_size: given, else torch.distributed's, else the
    RANK / WORLD_SIZE environment, else 0 of 1."""
    dist = _dist_rank_world()
    if world_size is None:
        world_size = dist[1] if dist else _env_int("WORLD_SIZE")
        world_size = 1 if world_size is None else world_size
    if rank is None:
        rank = dist[0] if dist else _env_int("RANK")
        rank = 0 if rank is None else rank
    world_size = _int_arg("world_size", world_size, 1, maximum=_opt_max(
        _npyload.OPT_WORLD_SIZE), what="ranks")
    rank = _int_arg("rank", rank, 0, maximum=world_size - 1,
                    what=f"below world_size = {world_size}")
    return rank, world_size


def _check_transforms(specs: list[tuple[str, str | None, list[str] | None]],
                      transforms: object) -> list[tuple[str, Transform]]:
    """[(field, Transform)] from Loader's `transforms` mapping."""
    if transforms is None:
        return []
    if not isinstance(transforms, _Mapping):
        raise TypeError("transforms must be a mapping from field name to "
                        f"npyload.Transform, got {type(transforms).__name__}")
    names = [n for n, _, _ in specs]
    out = []
    for name, t in transforms.items():
        if name not in names:
            raise ValueError(f"transforms: no field named {name!r} (fields: "
                             f"{', '.join(names)})")
        if not isinstance(t, Transform):
            raise TypeError(f"transforms[{name!r}] must be an npyload.Transform, "
                            f"got {type(t).__name__}")
        out.append((name, t))
    return out


def _slots_for(prefetch: int, transform: object) -> int:
    """The library's PREFETCH (batch slots) for `prefetch` batches ahead.
    With transform=, the loop body may hold two batches for a moment (the
    previous one and the one just taken from the queue, before the `for`
    rebinds its variable), the queue holds its results, and the thread's
    next() needs a free slot to read into."""
    if transform is None:
        return prefetch + 1
    return _hook_depth(prefetch) + 3


def _epoch_batches(n: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Batches per rank of a full epoch: DistributedSampler's split, then
    DataLoader's batching (the C library's npyl_order_num_batches)."""
    per_rank = n // world_size if drop_last else -(-n // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


class _Iterator:
    __slots__ = ("_loader", "_gen", "_pipe")

    def __init__(self, loader: Loader[Any] | None, gen: int,
                 pipe: _HookPipe | None = None) -> None:
        self._loader = loader
        self._gen = gen
        self._pipe = pipe

    def __iter__(self) -> _Iterator:
        return self

    def _finish(self, ld: Loader[Any], eof: bool) -> None:
        self._loader = None
        if eof:
            if ld._gen == self._gen:
                ld._loop_ended = True  # (see Loader.state_dict)
            ld._len_override = None  # a resumed epoch is over: full epochs again
        if self._pipe is not None:
            self._pipe.stop()
            if ld._pipe is self._pipe:
                ld._pipe = None
            self._pipe = None

    def __next__(self) -> Any:
        ld = self._loader
        if ld is None:
            raise StopIteration
        with ld._in_use("next()"):
            return self._next(ld)

    def _next(self, ld: Loader[Any]) -> Any:
        if ld._gen != self._gen:
            self._finish(ld, False)
            raise RuntimeError("npyload: this iterator was superseded by a newer "
                               "iter(loader), set_epoch() or load_state_dict()")
        if self._pipe is not None:
            ld._live()
            t0 = _time.perf_counter_ns()
            err, out, state = self._pipe.get()
            ld._clock.waited(t0, _time.perf_counter_ns())
            if err is None:
                ld._hook_state = state
                return out
            self._finish(ld, err is _EOF)
            if err is _EOF:
                raise StopIteration
            try:
                raise err
            finally:
                # The traceback holds this frame: a local naming err would
                # make a cycle (err -> traceback -> frame -> err) that keeps
                # the failed batch's slot (err.__cause__ -> fn's frame ->
                # batch) until the cyclic GC runs.
                del err
        raw = ld._c.next()
        if raw is None:
            self._finish(ld, True)
            raise StopIteration
        return ld._wrap(raw)

    def __len__(self) -> int:
        return len(self._loader) if self._loader is not None else 0

    def __del__(self) -> None:
        # `break` out of a loop frees the iterator: stop the hook thread so
        # it neither runs on nor holds slots.
        pipe = self._pipe
        if pipe is not None:
            self._pipe = None
            pipe.stop()


class Loader(Generic[_B]):
    """Batches of NPY fields, read by worker threads into reused slots.

    Parameters
    ----------
    fields : mapping name -> glob string or list of paths
        Paths and globs may be str, bytes or os.PathLike; names that are not
        UTF-8 work as with os.fsencode / os.fsdecode (messages naming such a
        path hold it surrogate-escaped). Each field is the concatenation of its files along the first (sample)
        axis; a glob's matches are sorted lexicographically. All fields must
        hold the same number of samples.
    batch_size : int >= 1
    shuffle : bool or 'full' / 'local' / 'none'
        True = 'full' (a permutation of all samples per epoch, a pure function
        of (seed, epoch)); 'local' permutes files, then samples within windows
        of ``window`` files (for data larger than RAM).
    seed : int
    drop_last : bool
        As DistributedSampler(drop_last) and DataLoader(drop_last) together.
    num_workers : int >= 0
        Worker *threads* (no processes, no copies of the dataset). 0: no
        thread; each batch is read on the calling thread inside ``next()``
        (for debugging, as DataLoader's num_workers=0); same batches.
    prefetch : int >= 1 or None
        Batches read ahead of the one the loop body holds: the loader has
        prefetch + 1 slots (memory = (prefetch + 1) x batch bytes), because a
        ``for b in loader`` loop still holds the previous batch while it asks
        for the next (C's NPYLOAD_OPT_PREFETCH counts those slots:
        prefetch + 1; npyload-bench's column p is that count and its pasted
        python line says prefetch=p-1). None: the library default (npyload_default_prefetch:
        2 x num_workers slots, 2 with num_workers=0), asked of the library.
    device : 'cpu', 'cuda', 'cuda:N', an int, or None (= 'cpu')
        'cuda' without an index uses LOCAL_RANK when set (torchrun).
    rank, world_size : int or None
        Default: torch.distributed when initialised, else the RANK and
        WORLD_SIZE environment variables (torchrun), else 0 and 1.
    io : 'auto', 'uring', 'pread' or 'mmap'
    output : 'auto', 'torch' or 'numpy'
        'auto': torch tensors when torch is importable, numpy arrays otherwise.
    copy : bool
        True: yield owned copies and give each slot back immediately.
    window : int >= 1
        Files per window for shuffle='local'.
    direct_io : bool
        O_DIRECT reads (bypass the page cache).
    read_ahead : bool
        True (default): when a batch has work after its reads (.npy.zst
        decode, narrowed codes, host transforms, a device copy), each
        worker thread has its next batch's reads in flight while it does
        that work on the current one (a read thread and a second read
        buffer per worker; README, "Read-ahead inside every worker"); a
        batch delivered as stored has nothing to overlap and is read by its
        worker. False: a worker reads a batch when it starts it (less
        memory: one read buffer and one slot per worker).
    align : 'names' or 'none'
        'names' (default): when every field has the same number of files,
        the i-th files of all fields must carry the same number as the last
        run of digits of their names (``train_0007.npy`` pairs with
        ``train_0007_heatmaps.npy``), so misaligned lists fail at start
        naming both files. 'none' turns the check off.
    on_error : 'raise' or 'skip'
        'raise' (default): a failed read (I/O error, truncated, changed or
        replaced file) raises NpyloadError from the iteration, and a file
        already shorter than its header says fails the constructor. 'skip':
        the batch's reads are retried once, then samples that still fail are
        dropped from the batch (it is shorter; ``batch.indices`` lists what it
        holds), never delivered as wrong bytes, and counted in
        ``stats()['samples_skipped']``; nothing is logged. A ``.npy`` already
        shorter than its header says when the loader is built (a failed
        copy) is loaded with the samples its header says: those it lacks
        are skipped and counted in the same way, and the constructor warns
        once (RuntimeWarning) naming the file. An epoch whose reads all fail
        still ends (its batches are empty).
    max_errors : int or None
        With on_error='skip': once more than this many samples were skipped,
        the next failing batch raises anyway.
    pin_memory : bool or None
        None: pin the staging slots when a CUDA device is the output; True:
        pin host slots through CUDA device 0 even for device='cpu' (where
        CUDA is unusable this warns once, as DataLoader does, and the slots
        stay pageable); False: never pin.
    transforms : mapping from field name to Transform, or None
        Conversions done by the loader (see Transform): in the worker
        threads for device='cpu', on the GPU after the copy otherwise.
    as_tuple : bool
        True: each batch is a :class:`BatchTuple`, the fields' tensors in the
        order ``fields`` gave them (``for images, labels in loader``). False
        (default): a :class:`Batch` mapping. Iterating a ``Batch`` itself
        raises TypeError (it would yield the field names).
    transform : callable or None
        A per-batch hook: ``fn(batch)`` runs on a background thread while the
        loop body works on earlier batches, and what it returns is what the
        loop gets, in order. See "Per-batch hook" below.
    transform_workers : int >= 1
        Threads running ``fn`` (default 1); above 1 only with ``transform=``.
        See "Per-batch hook" below.
    remote : mapping or None
        For ``s3://bucket/prefix/*.npy[.zst]`` globs and lists, and
        ``https://`` lists: ``endpoint``, ``region``, ``access_key``,
        ``secret_key``, ``session_token``, ``profile``, ``path_style``
        ('auto', 'path', 'virtual'), ``anonymous`` (unsigned requests),
        ``cache_dir``, ``cache_bytes``, ``cache_block``, ``timeout`` and
        ``connect_timeout`` (seconds per request attempt), ``retries``,
        ``retry_base`` (seconds), ``max_inflight`` (requests in flight per
        reading thread), ``ca_file``, ``proxy``. What it leaves out comes
        from the AWS environment (``AWS_ENDPOINT_URL_S3`` /
        ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` /
        ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``) and ``~/.aws/config`` and
        ``credentials``, as boto3 reads them. Batches, order, resume,
        transforms and errors are those of local files; reads are ranged
        GETs retried on transient failures, an object that changed since
        start raises naming its URL. With ``cache_dir``, fetched blocks are
        kept on local disk (at most ``cache_bytes``, default 10 GiB) and
        later epochs read them from there; ranks of a node may share it.
        Secrets never appear in messages, ``stats()`` or ``state_dict()``.
    persistent_workers, in_order : bool, keyword only
        DataLoader's keywords whose meaning carries over, accepted so that a
        ported call runs: workers are threads that live from the first
        ``iter()`` to ``close()`` (always "persistent"), and batches always
        arrive in order. Other DataLoader keywords (``prefetch_factor``,
        ``collate_fn``, ``sampler``, ``worker_init_fn``...) raise a
        TypeError naming the npyload equivalent.

    Notes
    -----
    Per-batch hook (``transform=fn``): one thread per loader calls ``fn`` on
    each batch (a ``Batch`` or ``BatchTuple``) and queues the result; at most
    ``prefetch`` batches are ahead of the loop (queued results and the one
    ``fn`` works on; at least one queued). The loader then has ``prefetch +
    2`` slots (``4`` for prefetch=1): the loop body may hold two batches
    for a moment while ``for`` rebinds its variable. Torch ops
    release the GIL, so augmentation overlaps the training step. An exception
    from ``fn`` reaches the loop as :class:`TransformError` (with ``seq`` and
    ``epoch`` of the batch, the original chained as ``__cause__``) after the
    batches before it; a read error arrives as the NpyloadError it is. The
    thread stops, and the batches it had queued are dropped (their slots
    given back), when the loop ends or breaks (the iterator is freed), on
    ``close()``, ``set_epoch()``, ``load_state_dict()`` or a new
    ``iter(loader)``; stopping waits for a running ``fn`` call to return.
    ``state_dict()`` counts the batches the loop received, not those the
    thread prepared ahead. With a CUDA device, ``fn`` runs with the CUDA
    stream current when ``iter(loader)`` was called.

    ``transform_workers=N`` runs ``fn`` on N threads (threads, not
    processes: it pays where ``fn`` releases the GIL, as torch ops and most
    numpy ops on whole arrays do; pure-Python code runs one thread at a
    time). Results still come out in order, and the bound is the same: at
    most ``prefetch`` batches (2 for prefetch=1) taken from the loader and
    not yet received by the loop, whether being read, in ``fn`` or done and
    waiting for an earlier one, so the slots stay ``prefetch + 2`` and at
    most ``prefetch`` threads are busy at once (with ``prefetch=None`` the
    default is raised to at least ``N + 1``). An exception, ``break`` and
    the calls above behave as with one thread: the batches before a failed
    one are delivered, then its TransformError; stopping waits for every
    running ``fn`` call. ``stats()["hook_ns"]`` is the time in ``fn``
    summed over the threads; the verdict's "hook" rule (``fn`` busy at
    least half the time) is judged on ``hook_ns / N``, the time per thread.

    Randomness that is exact on resume: the batch ``fn`` receives has
    ``rng``, a ``numpy.random.Generator`` (None without numpy) that depends
    only on the loader's seed, the batch's ``epoch`` and ``seq`` and the
    rank, so the same batch gets the same draws for any
    ``transform_workers``, ``num_workers``, backend, and after
    ``load_state_dict`` at the same world size. Bit for bit::

        words = numpy.array([seed % 2**64, epoch, rank, seq], dtype="<u8").view("<u4")
        rng = numpy.random.Generator(numpy.random.PCG64(numpy.random.SeedSequence(words)))

    (each value as two little-endian 32-bit words, so no two tuples share
    an entropy pool; the rank is in so that ranks do not repeat each
    other's draws). ``fn``'s one argument is unchanged: a ``Batch`` (a
    subclass carrying ``rng``) or a ``BatchTuple`` with the attribute.

    Epochs: every ``iter(loader)`` that is not the first since the
    construction, ``set_epoch()`` or ``load_state_dict()`` advances the epoch
    by one, as ``DataLoader(shuffle=True)`` reshuffles on every ``iter()``.
    So the first loop runs epoch 0 and each later loop the next epoch, from
    its first batch, whether the loop before it ran to its end or was left
    early (``break``, ``next(iter(loader))``). ``set_epoch(e)`` makes the
    next ``iter()`` run epoch ``e`` and always wins: calling it before every
    loop, as DistributedSampler wants, gives the same batches as not calling
    it. ``load_state_dict(state)`` makes the next ``iter()`` run the rest of
    the saved epoch, and the loops after it advance from there; a state
    saved once its loop had run out (``state["loop_ended"] == 1``) resumes
    where the saved loader goes on, at the start of the next epoch. A state
    saved after a ``break`` resumes the rest of that epoch, as one saved
    inside the loop does (and as StatefulDataLoader's does): a loop left
    early, a preempted job's, is taken to be interrupted, not finished,
    so that no sample of it is skipped. Right after ``load_state_dict``,
    ``set_epoch`` with the saved epoch keeps the saved position (the usual
    ``for epoch in range(saved, n): set_epoch(epoch)``).
    An epoch's order is a pure function of (seed, epoch), so the batches of
    a loader never depend on how its epochs were chosen.

    Lazy start: the loader starts (worker threads, slots, pinned and device
    memory, io rings) at the first ``iter()``, so a loader built up front
    (a validation set) holds nothing until it is used. The constructor still
    raises what starting would (missing files, bad headers, sample counts
    that differ between fields, misaligned file names, transforms that do
    not fit, an io backend or CUDA device that cannot be used): it starts a
    scratch loader of one row and one slot, with no worker thread, and
    stops it at once, keeping only what it read of the files (headers,
    sizes and identities): the first ``iter()`` starts it for real without
    reading a header again, and a file changed in between raises (or is
    skipped with ``on_error='skip'``) when its rows are read. Before the
    first ``iter()``, ``len()``, ``num_samples``, ``field_names``,
    ``num_slots`` (the slots it will have), ``backend`` (the one the check
    chose), ``state_dict()`` and ``load_state_dict()`` work as after it, and
    ``stats()`` counts nothing: every counter is 0, ``num_slots`` and
    ``slot_bytes`` too.

    See the module docstring for the lifetime rule.

    Threads: one call at a time. A loop's ``next()``, ``iter()``,
    ``set_epoch()``, ``load_state_dict()``, ``state_dict()`` and ``close()``
    called while another of them runs on another thread raise RuntimeError
    ("npyload loader is in use: X was called while Y is running") and change
    nothing. ``stats()``, ``len()``, ``backend`` and the attributes may be
    read from any thread at any time, also while a loop waits for a batch
    (with ``transform=``, ``state_dict()`` too).

    Numeric arguments out of range raise ValueError naming the argument, the
    value and the accepted range in these units (the library's limits, asked
    of it): batch_size 1 .. 2**31, num_workers 0 .. 256, prefetch 1 .. 1023
    (1 .. 1022 with ``transform=``), world_size 1 .. 2**24, window 1 ..
    2**31, seed an int64, max_errors 1 .. 2**63-1, rank below world_size.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> for i in range(2):  # two files per field, 6 samples each
    ...     np.save(os.path.join(d, f"x_{i}.npy"), np.ones((6, 2, 3), np.float32) * i)
    ...     np.save(os.path.join(d, f"y_{i}.npy"), np.arange(6 * i, 6 * i + 6))
    >>> loader = npyload.Loader({"x": os.path.join(d, "x_*.npy"),
    ...                          "y": os.path.join(d, "y_*.npy")},
    ...                         batch_size=4, shuffle=True, seed=0, num_workers=2,
    ...                         output="numpy")
    >>> len(loader), loader.num_samples
    (3, 12)
    >>> for epoch in range(2):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         assert (batch["y"] == batch.indices).all()  # y holds the sample index
    >>> [batch["x"].shape for batch in loader]
    [(4, 2, 3), (4, 2, 3), (4, 2, 3)]
    >>> loader.close()
    """

    # Set by __init__ (declared for type checkers).
    batch_size: int
    shuffle: bool | str
    seed: int
    drop_last: bool
    num_workers: int
    read_ahead: bool
    num_slots: int
    prefetch: int
    device: int
    rank: int
    world_size: int
    copy: bool
    as_tuple: bool
    field_names: tuple[str, ...]
    transform: Callable[[Any], Any] | None
    transform_workers: int

    # The type of a batch follows as_tuple and transform: Loader[Batch],
    # Loader[BatchTuple], or Loader[R] for a transform= returning R.
    @overload
    def __init__(self: Loader[Batch], fields: _Fields, batch_size: int,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: int = 2, prefetch: int | None = None, device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: Mapping[str, Transform] | None = None,
                 as_tuple: Literal[False] = False, transform: None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None, *,
                 persistent_workers: bool = False, in_order: bool = True) -> None: ...
    @overload
    def __init__(self: Loader[BatchTuple], fields: _Fields, batch_size: int,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: int = 2, prefetch: int | None = None, device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: Mapping[str, Transform] | None = None,
                 as_tuple: Literal[True] = ..., transform: None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None, *,
                 persistent_workers: bool = False, in_order: bool = True) -> None: ...
    @overload
    def __init__(self: Loader[_T], fields: _Fields, batch_size: int,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: int = 2, prefetch: int | None = None, device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: Mapping[str, Transform] | None = None,
                 as_tuple: Literal[False] = False, transform: Callable[[Batch], _T] = ...,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None, *,
                 persistent_workers: bool = False, in_order: bool = True) -> None: ...
    @overload
    def __init__(self: Loader[_T], fields: _Fields, batch_size: int,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: int = 2, prefetch: int | None = None, device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: Mapping[str, Transform] | None = None,
                 as_tuple: Literal[True] = ..., transform: Callable[[BatchTuple], _T] = ...,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None, *,
                 persistent_workers: bool = False, in_order: bool = True) -> None: ...
    @overload
    def __init__(self: Loader[Any], fields: _Fields, batch_size: int,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: int = 2, prefetch: int | None = None, device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: Mapping[str, Transform] | None = None,
                 as_tuple: bool = False, transform: Callable[[Any], Any] | None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None, *,
                 persistent_workers: bool = False, in_order: bool = True) -> None: ...
    def __init__(self, fields: _Fields, batch_size: int,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: int = 2, prefetch: int | None = None, device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: Mapping[str, Transform] | None = None,
                 as_tuple: bool = False, transform: Callable[[Any], Any] | None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None, *,
                 persistent_workers: bool = False, in_order: bool = True,
                 **dataloader_kw: Any) -> None:
        _habits.dataloader_keywords(  # DataLoader's names, answered
            {"persistent_workers": persistent_workers, "in_order": in_order, **dataloader_kw})
        self._c: Any = None     # the started C loader: None until the first iter()
        self._kept: tuple[Any, int] | None = None  # the checked loader, stopped, and its pid
        self._closed = False
        self._pipe: _HookPipe | None = None
        self._in_use = _InUse()
        specs = _field_specs(_manifest.fields_of(fields, remote))  # a manifest: its files
        self._remote = _remote.build(
            remote, [p for _, g, ps in specs for p in ([g] if g is not None else ps or [])])
        batch_size, seed, num_workers, prefetch, window, max_errors = _check_counts(
            batch_size, seed, num_workers, prefetch, window, max_errors, transform)
        shuffle_mode, dev, pin_memory = _check_choices(
            shuffle, drop_last, direct_io, read_ahead, io, device, output, pin_memory,
            align, on_error, transform)
        transform_workers = _check_hook_workers(transform_workers, transform)
        rank, world_size = _resolve_ranks(rank, world_size)
        self._pick_output(output, dev)
        self._specs = specs
        self._transforms = _check_transforms(specs, transforms)
        # Fields whose batches carry augmentation decisions (batch.augment).
        self._aug_fields = frozenset(
            name for name, t in self._transforms
            if t.hflip or t.vflip or t.crop is not None or t.pad)
        self.transform = transform
        self.transform_workers = transform_workers
        if not prefetch:
            # The library's default memory, asked of it (slots - 1 batches
            # ahead of the one the loop holds).
            prefetch = _hook_prefetch(max(1, _npyload.default_prefetch(num_workers or -1) - 1),
                                      transform_workers)
        self._opts: dict[int, int] = {
            _npyload.OPT_BATCH_SIZE: batch_size,
            _npyload.OPT_NUM_WORKERS: num_workers if num_workers else -1,  # -1: sync
            _npyload.OPT_PREFETCH: _slots_for(prefetch, transform),
            _npyload.OPT_SHUFFLE: shuffle_mode,
            _npyload.OPT_SEED: seed,
            _npyload.OPT_DROP_LAST: int(bool(drop_last)),
            _npyload.OPT_WORLD_SIZE: world_size,
            _npyload.OPT_RANK: rank,
            _npyload.OPT_IO_BACKEND: _IO[io.lower()],
            _npyload.OPT_SHUFFLE_WINDOW: window,
            _npyload.OPT_DIRECT_IO: int(bool(direct_io)),
            _npyload.OPT_ALIGN: 0 if align == "names" else 1,
            _npyload.OPT_ON_ERROR: 1 if on_error == "skip" else 0,
            _npyload.OPT_MAX_ERRORS: max_errors,
            _npyload.OPT_READ_AHEAD: 0 if read_ahead else -1,
        }
        if pin_memory is not None:
            self._opts[_npyload.OPT_PIN_MEMORY] = int(pin_memory)
        self._opts[_npyload.OPT_DEVICE] = dev  # last: it may load CUDA
        self._check_start()

        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.num_workers = num_workers
        self.read_ahead = bool(read_ahead)
        # The library's PREFETCH, as it reports it once started (host slots,
        # or device slots with a CUDA device; the range was checked).
        self.num_slots = self._opts[_npyload.OPT_PREFETCH]
        self.prefetch = prefetch
        self.device = dev
        self.rank = rank
        self.world_size = world_size
        self.copy = bool(copy)
        self.as_tuple = bool(as_tuple)
        # What the next iter() runs (see the class docstring, "Epochs"):
        # _START: epoch _epoch from its start; _RESUME: the position of the
        # loaded state (pending in _pending until the loader starts);
        # _ADVANCE: epoch _epoch + 1 from its start.
        self._epoch = 0
        self._next = _START
        self._keep_epoch = False  # after load_state_dict: set_epoch(saved) keeps it
        self._pending: dict[str, Any] | None = None  # a loaded state, before the loader started
        self._loop_ended = False  # the current loop ran to its end (StopIteration)
        self._gen = 0
        self._resume_len: int | None = None  # batches left at the loaded position
        self._len_override: int | None = None  # batches of a resumed epoch (load_state_dict)
        self._hook_state = None  # with transform=: the state the consumer is at
        self._clock = _LoopClock(transform_workers)  # with transform=: hook, loop wait, step
        _habits.construction_warnings(specs, self._transforms, len(self), batch_size,
                                      -(-self._n // world_size), bool(drop_last), stacklevel=3)

    def _pick_output(self, output: str, dev: int) -> None:
        """torch when it is importable (or asked for), else numpy."""
        torch: Any = None
        if output in ("auto", "torch"):
            torch = _torch_or_none()
            if torch is None and output == "torch":
                raise ImportError("output='torch' needs torch, which is not importable")
        if torch is None:
            if dev >= 0:
                raise ValueError("device memory needs torch output (numpy cannot view "
                                 "CUDA memory): install torch or use device='cpu'")
            try:
                import numpy
            except ImportError:
                raise ImportError("npyload.Loader needs numpy or torch to yield arrays") from None
            self._np: Any = numpy
            self._bf16 = _bfloat16_numpy()
        else:
            self._np = None
        self._torch = torch

    # ---- DataLoader-like surface ----

    def __len__(self) -> int:
        """Batches the next ``for`` loop yields for this rank: a full epoch
        (the same on every rank), except after load_state_dict, until that
        loop has ended, where it is what the resumed loop yields (what was
        left of the epoch)."""
        self._live()
        if self._len_override is not None:
            return self._len_override
        return _epoch_batches(self._n, self.world_size, self.batch_size, self.drop_last)

    @property
    def num_samples(self) -> int:
        """N: samples in every field (all ranks together)."""
        self._live()
        return self._n

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) loop; before the first loop
        after set_epoch() or load_state_dict(), the epoch they chose."""
        return self._epoch

    @property
    def backend(self) -> str:
        """Name of the active io backend ('uring', 'pread' or 'mmap'); before
        the first iter(), the one the constructor's check chose. May be read
        from any thread, also while a loop waits for a batch."""
        c = self._live()
        backend: str = c.backend if c is not None else self._checked_backend
        return backend

    def field_engines(self) -> dict[str, tuple[str, str]]:
        """Where each field's transform and the expansion of its narrowed
        codes run, as ``{field: (engine, why)}``: engine ``'none'`` (the
        stored rows are delivered), ``'host'`` (the host engine in the
        workers; on a GPU the output crosses PCIe) or ``'device'`` (kernels
        after the copy: the stored dtype, or one-byte codes, cross PCIe), and
        why in words, including why a field asked for the device runs on
        the host (npyload_loader_field_engine). Known from the constructor
        on: its check started the same fields, transforms and device. May be
        called from any thread, also while a loop waits for a batch."""
        c = self._live()
        if c is None:
            return dict(self._checked_engines)
        engines: dict[str, tuple[str, str]] = c.field_engines()
        return engines

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next ``for`` loop runs (its order is a pure
        function of (seed, epoch)); it wins over the advance a new iter()
        would make. Once the loader has started, prefetching for it starts
        now. Right after load_state_dict, set_epoch with the saved epoch
        keeps the resumed position. Raises RuntimeError ("in use") while
        another call on this loader runs (a loop's next() included), changing
        nothing."""
        epoch = _int_arg("epoch", epoch, 0, maximum=_EPOCH_MAX)
        with self._in_use("set_epoch()"):
            self._set_epoch(epoch)

    def _set_epoch(self, epoch: int) -> None:
        c = self._live()
        if self._keep_epoch and epoch == self._epoch:
            # The trainer's epoch loop names the saved epoch: go on from the
            # saved position (even one whose loop had ended).
            self._next = _RESUME
            self._loop_ended = False
            self._len_override = self._resume_len
            return
        self._stop_pipe()
        if c is not None:
            c.set_epoch(epoch)
        self._epoch = epoch
        self._next = _START
        self._keep_epoch = False
        self._pending = None
        self._loop_ended = False
        self._gen += 1
        self._len_override = None
        self._hook_state = None

    def __iter__(self) -> Iterator[_B]:
        with self._in_use("iter()"):
            return self._iter()

    def _iter(self) -> Iterator[_B]:
        self._live()
        self._stop_pipe()
        nxt = self._next
        epoch = self._epoch
        if nxt is _ADVANCE:
            if epoch >= _EPOCH_MAX:
                raise ValueError(f"npyload: epoch {epoch} is the last one; call "
                                 "set_epoch() to choose the next")
            epoch += 1
        c = self._started()  # the first iter(): the loader starts here
        if nxt is not _RESUME:
            c.set_epoch(epoch)  # (a no-op for an epoch not yet begun)
            self._len_override = None
        self._epoch = epoch
        self._next = _ADVANCE
        self._keep_epoch = False
        self._loop_ended = False
        self._gen += 1
        if self.transform is None:
            return _Iterator(self, self._gen)
        self._hook_state = c.get_state()
        stream = None
        if self.device >= 0 and self._torch is not None:
            stream = self._torch.cuda.current_stream(self.device)
        wrap = _functools.partial(_wrap_raw, torch=self._torch, np=self._np,
                                  copy=self.copy, as_tuple=self.as_tuple,
                                  bf16=getattr(self, "_bf16", None), aug=self._aug_fields)
        pipe = self._pipe = _HookPipe(c, wrap, self.transform, _hook_depth(self.prefetch),
                                      stream, self._clock, self.transform_workers,
                                      _rng_key(self.seed, self.rank))
        try:
            pipe.start()
            return _Iterator(self, self._gen, pipe)
        except BaseException:  # Ctrl-C while the threads start: none is left running
            self._stop_pipe()
            raise

    def state_dict(self) -> LoaderState:
        """The position after the last batch handed out (with transform=:
        the last batch the loop received), as a dict of ints (save it with
        your checkpoint): the library's position (seed, epoch, consumed,
        base, ...) and ``loop_ended``, 1 when the loop over that position ran
        to its end (StopIteration), so that a loader resumed from it starts
        the next epoch, as this one would (0 after a ``break``: the rest of
        the epoch is resumed).
        Works before the first iter() too (without starting the loader).
        Without transform=, refused (RuntimeError "in use") while another
        thread's loop waits in next()."""
        self._live()
        hook_state = self._hook_state  # with transform=: a Python read
        if hook_state is not None:
            out = dict(hook_state)
        else:
            with self._in_use("state_dict()"):
                c = self._live()
                if c is not None:
                    out = dict(c.get_state())
                elif self._pending is not None:
                    out = self._position_of(self._pending)
                else:
                    out = self._position_of(None)
        out["loop_ended"] = int(self._loop_ended)
        return cast("LoaderState", out)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state_dict()`` of a loader over the same data with
        the same batch_size (num_workers, prefetch and io may differ). At the
        same world_size the next ``iter(loader)`` yields exactly the batches
        the saved loader would have yielded next (with ``loop_ended``: its
        next epoch). At another world_size (a
        state saved by any rank of a DDP job, resumed with W' ranks) the rest
        of the epoch's global sequence is split over the W' ranks like
        DistributedSampler: nothing lost, nothing repeated but the padding
        (at most W'-1 samples), equal batch counts; the next epoch is the
        normal split. Before the first iter() the state is checked now and
        applied when the loader starts. Raises RuntimeError ("in use") while
        another call on this loader runs, changing nothing."""
        if not isinstance(state, _Mapping):
            raise TypeError("state must be the dict returned by state_dict()")
        with self._in_use("load_state_dict()"):
            self._load_state_dict(state)

    def _load_state_dict(self, state: Mapping[str, Any]) -> None:
        c = self._live()
        adopt = {_npyload.OPT_SEED: "seed", _npyload.OPT_SHUFFLE: "shuffle",
                 _npyload.OPT_DROP_LAST: "drop_last"}
        for key in ("epoch", "consumed", "seed", "shuffle", "drop_last"):
            if key not in state:
                raise ValueError(f"state lacks the key {key!r} (expected the dict "
                                 "returned by state_dict())")
        ended = _int_arg("state['loop_ended']", state.get("loop_ended", 0), 0, maximum=1)
        if c is None:
            position = self._check_state(state)  # raises what start would
            self._pending = dict(state)
        else:
            self._stop_pipe()
            if all(int(state[k]) == self._opts[o] for o, k in adopt.items()):
                c.set_state(state)
            else:
                # Workers chose their read hints (random or sequential) for
                # the shuffle mode they started with: start new ones, restored
                # before start (which adopts the state's seed, shuffle and
                # drop_last).
                new = self._build(state)
                self._c, old = new, c
                old.close()
                c = new
            position = c.get_state()
        for o, k in adopt.items():
            self._opts[o] = int(state[k])
        self.seed = int(state["seed"])
        self.drop_last = bool(int(state["drop_last"]))
        names: dict[int, bool | str] = {0: False, 1: True, 2: "local"}
        self.shuffle = names.get(int(state["shuffle"]), self.shuffle)
        self._epoch = int(state["epoch"])
        self._next = _ADVANCE if ended else _RESUME
        self._keep_epoch = True
        self._loop_ended = bool(ended)
        self._gen += 1
        self._hook_state = None
        # The resumed loop yields the rest of the epoch (at another world
        # size, the rest split over the new ranks): len() says so until it
        # ends. A state whose loop had ended resumes at the next epoch.
        B = self.batch_size
        self._resume_len = (_epoch_batches(self._n - int(position["base"]), self.world_size,
                                           B, self.drop_last)
                            - (-(-int(position["consumed"]) // B)))
        self._len_override = None if ended else self._resume_len

    def stats(self) -> LoaderStats:
        """Counters since start: bytes_read, batches_delivered, wait_ns, io_ns,
        h2d_bytes, h2d_ns, backend, pinned, direct_io, device, slot_bytes,
        num_slots, uring_fallbacks, read_ahead_batches (batches decoded while
        the worker's next batch was being read) and read_wait_ns (worker
        time waiting for reads), and with on_error='skip' samples_skipped,
        errors and last_error (the message of the last failure behind a
        skip).

        Where the time goes: elapsed_ns (since start), step_ns (the loop's
        time between batches: the training step), worker_cpu_ns,
        num_workers, and ``verdict``, one line naming the bottleneck (the
        consumer, the hook, the disk, the object store, decode, host
        transforms, the H2D copy or CPU copies) and what to do, by the rules
        documented at
        npyload_stats_verdict in npyload.h. With ``transform=fn`` also
        hook_ns (time in fn, summed over the hook threads), transform_workers
        (those threads: the verdict judges hook_ns / transform_workers) and
        loop_wait_ns / loop_step_ns, the wait and step of the loop you run
        (wait_ns is then the hook thread's), which the verdict judges;
        without a hook hook_ns and transform_workers are 0 and loop_wait_ns /
        loop_step_ns equal wait_ns / step_ns.

        Before the first iter() nothing has started: every counter is 0,
        slot_bytes and num_slots too (the verdict says none was judged);
        backend and device are those the loader will use.

        May be called from any thread, also while a loop waits for a
        batch (then it does not wait); refused (RuntimeError "in use") only
        during set_epoch(), load_state_dict(), close() and the like."""
        c, k = self._live(), self._clock
        if c is None:
            scratch = _npyload.Loader()  # unstarted: the library's zeros, every key
            try:
                st = scratch.stats()
            finally:
                scratch.close()
            st["backend"] = self._checked_backend
            st["device"] = self.device
            st["hook_ns"] = st["loop_wait_ns"] = st["loop_step_ns"] = 0
            st["transform_workers"] = 0 if self.transform is None else self.transform_workers
            return st
        if self.transform is None:
            st = cast("LoaderStats", c.stats())
            st["hook_ns"] = st["transform_workers"] = 0
            st["loop_wait_ns"], st["loop_step_ns"] = st["wait_ns"], st["step_ns"]
            return st
        st = cast("LoaderStats", c.stats(hook_ns=k.verdict_hook_ns(), loop_wait_ns=k.wait_ns,
                                         loop_step_ns=k.step_ns))
        st["hook_ns"], st["loop_wait_ns"], st["loop_step_ns"] = k.hook_ns, k.wait_ns, k.step_ns
        st["transform_workers"] = self.transform_workers
        return st

    def close(self) -> None:
        """Stops the workers and frees the loader at once (threads, open
        files, io_uring rings, unused slots). Arrays and tensors still alive
        stay valid: only their slots are kept, each freed when its last array
        dies. A ``transform=`` thread is stopped first (after its running
        call returns) and the batches it had prepared are dropped. Refused
        (RuntimeError "in use") while another call on this loader runs, a
        loop's next() included: stop the loop first. Closing twice is fine,
        and so is closing a loader that never started."""
        with self._in_use("close()"):
            self._stop_pipe()
            self._closed = True
            kept = self._take_kept()
            if kept is not None:
                kept.close()
            if self._c is not None:
                self._c.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return "<npyload.Loader closed>"
        return (f"<npyload.Loader fields={list(self.field_names)} batch_size={self.batch_size} "
                f"batches={len(self)} rank={self.rank}/{self.world_size} "
                f"backend={self.backend} device={self.device}"
                f"{'' if self._c is not None else ' not started'}>")

    # ---- internals ----

    def _build(self, state: Mapping[str, Any] | None = None,
               opts: dict[int, int] | None = None) -> Any:
        """A started C loader for the stored fields and `opts` (default: the
        loader's), positioned at `state` when given (restored before start,
        so the state's seed, shuffle and drop_last are adopted), else at the
        start of epoch self._epoch. The first build with the loader's own
        options reuses the constructor's checked loader (stopped, with the
        headers and remote probes it read), so remote objects are probed
        once; in a forked child that one is left alone (unusable there)."""
        opts = self._opts if opts is None else opts
        kept = self._take_kept()
        if kept is not None and opts is not self._opts:
            kept.close()
            kept = None
        c = kept if kept is not None else self._new_c(opts)
        try:
            if kept is not None:  # it has its fields and transforms: the options
                for opt, value in opts.items():
                    c.set(opt, value)
            if state is not None:
                c.set_state(state)
            elif getattr(self, "_epoch", 0):
                c.set_epoch(self._epoch)
            c.start()
        except BaseException:
            c.close()
            raise
        return c

    def _take_kept(self) -> Any:
        """The constructor's checked loader (stopped), taken over, or None;
        in a forked child it is left alone (unusable there)."""
        kept, self._kept = self._kept, None
        return kept[0] if kept is not None and kept[1] == _os.getpid() else None

    def _new_c(self, opts: dict[int, int]) -> Any:
        """A new C loader with the stored fields, `opts` and transforms,
        not started."""
        c: Any = _npyload.Loader()
        try:
            if opts[_npyload.OPT_DEVICE] >= 0:
                c._set_stream_joiner(_join_streams)
            if self._remote is not None:
                c.set_remote(self._remote)
            for name, glob, paths in self._specs:
                if paths is None:
                    assert glob is not None  # _field_specs gives one of the two
                    c.add_field(name, glob)
                else:
                    c.add_field_files(name, paths)
            for opt, value in opts.items():
                c.set(opt, value)
            if opts[_npyload.OPT_DEVICE] >= 0 and self._transforms:
                for which, path in _kernel_paths():
                    c.set_path(which, path)
            for name, t in self._transforms:
                crop = t.crop or (0, 0)
                c.set_transform(name, _TDTYPES[t.dtype], t.scale, t.mean, t.std,
                                t.channels_last, t.hflip, t.vflip, crop[0], crop[1], t.pad,
                                t.hflip_sign, t.vflip_sign)
        except BaseException:
            c.close()
            raise
        return c

    def _check_start(self) -> None:
        """The constructor's check: starts the fields and options as the
        first iter() will, but with one row per slot, one slot, no worker
        thread and no read-ahead, so that every error of a start (paths,
        headers, counts, names, transforms, backend, device) is raised here,
        then closes it: nothing is held afterwards. Keeps what the loader
        reports before it starts."""
        opts = dict(self._opts)
        opts.update({_npyload.OPT_BATCH_SIZE: 1, _npyload.OPT_NUM_WORKERS: -1,
                     _npyload.OPT_PREFETCH: 1, _npyload.OPT_READ_AHEAD: -1})
        c = self._build(opts=opts)
        try:
            self.field_names = c.field_names
            self._n: int = c.num_samples()
            self._checked_backend = c.backend
            self._checked_engines: dict[str, tuple[str, str]] = c.field_engines()
            self._state_version = int(c.get_state()["version"])
            if self._opts[_npyload.OPT_ON_ERROR] == 1:
                # Files already shorter than their headers say: loaded, their
                # missing samples skipped and counted when read; said once.
                short = c.stats()["last_error"]
                if short:
                    _warnings.warn(f"npyload: {short}", RuntimeWarning, stacklevel=3)
            # Kept for the first iter(), stopped: its workers, slots and
            # buffers are freed; the headers (and the remote objects' sizes
            # and ETags) are kept, so no header is read or probed again.
            c.stop()
            self._kept = (c, _os.getpid())
            c = None
        finally:
            if c is not None:
                c.close()

    def _started(self) -> Any:
        """The started C loader; the first call starts it, at the position
        state_dict() reports (a loaded state, else the start of the epoch)."""
        c = self._c
        if c is None:
            c = self._c = self._build(self._pending)
            self._pending = None
        return c

    def _check_state(self, state: Mapping[str, Any]) -> dict[str, int]:
        """Before start: raises for `state` what set_state and start would,
        and returns the position get_state() will report once started."""
        scratch = _npyload.Loader()  # no fields: only the state's checks
        try:
            for opt in (_npyload.OPT_BATCH_SIZE, _npyload.OPT_WORLD_SIZE, _npyload.OPT_RANK):
                scratch.set(opt, self._opts[opt])
            scratch.set_state(state)
        finally:
            scratch.close()
        if int(state["num_samples"]) != self._n:
            err = _npyload.NpyloadError(f"saved state is for {int(state['num_samples'])} "
                                        f"samples, the fields hold {self._n}")
            err.code = _npyload.EMISMATCH
            raise err
        return self._position_of(state)

    def _position_of(self, state: Mapping[str, Any] | None) -> dict[str, int]:
        """What get_state() of the started loader reports: at the start of
        epoch self._epoch (state None), or right after set_state(state) (the
        library's rule, npyl_state_check: at the saved world size the saved
        position; at another one, the global position P = min(N, base +
        consumed x W) becomes the base of a new split, nothing consumed)."""
        o, n = self._opts, self._n
        out = {"version": self._state_version, "seed": o[_npyload.OPT_SEED],
               "epoch": self._epoch, "consumed": 0, "num_samples": n,
               "batch_size": self.batch_size, "world_size": self.world_size,
               "rank": self.rank, "shuffle": o[_npyload.OPT_SHUFFLE],
               "drop_last": o[_npyload.OPT_DROP_LAST], "base": 0}
        if state is None:
            return out
        base = int(state["base"]) if int(state["version"]) >= 2 and "base" in state else 0
        consumed = int(state["consumed"])
        w = int(state["world_size"])
        if w != self.world_size:
            rest = n - base
            pos = n if consumed >= -(-rest // w) else base + consumed * w
            base, consumed = min(pos, n), 0
        out.update(seed=int(state["seed"]), epoch=int(state["epoch"]), consumed=consumed,
                   shuffle=int(state["shuffle"]), drop_last=int(state["drop_last"]),
                   base=base)
        return out

    def _stop_pipe(self) -> None:
        pipe = self._pipe
        if pipe is not None:
            self._pipe = None
            pipe.stop()

    def _live(self) -> Any:
        """The started C loader, or None before the first iter(); raises
        once closed."""
        if self._closed:
            raise ValueError("npyload loader is closed")
        return self._c

    def _wrap(self, raw: _npyload.Batch) -> Any:
        return _wrap_raw(raw, self._torch, self._np, self.copy, self.as_tuple,
                         getattr(self, "_bf16", None), self._aug_fields)
