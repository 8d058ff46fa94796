# Type stub of the C extension npyload._npyload (python_bindings/src/*.c).
# Keep it in step with the module's method tables: tests/python/test_typing.py
# runs mypy's stubtest against the built module, and compares the dict
# TypedDicts below with what the functions return.
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, final, type_check_only

import numpy.typing as npt
from typing_extensions import NotRequired, Self, TypedDict

_Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]

__version__: str

# ---- dicts returned by the functions (no runtime class: type checking only) ----

@type_check_only
class LoaderState(TypedDict):
    """npyload.Loader.state_dict(): the position after the last batch
    handed out, the C library's state records (npyload_loader_save_state)
    as a dict. Save it as is; load_state_dict() also takes the dicts of
    npyload 0.3 (state version 1, without ``base``, and 2), and a later
    version's records are refused unless their names begin with ``_``."""
    version: int
    seed: int
    epoch: int
    consumed: int
    num_samples: int
    batch_size: int
    world_size: int
    rank: int
    shuffle: int
    drop_last: int
    base: int
    # 1 when the saved loop had run to its end (a resumed loader starts the
    # next epoch). A 0.3 dict may lack it (read as 0).
    loop_ended: int
    # A mixture (Loader(sources=...)): the weights' history in force, a list
    # with one value per source (an int with one source).
    mix_samples: NotRequired[int | list[int]]
    mix_weights: NotRequired[int | list[int]]
    mix_draws: NotRequired[int | list[int]]
    mix_block: NotRequired[int]
    mix_epoch: NotRequired[int]
    mix_position: NotRequired[int]
    # The running digest of the rows handed out, and how many rows it covers.
    _digest: int
    _digest_rows: int

@type_check_only
class LoaderStats(TypedDict):
    """npyload.Loader.stats(): counters since start."""
    bytes_read: int
    batches_delivered: int
    samples_delivered: int
    wait_ns: int
    io_ns: int
    h2d_bytes: int
    h2d_ns: int
    backend: str
    pinned: bool
    direct_io: bool
    device: int
    slot_bytes: int
    num_slots: int
    uring_fallbacks: int
    samples_skipped: int
    errors: int
    gather_bytes: int
    gather_requests: int
    read_requests: int
    last_error: str
    compressed_bytes_read: int
    decompressed_bytes: int
    decode_ns: int
    transform_ns: int
    read_ahead_batches: int
    read_wait_ns: int
    elapsed_ns: int
    step_ns: int
    worker_cpu_ns: int
    num_workers: int
    read_blocked_ns: int
    verdict: str
    remote_bytes: int
    remote_requests: int
    remote_retries: int
    remote_wait_ns: int
    cache_hits: int
    cache_misses: int
    cache_read_bytes: int
    cache_write_bytes: int
    cache_evictions: int
    fill_state: str
    fill_error: str
    fill_error_code: int
    fill_wanted_bytes: int
    fill_planned_bytes: int
    fill_planned_blocks: int
    fill_done_bytes: int
    fill_found_blocks: int
    fill_fetched_blocks: int
    fill_fetched_bytes: int
    fill_waited_blocks: int
    fill_ns: int
    auto_mode: int
    memory_budget: int
    memory_bytes: int
    auto_decisions: int
    parked_slots: int
    slot_wait_ns: int
    read_ahead_on: int
    # Added by npyload.Loader.stats() (not the extension's Loader):
    hook_ns: NotRequired[int]
    transform_workers: NotRequired[int]
    loop_wait_ns: NotRequired[int]
    loop_step_ns: NotRequired[int]
    source_samples: NotRequired[dict[str, int]]
    digest: NotRequired[int]
    digest_rows: NotRequired[int]

@type_check_only
class HeaderInfo(TypedDict):
    """npyload.inspect(): header facts of a .npy (or of the .npy inside a
    .npy.zst, plus the compression's facts)."""
    version: tuple[int, int]
    descr: str
    shape: tuple[int, ...]
    fortran_order: bool
    itemsize: int
    header_len: int
    data_offset: int
    data_bytes: int
    file_bytes: int
    # .npy.zst only
    compressed_bytes: NotRequired[int]
    ratio: NotRequired[float]
    frames: NotRequired[int]
    samples_per_frame: NotRequired[int]
    # .npy.zst with verify=True only
    verified: NotRequired[bool]
    checksums: NotRequired[bool]
    # a narrowed file only, packed or stored (descr is then the codes', '|u1')
    narrow_values: NotRequired[int]
    value_descr: NotRequired[str]

@type_check_only
class PackResult(TypedDict):
    """One input's result of npyload.pack()."""
    in_bytes: int
    out_bytes: int
    frames: int
    samples_per_frame: int
    seconds: float
    out: str
    narrow_values: int

