"""torch interop: the only module that imports torch (lazily), so the rest of
the package imports and runs without it."""
import sys as _sys
from typing import Any



def _torch_or_none() -> Any:
    """The torch module, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


# One side stream per CUDA device, shared by every loader of the process: the
# stream a device batch's slot is released on when the batch was handed to
# several streams. torch's pool streams live as long as the process, as the
# C library requires of a release stream.
_side_streams: dict[int, Any] = {}


def _join_streams(device: int, handles: list[int]) -> int:
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
        stream: int = side.cuda_stream
        return stream


def _wait_stream(raw: Any, stream: object) -> None:
    if raw is None:
        return
    if stream is not None and hasattr(stream, "cuda_stream"):
        stream = stream.cuda_stream
    raw.wait_stream(stream)
