"""Concrete sizes from metadata shapes, whose dims may be symbols such as ``"batch"`` or ``"seq*2"``.

Example::

    >>> numel(["batch", "seq", 128], {"batch": 2, "seq": 10})
    2560
"""

from __future__ import annotations

import math
from functools import lru_cache

import sympy

from mase_lite.infra.errors import UserError


@lru_cache(maxsize=4096)
def _expr(text: str) -> sympy.Expr:
    return sympy.sympify(text)


def dim_value(dim: int | str, dims: dict[str, int]) -> int:
    """The size of one dim under the symbol values ``dims``."""
    if isinstance(dim, int):
        return dim
    expr = _expr(dim)
    value = expr.subs({sympy.Symbol(k): v for k, v in dims.items()})
    if not value.is_number:
        missing = ", ".join(sorted(str(s) for s in value.free_symbols))
        raise UserError(f"shape dim {dim!r} needs a value for: {missing} (given: {', '.join(dims) or 'none'})")
    return int(value)


def concrete(shape: list[int | str], dims: dict[str, int]) -> list[int]:
    return [dim_value(d, dims) for d in shape]


def numel(shape: list[int | str], dims: dict[str, int]) -> int:
    return math.prod(concrete(shape, dims))


def graph_symbols(mg) -> set[str]:
    """The symbolic dim names the shapes of ``mg``'s node metadata use (e.g. ``{"batch", "seq"}``)."""
    found: set[str] = set()
    for node in mg.model.graph.nodes:
        meta = node.meta.get("mase") or {}
        entries = [*(meta.get("args") or []), *(meta.get("results") or []), *(meta.get("params") or {}).values()]
        for entry in entries:
            for dim in (entry or {}).get("shape") or [] if isinstance(entry, dict) else []:
                if isinstance(dim, str):
                    found.update(str(s) for s in _expr(dim).free_symbols)
    return found


def check_dims(dims: dict[str, int], mg, field: str = "dims") -> None:
    """Every name in ``dims`` is a symbolic dim of ``mg`` and every value is at least 1."""
    used = graph_symbols(mg)
    unknown = sorted(set(dims) - used)
    if unknown:
        raise UserError(f"unknown dim(s) {', '.join(unknown)}; this graph's symbolic dims: {', '.join(sorted(used)) or 'none'}", location=(field,))
    bad = {k: v for k, v in dims.items() if v < 1}
    if bad:
        raise UserError(f"dim values must be at least 1, got {bad}", location=(field,))
