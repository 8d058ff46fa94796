"""npyload: stream NPY arrays into reused pinned buffers and onto the GPU.

A drop-in for ``torch.utils.data.DataLoader`` over pre-batched ``.npy`` files::

    import npyload
    loader = npyload.Loader({"images": "data/images/train/*.npy",
                             "heatmaps": "data/labels/train/*_heatmaps.npy"},
                            batch_size=128, shuffle=True, num_workers=4,
                            device="cuda")
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:
            x, y = batch["images"], batch["heatmaps"]   # torch tensors
            ...

Lifetime rule
-------------
Arrays and tensors of a batch are zero-copy views of one of the loader's
``prefetch`` slots. A slot is given back to the loader when the last array or
tensor made from its batch is freed (and the ``Batch`` object itself).
Keeping batches alive therefore holds slots: when every slot is held, the next
batch cannot be read and iteration raises ``NpyloadError`` (rather than
hanging). Copy what you keep (``.clone()`` / ``.copy()``), or pass
``copy=True`` to get owned copies and release slots immediately.
Deleting (or closing) the loader while arrays from it are alive is safe: the
workers stop at once, its files and free slots are released, and only the
slots still in use live on, each freed when its last array dies.

Threads: calls on one loader never overlap. A call made while another thread
is inside one (``next()`` of a loop, ``iter()``, ``set_epoch()``,
``load_state_dict()``, ``state_dict()``, ``close()``) raises RuntimeError
("npyload loader is in use: X was called while Y is running") and changes
nothing. ``stats()``, ``len()``, ``backend`` and the other attributes may be
read from any thread at any time, also while a loop waits for a batch.
Waits for a batch release the GIL and Ctrl-C interrupts them promptly.
"""

import functools as _functools
import math as _math
import struct as _struct
import os as _os
import sys as _sys
import queue as _queue
import threading as _threading
import warnings as _warnings
from collections.abc import Mapping as _Mapping

from . import _npyload
from ._npyload import NpyloadError, inspect, load, order_indices, cuda_available

__all__ = ["Loader", "Batch", "BatchTuple", "Transform", "TransformError", "NpyloadError",
           "inspect", "load", "order_indices", "cuda_available", "pack", "__version__"]
__version__ = _npyload.__version__

_IO = {"auto": _npyload.IO_AUTO, "uring": _npyload.IO_URING,
       "io_uring": _npyload.IO_URING, "pread": _npyload.IO_PREAD,
       "mmap": _npyload.IO_MMAP}
_SHUFFLE = {"none": _npyload.SHUFFLE_NONE, "full": _npyload.SHUFFLE_FULL,
            "local": _npyload.SHUFFLE_LOCAL}


