"""Transform: dtype, scale, normalise, channels-last and random flips and
crops in the loader."""
from __future__ import annotations

import math as _math
import numbers as _numbers
import operator as _operator
import struct as _struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable



_TDTYPES = {None: 0, "float32": 1, "float16": 2, "bfloat16": 3}


def _real(what: str, v: Any, kind: str = "a number") -> float:
    """v as a float: an int, a float or a numpy scalar of either (numbers.Real
    counts numpy's), never a bool; else TypeError naming `what`."""
    if isinstance(v, bool) or not isinstance(v, _numbers.Real):
        raise TypeError(f"Transform: {what} must be {kind}, got {v!r}")
    big: Any = v  # (not narrowed to Real: compared with an int below)
    try:
        return float(big)
    except OverflowError:  # an int beyond the double range
        return _math.inf if big > 0 else -_math.inf


def _integer(what: str, v: Any, kind: str) -> int:
    """v as an int: an int or a numpy integer (anything with __index__),
    never a bool; else TypeError naming `what`."""
    if isinstance(v, bool) or _is_numpy_bool(v):
        raise TypeError(f"Transform: {what} must be {kind}, got {v!r}")
    try:
        return _operator.index(v)
    except TypeError:
        raise TypeError(f"Transform: {what} must be {kind}, got {v!r}") from None


