"""GPTQ (Frantar et al., 2022): quantize a weight column by column, feeding each column's error forward.

``W`` (``[out, in]``) minimises ``||(W - Q) X||`` over the layer's inputs ``X`` through the Hessian
``H = 2 X Xᵀ / n``: with ``U`` the upper Cholesky factor of ``(H + damp·I)⁻¹``, column ``i`` is
quantized to ``q`` and every later column ``j`` moves by ``-(w_i - q) U[i, j] / U[i, i]``. Columns are
processed in blocks (lazy batch updates: the block's errors reach later columns in one matrix product),
optionally in order of decreasing ``H[i, i]`` (act-order). The arithmetic equals the straightforward
column-by-column algorithm.

Any format whose values in a row depend only on the row's groups of consecutive elements works
(:attr:`~mase_lite.numerics.NumberFormat.group`: integers, minifloats, logs, scaled integers, the MX and
block formats): a group's scale is fixed when its first column is quantized, from the group's current
values (their largest and smallest value per row, what the format's scale depends on), and each column
is quantized under it. The result is quantized once more as a whole, so it is a value of the format; for a
format whose scale the values give back exactly (the symmetric ones), the layer's own fake quantization
of the stored weight then leaves it unchanged.

Example::

    q = gptq(weight, hessian, {"name": "mxint", "element_width": 4}, block_size=128, act_order=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor

from mase_lite.errors import UserError
from mase_lite.numerics import NumberFormat, apply_format, parse_format


@dataclass
class GPTQResult:
    """The quantized weight, and the layer-output error ``tr((W - Q) H (W - Q)ᵀ)`` of GPTQ and of rounding alone."""

    weight: Tensor
    error: float
    rtn_error: float


def _quantize_column(fmt: NumberFormat, params: Any, column: Tensor, ghost: tuple[Tensor, Tensor]) -> Tensor:
    """``column`` quantized under the scale its group's extreme values (``ghost``: per-row max and min) give."""
    probe = torch.stack([column, *ghost], 1).to(torch.float32)
    return fmt.quantize(probe, params)[:, 0].to(column.dtype)


def probe_params(fmt: NumberFormat, params: Any) -> Any:
    """``params`` with the group of three elements a probe ``[column, max, min]`` is, so no row is padded to a
    whole group (a group's scale depends on its extreme values only, not on its length)."""
    for key in ("block_size", "group_size"):
        if key in type(params).model_fields:
            return params.model_copy(update={key: 3})
    return params


def _inverse_factor(hessians: list[Tensor], damp: float) -> Tensor:
    """The upper Cholesky factor of the damped Hessian's inverse. The Hessian comes in a list the function
    empties, so it and each intermediate are released as soon as the next exists (a 5632-wide float64
    Hessian is 254 MB)."""
    h = hessians.pop()
    h.diagonal().add_(damp * h.diagonal().mean())
    try:
        factor = torch.linalg.cholesky(h)
    except torch.linalg.LinAlgError:
        raise UserError(
            f"gptq: the damped Hessian is not positive definite (damp {damp}); raise damp or the calibration data"
        ) from None
    del h
    factor = torch.cholesky_inverse(factor)
    factor = torch.linalg.cholesky(factor, upper=True)
    return factor if factor.is_contiguous() else factor.contiguous()  # rows are read one by one


def gptq(weight: Tensor, hessian: Tensor, fmt: Mapping[str, Any], *, block_size: int = 128, act_order: bool = False,
         damp: float = 0.01, dtype: torch.dtype = torch.float64) -> GPTQResult:
    """``weight`` (``[out, in]``) quantized to ``fmt`` with GPTQ error compensation for ``hessian`` (``[in, in]``).

    The arithmetic runs in ``dtype``; the result has ``weight``'s dtype.
    """
    number_format, params = parse_format(fmt)
    if number_format.group is None:
        raise UserError(
            f"gptq: format '{number_format.name}' has no column groups to quantize column by column; GPTQ works with "
            "integer, minifloat, log, scaled_integer, mxint, mxfp and the block formats"
        )
    w = weight.detach().to(dtype).clone()
    h = hessian.detach().to(dtype, copy=True)
    columns = w.shape[1]
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    order = torch.argsort(h.diagonal(), descending=True, stable=True) if act_order else torch.arange(columns)
    if act_order:
        h = h.index_select(0, order).index_select(1, order)
    hessians = [h]
    del h
    u = _inverse_factor(hessians, damp)
    size = number_format.group(params, columns)
    column_params = probe_params(number_format, params)
    position = torch.empty_like(order)
    position[order] = torch.arange(columns)
    ghosts: dict[int, tuple[Tensor, Tensor]] = {}
    current = w.clone()  # updated at block boundaries; a block's own columns live in `block`
    q = torch.zeros_like(w)
    threads = torch.get_num_threads()
    for start in range(0, columns, block_size):
        stop = min(start + block_size, columns)
        block = current[:, order[start:stop]].clone()
        errors = torch.zeros_like(block)
        torch.set_num_threads(1)  # the column loop's small updates only wait on each other across threads
        try:
            for i in range(stop - start):
                j = int(order[start + i])
                group = j // size
                if group not in ghosts:  # its first column: every column of the group is still to be quantized
                    cols = torch.arange(group * size, min((group + 1) * size, columns))
                    pos = position[cols]
                    values = current[:, cols] - errors[:, :i] @ u[start : start + i][:, pos]
                    inside = pos < stop
                    values[:, inside] = block[:, pos[inside] - start]
                    ghosts[group] = (values.amax(1), values.amin(1))
                value = _quantize_column(number_format, column_params, block[:, i], ghosts[group])
                q[:, j] = value
                err = (block[:, i] - value) / u[start + i, start + i]
                block[:, i:].addr_(err, u[start + i, start + i : stop], alpha=-1)  # one rank-1 update, in place
                errors[:, i] = err
        finally:
            torch.set_num_threads(threads)
        current[:, order[stop:]] -= errors @ u[start:stop, stop:]
    q = apply_format(q.to(torch.float32), number_format, params).to(dtype)
    h_full = hessian.detach().to(dtype)
    rtn = apply_format(weight.detach().to(torch.float32), number_format, params).to(dtype)
    return GPTQResult(
        weight=q.to(weight.dtype),
        error=float(((w - q) @ h_full * (w - q)).sum()),
        rtn_error=float(((w - rtn) @ h_full * (w - rtn)).sum()),
    )