def _int_arg(name, value, minimum=None, allow_none=False, maximum=None, what=""):
    """value as an int, or ValueError "NAME = VALUE out of range: LO .. HI
    (WHAT)" naming the caller's argument in the caller's units."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = value.__index__()
    if ((minimum is not None and value < minimum) or
            (maximum is not None and value > maximum)):
        lo = "" if minimum is None else _int_text(minimum)
        hi = "" if maximum is None else _int_text(maximum)
        span = f"{lo} .. {hi}" if lo and hi else f">= {lo}" if lo else f"<= {hi}"
        raise ValueError(f"{name} = {value} out of range: {span}"
                         + (f" ({what})" if what else ""))
    return value


def _int_text(v):
    return {_INT64_MAX: "2**63-1", -_INT64_MAX - 1: "-2**63"}.get(v, str(v))


_INT64_MAX = (1 << 63) - 1
_EPOCH_MAX = _INT64_MAX  # the binding passes epochs as int64
# {option: (lo, hi, default)}: what npyload_loader_set accepts, asked of the
# library (the limits live in the C code only).
_OPT_RANGES = _npyload.Loader.option_ranges()


def _opt_max(opt):
    return _OPT_RANGES[opt][1]


def _env_int(var):
    v = _os.environ.get(var)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {var}={v!r} is not an int") from None


def _dist_rank_world():
    """(rank, world_size) from an initialised torch.distributed, else None."""
    dist = _sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - defensive
        pass
    return None


def _parse_device(device):
    """-1 for host memory, k for CUDA device k."""
    if device is None:
        return -1
    if isinstance(device, bool):
        raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}")
    if hasattr(device, "__index__"):
        return _device_index(device.__index__())
    if type(device).__name__ == "device" and hasattr(device, "type"):  # torch.device
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}")
    d = device.strip().lower()
    if d == "cpu":
        return -1
    if d == "cuda":
        lr = _env_int("LOCAL_RANK")
        return lr if lr is not None else 0
    if d.startswith("cuda:"):
        tail = d[5:]
        if tail.isdigit():
            return _device_index(int(tail))
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (N a device index), got {device!r}")


def _device_index(k):
    lo, hi = _OPT_RANGES[_npyload.OPT_DEVICE][:2]
    if not lo <= k <= hi:
        raise ValueError(f"device = {k} out of range: -1 (cpu) or a CUDA device index "
                         f"0 .. {hi}")
    return k


def _parse_shuffle(shuffle):
    if isinstance(shuffle, bool):
        return _npyload.SHUFFLE_FULL if shuffle else _npyload.SHUFFLE_NONE
    if isinstance(shuffle, str) and shuffle.lower() in _SHUFFLE:
        return _SHUFFLE[shuffle.lower()]
    raise ValueError(f"shuffle must be True, False, 'full', 'local' or 'none', got {shuffle!r}")


def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


# One side stream per CUDA device, shared by every loader of the process: the
# stream a device batch's slot is released on when the batch was handed to
# several streams. torch's pool streams live as long as the process, as the
# C library requires of a release stream.
_side_streams = {}


def _join_streams(device, handles):
    """Called by the extension when a device batch that was handed to several
    CUDA streams (``handles``: cudaStream_t as ints, 0 = legacy default) is
    released. Makes a side stream wait for an event recorded now on each of
    them and returns it: the slot is released on it, so its next copy is
    ordered after the work queued on all of them. The consumers' streams get
    no new dependency."""
    torch = _sys.modules["torch"]  # device output always goes through torch
    with torch.cuda.device(device):
        side = _side_streams.get(device)
        if side is None:
            side = _side_streams[device] = torch.cuda.Stream(device)
        for h in handles:
            s = (torch.cuda.ExternalStream(h, device=device) if h
                 else torch.cuda.default_stream(device))
            ev = torch.cuda.Event()
            ev.record(s)
            side.wait_event(ev)
        return side.cuda_stream


class Batch(_Mapping):
    """One batch: a read-only mapping from field name to array or tensor.

    Attributes: ``indices`` (global sample index of each row; an int64 numpy
    array or torch tensor, an owned copy), ``epoch``, ``seq`` (the batch's
    position in this rank's epoch) and ``num_samples`` (rows).
    Without ``copy=True`` the values share memory with a loader slot; the
    slot is given back when the last of them (and this object) is freed.
    """

    __slots__ = ("_data", "indices", "epoch", "seq", "num_samples", "_raw")

    def __init__(self, data, indices, epoch, seq, num_samples, raw):
        self._data = data
        self.indices = indices
        self.epoch = epoch
        self.seq = seq
        self.num_samples = num_samples
        self._raw = raw

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        # A mapping iterates its keys, so `images, labels = batch` (the
        # DataLoader habit) would silently bind field *names*. Refuse it
        # loudly; keys()/items()/values(), dict(batch) and **batch do not
        # come through here.
        raise TypeError(
            "npyload.Batch is a mapping from field name to tensor: iterating it "
            "(`a, b = batch`, `for x in batch`, list(batch)) would give the field "
            f"names {tuple(self._data)}, not the tensors. Index it (batch[name]), "
            "iterate batch.keys() or batch.items(), or pass as_tuple=True to "
            "npyload.Loader to get tuples in field order")

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def keys(self):
        return self._data.keys()

    def items(self):
        return self._data.items()

    def values(self):
        return self._data.values()

    def wait_stream(self, stream=None):
        """Makes a CUDA stream (a torch.cuda.Stream or an int handle; None =
        legacy default) wait for this batch's copy. Tensors made by the loader
        already wait on the stream current when the batch was yielded. The
        batch's slot is reused only after the work queued on every stream it
        was handed to (this one included) when the batch is freed."""
        _wait_stream(self._raw, stream)

    def __repr__(self):
        fields = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self._data.items())
        return f"<npyload.Batch epoch={self.epoch} seq={self.seq} rows={self.num_samples} {{{fields}}}>"


def _wait_stream(raw, stream):
    if raw is None:
        return
    if stream is not None and hasattr(stream, "cuda_stream"):
        stream = stream.cuda_stream
    raw.wait_stream(stream)


class BatchTuple(tuple):
    """One batch with ``as_tuple=True``: a tuple of the fields' arrays or
    tensors in the order the fields were given, so ``images, labels = batch``
    works. Carries the same ``indices``, ``epoch``, ``seq``, ``num_samples``
    and ``wait_stream()`` as :class:`Batch`, and ``field_names``."""

    def wait_stream(self, stream=None):
        """As :meth:`Batch.wait_stream`."""
        _wait_stream(self._raw, stream)

    def __repr__(self):
        fields = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in zip(self.field_names, self))
        return (f"<npyload.BatchTuple epoch={self.epoch} seq={self.seq} "
                f"rows={self.num_samples} ({fields})>")


class TransformError(RuntimeError):
    """Raised from iteration when the ``transform=`` hook failed on a batch.

    ``seq`` and ``epoch`` name the batch; the exception the hook raised is
    chained as ``__cause__``. The batches before it were delivered."""

    def __init__(self, message, seq, epoch):
        super().__init__(message)
        self.seq = seq
        self.epoch = epoch


_EOF = object()


class _InUse:
    """A Loader's in-use guard: one call at a time. ``with guard("set_epoch()"):``
    runs the body if no call is in progress, else raises RuntimeError naming
    both calls (never waits: an overlap is a bug in the caller). The C object
    has the same guard, with the same message, for its own state; this one
    also keeps the Python-level state (generation counter, hook thread, the C
    object itself, which load_state_dict may replace) whole."""

    __slots__ = ("_mu", "call")

    def __init__(self):
        self._mu = _threading.Lock()  # held for a few bytecodes only
        self.call = None

    def __call__(self, call):
        with self._mu:
            busy = self.call
            if busy is None:
                self.call = call
                return self
        raise RuntimeError(f"npyload loader is in use: {call} was called while {busy} is "
                           "running (on another thread, or below this call); calls on one "
                           "loader must not overlap, only stats() and len() may run during "
                           "a next()")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.call = None


def _epoch_batches(n, world_size, batch_size, drop_last):
    """Batches per rank of a full epoch: DistributedSampler's split, then
    DataLoader's batching (the C library's npyl_order_num_batches)."""
    per_rank = n // world_size if drop_last else -(-n // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def _hook_depth(prefetch):
    """Results queued by the transform= thread: with the one fn works on,
    `prefetch` batches ahead of the loop (at least one queued)."""
    return max(1, prefetch - 1)


class _HookPipe:
    """The ``transform=`` thread of one iteration: takes batches from the C
    loader in order, calls fn on each, and queues (error, result, state) with
    the C loader's state after that batch, so the consumer's state_dict()
    counts what it received. Holds no reference to the Loader or the
    iterator, so freeing the iterator (a `break`) can stop it.

    While it runs, this thread is the only caller of the C loader's next()
    and get_state(): the Loader stops it (stop()) before any call of its own
    that would overlap (set_epoch, load_state_dict, close, iter), and the
    consumer's stats() may overlap a waiting next() (the C object allows
    it)."""

    def __init__(self, c, wrap, fn, depth, stream):
        self._c = c
        self._wrap = wrap
        self._fn = fn
        self._stream = stream
        self._q = _queue.Queue(depth)
        self._stop = _threading.Event()
        self._thread = _threading.Thread(target=self._run, name="npyload-transform",
                                         daemon=True)
        self._thread.start()

    def _run(self):
        try:
            if self._stream is not None:
                with _sys.modules["torch"].cuda.stream(self._stream):
                    self._loop()
            else:
                self._loop()
        except BaseException as e:  # a read error: delivered in order, as is
            self._put((e, None, None))

    def _loop(self):
        c, fn, stop = self._c, self._fn, self._stop
        while not stop.is_set():
            raw = c.next()
            state = None if raw is None else c.get_state()
            if raw is None:
                self._put((_EOF, None, None))
                return
            seq, epoch = raw.seq, raw.epoch
            batch = self._wrap(raw)
            del raw
            try:
                out = fn(batch)
            except BaseException as e:
                # No local may keep the batch or the error: e's traceback
                # keeps this frame (and fn's, which holds the batch while the
                # error lives: freed with it, by reference counting, as long
                # as no cycle holds the error; see _Iterator.__next__).
                del batch
                self._put((self._failed(e, seq, epoch), None, None))
                return
            del batch
            # The put blocks while the queue is full; stop() drains it.
            self._put((None, out, state))
            del out

    @staticmethod
    def _failed(e, seq, epoch):
        err = TransformError(f"npyload: transform failed on batch seq={seq} of epoch "
                             f"{epoch}: {type(e).__name__}: {e}", seq, epoch)
        err.__cause__ = e
        return err

    def _put(self, item):
        if not self._stop.is_set():
            self._q.put(item)

    def get(self):
        while True:
            try:
                return self._q.get(timeout=0.1)
            except _queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    raise RuntimeError("npyload: the transform thread was stopped") from None

    def _drain(self):
        try:
            while True:
                self._q.get_nowait()
        except _queue.Empty:
            pass

    def stop(self):
        """Stops the thread and drops what it queued (their slots go back).
        Waits for a running fn or next() to return; idempotent."""
        self._stop.set()
        t = self._thread
        if t is _threading.current_thread() or _sys.is_finalizing():
            return  # (at exit the daemon thread may never run again)
        while t.is_alive():
            self._drain()  # unblocks a put
            t.join(0.05)
        self._drain()


class _Iterator:
    __slots__ = ("_loader", "_gen", "_pipe")

    def __init__(self, loader, gen, pipe=None):
        self._loader = loader
        self._gen = gen
        self._pipe = pipe

    def __iter__(self):
        return self

    def _finish(self, ld, eof):
        self._loader = None
        if eof:
            ld._at_eof = True
            ld._len_override = None  # a resumed epoch is over: full epochs again
        if self._pipe is not None:
            self._pipe.stop()
            if ld._pipe is self._pipe:
                ld._pipe = None
            self._pipe = None

    def __next__(self):
        ld = self._loader
        if ld is None:
            raise StopIteration
        with ld._in_use("next()"):
            return self._next(ld)

    def _next(self, ld):
        if ld._gen != self._gen:
            self._finish(ld, False)
            raise RuntimeError("npyload: this iterator was superseded by a newer "
                               "iter(loader), set_epoch() or load_state_dict()")
        if self._pipe is not None:
            ld._live()
            err, out, state = self._pipe.get()
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

    def __len__(self):
        return len(self._loader) if self._loader is not None else 0

    def __del__(self):
        # `break` out of a loop frees the iterator: stop the hook thread so
        # it neither runs on nor holds slots.
        pipe = self._pipe
        if pipe is not None:
            self._pipe = None
            pipe.stop()


_TDTYPES = {None: 0, "float32": 1, "float16": 2, "bfloat16": 3}


def _float32(x):
    """x rounded to float32 (inf beyond its range)."""
    try:
        x = float(x)
    except OverflowError:  # an int beyond the double range
        return _math.inf if x > 0 else -_math.inf
    return _struct.unpack("f", _struct.pack("f", x))[0]


class Transform:
    """A per-field conversion done by the loader (workers on the host, a
    kernel on the GPU after the copy), before the batch is handed out.

    Per element, in float32: ``y = (x * scale - mean[c]) / std[c]`` (three
    roundings, no FMA), c the channel (axis 1 of the batch, axis 0 of a
    sample), then rounded to nearest even into ``dtype``.

    dtype : 'float32', 'float16', 'bfloat16' (numpy/torch dtypes accepted),
        or None to keep the stored dtype (only without arithmetic).
    scale : float, applied first; finite and nonzero (ValueError otherwise).
    mean, std : None, a number, or one number per channel.
    channels_last : bool. The batch keeps its logical shape (N, C, H, W) in
        NHWC memory order: a torch tensor is
        ``is_contiguous(memory_format=torch.channels_last)``, a numpy array
        has the matching strides.

    On a CUDA device the stored dtype crosses PCIe (a uint8 field costs one
    byte per element). bfloat16 batches are torch.bfloat16 tensors, or
    ml_dtypes.bfloat16 numpy arrays (raw uint16 bits without ml_dtypes).
    """

    __slots__ = ("dtype", "scale", "mean", "std", "channels_last")

    def __init__(self, dtype=None, scale=1.0, mean=None, std=None, channels_last=False):
        if dtype is not None:
            # 'float16', np.float16, np.dtype('float16'), torch.float16,
            # ml_dtypes.bfloat16
            name = dtype if isinstance(dtype, str) else (
                getattr(dtype, "__name__", None) or getattr(dtype, "name", None))
            name = (name if isinstance(name, str) else str(dtype)).rsplit(".", 1)[-1]
            if name not in _TDTYPES:
                raise ValueError(f"Transform: dtype must be 'float32', 'float16', "
                                 f"'bfloat16' or None, got {dtype!r}")
            dtype = name
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"Transform: scale must be a number, got {scale!r}")
        # The library computes in float32: a scale must be finite and nonzero
        # there (0 would zero the field, and the library's struct once read 0
        # as "unset", delivering x unscaled; inf and nan would poison it).
        # The default 1.0 reaches C as 1.0.
        if _float32(scale) in (0.0, _math.inf, -_math.inf) or scale != scale:
            raise ValueError(f"Transform: scale = {scale!r} out of range: a finite "
                             "nonzero float32 (|scale| from 1.4e-45 to 3.4e38; 1.0 = "
                             "no scaling)")
        self.dtype = dtype
        self.scale = float(scale)
        self.mean = self._values("mean", mean)
        self.std = self._values("std", std)
        if self.std is not None and any(v == 0 for v in self.std):
            raise ValueError(f"Transform: std must be nonzero, got {std!r}")
        if not isinstance(channels_last, (bool, int)):
            raise TypeError(f"Transform: channels_last must be a bool, got {channels_last!r}")
        self.channels_last = bool(channels_last)
        if dtype is None:
            what = ("mean" if self.mean is not None else "std" if self.std is not None
                    else "scale" if self.scale != 1.0 else None)
            if what:
                raise ValueError(f"Transform: {what} needs an output dtype ('float32', "
                                 "'float16' or 'bfloat16'); dtype=None keeps the stored "
                                 "one and allows no arithmetic")

    @staticmethod
    def _values(what, v):
        if v is None:
            return None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return (float(v),)
        try:
            vals = tuple(float(x) for x in v)
        except TypeError:
            raise TypeError(f"Transform: {what} must be None, a number or a sequence of "
                            f"numbers, got {v!r}") from None
        if not vals:
            raise ValueError(f"Transform: {what} is empty")
        return vals

    def __repr__(self):
        return (f"Transform(dtype={self.dtype!r}, scale={self.scale!r}, mean={self.mean!r}, "
                f"std={self.std!r}, channels_last={self.channels_last!r})")


def _bfloat16_numpy():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


class Loader:
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
        for the next. None: the library default (2 x num_workers slots).
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
    align : 'names' or 'none'
        'names' (default): when every field has the same number of files,
        the i-th files of all fields must carry the same number as the last
        run of digits of their names (``train_0007.npy`` pairs with
        ``train_0007_heatmaps.npy``), so misaligned lists fail at start
        naming both files. 'none' turns the check off.
    on_error : 'raise' or 'skip'
        'raise' (default): a failed read (I/O error, truncated, changed or
        replaced file) raises NpyloadError from the iteration. 'skip': the
        batch's reads are retried once, then samples that still fail are
        dropped from the batch (it is shorter; ``batch.indices`` lists what it
        holds), never delivered as wrong bytes, and counted in
        ``stats()['samples_skipped']``; nothing is logged. An epoch whose reads
        all fail still ends (its batches are empty).
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

    Iteration follows DataLoader with DistributedSampler: ``for b in loader``
    runs the epoch chosen with ``set_epoch`` (0 at first) from its first batch;
    every new ``iter(loader)`` starts that epoch again, except the first one
    after ``load_state_dict``, which resumes where the saved loader stopped.
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
    """

    def __init__(self, fields, batch_size, shuffle=False, seed=0, drop_last=False,
                 num_workers=2, prefetch=None, device="cpu", rank=None,
                 world_size=None, io="auto", output="auto", copy=False, window=8,
                 direct_io=False, pin_memory=None, align="names", on_error="raise",
                 max_errors=None, transforms=None, as_tuple=False, transform=None):
        self._c = None
        self._pipe = None
        self._in_use = _InUse()
        if not isinstance(fields, _Mapping) or len(fields) == 0:
            raise TypeError("fields must be a non-empty mapping from field name "
                            "to a glob string or a list of paths"
                            if not isinstance(fields, _Mapping) else
                            "fields must be a non-empty mapping (got an empty one)")
        specs = []
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

        # Ranges in this constructor's units, from the library's limits:
        # num_workers=0 is the library's WORKERS_SYNC, prefetch counts the
        # batches ahead of the one the loop holds (slots - 1, or slots - 2
        # with transform=; see below), window=0 is not "default" here.
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
        if align not in ("names", "none"):
            raise ValueError(f"align must be 'names' or 'none', got {align!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        max_errors = 0 if max_errors is None else _int_arg(
            "max_errors", max_errors, 1, maximum=_opt_max(_npyload.OPT_MAX_ERRORS),
            what="skipped samples; None = no limit")
        shuffle_mode = _parse_shuffle(shuffle)
        if not isinstance(drop_last, (bool, int)):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
        if not isinstance(direct_io, (bool, int)):
            raise TypeError(f"direct_io must be a bool, got {direct_io!r}")
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
                               stacklevel=2)
                pin_memory = None

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

        torch = None
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
            self._np = numpy
            self._bf16 = _bfloat16_numpy()
        else:
            self._np = None
        self._torch = torch

        self._specs = specs
        self._transforms = []
        if transforms is not None:
            if not isinstance(transforms, _Mapping):
                raise TypeError("transforms must be a mapping from field name to "
                                f"npyload.Transform, got {type(transforms).__name__}")
            names = [n for n, _, _ in specs]
            for name, t in transforms.items():
                if name not in names:
                    raise ValueError(f"transforms: no field named {name!r} (fields: "
                                     f"{', '.join(names)})")
                if not isinstance(t, Transform):
                    raise TypeError(f"transforms[{name!r}] must be an npyload.Transform, "
                                    f"got {type(t).__name__}")
                self._transforms.append((name, t))
        self.transform = transform
        if transform is not None and not prefetch:
            prefetch = max(1, 2 * num_workers - 1)  # the library's default memory
        if transform is None:
            slots = prefetch + 1 if prefetch else 0
        else:
            # The loop body may hold two batches for a moment (the previous
            # one and the one just taken from the queue, before the `for`
            # rebinds its variable), the queue holds its results, and the
            # thread's next() needs a free slot to read into.
            slots = _hook_depth(prefetch) + 3
        self._opts = {
            _npyload.OPT_BATCH_SIZE: batch_size,
            _npyload.OPT_NUM_WORKERS: num_workers if num_workers else -1,  # -1: sync
            _npyload.OPT_PREFETCH: slots,
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
        }
        if pin_memory is not None:
            self._opts[_npyload.OPT_PIN_MEMORY] = int(pin_memory)
        self._opts[_npyload.OPT_DEVICE] = dev  # last: it may load CUDA
        self._c = c = self._build()

        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.num_workers = num_workers
        self.num_slots = c.get(_npyload.OPT_PREFETCH)
        self.prefetch = prefetch if prefetch else self.num_slots - 1
        self.device = dev
        self.rank = rank
        self.world_size = world_size
        self.copy = bool(copy)
        self.as_tuple = bool(as_tuple)
        self.field_names = c.field_names
        self._epoch = 0
        self._gen = 0
        self._fresh = True      # the C loader is at the start of _epoch
        self._resumed = False   # a load_state_dict position awaits iteration
        self._at_eof = False
        self._n = c.num_samples()
        self._len_override = None  # batches of a resumed epoch (load_state_dict)
        self._hook_state = None  # with transform=: the state the consumer is at

    # ---- DataLoader-like surface ----

    def __len__(self):
        """Batches per epoch for this rank (the same on every rank). After
        load_state_dict, until that epoch's loop has ended: the batches the
        resumed loop yields (what was left of the epoch)."""
        self._live()
        if self._len_override is not None:
            return self._len_override
        return _epoch_batches(self._n, self.world_size, self.batch_size, self.drop_last)

    @property
    def num_samples(self):
        """N: samples in every field (all ranks together)."""
        self._live()
        return self._n

    @property
    def epoch(self):
        return self._epoch

    @property
    def backend(self):
        """Name of the active io backend ('uring', 'pread' or 'mmap'). May be
        read from any thread, also while a loop waits for a batch."""
        return self._live().backend

    def set_epoch(self, epoch):
        """Selects the epoch the next ``for`` loop runs (its order is a pure
        function of (seed, epoch)). Prefetching for it starts now. Right after
        load_state_dict, set_epoch with the saved epoch keeps the resumed
        position. Raises RuntimeError ("in use") while another call on this
        loader runs (a loop's next() included), changing nothing."""
        epoch = _int_arg("epoch", epoch, 0, maximum=_EPOCH_MAX)
        with self._in_use("set_epoch()"):
            self._set_epoch(epoch)

    def _set_epoch(self, epoch):
        c = self._live()
        if self._resumed and epoch == self._epoch:
            return
        self._stop_pipe()
        c.set_epoch(epoch)
        self._epoch = epoch
        self._gen += 1
        self._fresh = True
        self._resumed = False
        self._at_eof = False
        self._len_override = None
        self._hook_state = None

    def __iter__(self):
        with self._in_use("iter()"):
            return self._iter()

    def _iter(self):
        c = self._live()
        self._stop_pipe()
        if self._resumed:
            self._resumed = False
        elif not self._fresh:
            c.set_epoch(self._epoch)
            self._len_override = None
        self._fresh = False
        self._at_eof = False
        self._gen += 1
        if self.transform is None:
            return _Iterator(self, self._gen)
        self._hook_state = c.get_state()
        stream = None
        if self.device >= 0 and self._torch is not None:
            stream = self._torch.cuda.current_stream(self.device)
        wrap = _functools.partial(_wrap_raw, torch=self._torch, np=self._np,
                                  copy=self.copy, as_tuple=self.as_tuple,
                                  bf16=getattr(self, "_bf16", None))
        self._pipe = _HookPipe(c, wrap, self.transform,
                               _hook_depth(self.prefetch), stream)
        return _Iterator(self, self._gen, self._pipe)

    def state_dict(self):
        """The position after the last batch handed out (with transform=:
        the last batch the loop received), as a dict of ints (save it with
        your checkpoint). Without transform=, refused (RuntimeError "in
        use") while another thread's loop waits in next()."""
        self._live()
        hook_state = self._hook_state  # with transform=: a Python read
        if hook_state is not None:
            return dict(hook_state)
        with self._in_use("state_dict()"):
            return dict(self._live().get_state())

    def load_state_dict(self, state):
        """Resumes from ``state_dict()`` of a loader over the same data with
        the same batch_size (num_workers, prefetch and io may differ). At the
        same world_size the next ``iter(loader)`` yields exactly the batches
        the saved loader would have yielded next. At another world_size (a
        state saved by any rank of a DDP job, resumed with W' ranks) the rest
        of the epoch's global sequence is split over the W' ranks like
        DistributedSampler: nothing lost, nothing repeated but the padding
        (at most W'-1 samples), equal batch counts; the next epoch is the
        normal split. Raises RuntimeError ("in use") while another call on
        this loader runs, changing nothing."""
        if not isinstance(state, _Mapping):
            raise TypeError("state must be the dict returned by state_dict()")
        with self._in_use("load_state_dict()"):
            self._load_state_dict(state)

    def _load_state_dict(self, state):
        c = self._live()
        self._stop_pipe()
        adopt = {_npyload.OPT_SEED: "seed", _npyload.OPT_SHUFFLE: "shuffle",
                 _npyload.OPT_DROP_LAST: "drop_last"}
        for key in ("epoch", "consumed", "seed", "shuffle", "drop_last"):
            if key not in state:
                raise ValueError(f"state lacks the key {key!r} (expected the dict "
                                 "returned by state_dict())")
        if all(int(state[k]) == self._opts[o] for o, k in adopt.items()):
            c.set_state(state)
        else:
            # The order depends on seed/shuffle/drop_last, which a started
            # loader cannot change: build a new one restored before start.
            new = self._build(state)
            for o, k in adopt.items():
                self._opts[o] = int(state[k])
            self.seed = int(state["seed"])
            self.drop_last = bool(state["drop_last"])
            self.shuffle = {0: False, 1: True, 2: "local"}.get(int(state["shuffle"]), self.shuffle)
            self._c, old = new, c
            old.close()
            c = new
        self._epoch = int(state["epoch"])
        self._gen += 1
        self._resumed = True
        self._fresh = False
        self._at_eof = False
        self._hook_state = None
        # The resumed loop yields the rest of the epoch (at another world
        # size, the rest split over the new ranks): len() says so until it ends.
        consumed = int(c.get_state()["consumed"])
        self._len_override = c.num_batches() - (-(-consumed // self.batch_size))

    def stats(self):
        """Counters since start: bytes_read, batches_delivered, wait_ns, io_ns,
        h2d_bytes, h2d_ns, backend, pinned, direct_io, device, slot_bytes,
        num_slots, uring_fallbacks, and with on_error='skip' samples_skipped,
        errors and last_error (the message of the last failure behind a
        skip). May be called from any thread, also while a loop waits for a
        batch (then it does not wait); refused (RuntimeError "in use") only
        during set_epoch(), load_state_dict(), close() and the like."""
        return self._live().stats()

    def close(self):
        """Stops the workers and frees the loader at once (threads, open
        files, io_uring rings, unused slots). Arrays and tensors still alive
        stay valid: only their slots are kept, each freed when its last array
        dies. A ``transform=`` thread is stopped first (after its running
        call returns) and the batches it had prepared are dropped. Refused
        (RuntimeError "in use") while another call on this loader runs, a
        loop's next() included: stop the loop first. Closing twice is fine."""
        with self._in_use("close()"):
            self._stop_pipe()
            if self._c is not None:
                self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._c is None or self._c.closed:
            return "<npyload.Loader closed>"
        return (f"<npyload.Loader fields={list(self.field_names)} batch_size={self.batch_size} "
                f"batches={len(self)} rank={self.rank}/{self.world_size} "
                f"backend={self.backend} device={self.device}>")

    # ---- internals ----

    def _build(self, state=None):
        """A started C loader for the stored fields and options, positioned
        at `state` when given (restored before start, so the state's seed,
        shuffle and drop_last are adopted)."""
        c = _npyload.Loader()
        if self._opts[_npyload.OPT_DEVICE] >= 0:
            c._set_stream_joiner(_join_streams)
        try:
            for name, glob, paths in self._specs:
                if paths is None:
                    c.add_field(name, glob)
                else:
                    c.add_field_files(name, paths)
            for opt, value in self._opts.items():
                c.set(opt, value)
            for name, t in self._transforms:
                c.set_transform(name, _TDTYPES[t.dtype], t.scale, t.mean, t.std,
                                t.channels_last)
            if state is not None:
                c.set_state(state)
            c.start()
        except BaseException:
            c.close()
            raise
        return c

    def _stop_pipe(self):
        pipe = self._pipe
        if pipe is not None:
            self._pipe = None
            pipe.stop()

    def _live(self):
        c = self._c
        if c is None or c.closed:
            raise ValueError("npyload loader is closed")
        return c

    def _wrap(self, raw):
        return _wrap_raw(raw, self._torch, self._np, self.copy, self.as_tuple,
                         getattr(self, "_bf16", None))


def _wrap_raw(raw, torch, np, copy, as_tuple, bf16=None):
    """A Batch (or BatchTuple) of torch tensors or numpy arrays viewing raw's slot."""
    names = raw.field_names
    data = {}
    if torch is not None:
        for i, name in enumerate(names):
            t = torch.from_dlpack(raw.field(i))
            data[name] = t.clone() if copy else t
        indices = torch.frombuffer(raw.indices_bytes(), dtype=torch.int64) \
            if raw.size else torch.empty(0, dtype=torch.int64)
    else:
        for i, name in enumerate(names):
            view = raw.field(i)
            a = np.asarray(view)
            if bf16 is not None and view.descr == "bfloat16":
                a = a.view(bf16)  # the array interface gives uint16 bits
            data[name] = a.copy() if copy else a
        indices = np.frombuffer(raw.indices_bytes(), dtype=np.int64)
    epoch, seq, n = raw.epoch, raw.seq, raw.size
    keep = raw
    if copy:
        if raw.live_views == 0:
            raw.release()
        keep = None
    if as_tuple:
        t = BatchTuple(data[name] for name in names)
        t.field_names = tuple(names)
        t.indices, t.epoch, t.seq, t.num_samples, t._raw = indices, epoch, seq, n, keep
        return t
    return Batch(data, indices, epoch, seq, n, keep)


_PACK_LEVELS = (-131072, 22)     # zstd's ZSTD_minCLevel() .. ZSTD_maxCLevel()
_PACK_MAX_FRAME = 1 << 30        # bytes: the seekable format's frame limit
_PACK_MAX_THREADS = 1024


def pack(paths, level=3, frame_size=None, threads=None, force=False,
         remove=False, out=None, checksum=True):
    """Compresses NPY files into seekable ``FILE.npy.zst`` shards, with the
    same C code as ``npyload-pack`` (``npyload_pack_file``) and its options:

    - ``paths``: one path or a list of paths of ``.npy`` files;
    - ``level``: zstd level (``-l``; negative levels are faster);
    - ``frame_size``: target decompressed bytes per frame (``--frame-size``):
      each frame holds the fewest whole samples reaching it (None: 128 KiB);
    - ``threads``: compression threads (``-T``; None or 0: all cores);
    - ``force``: replace existing outputs (``-f``); without it an existing
      output raises NpyloadError (``code == -errno.EEXIST``);
    - ``remove``: delete each input once it is packed (``--rm``);
    - ``out``: the output path (``-o``), with exactly one input;
    - ``checksum``: frame checksums (False is ``--no-check``).

    Each output is written as a nameless temporary file in its directory,
    synced to disk, and only then linked under its name (the directory
    synced after): an error, Ctrl-C (KeyboardInterrupt) or a power loss
    never leaves a partial file under the final name. ``force`` replaces
    regular files only: a device, FIFO, socket, directory or symbolic link at
    ``out`` raises NpyloadError naming it. An input modified while it is
    packed raises NpyloadError naming it (nothing written).
    Numbers out of range raise ValueError naming the argument and its range:
    ``level`` -131072 .. 22 (0: the default), ``frame_size`` 1 .. 1 GiB,
    ``threads`` 0 .. 1024. Files are packed in order; the first failure raises
    NpyloadError naming the file (earlier outputs stay). Returns one dict per
    input: ``in_bytes``, ``out_bytes``, ``frames`` (frame 0, the header, in),
    ``samples_per_frame``, ``seconds``, ``out``. ``zstd -d`` restores each
    ``.npy`` byte for byte.
    """
    if isinstance(paths, (str, bytes, _os.PathLike)):
        paths = [paths]
    paths = [_os.fsdecode(_os.fspath(p)) for p in paths]
    if not paths:
        raise ValueError("pack: no input file")
    if out is not None:
        if len(paths) != 1:
            raise ValueError(f"pack: out names one output: give exactly one "
                             f"input (got {len(paths)})")
        out = _os.fsdecode(_os.fspath(out))
    # The ranges of npyload_pack_file, checked here so that a bad value is a
    # ValueError naming it before any file is touched.
    level = _int_arg("level", level)
    if level != 0 and not _PACK_LEVELS[0] <= level <= _PACK_LEVELS[1]:
        raise ValueError(f"pack: level={level} out of range ({_PACK_LEVELS[0]} "
                         f".. {_PACK_LEVELS[1]}; 0 = the default 3)")
    frame_size = _int_arg("frame_size", frame_size, allow_none=True)
    if frame_size is not None and not 1 <= frame_size <= _PACK_MAX_FRAME:
        raise ValueError(f"pack: frame_size={frame_size} out of range (1 .. "
                         f"{_PACK_MAX_FRAME} bytes; None = 131072)")
    threads = _int_arg("threads", threads, allow_none=True)
    if threads is not None and not 0 <= threads <= _PACK_MAX_THREADS:
        raise ValueError(f"pack: threads={threads} out of range (0 .. "
                         f"{_PACK_MAX_THREADS}; None or 0 = all cores)")
    results = []
    for p in paths:
        r = _npyload.pack_file(p, out, level, frame_size or 0, threads or 0,
                               bool(force), bool(checksum))
        if remove:
            try:
                _os.unlink(p)
            except OSError as e:
                err = NpyloadError(f"{p}: packed, but cannot remove it: "
                                   f"{e.strerror}")
                err.code = -(e.errno or 0)
                raise err from e
        results.append(r)
    return results
