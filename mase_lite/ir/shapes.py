"""Concrete sizes from metadata shapes, whose dims may be symbols such as ``"batch"`` or ``"seq*2"``.

Example::

    >>> numel(["batch", "seq", 128], {"batch": 2, "seq": 10})
    2560
"""

from __future__ import annotations

import math
from functools import lru_cache

import sympy

from mase_lite.errors import UserError


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