def _is_numpy_bool(v: Any) -> bool:
    t = type(v)
    return t.__module__ == "numpy" and t.__name__ in ("bool_", "bool")


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

    Random augmentation, in the loader's workers, before the arithmetic:
    hflip, vflip : probability of reversing the last axis (horizontal) or the
        one before it (vertical) of a sample with two or more axes.
    crop : None, an int or (h, w): a random window of the last two axes,
        taken after ``pad`` zeros (stored zeros) on each side of them; with
        pad and no crop, the window has the sample's own size.
    hflip_sign, vflip_sign : None, +-1 or one +-1 per channel: channel c is
        multiplied by it when the sample is flipped (vector targets such as
        offsets (du, dv) of a float field; a sample with fewer than two axes
        is never moved, only signed).

    Notes
    -----
    The decisions are a pure function of (seed, epoch, global sample index),
    documented bit for bit in npyload.h ("Augmentation"): the same for any
    worker count, backend, world size and resume, and shared by every field
    of a sample (fields with the same probability flip together; fields of
    the same size get the same crop). ``batch.augment[field]`` holds each
    row's decisions. With a CUDA device= the stored dtype crosses PCIe
    (and a 16-byte record of each row's decisions) and one kernel after the
    copy pads, crops, flips, signs and converts, bit for bit as the workers
    would (NaN payloads aside); past the kernels' limits (flip signs for
    more than 128 channels) the workers do it and their output crosses.

    >>> t = Transform("float32", scale=1 / 255, hflip=0.5, crop=(112, 240), pad=4)
    >>> t.hflip, t.crop, t.pad
    (0.5, (112, 240), 4)

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

    __slots__ = ("dtype", "scale", "mean", "std", "channels_last", "hflip", "vflip",
                 "crop", "pad", "hflip_sign", "vflip_sign")
    # The checked values (declared for type checkers).
    dtype: str | None
    scale: float
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    channels_last: bool
    hflip: float
    vflip: float
    crop: tuple[int, int] | None
    pad: int
    hflip_sign: tuple[float, ...] | None
    vflip_sign: tuple[float, ...] | None

    def __init__(self, dtype: object = None, scale: float = 1.0,
                 mean: float | Iterable[float] | None = None,
                 std: float | Iterable[float] | None = None,
                 channels_last: bool = False, *, hflip: float = 0.0, vflip: float = 0.0,
                 crop: int | tuple[int, int] | None = None, pad: int = 0,
                 hflip_sign: float | Iterable[float] | None = None,
                 vflip_sign: float | Iterable[float] | None = None) -> None:
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
        fscale = _real("scale", scale)
        # The library computes in float32: a scale must be finite and nonzero
        # there (0 would zero the field, and the library's struct once read 0
        # as "unset", delivering x unscaled; inf and nan would poison it).
        # The default 1.0 reaches C as 1.0.
        if _float32(fscale) in (0.0, _math.inf, -_math.inf) or fscale != fscale:
            raise ValueError(f"Transform: scale = {scale!r} out of range: a finite "
                             "nonzero float32 (|scale| from 1.4e-45 to 3.4e38; 1.0 = "
                             "no scaling)")
        self.dtype = dtype
        self.scale = fscale
        self.mean = self._values("mean", mean)
        self.std = self._values("std", std)
        if self.std is not None and any(v == 0 for v in self.std):
            raise ValueError(f"Transform: std must be nonzero, got {std!r}")
        if not isinstance(channels_last, (bool, int)) and not _is_numpy_bool(channels_last):
            raise TypeError(f"Transform: channels_last must be a bool, got {channels_last!r}")
        self.channels_last = bool(channels_last)
        self.hflip = self._probability("hflip", hflip)
        self.vflip = self._probability("vflip", vflip)
        self.crop = self._crop(crop)
        ipad = _integer("pad", pad, "an int >= 0")
        if ipad < 0:
            raise ValueError(f"Transform: pad = {ipad} out of range: an int >= 0")
        self.pad = ipad
        self.hflip_sign = self._signs("hflip_sign", hflip_sign)
        self.vflip_sign = self._signs("vflip_sign", vflip_sign)
        if dtype is None:
            what = ("mean" if self.mean is not None else "std" if self.std is not None
                    else "scale" if self.scale != 1.0 else None)
            if what:
                raise ValueError(f"Transform: {what} needs an output dtype ('float32', "
                                 "'float16' or 'bfloat16'); dtype=None keeps the stored "
                                 "one and allows no arithmetic")

    @staticmethod
    def _probability(what: str, p: Any) -> float:
        fp = _real(what, p, "a probability, a number in [0, 1]")
        if not 0 <= fp <= 1:
            raise ValueError(f"Transform: {what} = {fp!r} out of range: a probability in "
                             "[0, 1]")
        return fp

    @staticmethod
    def _crop(crop: Any) -> tuple[int, int] | None:
        if crop is None:
            return None
        kind = "None, an int or (h, w) of ints > 0"
        if isinstance(crop, (tuple, list)):
            if len(crop) != 2:
                raise ValueError(f"Transform: crop must be {kind}, got {crop!r}")
            hw = (_integer("crop", crop[0], kind), _integer("crop", crop[1], kind))
        else:
            h = _integer("crop", crop, kind)
            hw = (h, h)
        if min(hw) <= 0:
            raise ValueError(f"Transform: crop = {hw} out of range: ints > 0")
        return hw

    @classmethod
    def _signs(cls, what: str, v: Any) -> tuple[float, ...] | None:
        vals = cls._values(what, v)
        if vals is not None and any(x not in (1.0, -1.0) for x in vals):
            raise ValueError(f"Transform: {what} values are +1 or -1, got {v!r}")
        return vals

    @staticmethod
    def _values(what: str, v: Any) -> tuple[float, ...] | None:
        if v is None:
            return None
        if isinstance(v, _numbers.Real) and not isinstance(v, bool):
            return (float(v),)  # a number, numpy's scalars included
        try:
            vals = tuple(float(x) for x in v)
        except (TypeError, ValueError):
            raise TypeError(f"Transform: {what} must be None, a number or a sequence of "
                            f"numbers, got {v!r}") from None
        if not vals:
            raise ValueError(f"Transform: {what} is empty")
        return vals

    def _set_on(self, c: Any, field: str, source: str | None = None) -> None:
        """Sets this transform on the C loader `c`: field's
        (npyload_loader_set_transform), or source's own transform of field
        (npyload_loader_set_source_transform)."""
        crop = self.crop or (0, 0)
        args = (field, _TDTYPES[self.dtype], self.scale, self.mean, self.std,
                self.channels_last, self.hflip, self.vflip, crop[0], crop[1], self.pad,
                self.hflip_sign, self.vflip_sign)
        if source is None:
            c.set_transform(*args)
        else:
            c.set_source_transform(source, *args)

    def __repr__(self) -> str:
        aug = "".join(f", {k}={getattr(self, k)!r}" for k, off in (
            ("hflip", 0.0), ("vflip", 0.0), ("crop", None), ("pad", 0),
            ("hflip_sign", None), ("vflip_sign", None)) if getattr(self, k) != off)
        return (f"Transform(dtype={self.dtype!r}, scale={self.scale!r}, mean={self.mean!r}, "
                f"std={self.std!r}, channels_last={self.channels_last!r}{aug})")
