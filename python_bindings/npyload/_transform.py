"""Transform: dtype, scale, normalise and channels-last in the loader."""
from __future__ import annotations

import math as _math
import struct as _struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable



_TDTYPES = {None: 0, "float32": 1, "float16": 2, "bfloat16": 3}


def _float32(x: float) -> float:
    """x rounded to float32 (inf beyond its range)."""
    try:
        x = float(x)
    except OverflowError:  # an int beyond the double range
        return _math.inf if x > 0 else -_math.inf
    r: float = _struct.unpack("f", _struct.pack("f", x))[0]
    return r


class Transform:
    """A per-field conversion done by the loader (workers on the host, a
    kernel on the GPU after the copy), before the batch is handed out.

    Per element, in float32: ``y = (x * scale - mean[c]) / std[c]`` (three
    roundings, no FMA), c the channel (axis 1 of the batch, axis 0 of a
    sample), then rounded to nearest even into ``dtype``.

    Parameters
    ----------
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

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "img.npy"), np.full((4, 3, 2, 2), 255, np.uint8))
    >>> t = npyload.Transform(dtype="float16", scale=1 / 255, mean=0.5, std=0.5)
    >>> loader = npyload.Loader({"img": os.path.join(d, "img.npy")}, batch_size=4,
    ...                         transforms={"img": t}, output="numpy")
    >>> img = next(iter(loader))["img"]
    >>> img.dtype, img.shape, float(img.min()), float(img.max())
    (dtype('float16'), (4, 3, 2, 2), 1.0, 1.0)
    """

    __slots__ = ("dtype", "scale", "mean", "std", "channels_last")
    # The checked values (declared for type checkers).
    dtype: str | None
    scale: float
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    channels_last: bool

    def __init__(self, dtype: object = None, scale: float = 1.0,
                 mean: float | Iterable[float] | None = None,
                 std: float | Iterable[float] | None = None,
                 channels_last: bool = False) -> None:
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
    def _values(what: str, v: Any) -> tuple[float, ...] | None:
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

    def __repr__(self) -> str:
        return (f"Transform(dtype={self.dtype!r}, scale={self.scale!r}, mean={self.mean!r}, "
                f"std={self.std!r}, channels_last={self.channels_last!r})")
