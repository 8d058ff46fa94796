"""Loader's construction-time help for users coming from DataLoader: its
keywords that npyload spells differently (a TypeError naming the
equivalent, or accepted where the meaning carries over), and the mistakes
that would train silently on wrong data (warnings). Kept apart from
_loader so that the loader's own logic stays about loading."""
import glob as _glob
import warnings as _warnings
from collections.abc import Mapping
from typing import Any

from . import _npyload
from ._transform import Transform


class FlipMismatchWarning(UserWarning):
    """A random flip on some of the fields that share the flipped axes, not
    on the others (images flipped, their heatmaps not): a sample's fields
    no longer agree. When that is intended, silence it for the construction:
    ``warnings.filterwarnings("ignore", category=npyload.FlipMismatchWarning)``
    (or inside ``warnings.catch_warnings()``)."""


# DataLoader keyword -> what npyload has instead (None: accepted, see below).
_INSTEAD = {
    "prefetch_factor": "prefetch= (batches read ahead in total, not per worker; the "
                       "default 'auto' sizes it while the loader runs)",
    "collate_fn": "nothing: rows arrive stacked per field; per-batch code goes in "
                  "transform=fn (a thread of its own) or a per-field npyload.Transform",
    "sampler": "shuffle=True/False/'local' and seed= (order), rank=/world_size= "
               "(DistributedSampler's split)",
    "batch_sampler": "batch_size=, shuffle=, drop_last=",
    "worker_init_fn": "nothing: workers are threads of this process (no copy of your "
                      "objects to set up); seed= fixes the order and the augmentations",
    "generator": "seed= (the order is a pure function of seed and epoch)",
    "multiprocessing_context": "nothing: workers are threads",
    "timeout": "remote={'timeout': seconds} for s3:// and https:// reads",
    "pin_memory_device": "device='cuda:N' (batches arrive on that GPU)",
}

# Accepted: their meaning carries over (threads live until close(); batches
# always arrive in order, which in_order=False allows too).
_ACCEPTED = ("persistent_workers", "in_order")


def dataloader_keywords(kw: Mapping[str, Any]) -> None:
    """Checks the keywords Loader does not have: ``persistent_workers``
    (True or False) is accepted (workers are threads that live from the first
    iter() to close(); there is nothing to restart per epoch), so is
    ``in_order`` (batches always arrive in order), the other
    DataLoader keywords raise a TypeError naming the npyload equivalent, and
    any other name raises Python's usual TypeError."""
    for name, value in kw.items():
        if name in _ACCEPTED:
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
            continue
        if name in _INSTEAD:
            raise TypeError(f"npyload.Loader has no {name}= (a DataLoader keyword): use "
                            f"{_INSTEAD[name]}; see the migration page of the docs")
        raise TypeError(f"Loader() got an unexpected keyword argument {name!r}")


def _sample_shape(spec: tuple[str, str | None, list[str] | None]) -> tuple[int, ...] | None:
    """A local field's per-sample shape from its first file's header (None
    for remote or unmatched fields: not judged)."""
    _, g, paths = spec
    first = sorted(_glob.glob(g))[:1] if g is not None else (paths or [])[:1]
    if not first or "://" in first[0]:
        return None
    try:
        shape = tuple(_npyload.inspect(first[0])["shape"])
    except Exception:
        return None
    return shape[1:]


def _aspect(shape: tuple[int, ...]) -> float:
    return shape[-2] / shape[-1] if shape[-1] else 0.0


def construction_warnings(specs: list[tuple[str, str | None, list[str] | None]],
                          transforms: list[tuple[str, Transform]], batches: int,
                          batch_size: int, samples: int, drop_last: bool,
                          stacklevel: int) -> None:
    """The silent mistakes, said at construction: a flip on only some of the
    fields sharing the flipped axes (FlipMismatchWarning), a flip sign
    without its flip, an epoch of zero batches."""
    ts = dict(transforms)
    for name, t in transforms:
        for sign, p in (("hflip_sign", t.hflip), ("vflip_sign", t.vflip)):
            if getattr(t, sign) is not None and not p:
                _warnings.warn(f"npyload: transforms[{name!r}] has {sign} but no "
                               f"{sign[:5]} (probability 0): the signs are never applied",
                               UserWarning, stacklevel=stacklevel)
    for axis in ("hflip", "vflip"):
        flipped = {n: getattr(t, axis) for n, t in transforms if getattr(t, axis)}
        if not flipped:
            continue
        shapes = {s[0]: _sample_shape(s) for s in specs}
        ref = [shapes[n] for n in flipped if shapes.get(n) and len(shapes[n] or ()) >= 2]
        aspects = {round(_aspect(s), 3) for s in ref if s}
        odd = []
        for n, _, _ in specs:
            shp = shapes.get(n)
            p = getattr(ts[n], axis) if n in ts else 0.0
            if p == max(flipped.values()) or not shp or len(shp) < 2:
                continue
            if round(_aspect(shp), 3) in aspects:
                odd.append(f"{n} ({axis}={p})")
        if odd:
            on = ", ".join(f"{n} ({axis}={p})" for n, p in flipped.items())
            _warnings.warn(
                f"npyload: {axis} flips {on} but not {', '.join(odd)}, whose samples have "
                f"the same spatial axes: a sample's fields would disagree (an image "
                f"flipped, its labels not). Give them the same {axis} (and {axis}_sign "
                f"for signed offsets), or, if intended, silence this with "
                f"warnings.filterwarnings('ignore', category=npyload.FlipMismatchWarning)",
                FlipMismatchWarning, stacklevel=stacklevel)
    if batches == 0:
        why = (f"batch_size={batch_size} is more than the {samples} samples of this rank "
               f"and drop_last=True drops the short batch" if drop_last else
               f"{samples} samples")
        _warnings.warn(f"npyload: an epoch has no batch ({why}): the loop will not run",
                       UserWarning, stacklevel=stacklevel)
