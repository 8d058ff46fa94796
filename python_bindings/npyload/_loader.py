"""Loader: the drop-in for torch.utils.data.DataLoader (its iterator is
_iterate.py's, its documentation _loader_doc.py). The position, the epochs
and the pass rules are the C library's: this module asks."""
from __future__ import annotations

import functools as _functools
import logging as _logging
import os as _os
import warnings as _warnings
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from . import _loader_doc
from . import _npyload
from . import _habits, _mix, _remote
from ._batch import _wrap_raw
from ._hook import _HookPipe, _LoopClock, _check_hook_workers, _hook_depth
from ._hook import _hook_prefetch, _rng_key, _slots_for
from ._options import _EPOCH_MAX, _IO, _auto_options, _check_cache_fill, _check_choices
from ._options import _check_counts, _check_state, _int_arg, _kernel_paths, _output_libs
from ._options import _resolve_ranks
from ._torch import _join_streams
from ._iterate import _InUse, _Iterator
from ._transform import Transform

_auto_log = _logging.getLogger("npyload")

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Literal, Optional, Protocol, Union

    from typing_extensions import Self
    from typing_extensions import TypeVar as _TypeVarDefault

    from ._batch import Batch, BatchTuple
    from ._npyload import LoaderState, LoaderStats, _Path
    from ._options import _Count  # num_workers=, prefetch=: an int or "auto"

    class _TorchDevice(Protocol):
        """torch.device (read through str())."""
        @property
        def type(self) -> str: ...

    _Fields = Union[Mapping[str, Union[_Path, Sequence[_Path]]], _Path]  # or a manifest
    _Sources = Optional[Mapping[str, _Fields]]  # Loader(sources=...)
    _Weights = Optional[Mapping[str, float]]
    _Transforms = Mapping[str, Union[Transform, Mapping[str, Transform]]]  # or per source
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


