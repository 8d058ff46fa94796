"""Argument parsing and checks in the caller's units, against the limits the
C library reports (npyload_option_range), and torchrun's environment."""
from __future__ import annotations

import os as _os
import sys as _sys
import warnings as _warnings
from collections.abc import Mapping as _Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _npyload
from ._batch import _bfloat16_numpy
from ._torch import _torch_or_none
from ._transform import Transform

if TYPE_CHECKING:
    from typing import Union

    _Count = Union[int, Literal["auto"]]  # Loader's num_workers= and prefetch=


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


# ---- Loader's arguments ----

def _check_counts(batch_size: int, seed: int, num_workers: object, prefetch: object,
                  window: int, max_errors: int | None,
                  transform: object) -> tuple[int, int, _Count, _Count, int, int]:
    """The numeric arguments, in Loader's units, against the library's
    limits: num_workers=0 is the library's WORKERS_SYNC, prefetch counts the
    batches ahead of the one the loop holds (slots - 1, or slots - 2 with
    transform=; see _slots_for), window=0 is not "default" here;
    num_workers and prefetch may be "auto" (prefetch None is "auto")."""
    batch_size = _int_arg("batch_size", batch_size, 1, maximum=_opt_max(
        _npyload.OPT_BATCH_SIZE), what="samples per batch")
    seed = _int_arg("seed", seed, -_INT64_MAX - 1, maximum=_INT64_MAX,
                    what="an int64")
    if num_workers != "auto":
        _int_or_auto("num_workers", num_workers)
        num_workers = _int_arg("num_workers", num_workers, 0, maximum=_opt_max(
            _npyload.OPT_NUM_WORKERS), what="worker threads; 0 = none, batches "
            "are read inside next(); or 'auto'")
        _warn_oversubscribed(num_workers)
    if prefetch is None:
        prefetch = "auto"
    max_slots = _opt_max(_npyload.OPT_PREFETCH)
    if prefetch != "auto":
        _int_or_auto("prefetch", prefetch)
        if transform is None:
            prefetch = _int_arg("prefetch", prefetch, 1, maximum=max_slots - 1,
                                what="batches read ahead; the loader has prefetch + 1 "
                                f"slots, at most {max_slots}")
        else:
            prefetch = _int_arg("prefetch", prefetch, 1, maximum=max_slots - 2,
                                what="batches read ahead; with transform= the loader has "
                                f"prefetch + 2 slots, at most {max_slots}")
    window = _int_arg("window", window, 1, maximum=_opt_max(
        _npyload.OPT_SHUFFLE_WINDOW), what="files per window")
    max_errors = 0 if max_errors is None else _int_arg(
        "max_errors", max_errors, 1, maximum=_opt_max(_npyload.OPT_MAX_ERRORS),
        what="skipped samples; None = no limit")
    return batch_size, seed, num_workers, prefetch, window, max_errors


def _int_or_auto(name: str, value: object) -> None:
    """TypeError "NAME must be an int or 'auto'" for what is neither (a
    str such as "2", a float); the range is _int_arg's."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int or 'auto', got {value!r}")


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
        ok, why = _npyload.cuda_available(0)
        if not ok:
            # DataLoader warns and carries on without pinning; so do we
            # (pinning only speeds up a later copy to a GPU there is none of).
            _warnings.warn(f"npyload: pin_memory=True but CUDA is unusable ({why}); "
                           "the slots stay in pageable memory", RuntimeWarning,
                           stacklevel=3)
            pin_memory = None
    return shuffle_mode, dev, pin_memory


_warned_workers = False


def _process_cores() -> int:
    """The cores this process may run on (its affinity mask)."""
    try:
        return max(1, len(_os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, _os.cpu_count() or 1)


def _warn_oversubscribed(num_workers: int) -> None:
    """Once per process: an explicit num_workers above the cores this
    process may use gets what it asked for, and a word about "auto"."""
    global _warned_workers
    cores = _process_cores()
    if num_workers <= cores or _warned_workers:
        return
    _warned_workers = True
    _warnings.warn(
        f"npyload: num_workers={num_workers} but this process may use {cores} "
        f"core{'s' if cores != 1 else ''}; the loader starts {num_workers} threads as "
        "asked. num_workers='auto' (the default) chooses and adjusts the count at run "
        "time from what the loop waits", RuntimeWarning, stacklevel=4)


def _auto_cores() -> int:
    """Cores for one loader's workers: the process's cores divided among the
    ranks of the node (torchrun's LOCAL_WORLD_SIZE), at least 1. The ranks'
    controllers then together keep the node's cores busy, not more."""
    local = _env_int("LOCAL_WORLD_SIZE") or 1
    cores = _process_cores()
    # A rank pinned to its own cores (affinity already divided) keeps them.
    total = _os.cpu_count() or cores
    if cores < total:
        return cores
    return max(1, cores // max(1, local))


def _auto_options(num_workers: _Count, prefetch: _Count | None,
                  memory_budget: int | None, auto_target: float) -> dict[int, int]:
    """The controller's options (NPYLOAD_AUTO) for the library."""
    if num_workers != "auto" and prefetch != "auto":
        return {}
    budget = 0 if memory_budget is None else _int_arg(
        "memory_budget", memory_budget, 1, maximum=_INT64_MAX, what="bytes")
    if not isinstance(auto_target, (int, float)) or not 0 < auto_target <= 1:
        raise ValueError(f"auto_target = {auto_target!r} out of range: a share of the "
                         "loop in (0, 1], e.g. 0.02")
    return {_npyload.OPT_MEMORY_BUDGET: budget,
            _npyload.OPT_AUTO_TARGET: max(1, round(auto_target * 10000)),
            _npyload.OPT_AUTO_CORES: min(_auto_cores(), _opt_max(_npyload.OPT_AUTO_CORES))}


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


def _check_cache_fill(cache_fill: object) -> int:
    """The library's CACHE_FILL of ``cache_fill=``: None (auto) 0, True 1,
    False -1."""
    if cache_fill is None:
        return 0
    if not isinstance(cache_fill, bool):
        raise TypeError(f"cache_fill must be None, True or False, got {cache_fill!r}")
    return 1 if cache_fill else -1


def _output_libs(output: str, dev: int) -> tuple[Any, Any, Any]:
    """(torch, numpy, numpy's bfloat16 or None) for ``output=``: torch when
    it is importable (or asked for), else numpy (the other one None)."""
    torch: Any = None
    if output in ("auto", "torch"):
        torch = _torch_or_none()
        if torch is None and output == "torch":
            raise ImportError("output='torch' needs torch, which is not importable")
    if torch is not None:
        return torch, None, None
    if dev >= 0:
        raise ValueError("device memory needs torch output (numpy cannot view "
                         "CUDA memory): install torch or use device='cpu'")
    try:
        import numpy
    except ImportError:
        raise ImportError("npyload.Loader needs numpy or torch to yield arrays") from None
    return None, numpy, _bfloat16_numpy()


def _check_state(state: object) -> None:
    """load_state_dict's argument: a mapping with the keys state_dict()
    writes, each an int in range (the library checks it against the fields)."""
    if not isinstance(state, _Mapping):
        raise TypeError("state must be the dict returned by state_dict()")
    for key in ("epoch", "consumed", "seed", "shuffle", "drop_last"):
        if key not in state:
            raise ValueError(f"state lacks the key {key!r} (expected the dict "
                             "returned by state_dict())")
        _int_arg(f"state[{key!r}]", state[key], 0 if key in ("epoch", "consumed") else None)
    _int_arg("state['loop_ended']", state.get("loop_ended", 0), 0, maximum=1)
