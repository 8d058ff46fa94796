"""Loader(sources=..., weights=...): the arguments of a mixture checked and
put in the library's order, the C loader's sources, set_weights and the
mixture's stats (the semantics are the C library's: lib/order/npyload_mix.h,
docs/mixing.md)."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from ._manifest import fields_of
from ._options import _check_transforms, _field_specs
from ._transform import Transform

if TYPE_CHECKING:
    from ._loader import Loader
    from ._npyload import LoaderStats

_Specs = list[tuple[str, Optional[str], Optional[list[str]]]]
_Sources = list[tuple[str, _Specs]]


def check_args(fields: Any, batch_size: Any, sources: Any, weights: Any,
               samples_per_epoch: Any, remote: Any) -> tuple[_Specs, list[str], _Sources | None,
                                                             list[float] | None]:
    """Loader's fields or sources: (the field specs (of the first source),
    every file or glob of every source (for remote=), [(source, specs)] or
    None, the weights in the sources' order or None)."""
    if batch_size is None:
        raise TypeError("Loader() needs batch_size (a positive int)")
    srcs, w = check_sources(fields, sources, weights, samples_per_epoch, remote)
    every = _field_specs(fields_of(fields, remote)) if srcs is None else \
        [spec for _, sp in srcs for spec in sp]  # a manifest: its files
    files = [p for _, g, ps in every for p in ([g] if g is not None else ps or [])]
    return (every if srcs is None else srcs[0][1]), files, srcs, w


def add_fields(c: Any, specs: _Specs, sources: _Sources | None, weights: list[float] | None,
               src_transforms: list[tuple[str, str, Transform]]) -> None:
    """The fields (or each source, then its fields, the weights and the
    sources' own transforms) added to the C loader `c`."""
    for source, group in [(None, specs)] if sources is None else sources:
        if source is not None:
            c.add_source(source)
        for name, glob, paths in group:
            if paths is None:
                assert glob is not None  # _field_specs gives one of the two
                c.add_field(name, glob)
            else:
                c.add_field_files(name, paths)
    if sources is not None and weights is not None:
        c.set_weights(weights)
    for source, name, t in src_transforms:
        t._set_on(c, name, source)


def check_transforms(specs: _Specs, transforms: Any, sources: _Sources | None) -> tuple[
        list[tuple[str, Transform]], list[tuple[str, str, Transform]]]:
    """Loader's ``transforms``: ([(field, Transform)] for every source
    alike, [(source, field, Transform)]: a source's own, in place of the
    field's for its rows). With sources, a key naming a source takes a
    mapping {field: Transform}; a key naming a field, a Transform."""
    if sources is None or not isinstance(transforms, Mapping):
        return _check_transforms(specs, transforms), []
    names = [n for n, _ in sources]
    fields = [n for n, _, _ in specs]
    shared: dict[str, Any] = {}
    own: list[tuple[str, str, Transform]] = []
    for key, val in transforms.items():
        if key in names and isinstance(val, Mapping):
            try:
                own += [(key, f, t) for f, t in _check_transforms(specs, val)]
            except TypeError as e:
                raise TypeError(f"source {key!r}: {e}") from None
            except ValueError as e:
                raise ValueError(f"source {key!r}: {e}") from None
        elif key in fields:
            shared[key] = val
        elif key in names:
            raise TypeError(f"transforms[{key!r}]: a source's transforms are a mapping "
                            f"{{field: npyload.Transform}}, got {type(val).__name__}")
        else:
            raise ValueError(f"transforms: {key!r} is neither a field ({', '.join(fields)}) "
                             f"nor a source ({', '.join(names)})")
    return _check_transforms(specs, shared), own


def add_stats(c: Any, sources: _Sources | None, st: LoaderStats) -> LoaderStats:
    """stats()' source_samples ({source: rows handed out}), digest and
    digest_rows (the running digest of the rows handed out), from `c`."""
    per, digest, rows = c.mix_stats()
    st["source_samples"] = {name: per[k] for k, (name, _) in enumerate(sources or ())}
    st["digest"], st["digest_rows"] = digest, rows
    return st