class Loader(Generic[_B]):
    __doc__ = _loader_doc.LOADER  # parameters, hook, epochs, threads, examples

    # Set by __init__ (declared for type checkers).
    batch_size: int
    shuffle: bool | str
    seed: int
    drop_last: bool
    num_workers: _Count
    read_ahead: bool
    cache_fill: bool | None
    num_slots: int
    prefetch: _Count
    memory_budget: int | None
    auto_target: float
    device: int
    rank: int
    world_size: int
    copy: bool
    as_tuple: bool
    field_names: tuple[str, ...]
    source_names: tuple[str, ...]  # sources=' names, in their order
    transform: Callable[[Any], Any] | None
    transform_workers: int

    # The type of a batch follows as_tuple and transform: Loader[Batch],
    # Loader[BatchTuple], or Loader[R] for a transform= returning R. Only
    # overloads map as_tuple=True to BatchTuple; the price is mypy's "No overload
    # variant" (no argument named) for a wrongly typed argument, unless the user
    # enables npyload.mypy_plugin, which names it (docs/python-api.md). The
    # BatchTuple overloads take as_tuple=True by keyword only, so that a call
    # without it cannot reach them (a transform taking BatchTuple is then
    # refused); the last one (as_tuple a bool known only at run time) wants
    # a transform taking either type.
    @overload
    def __init__(self: Loader[Batch], fields: _Fields | None = None, batch_size: int = ...,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: _Count = "auto", prefetch: _Count | None = "auto",
                 device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: _Transforms | None = None,
                 as_tuple: Literal[False] = False, transform: None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None,
                 cache_fill: bool | None = None, *,
                 memory_budget: int | None = None, auto_target: float = 0.02,
                 persistent_workers: bool = False, in_order: bool = True, sources: _Sources = None,
                 weights: _Weights = None, samples_per_epoch: int | None = None) -> None: ...
    @overload
    def __init__(self: Loader[BatchTuple], fields: _Fields | None = None, batch_size: int = ...,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: _Count = "auto", prefetch: _Count | None = "auto",
                 device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: _Transforms | None = None, *,
                 as_tuple: Literal[True], transform: None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None,
                 cache_fill: bool | None = None,
                 memory_budget: int | None = None, auto_target: float = 0.02,
                 persistent_workers: bool = False, in_order: bool = True, sources: _Sources = None,
                 weights: _Weights = None, samples_per_epoch: int | None = None) -> None: ...
    @overload
    def __init__(self: Loader[_T], fields: _Fields | None = None, batch_size: int = ...,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: _Count = "auto", prefetch: _Count | None = "auto",
                 device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: _Transforms | None = None,
                 as_tuple: Literal[False] = False, transform: Callable[[Batch], _T] = ...,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None,
                 cache_fill: bool | None = None, *,
                 memory_budget: int | None = None, auto_target: float = 0.02,
                 persistent_workers: bool = False, in_order: bool = True, sources: _Sources = None,
                 weights: _Weights = None, samples_per_epoch: int | None = None) -> None: ...
    @overload
    def __init__(self: Loader[_T], fields: _Fields | None = None, batch_size: int = ...,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: _Count = "auto", prefetch: _Count | None = "auto",
                 device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: _Transforms | None = None, *,
                 as_tuple: Literal[True], transform: Callable[[BatchTuple], _T] = ...,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None,
                 cache_fill: bool | None = None,
                 memory_budget: int | None = None, auto_target: float = 0.02,
                 persistent_workers: bool = False, in_order: bool = True, sources: _Sources = None,
                 weights: _Weights = None, samples_per_epoch: int | None = None) -> None: ...
    @overload
    def __init__(self: Loader[Any], fields: _Fields | None = None, batch_size: int = ...,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: _Count = "auto", prefetch: _Count | None = "auto",
                 device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: _Transforms | None = None,
                 as_tuple: bool = False,
                 transform: Callable[[Batch | BatchTuple], Any] | None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None,
                 cache_fill: bool | None = None, *,
                 memory_budget: int | None = None, auto_target: float = 0.02,
                 persistent_workers: bool = False, in_order: bool = True, sources: _Sources = None,
                 weights: _Weights = None, samples_per_epoch: int | None = None) -> None: ...
    def __init__(self, fields: _Fields | None = None, batch_size: Any = None,
                 shuffle: _Shuffle = False, seed: int = 0, drop_last: bool = False,
                 num_workers: _Count = "auto", prefetch: _Count | None = "auto",
                 device: _Device = "cpu",
                 rank: int | None = None, world_size: int | None = None,
                 io: _IOName = "auto", output: _Output = "auto", copy: bool = False,
                 window: int = 8, direct_io: bool = False, pin_memory: bool | None = None,
                 align: _Align = "names", on_error: _OnError = "raise",
                 max_errors: int | None = None,
                 transforms: _Transforms | None = None,
                 as_tuple: bool = False, transform: Callable[[Any], Any] | None = None,
                 read_ahead: bool = True, transform_workers: int = 1,
                 remote: Mapping[str, Any] | None = None,
                 cache_fill: bool | None = None, *,
                 memory_budget: int | None = None, auto_target: float = 0.02,
                 persistent_workers: bool = False, in_order: bool = True, sources: _Sources = None,
                 weights: _Weights = None, samples_per_epoch: int | None = None,
                 **dataloader_kw: Any) -> None:
        _habits.dataloader_keywords(  # DataLoader's names, answered
            {"persistent_workers": persistent_workers, "in_order": in_order, **dataloader_kw})
        self._running = False   # the C loader was started (the first iter())
        self._pid = _os.getpid()  # of the process that made it
        self._closed = False
        self._pipe: _HookPipe | None = None
        self._in_use = _InUse()
        # specs: the fields (of sources=' first source); files: every source's
        specs, files, self._sources, self._weights = _mix.check_args(
            fields, batch_size, sources, weights, samples_per_epoch, remote)
        self.source_names = tuple(name for name, _ in self._sources or ())
        self._remote = _remote.build(remote, files)
        batch_size, seed, num_workers, prefetch, window, max_errors = _check_counts(
            batch_size, seed, num_workers, prefetch, window, max_errors, transform)
        shuffle_mode, dev, pin_memory = _check_choices(
            shuffle, drop_last, direct_io, read_ahead, io, device, output, pin_memory,
            align, on_error, transform)
        transform_workers = _check_hook_workers(transform_workers, transform)
        rank, world_size = _resolve_ranks(rank, world_size)
        self._torch, self._np, self._bf16 = _output_libs(output, dev)
        self._specs = specs
        self._transforms, self._src_transforms = _mix.check_transforms(
            specs, transforms, self._sources)  # {field: T}, or per source
        # Fields whose batches carry augmentation decisions (batch.augment).
        self._aug_fields = frozenset(
            name for name, t in self._transforms + [(n, t) for _, n, t in self._src_transforms]
            if t.hflip or t.vflip or t.crop is not None or t.pad)
        self.transform = transform
        self.transform_workers = transform_workers
        auto_opts = _auto_options(num_workers, prefetch, memory_budget, auto_target)
        hook_prefetch = 0
        if prefetch == "auto":
            # The controller sizes the slots; the hook's queue (transform=)
            # takes the library's default depth for the first workers.
            hook_prefetch = _hook_prefetch(
                max(1, _npyload.default_prefetch(
                    (num_workers or -1) if isinstance(num_workers, int) else 0) - 1),
                transform_workers)
        self._opts: dict[int, int] = {
            _npyload.OPT_BATCH_SIZE: batch_size,
            _npyload.OPT_NUM_WORKERS: (_npyload.AUTO if num_workers == "auto" else
                                       num_workers or -1),  # -1: sync
            _npyload.OPT_PREFETCH: (_npyload.AUTO if prefetch == "auto" else
                                    _slots_for(prefetch, transform)),
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
            _npyload.OPT_CACHE_FILL: _check_cache_fill(cache_fill),
            _npyload.OPT_SAMPLES_PER_EPOCH: samples_per_epoch or 0,  # 0: the sources' sum
        }
        self._opts.update(auto_opts)
        self._auto = bool(auto_opts)
        self._auto_seen = 0  # controller decisions already logged
        if pin_memory is not None:
            self._opts[_npyload.OPT_PIN_MEMORY] = int(pin_memory)
        self._opts[_npyload.OPT_DEVICE] = dev  # last: it may load CUDA
        self._c: Any = self._check_start()  # checked, stopped until the first iter()

        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.num_workers = num_workers
        self.read_ahead = bool(read_ahead)
        self._hook_prefetch = hook_prefetch if prefetch == "auto" else prefetch
        self.cache_fill = cache_fill
        # The library's PREFETCH, as it reports it once started (host slots,
        # or device slots with a CUDA device; the range was checked).
        self.num_slots = self._opts[_npyload.OPT_PREFETCH]  # AUTO (-2): the controller's
        self.prefetch = prefetch  # None was made 'auto'
        self.memory_budget = memory_budget
        self.auto_target = auto_target
        self.device = dev
        self.rank = rank
        self.world_size = world_size
        self.copy = bool(copy)
        self.as_tuple = bool(as_tuple)
        self._gen = 0  # bumped by each call that supersedes a running loop
        self._hook_state = None  # with transform=: the state the consumer is at
        self._clock = _LoopClock(transform_workers)  # with transform=: hook, loop wait, step
        _habits.construction_warnings(specs, self._transforms, len(self), batch_size,
                                      -(-self._n // world_size), bool(drop_last), stacklevel=3)

    # ---- DataLoader-like surface ----

    def __len__(self) -> int:
        """Batches the next ``for`` loop yields for this rank: a full epoch
        (the same on every rank), except after load_state_dict, until that
        loop has ended, where it is what the resumed loop yields (what was
        left of the epoch). The library's count (npyload_loader_pass_batches).
        May be read from any thread, also while a loop waits for a batch."""
        return int(self._live().pass_batches())

    @property
    def num_samples(self) -> int:
        """N: samples in every field (all ranks together)."""
        self._live()
        return self._n

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) loop; before the first loop
        after set_epoch() or load_state_dict(), the epoch they chose."""
        return int(self._live().get_state()["epoch"])

    @property
    def backend(self) -> str:
        """Name of the active io backend ('uring', 'pread' or 'mmap'); before
        the first iter(), the one the constructor's check chose. May be read
        from any thread, also while a loop waits for a batch."""
        return str(self._live().backend if self._running else self._checked_backend)

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
        return dict(c.field_engines() if self._running else self._checked_engines)

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
            c = self._live()
            self._stop_pipe()
            c.set_epoch(epoch)  # the library's rules (npyload_loader_set_epoch)
            self._gen += 1  # a running loop is superseded
            self._hook_state = None

    def __iter__(self) -> Iterator[_B]:
        with self._in_use("iter()"):
            return self._iter()

    def _iter(self) -> Iterator[_B]:
        self._live()
        self._stop_pipe()
        c = self._started()
        c.begin_pass()  # the epoch (or the resumed position) by the library's rule
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
        pipe = self._pipe = _HookPipe(c, wrap, self.transform, _hook_depth(self._hook_prefetch),
                                      stream, self._clock, self.transform_workers,
                                      _rng_key(self.seed, self.rank))
        try:
            pipe.start()
            return _Iterator(self, self._gen, pipe)
        except BaseException:  # Ctrl-C while the threads start: none is left running
            self._stop_pipe()
            raise

    set_weights = _mix.set_weights  # with sources=

    def state_dict(self) -> LoaderState:
        """The position after the last batch handed out (with transform=:
        the last batch the loop received), as a dict of ints (save it with
        your checkpoint): the library's state records (npyload.h,
        npyload_loader_save_state): seed, epoch, consumed, base, ... and
        ``loop_ended``, 1 when the loop over that position ran to its end
        (StopIteration), so that a loader resumed from it starts the next
        epoch, as this one would (0 after a ``break``: the rest of the epoch
        is resumed). Works before the first iter() too (without starting
        the loader). Without transform=, refused (RuntimeError "in use")
        while another thread's loop waits in next()."""
        self._live()
        hook_state = self._hook_state  # with transform=: a Python read
        if hook_state is not None:
            return cast("LoaderState", dict(hook_state))
        with self._in_use("state_dict()"):
            return cast("LoaderState", self._live().get_state())

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
        _check_state(state)
        with self._in_use("load_state_dict()"):
            self._load_state_dict(dict(state))

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        c = self._live()
        self._stop_pipe()
        if self._running and int(state["shuffle"]) != self._opts[_npyload.OPT_SHUFFLE]:
            # The workers chose their read hints (random or sequential) for
            # the shuffle mode they started with: new ones, restored before
            # start (which adopts the state's seed, shuffle and drop_last).
            new = self._new_c(self._opts)
            try:
                new.set_state(state)
                new.start()
            except BaseException:
                new.close()
                raise
            self._c, old = new, c
            old.close()
        else:
            c.set_state(state)  # checked by the library, against the fields
        for o, k in ((_npyload.OPT_SEED, "seed"), (_npyload.OPT_SHUFFLE, "shuffle"),
                     (_npyload.OPT_DROP_LAST, "drop_last")):
            self._opts[o] = int(state[k])
        self.seed = int(state["seed"])
        self.drop_last = bool(int(state["drop_last"]))
        names: dict[int, bool | str] = {0: False, 1: True, 2: "local"}
        self.shuffle = names.get(int(state["shuffle"]), self.shuffle)
        self._gen += 1  # a running loop is superseded
        self._hook_state = None

    def _log_auto(self) -> None:
        """One INFO line on the "npyload" logger per change the controller
        made since the last call (num_workers / prefetch "auto")."""
        if not self._auto or not self._running:
            return
        total, events = self._c.auto_history(self._auto_seen)
        if total == self._auto_seen:
            return
        self._auto_seen = total
        for (t_ns, batch, w, s, pw, ps, why, share, rate, busy, blocked, _slot, ahead,
             pahead) in events:
            if why == "start" or not _auto_log.isEnabledFor(_logging.INFO):
                continue
            _auto_log.info(
                "npyload auto: workers %d->%d, slots %d->%d, read-ahead %s->%s (%s) at "
                "batch %d, %.1f s: consumer waited %.1f%% of its loop, %.0f samples/s, "
                "workers busy %.0f%%, blocked in reads %.0f%%", pw, w, ps, s,
                "on" if pahead else "off", "on" if ahead else "off", why, batch,
                t_ns / 1e9, 100 * share, rate, 100 * busy, 100 * blocked)

    def auto_history(self) -> list[dict[str, Any]]:
        """The controller's last decisions (at most 32), oldest first: dicts
        with t (seconds since the first iter()), batch, workers, slots,
        prev_workers, prev_slots, reason ("start", "wait", "no-gain",
        "spare", "worse", "held", "regime", "forced", "unused",
        "read-ahead-off", "read-ahead-on"), read_ahead and prev_read_ahead
        (the workers read ahead after it and before: True or False) and the
        window's measurements behind it: wait_share (the loop's wait in
        next() over wait + step), samples_per_s, worker_busy, read_blocked
        and slot_wait (shares of the workers' time; slot_wait: waiting for a
        free slot).
        Empty before the first iter() and with explicit num_workers and
        prefetch."""
        if not self._running:
            return []
        _, events = self._live().auto_history(0)
        keys = ("t", "batch", "workers", "slots", "prev_workers", "prev_slots", "reason",
                "wait_share", "samples_per_s", "worker_busy", "read_blocked", "slot_wait",
                "read_ahead", "prev_read_ahead")
        out = []
        for e in events:
            d = dict(zip(keys, e))
            d["t"] = e[0] / 1e9
            d["read_ahead"] = bool(d["read_ahead"])
            d["prev_read_ahead"] = bool(d["prev_read_ahead"])
            out.append(d)
        return out

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
        documented at npyload_stats_verdict in npyload.h. With ``transform=fn`` also
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
        if not self._running:
            scratch = _npyload.Loader()  # unstarted: the library's zeros, every key
            try:
                st = scratch.stats()
            finally:
                scratch.close()
            st["backend"] = self._checked_backend
            st["device"] = self.device
            st["hook_ns"] = st["loop_wait_ns"] = st["loop_step_ns"] = 0
            st["transform_workers"] = 0 if self.transform is None else self.transform_workers
            return _mix.add_stats(c, self._sources, st)
        if self.transform is None:
            st = cast("LoaderStats", c.stats())
            st["hook_ns"] = st["transform_workers"] = 0
            st["loop_wait_ns"], st["loop_step_ns"] = st["wait_ns"], st["step_ns"]
            return _mix.add_stats(c, self._sources, st)
        st = cast("LoaderStats", c.stats(hook_ns=k.verdict_hook_ns(), loop_wait_ns=k.wait_ns,
                                         loop_step_ns=k.step_ns))
        st["hook_ns"], st["loop_wait_ns"], st["loop_step_ns"] = k.hook_ns, k.wait_ns, k.step_ns
        st["transform_workers"] = self.transform_workers
        return _mix.add_stats(c, self._sources, st)

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
            self._c.close()  # a second close is fine

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
                f"{'' if self._running else ' not started'}>")

    # ---- internals ----

    def _new_c(self, opts: dict[int, int]) -> Any:
        """A new C loader with the stored fields, `opts` and transforms,
        not started."""
        c: Any = _npyload.Loader()
        try:
            if opts[_npyload.OPT_DEVICE] >= 0:
                c._set_stream_joiner(_join_streams)
            if self._remote is not None:
                c.set_remote(self._remote)
            _mix.add_fields(c, self._specs, self._sources, self._weights, self._src_transforms)
            for opt, value in opts.items():
                c.set(opt, value)
            if opts[_npyload.OPT_DEVICE] >= 0 and self._transforms:
                for which, path in _kernel_paths():
                    c.set_path(which, path)
            for name, t in self._transforms:
                t._set_on(c, name)
        except BaseException:
            c.close()
            raise
        return c

    def _check_start(self) -> Any:
        """The constructor's check: a C loader with the fields and options,
        started as the first iter() will be but with one row per slot, one
        slot, no worker thread and no read-ahead, so that every error of a
        start (paths, headers, counts, names, transforms, backend, device)
        is raised here, then stopped: it keeps the headers and the remote
        probes it read (a file changed by the first iter() is read again
        then), and nothing else is held. Returns it, with the loader's own
        options, and keeps what the loader reports before it starts."""
        opts = dict(self._opts)
        opts.update({_npyload.OPT_BATCH_SIZE: 1, _npyload.OPT_NUM_WORKERS: -1,
                     _npyload.OPT_PREFETCH: 1, _npyload.OPT_READ_AHEAD: -1,
                     _npyload.OPT_CACHE_FILL: -1})  # the check fills nothing
        c = self._new_c(opts)
        try:
            c.start()
            self.field_names = c.field_names
            self._n: int = c.num_samples()
            self._checked_backend = c.backend
            self._checked_engines: dict[str, tuple[str, str]] = c.field_engines()
            short = c.stats()["last_error"]  # on_error='skip': files short at start
            if short and self._opts[_npyload.OPT_ON_ERROR] == 1:
                _warnings.warn(f"npyload: {short}", RuntimeWarning, stacklevel=3)
            c.stop()
            for opt, value in self._opts.items():
                c.set(opt, value)
        except BaseException:
            c.close()
            raise
        return c

    def _started(self) -> Any:
        """The C loader, started by the first call (at the position chosen
        so far); in a fork() child, the parent's is unusable: a new one."""
        if not self._running:
            if self._pid != _os.getpid():
                self._c = self._check_start()
            if not self._c.started:  # a start a Ctrl-C interrupted as it returned is kept
                self._c.start()
            self._running = True
        return self._c

    def _stop_pipe(self) -> None:
        pipe = self._pipe
        if pipe is not None:
            self._pipe = None
            pipe.stop()

    def _live(self) -> Any:
        """The C loader (stopped before the first iter()); raises once closed."""
        if self._closed:
            raise ValueError("npyload loader is closed")
        return self._c

    def _wrap(self, raw: _npyload.Batch) -> Any:
        return _wrap_raw(raw, self._torch, self._np, self.copy, self.as_tuple,
                         getattr(self, "_bf16", None), self._aug_fields)
