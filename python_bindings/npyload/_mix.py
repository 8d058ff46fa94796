"""Loader(sources=..., weights=...): the arguments of a mixture checked and
put in the library's order (the semantics are the C library's:
lib/order/npyload_mix.h, docs/mixing.md)."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any


def check_sources(fields: Any, sources: Any, weights: Any, samples_per_epoch: Any,
                  remote: Any = None) -> tuple[list[tuple[str, list[tuple[str, str | None, list[str] | None]]]] | None,
                             list[float] | None]:
    """([(source, field specs)], weights in the sources' order or None)
    from Loader's arguments; (None, None) without sources."""
    from ._manifest import fields_of
    from ._options import _field_specs
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
