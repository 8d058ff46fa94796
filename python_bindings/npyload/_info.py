"""npyload.build_info() and the text of ``python -m npyload info``: what a bug
report needs, from the C library (npyload_get_build_info) and the Python
side (the interpreter, numpy, torch). torch is looked up by its installed
metadata, never imported (importing npyload must not import torch)."""
from __future__ import annotations

import importlib.metadata as _metadata
import platform as _platform
import sys as _sys
from typing import TYPE_CHECKING, TypedDict

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
    device transform kernels: ``transform_kernels`` (compiled ahead of
    time), ``transform_kernel_archs``, ``transform_kernels_why``,
    ``transform_nvrtc`` (the source is embedded for NVRTC), ``nvrtc_found``,
    ``nvrtc_version``, ``nvrtc_path``, ``nvrtc_why`` (where the default
    search finds NVRTC, or what to install); CPU:
    ``f16c_compiled``, ``f16c_used``; what the options' defaults are here:
    ``default_num_workers``, ``default_prefetch`` (the C library's batch
    slots for that many workers; Python's ``prefetch`` is one less),
    ``default_queue_depth``, ``default_shuffle_window``,
    ``default_io_backend`` (what io='auto' picks here), ``default_read_ahead``;
    and ``python``, ``numpy``, ``torch`` (None when not installed).

    It probes io_uring and looks for the CUDA runtime the way
    ``cuda_available()`` does: counting devices initialises the CUDA driver
    in this process.

    Examples
    --------
    >>> import npyload
    >>> info = npyload.build_info()
    >>> info["version"] == npyload.__version__
    True
    >>> isinstance(info["uring_compiled"], bool), isinstance(info["cuda_devices"], int)
    (True, True)
    """
    info = _npyload.build_info()
    p = _python_facts()
    info["python"], info["numpy"], info["torch"] = p["python"], p["numpy"], p["torch"]
    return info


class _PythonFacts(TypedDict):
    python: str
    numpy: str | None
    torch: str | None


def _python_facts() -> _PythonFacts:
    return {"python": _platform.python_version(), "numpy": _dist_version("numpy"),
            "torch": _dist_version("torch")}


def format_info() -> str:
    """The human-readable block of ``python -m npyload info``: the library's
    own text of its facts (npyload_build_info_text, which npyload-bench
    prints too), then the system, Python, numpy and torch lines."""
    p = _python_facts()
    return (_npyload.build_info_text()
            + f"system:            {_platform.system()} {_platform.release()} "
              f"{_platform.machine()}\n"
            + f"Python:            {p['python']} ({_sys.executable})\n"
            + f"numpy:             {p['numpy'] or 'not installed'}\n"
            + f"torch:             {p['torch'] or 'not installed'}\n")