def set_weights(self: Loader[Any], weights: Mapping[str, float]) -> None:
    """Changes the sources' weights (a mapping over every source's name;
    only their ratios count). Before the first loop, the weights from
    epoch 0 on (or, after load_state_dict, from the resumed position).
    Once running, exactly from the next batch: the change is recorded in
    state_dict(), so a resume reproduces it; at the end of an epoch's
    loop, from the next epoch. Setting the weights in force again changes
    nothing, so a curriculum may set its schedule before every epoch.
    With several ranks, every rank calls it after the same number of
    batches. With ``transform=``, a running loop ends (its threads read
    ahead): change the weights between epochs there. Raises ValueError
    for names or values that do not fit,
    RuntimeError ("in use") while another call on this loader runs."""
    ld: Any = self  # the Loader's internals
    if ld._sources is None:
        raise ValueError("set_weights(): this loader has no sources (Loader(sources=...))")
    w = weight_list(ld._sources, weights)
    with ld._in_use("set_weights()"):
        c = ld._live()
        if ld._pipe is not None:
            # transform= threads took batches ahead: their loop ends here
            ld._stop_pipe()
            ld._gen += 1
            ld._hook_state = None
        c.set_weights(w)  # a plain loop goes on with the next batch
        ld._weights = w


def check_sources(fields: Any, sources: Any, weights: Any, samples_per_epoch: Any,
                  remote: Any = None) -> tuple[list[tuple[str, list[tuple[str, str | None, list[str] | None]]]] | None,
                             list[float] | None]:
    """([(source, field specs)], weights in the sources' order or None)
    from Loader's arguments; (None, None) without sources."""
    if sources is None:
        if fields is None:
            raise TypeError("Loader() needs fields (a mapping from field name to a glob "
                            "or a list of paths) or sources")
        if weights is not None or samples_per_epoch is not None:
            raise ValueError("weights and samples_per_epoch need sources= (a mixture)")
        return None, None
    if fields is not None:
        raise TypeError("Loader() takes fields or sources, not both")
    if not isinstance(sources, Mapping) or not sources:
        raise TypeError("sources must be a non-empty mapping from a source's name to its "
                        "fields (the mapping `fields` takes)")
    out = []
    for name, spec in sources.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"source names must be non-empty strings, got {name!r}")
        try:
            specs = _field_specs(fields_of(spec, remote))  # a manifest: its files
        except TypeError as e:
            raise TypeError(f"source {name!r}: {e}") from None
        except ValueError as e:
            raise ValueError(f"source {name!r}: {e}") from None
        out.append((name, specs))
    first = [n for n, _, _ in out[0][1]]
    for name, specs in out[1:]:
        names = [n for n, _, _ in specs]
        if sorted(names) != sorted(first):
            missing = sorted(set(first) - set(names))
            extra = sorted(set(names) - set(first))
            raise ValueError(f"source {name!r} has fields {names}, source {out[0][0]!r} "
                             f"{first}: every source has the same fields"
                             + (f" (missing: {missing})" if missing else "")
                             + (f" (not in {out[0][0]!r}: {extra})" if extra else ""))
    if samples_per_epoch is not None and (isinstance(samples_per_epoch, bool) or
                                          not isinstance(samples_per_epoch, int) or
                                          samples_per_epoch < 1):
        raise ValueError(f"samples_per_epoch must be a positive int or None, got "
                         f"{samples_per_epoch!r}")
    return out, None if weights is None else weight_list(out, weights)


def weight_list(sources: list[tuple[str, Any]], weights: Any) -> list[float]:
    """The weights of a {source: weight} mapping in the sources' order."""
    if not isinstance(weights, Mapping):
        raise TypeError("weights must be a mapping from a source's name to a number")
    names = [n for n, _ in sources]
    unknown = sorted(set(weights) - set(names), key=str)
    missing = [n for n in names if n not in weights]
    if unknown or missing:
        raise ValueError(f"weights name every source ({names})"
                         + (f"; unknown: {unknown}" if unknown else "")
                         + (f"; missing: {missing}" if missing else ""))
    out = []
    for n in names:
        w = weights[n]
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or \
                not math.isfinite(float(w)) or w < 0:
            raise ValueError(f"weights[{n!r}] = {w!r}: a finite number >= 0 expected")
        out.append(float(w))
    if not any(out):
        raise ValueError("weights: at least one must be > 0")
    return out