@type_check_only
class BuildInfo(TypedDict):
    """npyload.build_info(): the library's build and what it finds on this
    machine (npyload_get_build_info), for bug reports."""
    version: str
    uring_compiled: bool
    uring_usable: bool
    liburing_version: str
    uring_why: str
    zstd_compiled: str
    zstd_loaded: str
    cuda_runtime_found: bool
    cuda_devices: int
    cuda_runtime_version: str
    cuda_driver_version: str
    cuda_runtime_soname: str
    cuda_runtime_path: str
    cuda_why: str
    transform_kernels: bool
    transform_kernel_archs: str
    transform_kernels_why: str
    f16c_compiled: bool
    f16c_used: bool
    default_num_workers: int
    default_prefetch: int
    default_queue_depth: int
    default_shuffle_window: int
    default_io_backend: str
    default_read_ahead: bool
    transform_nvrtc: bool
    nvrtc_found: bool
    nvrtc_version: str
    nvrtc_path: str
    nvrtc_why: str
    remote_compiled: bool
    remote_version: str
    # Added by npyload.build_info() (not the extension's build_info):
    python: NotRequired[str]
    numpy: NotRequired[str | None]
    torch: NotRequired[str | None]

# ---- the exception ----

@type_check_only
class PrefetchProgress(TypedDict):
    objects: int
    dataset_bytes: int
    planned_bytes: int
    cached_bytes: int
    fetched_bytes: int
    planned_blocks: int
    found_blocks: int
    fetched_blocks: int
    waited_blocks: int
    requests: int
    received_bytes: int
    seconds: float
    probe_seconds: float
    phase: str  # "idle", "probing", "filling", "done"
    rc: int

class NpyloadError(RuntimeError):
    """Raised for every failure reported by the npyload C library; ``code``
    is the library's negative error code (NPYLOAD_E* or -errno)."""
    code: int | None

# ---- functions ----

def inspect(path: _Path, verify: bool = False,
            remote: dict[str, str | int | None] | None = None) -> HeaderInfo: ...
def load(path: _Path, mmap: bool = True) -> npt.NDArray[Any]: ...
def order_indices(
    n: int,
    shuffle: int,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    drop_last: bool,
    batch_size: int,
    file_sizes: Sequence[int] | None = None,
    window: int = 0,
) -> list[int]: ...
def pack_file(
    path: _Path,
    out: _Path | None = None,
    level: int = 0,
    frame_size: int = 0,
    threads: int = 0,
    force: bool = False,
    checksum: bool = True,
    narrow: bool = False,
    store: bool = False,
) -> PackResult: ...
def strerror(code: int, /) -> str: ...
def mask_urls(text: str, /) -> str: ...
def default_prefetch(num_workers: int, /) -> int: ...
def stats_verdict(stats: Mapping[str, Any], hook_ns: int = 0) -> str: ...
def cuda_available(device: int = 0, /) -> tuple[bool, str]: ...
def h2d_bandwidth(device: int = 0, nbytes: int = ..., iters: int = 20) -> float: ...
def build_info() -> BuildInfo: ...
def build_info_text() -> str: ...

# ---- the low-level types (npyload.Loader and npyload.Batch wrap them) ----

@final
class View:
    """Zero-copy view of one field of a batch (array interface, DLPack)."""
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    @property
    def __array_struct__(self) -> Any: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def descr(self) -> str: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def batch(self) -> Batch: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class Batch:
    """One batch: owns a slot of the loader until it is freed."""
    @property
    def size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def field_names(self) -> tuple[str, ...]: ...
    @property
    def released(self) -> bool: ...
    @property
    def live_views(self) -> int: ...
    @property
    def data_ptrs(self) -> tuple[int, ...]: ...
    @property
    def _streams(self) -> tuple[int, ...]: ...
    def field(self, name_or_index: str | int, /) -> View: ...
    def indices_view(self) -> View: ...
    def indices_bytes(self) -> bytearray: ...
    def sources_bytes(self) -> bytearray | None: ...
    def indices_list(self) -> list[int]: ...
    def augment_bytes(self, index: int, /) -> bytearray: ...
    def wait_stream(self, stream: int | None, /) -> None: ...
    def sync(self) -> None: ...
    def release(self) -> None: ...
    def _note_stream(self, stream: int | None, /) -> None: ...

