"""Batches as a mapping from field name to array or tensor (Batch), as a
tuple (BatchTuple), and the wrapping of the C batch views."""
from __future__ import annotations

import difflib as _difflib
from collections.abc import Mapping as _Mapping
from typing import TYPE_CHECKING, Any
from typing import NamedTuple as _NamedTuple

from ._torch import _wait_stream

if TYPE_CHECKING:
    from collections.abc import ItemsView, KeysView, ValuesView
    from typing import NoReturn

    from . import _npyload


class Augment(_NamedTuple):
    """One field's augmentation decisions for each row of a batch (numpy
    arrays of the batch's length): ``hflip``, ``vflip`` (bool) and the crop
    window's corner ``top``, ``left`` (int64, in the padded sample; 0
    without a crop). See :class:`npyload.Transform`."""

    hflip: Any
    vflip: Any
    top: Any
    left: Any


def _augment_of(raw: _npyload.Batch, names: tuple[str, ...],
                aug: frozenset[str]) -> dict[str, Augment]:
    """{field: Augment} for the fields in aug, from the library's decisions."""
    import numpy as np
    out = {}
    n = raw.size
    for i, name in enumerate(names):
        if name not in aug:
            continue
        b = raw.augment_bytes(i)
        out[name] = Augment(np.frombuffer(b, np.uint8, n, 16 * n).astype(bool),
                            np.frombuffer(b, np.uint8, n, 17 * n).astype(bool),
                            np.frombuffer(b, np.int64, n, 0), np.frombuffer(b, np.int64, n, 8 * n))
    return out


class Batch(_Mapping[str, Any]):
    """One batch: a read-only mapping from field name to array or tensor.

    Attributes: ``indices`` (global sample index of each row; an int64 numpy
    array or torch tensor, an owned copy; with ``sources=``, each row's index
    within its source), ``source`` (with ``sources=``, each row's source
    index in the order of ``sources``' keys, int64 like ``indices``; None
    without), ``epoch``, ``seq`` (the batch's
    position in this rank's epoch), ``num_samples`` (rows) and ``augment``
    ({field: :class:`Augment`} for the fields whose Transform flips or
    crops; empty otherwise) and ``rng`` (inside a ``transform=`` hook, the
    batch's numpy Generator, see ``Loader``; None elsewhere).
    Without ``copy=True`` the values share memory with a loader slot; the
    slot is given back when the last of them (and this object) is freed.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "y_0.npy"), np.arange(10))
    >>> loader = npyload.Loader({"y": os.path.join(d, "y_0.npy")}, batch_size=4,
    ...                         output="numpy")
    >>> batch = next(iter(loader))
    >>> list(batch.keys()), batch["y"].tolist(), batch.indices.tolist(), batch.epoch, batch.seq
    (['y'], [0, 1, 2, 3], [0, 1, 2, 3], 0, 0)
    """

    __slots__ = ("_data", "indices", "epoch", "seq", "num_samples", "_raw", "augment",
                 "rng", "source")

    def __init__(self, data: dict[str, Any], indices: Any, epoch: int, seq: int,
                 num_samples: int, raw: _npyload.Batch | None,
                 augment: dict[str, Augment] | None = None, source: Any = None) -> None:
        self.augment = augment if augment is not None else {}
        self.source = source
        self.rng: Any = None
        self._data = data
        self.indices = indices
        self.epoch = epoch
        self.seq = seq
        self.num_samples = num_samples
        self._raw = raw

    def __getitem__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            pass
        raise KeyError(_missing_field(key, self._data)) from None

    def __iter__(self) -> NoReturn:
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

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> KeysView[str]:
        return self._data.keys()

    def items(self) -> ItemsView[str, Any]:
        return self._data.items()

    def values(self) -> ValuesView[Any]:
        return self._data.values()

    def wait_stream(self, stream: object = None) -> None:
        """Makes a CUDA stream (a torch.cuda.Stream or an int handle; None =
        legacy default) wait for this batch's copy. Tensors made by the loader
        already wait on the stream current when the batch was yielded. The
        batch's slot is reused only after the work queued on every stream it
        was handed to (this one included) when the batch is freed."""
        _wait_stream(self._raw, stream)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self._data.items())
        return f"<npyload.Batch epoch={self.epoch} seq={self.seq} rows={self.num_samples} {{{fields}}}>"


