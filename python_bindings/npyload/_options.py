"""Argument parsing and checks in the caller's units, against the limits the
C library reports (npyload_option_range), and torchrun's environment."""
import os as _os
import sys as _sys
from typing import Literal, overload

from . import _npyload


_IO = {"auto": _npyload.IO_AUTO, "uring": _npyload.IO_URING,
       "io_uring": _npyload.IO_URING, "pread": _npyload.IO_PREAD,
       "mmap": _npyload.IO_MMAP}


_SHUFFLE = {"none": _npyload.SHUFFLE_NONE, "full": _npyload.SHUFFLE_FULL,
            "local": _npyload.SHUFFLE_LOCAL}


@overload
def _int_arg(name: str, value: object, minimum: int | None = None,
             allow_none: Literal[False] = False, maximum: int | None = None,
             what: str = "") -> int: ...
@overload
def _int_arg(name: str, value: object, minimum: int | None = None,
             allow_none: bool = False, maximum: int | None = None,
             what: str = "") -> int | None: ...
def _int_arg(name: str, value: object, minimum: int | None = None,
             allow_none: bool = False, maximum: int | None = None,
             what: str = "") -> int | None:
    """value as an int, or ValueError "NAME = VALUE out of range: LO .. HI
    (WHAT)" naming the caller's argument in the caller's units."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r}")
    ivalue: int = value.__index__()
    if ((minimum is not None and ivalue < minimum) or
            (maximum is not None and ivalue > maximum)):
        lo = "" if minimum is None else _int_text(minimum)
        hi = "" if maximum is None else _int_text(maximum)
        span = f"{lo} .. {hi}" if lo and hi else f">= {lo}" if lo else f"<= {hi}"
        raise ValueError(f"{name} = {ivalue} out of range: {span}"
                         + (f" ({what})" if what else ""))
    return ivalue


def _int_text(v: int) -> str:
    return {_INT64_MAX: "2**63-1", -_INT64_MAX - 1: "-2**63"}.get(v, str(v))


_INT64_MAX = (1 << 63) - 1


_EPOCH_MAX = _INT64_MAX  # the binding passes epochs as int64


# {option: (lo, hi, default)}: what npyload_loader_set accepts, asked of the
# library (the limits live in the C code only).
_OPT_RANGES = _npyload.Loader.option_ranges()


def _opt_max(opt: int) -> int:
    return _OPT_RANGES[opt][1]


def _env_int(var: str) -> int | None:
    v = _os.environ.get(var)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {var}={v!r} is not an int") from None


def _dist_rank_world() -> tuple[int, int] | None:
    """(rank, world_size) from an initialised torch.distributed, else None."""
    dist = _sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - defensive
        pass
    return None


def _parse_device(device: object) -> int:
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


def _device_index(k: int) -> int:
    lo, hi = _OPT_RANGES[_npyload.OPT_DEVICE][:2]
    if not lo <= k <= hi:
        raise ValueError(f"device = {k} out of range: -1 (cpu) or a CUDA device index "
                         f"0 .. {hi}")
    return k


def _parse_shuffle(shuffle: object) -> int:
    if isinstance(shuffle, bool):
        return _npyload.SHUFFLE_FULL if shuffle else _npyload.SHUFFLE_NONE
    if isinstance(shuffle, str) and shuffle.lower() in _SHUFFLE:
        return _SHUFFLE[shuffle.lower()]
    raise ValueError(f"shuffle must be True, False, 'full', 'local' or 'none', got {shuffle!r}")


def _kernel_paths() -> list[tuple[int, str]]:
    """Where device transforms find NVRTC and keep what it compiles, as
    npyload_loader_set_path() pairs: the library reads no environment, so
    the Python layer passes NPYLOAD_NVRTC (a libnvrtc file or its
    directory; unset: the library's own search) and NPYLOAD_KERNEL_CACHE
    (a directory; unset: $XDG_CACHE_HOME/npyload/kernels, else
    ~/.cache/npyload/kernels; empty: no cache) through."""
    cache = _os.environ.get("NPYLOAD_KERNEL_CACHE")
    if cache is None:
        base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(
            _os.path.expanduser("~"), ".cache")
        cache = _os.path.join(base, "npyload", "kernels")
    return [(_npyload.PATH_NVRTC, _os.environ.get("NPYLOAD_NVRTC", "")),
            (_npyload.PATH_KERNEL_CACHE, cache)]
