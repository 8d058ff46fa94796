"""npyload.build_info() and the text of ``python -m npyload info``: what a bug
report needs, from the C library (npyload_get_build_info) and the Python
side (the interpreter, numpy, torch). torch is looked up by its installed
metadata, never imported (importing npyload must not import torch)."""
from __future__ import annotations

import importlib.metadata as _metadata
import platform as _platform
import sys as _sys
from typing import TYPE_CHECKING

import numpy as _np

from . import _npyload

if TYPE_CHECKING:
    from ._npyload import BuildInfo


def _dist_version(name: str) -> str | None:
    mod = _sys.modules.get(name)
    v = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(v, str):
        return str(v)  # torch's TorchVersion is a str subclass
    try:
        return _metadata.version(name)
    except _metadata.PackageNotFoundError:
        return None


def build_info() -> BuildInfo:
    """The library's build and what it finds on this machine, as a dict, for
    bug reports (``python -m npyload info`` prints it).

    Keys: ``version``; io_uring: ``uring_compiled``, ``uring_usable`` (a ring
    works here, now), ``liburing_version``, ``uring_why`` (the kernel's
    answer when refused); zstd: ``zstd_compiled``, ``zstd_loaded``; CUDA:
    ``cuda_runtime_found``, ``cuda_runtime_path``, ``cuda_runtime_soname``,
    ``cuda_runtime_version``, ``cuda_driver_version`` ("12.4", "" when
    unknown), ``cuda_devices``, ``cuda_why`` (why CUDA is not usable);
    device transform kernels: ``transform_kernels``,
    ``transform_kernel_archs``, ``transform_kernels_why``; CPU:
    ``f16c_compiled``, ``f16c_used``; what the options' defaults are here:
    ``default_num_workers``, ``default_prefetch`` (the C library's batch
    slots for that many workers; Python's ``prefetch`` is one less),
    ``default_queue_depth``, ``default_shuffle_window``,
    ``default_io_backend`` (what io='auto' picks here), ``default_read_ahead``;
    and ``python``, ``numpy``, ``torch`` (None when not installed).

    It probes io_uring and looks for the CUDA runtime the way
    ``cuda_available()`` does: counting devices initialises the CUDA driver
    in this process."""
    info = _npyload.build_info()
    info["python"] = _platform.python_version()
    info["numpy"] = _np.__version__
    info["torch"] = _dist_version("torch")
    return info


def format_info(info: BuildInfo) -> str:
    """The human-readable block of ``python -m npyload info`` for a
    build_info() dict."""
    i = info
    lines = [f"npyload {i['version']}"]
    if not i["uring_compiled"]:
        uring = "not compiled in (built without liburing): reads use pread"
    elif i["uring_usable"]:
        uring = f"compiled in (liburing {i['liburing_version']}), usable here"
    else:
        uring = (f"compiled in (liburing {i['liburing_version']}), NOT usable here: "
                 f"{i['uring_why']}")
    lines.append(f"io_uring:          {uring}")
    zstd = f"{i['zstd_loaded']} loaded, built against {i['zstd_compiled']}"
    if i["zstd_loaded"] != i["zstd_compiled"]:
        zstd += " (they differ)"
    lines.append(f"zstd:              {zstd}")
    if i["cuda_runtime_found"]:
        rt = f"{i['cuda_runtime_path']} (CUDA {i['cuda_runtime_version'] or '?'})"
    else:
        rt = "not found"
    lines.append(f"CUDA runtime:      {rt}")
    if i["cuda_devices"]:
        drv = i["cuda_driver_version"] or "?"
        lines.append(f"CUDA devices:      {i['cuda_devices']} (driver {drv})")
    else:
        lines.append(f"CUDA devices:      none: {i['cuda_why']}")
    if i["transform_kernels"]:
        k = f"ahead of time (embedded fatbin: {i['transform_kernel_archs']})"
    else:
        k = f"unavailable: {i['transform_kernels_why']}"
    lines.append(f"device transforms: {k}")
    if not i["f16c_compiled"]:
        f16 = "F16C not compiled in (portable float16 conversion)"
    else:
        f16 = "F16C compiled in, " + ("used (this CPU has it)" if i["f16c_used"]
                                      else "not used (this CPU lacks F16C/AVX)")
    lines.append(f"CPU features:      {f16}")
    slots = i["default_prefetch"]
    lines.append(f"defaults:          num_workers {i['default_num_workers']}, prefetch "
                 f"{slots - 1} (C: PREFETCH {slots} slots), queue depth "
                 f"{i['default_queue_depth']} per worker, io auto -> "
                 f"{i['default_io_backend']} here, read-ahead "
                 f"{'on' if i['default_read_ahead'] else 'off'}, shuffle window "
                 f"{i['default_shuffle_window']} files")
    lines.append(f"system:            {_platform.system()} {_platform.release()} "
                 f"{_platform.machine()}")
    lines.append(f"Python:            {i['python']} ({_sys.executable})")
    lines.append(f"numpy:             {i['numpy']}")
    lines.append(f"torch:             {i['torch'] or 'not installed'}")
    return "\n".join(lines) + "\n"