@final
class Loader:
    """Low-level owner of one npyload_loader (see npyload.Loader)."""
    def __new__(cls) -> Self: ...
    @staticmethod
    def option_ranges() -> dict[int, tuple[int, int, int]]: ...
    @property
    def backend(self) -> str: ...
    @property
    def field_names(self) -> tuple[str, ...]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    def add_source(self, name: str, /) -> None: ...
    def set_weights(self, weights: Sequence[float], /) -> None: ...
    def mix_stats(self) -> tuple[list[int], int, int]: ...
    def add_field(self, name: _Path, glob: _Path, /) -> None: ...
    def add_field_files(self, name: _Path, paths: Sequence[_Path], /) -> None: ...
    def set(self, option: int, value: int, /) -> None: ...
    def set_path(self, which: int, path: str, /) -> None: ...
    def set_transform(
        self,
        field: _Path,
        dtype: int,
        scale: float,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        channels_last: bool,
        hflip: float = ...,
        vflip: float = ...,
        crop_h: int = ...,
        crop_w: int = ...,
        pad: int = ...,
        hflip_sign: Sequence[float] | None = ...,
        vflip_sign: Sequence[float] | None = ...,
        /,
    ) -> None: ...
    def set_source_transform(
        self,
        source: str,
        field: _Path,
        dtype: int,
        scale: float,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        channels_last: bool,
        hflip: float = ...,
        vflip: float = ...,
        crop_h: int = ...,
        crop_w: int = ...,
        pad: int = ...,
        hflip_sign: Sequence[float] | None = ...,
        vflip_sign: Sequence[float] | None = ...,
        /,
    ) -> None: ...
    def get(self, option: int, /) -> int: ...
    def set_remote(self, config: Mapping[str, str | int | None], /) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def set_epoch(self, epoch: int, /) -> None: ...
    def next(self) -> Batch | None: ...
    def num_batches(self) -> int: ...
    def num_samples(self) -> int: ...
    def field_engines(self) -> dict[str, tuple[Literal["none", "host", "device"], str]]: ...
    def get_state(self) -> LoaderState: ...
    def set_state(self, state: Mapping[str, int], /) -> None: ...
    def save_state(self) -> bytes: ...
    def load_state(self, state: bytes, /) -> None: ...
    def begin_pass(self) -> None: ...
    def pass_batches(self) -> int: ...
    def auto_history(self, since: int = 0) -> tuple[int, list[tuple[
        int, int, int, int, int, int, str, float, float, float, float, float, int, int]]]: ...
    def pass_rule(self) -> int: ...
    def ceiling(self, kind: int, threads: int, seconds: float, /) -> dict[str, Any]: ...
    def stats(self, hook_ns: int = 0, loop_wait_ns: int = -1,
              loop_step_ns: int = -1) -> LoaderStats: ...
    def _set_stream_joiner(self, fn: Callable[[int, list[int]], int] | None, /) -> None: ...
    def close(self) -> None: ...

@final
class Prefetch:
    """Low-level owner of one npyload_prefetch (see npyload.prefetch)."""
    def __new__(cls, remote: dict[str, str | int | None]) -> Self: ...
    @staticmethod
    def glob(pattern: _Path, remote: dict[str, str | int | None], /) -> list[str]: ...
    def add_field(self, pattern: _Path, /) -> None: ...
    def add_field_files(self, urls: Sequence[_Path], /) -> None: ...
    def set(self, option: int, value: int, /) -> None: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def progress(self) -> PrefetchProgress: ...

# ---- constants ----

OPT_BATCH_SIZE: int
OPT_NUM_WORKERS: int
OPT_PREFETCH: int
OPT_SHUFFLE: int
OPT_SEED: int
OPT_DROP_LAST: int
OPT_RANK: int
OPT_WORLD_SIZE: int
OPT_IO_BACKEND: int
OPT_DEVICE: int
OPT_DIRECT_IO: int
OPT_SHUFFLE_WINDOW: int
OPT_QUEUE_DEPTH: int
OPT_PIN_MEMORY: int
OPT_ALIGN: int
OPT_ON_ERROR: int
OPT_MAX_ERRORS: int
OPT_READ_AHEAD: int
OPT_CACHE_FILL: int
OPT_SAMPLES_PER_EPOCH: int
OPT_DEVICE_KERNELS: int
OPT_MEMORY_BUDGET: int
OPT_AUTO_TARGET: int
OPT_AUTO_CORES: int
OPT_AUTO_FORCE: int
AUTO: int

PREFETCH_MAX_BYTES: int
PREFETCH_INFLIGHT: int
PREFETCH_REQUEST_BYTES: int
PATH_NVRTC: int
PATH_KERNEL_CACHE: int
IO_AUTO: int
IO_URING: int
IO_PREAD: int
IO_MMAP: int

SHUFFLE_NONE: int
SHUFFLE_FULL: int
SHUFFLE_LOCAL: int
CEILING_PREAD: int
CEILING_GATHER: int
CEILING_DIRECT: int
PASS_START: int
PASS_RESUME: int
PASS_ADVANCE: int

EOF: int
STATE_VERSION: int

EINVAL: int
EFORMAT: int
EUNSUPPORTED: int
ETRUNCATED: int
EMISMATCH: int
ESTATE: int
ENOFILES: int
ETOOBIG: int
ENOCUDA: int
ECUDA: int
ENOURING: int
ECHANGED: int
EHELD: int
EFORKED: int
EREMOTE: int
