"""npyload: stream NPY arrays into reused pinned buffers and onto the GPU.

A drop-in for a ``torch.utils.data.DataLoader`` whose Dataset returns rows
(or whole pre-batched files) of ``.npy`` arrays, stacked or concatenated into
batches (README, "Drop-in for DataLoader", says exactly which pattern)::

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

# One module per concept; this file only re-exports. Only _torch imports
# torch (lazily), so the package imports and runs without it.
from . import _npyload
from ._npyload import NpyloadError, order_indices, cuda_available
from ._batch import Augment, Batch, BatchTuple
from ._ceiling import copy_ceiling, h2d_ceiling
from ._habits import FlipMismatchWarning
from ._hook import TransformError
from ._info import build_info
from ._inspect import inspect, inspect_manifest
from ._load import load
from ._loader import Loader
from ._model import cost_model, dataset_facts
from ._pack import pack
from ._prefetch import prefetch
from ._transform import Transform
from ._write import write

__all__ = ["Loader", "Batch", "BatchTuple", "Augment", "Transform", "TransformError",
           "FlipMismatchWarning", "NpyloadError",
           "inspect", "inspect_manifest", "load", "order_indices", "cuda_available",
           "build_info", "pack", "prefetch", "cost_model", "dataset_facts", "write",
           "copy_ceiling", "h2d_ceiling", "__version__"]
__version__ = _npyload.__version__