class BatchTuple(tuple[Any, ...]):
    """One batch with ``as_tuple=True``: a tuple of the fields' arrays or
    tensors in the order the fields were given, so ``images, labels = batch``
    works. Carries the same ``indices``, ``source``, ``epoch``, ``seq``, ``num_samples``
    and ``wait_stream()`` as :class:`Batch`, and ``field_names``.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "y_0.npy"), np.arange(10))
    >>> loader = npyload.Loader({"y": os.path.join(d, "y_0.npy")}, batch_size=4,
    ...                         as_tuple=True, output="numpy")
    >>> [y.tolist() for (y,) in loader]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    # Set by _wrap_raw on each instance (declared for type checkers).
    field_names: tuple[str, ...]
    indices: Any
    source: Any
    epoch: int
    seq: int
    num_samples: int
    augment: dict[str, Augment]
    rng: Any
    _raw: _npyload.Batch | None

    def wait_stream(self, stream: object = None) -> None:
        """As :meth:`Batch.wait_stream`."""
        _wait_stream(self._raw, stream)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in zip(self.field_names, self))
        return (f"<npyload.BatchTuple epoch={self.epoch} seq={self.seq} "
                f"rows={self.num_samples} ({fields})>")


def _missing_field(key: object, data: _Mapping[str, Any]) -> str:
    """The message of a batch's KeyError: the key, the fields there are and,
    for a near miss (``"image"`` for ``"images"``), the likely one."""
    names = list(data)
    msg = (f"{key!r}: the batch has no such field; its fields are "
           f"{', '.join(repr(n) for n in names)}")
    if isinstance(key, str):
        close = _difflib.get_close_matches(key, names, n=1)
        if close:
            msg += f" (did you mean {close[0]!r}?)"
    return msg


def _bfloat16_numpy() -> Any:
    try:
        import ml_dtypes  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def _wrap_raw(raw: _npyload.Batch, torch: Any, np: Any, copy: bool, as_tuple: bool,
              bf16: Any = None, aug: frozenset[str] = frozenset()) -> Batch | BatchTuple:
    """A Batch (or BatchTuple) of torch tensors or numpy arrays viewing raw's slot."""
    names = raw.field_names
    data: dict[str, Any] = {}
    if torch is not None:
        for i, name in enumerate(names):
            t = torch.from_dlpack(raw.field(i))
            data[name] = t.clone() if copy else t
        indices = torch.frombuffer(raw.indices_bytes(), dtype=torch.int64) \
            if raw.size else torch.empty(0, dtype=torch.int64)
        sb = raw.sources_bytes()
        source = None if sb is None else (torch.frombuffer(sb, dtype=torch.int64) if raw.size
                                          else torch.empty(0, dtype=torch.int64))
    else:
        for i, name in enumerate(names):
            view = raw.field(i)
            a = np.asarray(view)
            if bf16 is not None and view.descr == "bfloat16":
                a = a.view(bf16)  # the array interface gives uint16 bits
            data[name] = a.copy() if copy else a
        indices = np.frombuffer(raw.indices_bytes(), dtype=np.int64)
        sb = raw.sources_bytes()
        source = None if sb is None else np.frombuffer(sb, dtype=np.int64)
    epoch, seq, n = raw.epoch, raw.seq, raw.size
    augment = _augment_of(raw, names, aug) if aug else {}
    keep: _npyload.Batch | None = raw
    if copy:
        if raw.live_views == 0:
            raw.release()
        keep = None
    if as_tuple:
        t = BatchTuple(data[name] for name in names)
        t.field_names = tuple(names)
        t.indices, t.epoch, t.seq, t.num_samples, t._raw = indices, epoch, seq, n, keep
        t.augment = augment
        t.source = source
        t.rng = None
        return t
    return Batch(data, indices, epoch, seq, n, keep, augment, source)
