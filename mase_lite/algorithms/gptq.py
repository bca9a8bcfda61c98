"""GPTQ (Frantar et al., 2022): quantize a weight column by column, feeding each column's error forward.

``W`` (``[out, in]``) minimises ``||(W - Q) X||`` over the layer's inputs ``X`` through the Hessian
``H = 2 X Xᵀ / n``: with ``U`` the upper Cholesky factor of ``(H + damp·I)⁻¹``, column ``i`` is
quantized to ``q`` and every later column ``j`` moves by ``-(w_i - q) U[i, j] / U[i, i]``. Columns are
processed in blocks (lazy batch updates: a block's errors reach later columns in one matrix product,
and within a block, a sub-block's errors reach the block's later columns in one more), optionally in
order of decreasing ``H[i, i]`` (act-order). Only the few operations a column needs run per column,
on a contiguous vector (the weight is held transposed), so the time goes to the matrix products.

Any format whose values in a row depend only on the row's groups of consecutive elements works
(:attr:`~mase_lite.numerics.NumberFormat.group`: integers, minifloats, logs, scaled integers, the MX and
block formats). A group's scale is fixed when its first column is quantized, from the group's current
values, and every column of the group is quantized on that grid (values beyond it saturate). Formats
with a ``group_quantizer`` (scaled integers, MX) report the scales they fixed (``side``, as their codec
stores them): the weight decodes from its codes under exactly those scales, which a layer then holds
(see :meth:`~mase_lite.layers.quantized.OperandQuantizer.hold`). Other formats are probed: a column is
quantized in a group ``[column, max, min]`` of the group's extreme values, and the result quantized once
more as a whole, so it is a value of the format.

SparseGPT (Frantar & Alistarh, 2023) is the same sweep with a mask: at each block's start (unstructured:
the block's share of the pruned count, by saliency ``w² / U[i, i]²``) or at the first column of every ``m``
(``n`` of each ``m`` consecutive inputs of a row), the weights of least saliency are chosen and set to zero as
their columns are reached, their error fed forward like a rounding error; with a format, the kept weights
are quantized in the same sweep.

Example::

    result = gptq(weight, hessian, {"name": "mxint", "element_width": 4}, block_size=128, act_order=True)
    result.weight, result.side, result.error / result.rtn_error
    pruned = gptq(weight, hessian, None, sparsity=Sparsity(n=2, m=4))     # 2:4 SparseGPT, float values
    pruned.mask                                                           # True where a weight is kept
"""

from __future__ import annotations

import inspect

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from mase_lite.infra.cores import steady_threads
from mase_lite.infra.errors import UserError
from mase_lite.layers.pruning import Sparsity, lowest_mask
from mase_lite.numerics import NumberFormat, apply_format, parse_format
from mase_lite.numerics.native.threads import torch_threads

SUB_BLOCK = 16  # columns whose errors reach the rest of their block one at a time (rank-1 updates)
ROWS_AT_ONCE = 1024  # rows of the weight whose error is summed at a time once the sweep is done


@dataclass
class GPTQResult:
    """The quantized (and pruned) weight, the shared values (scales) GPTQ fixed for it (None: those its values
    give), the keep-mask (None without sparsity), and per row the layer-output error ``((W - Q) H (W - Q)ᵀ)``
    of GPTQ and of the baseline: rounding alone, after magnitude pruning of the same pattern when pruning."""

    weight: Tensor | None  # None where it was written ``into`` the given tensors
    side: dict[str, Tensor] | None
    row_error: Tensor
    row_rtn_error: Tensor
    mask: Tensor | None = None

    @property
    def error(self) -> float:
        return float(self.row_error.sum())

    @property
    def rtn_error(self) -> float:
        return float(self.row_rtn_error.sum())


def probe_params(fmt: NumberFormat, params: Any) -> Any:
    """``params`` with the group of three elements a probe ``[column, max, min]`` is, so no row is padded to a
    whole group (a group's scale depends on its extreme values only, not on its length)."""
    for key in ("block_size", "group_size"):
        if key in type(params).model_fields:
            return params.model_copy(update={key: 3})
    return params


def _inverse_factor(hessians: list[Tensor], damp: float) -> tuple[Tensor, float]:
    """The upper Cholesky factor ``U`` of the damped Hessian's inverse (``H⁻¹ = Uᵀ U``) and the damping ``λ``
    added to the diagonal, from one Cholesky factorisation and one triangular inverse: with ``P`` the
    reversal permutation and ``P H P = L Lᵀ``, ``U = P L⁻¹ P``. The Hessian comes reversed (``P H P``) in a
    list the function empties; all three steps run in its memory (a 5632-wide float64 Hessian is 254 MB).

    >>> h = torch.tensor([[4.0, 2.0], [2.0, 5.0]], dtype=torch.float64)
    >>> u, lam = _inverse_factor([h.flip(0, 1).clone()], 0.0)
    >>> torch.allclose(u.T @ u, torch.linalg.inv(h)), bool((u.tril(-1) == 0).all()), lam
    (True, True, 0.0)
    """
    with torch_threads(steady_threads()):  # LAPACK's bits follow its thread count; the load must not
        factor = hessians.pop()
        lam = damp * float(factor.diagonal().mean())
        factor.diagonal().add_(lam)
        info = torch.empty((), dtype=torch.int32)
        torch.linalg.cholesky_ex(factor, out=(factor, info))  # in place
        if int(info):
            raise UserError(f"gptq: the damped Hessian is not positive definite (damp {damp}); raise damp or the "
                            "calibration data")
        _invert_lower(factor)
        _permute_symmetric(factor, torch.arange(factor.shape[0] - 1, -1, -1))  # the reversal P · P
    return factor, lam


def _invert_lower(lower: Tensor, leaf: int = 128) -> None:
    """Inverts a lower-triangular matrix in its own memory, by halves: ``[[A, 0], [B, C]]⁻¹ =
    [[A⁻¹, 0], [−C⁻¹ B A⁻¹, C⁻¹]]``, the products taken ``leaf`` rows or columns at a time (no buffer larger
    than ``leaf`` of them). What lies above the diagonal is ignored and left zero."""
    n = lower.shape[0]
    if n <= leaf:
        lower.copy_(torch.linalg.solve_triangular(lower, torch.eye(n, dtype=lower.dtype), upper=False))
        return
    half = n // 2
    a, b, c = lower[:half, :half], lower[half:, :half], lower[half:, half:]
    lower[:half, half:].zero_()
    _invert_lower(a, leaf)
    _invert_lower(c, leaf)
    buffer = torch.empty(leaf * max(half, n - half), dtype=lower.dtype)
    for stop in range(n - half, 0, -leaf):  # C⁻¹ B from the last rows up: row i needs B's rows up to i
        start = max(stop - leaf, 0)
        rows = buffer[: (stop - start) * half].view(stop - start, half)
        b[start:stop].copy_(torch.mm(c[start:stop, :stop], b[:stop], out=rows))
    for start in range(0, half, leaf):  # then · A⁻¹ from the first columns on: column j needs columns from j
        stop = min(start + leaf, half)
        columns = buffer[: (n - half) * (stop - start)].view(n - half, stop - start)
        b[:, start:stop].copy_(torch.mm(b[:, start:], a[start:, start:stop], out=columns))
    b.neg_()


def _permute_symmetric(matrix: Tensor, order: Tensor, rows: int = 64) -> None:
    """``matrix[order][:, order]`` in its own memory: the rows along their permutation's cycles, then the
    columns ``rows`` rows at a time."""
    targets = order.tolist()
    done = [False] * len(targets)
    for first in range(len(targets)):
        if done[first] or targets[first] == first:
            continue
        kept = matrix[first].clone()
        i = first
        while targets[i] != first:
            matrix[i].copy_(matrix[targets[i]])
            done[i] = True
            i = targets[i]
        matrix[i].copy_(kept)
        done[i] = True
    for start in range(0, matrix.shape[0], rows):
        chunk = matrix[start : start + rows]
        chunk.copy_(chunk.index_select(1, order))


Quantizer = Callable[[Tensor], Tensor]


def _group_opener(fmt: NumberFormat, params: Any, dtype: torch.dtype
                  ) -> Callable[[Tensor, Tensor], tuple[dict | None, Quantizer]]:
    """From a group's current values (``[rows, k]``) and its columns' curvature (``[k]``, the Hessian's diagonal):
    the shared values it fixes (None where the format does not say), chosen by the error the curvature weighs where
    the format's group quantizer takes an ``importance``, and the quantizer of a column (``[rows]`` in ``dtype``) on
    its grid."""

    def in_dtype(fn: Quantizer) -> Quantizer:
        if dtype == torch.float32:
            return fn
        if getattr(fn, "positional", False):  # its grid depends on the column's place in the group (ggml's K-quants)
            def positioned(col: Tensor, column: int) -> Tensor:
                return fn(col.to(torch.float32), column=column).to(dtype)
            positioned.positional = True
            return positioned
        return lambda col: fn(col.to(torch.float32)).to(dtype)

    if fmt.group_quantizer is not None:
        weighted = "importance" in inspect.signature(fmt.group_quantizer).parameters

        def opened(values: Tensor, curvature: Tensor):
            given = {"importance": curvature.to(torch.float32)} if weighted else {}
            side, fn = fmt.group_quantizer(params, values.to(torch.float32).contiguous(), **given)
            return side, in_dtype(fn)
        return opened
    probe = probe_params(fmt, params)

    def probed(values: Tensor, curvature: Tensor):
        high, low = values.to(torch.float32).amax(1), values.to(torch.float32).amin(1)
        return None, in_dtype(lambda col: fmt.quantize(torch.stack([col, high, low], 1), probe)[:, 0])
    return probed


def _elementwise(fmt: NumberFormat, params: Any, dtype: torch.dtype) -> Quantizer:
    if dtype == torch.float32:
        return lambda col: fmt.quantize(col, params)
    return lambda col: fmt.quantize(col.to(torch.float32), params).to(dtype)


def gptq(weight: Tensor | list[Tensor], hessian: Tensor | list[Tensor], fmt: Mapping[str, Any] | None, *, sparsity: Sparsity | None = None,
         block_size: int = 128, act_order: bool = False, damp: float = 0.01, dtype: torch.dtype = torch.float64,
         baseline: bool = True, into: list[Tensor] | None = None) -> GPTQResult:
    """``weight`` (``[out, in]``; or a list of weights whose rows it stacks, never copied together) quantized to
    ``fmt`` (None: kept float) and pruned to ``sparsity`` (None: not pruned) with error compensation for
    ``hessian`` (``[in, in]``); given in a one-element list, the Hessian is handed over: the list is emptied and
    its memory reused (where the error needs it no more at the end). ``into``: tensors shaped as the weights to
    write the result into instead of a new tensor (they may be the weights themselves: each row chunk is read
    before it is written), the result's ``weight`` then None.

    The arithmetic runs in ``dtype``; the result has ``weight``'s dtype. The layer-output error comes from the
    sweep itself (the errors it feeds forward: ``Σ err² = (W - Q)(H + λI)(W - Q)ᵀ``, less ``λ‖W - Q‖²``); the
    baseline's (``baseline=False``: not computed, NaN) costs one more product as large as the sweep's updates.
    """
    parts = [w.detach() for w in weight] if isinstance(weight, list) else [weight.detach()]
    shape, out_dtype = torch.Size((sum(w.shape[0] for w in parts), parts[0].shape[1])), parts[0].dtype
    number_format, params = parse_format(fmt) if fmt is not None else (None, None)
    if number_format is not None and number_format.group is None:
        raise UserError(
            f"gptq: format '{number_format.name}' has no column groups to quantize column by column; GPTQ works with "
            "integer, minifloat, log, scaled_integer, mxint, mxfp and the block formats"
        )
    if sparsity is not None and sparsity.m:
        if act_order:
            raise UserError(f"sparsity {sparsity.n}:{sparsity.m} needs the columns in their order: act_order must be off")
        if shape[1] % sparsity.m:
            raise UserError(f"sparsity {sparsity.n}:{sparsity.m}: the weight's {shape[1]} inputs are not a multiple of {sparsity.m}")
    size = number_format.group(params, shape[1]) if number_format is not None else 1
    probed = size > 1 and number_format.group_quantizer is None  # its error is computed from the Hessian at the end
    handed = isinstance(hessian, list)
    h = hessian.pop() if handed else hessian
    hessian = h if baseline or probed or not handed else None
    h = h.detach()
    columns = h.shape[0]
    curvature = h.diagonal().to(dtype, copy=True)
    dead = curvature == 0
    curvature[dead] = 1
    order = torch.argsort(curvature, descending=True, stable=True) if act_order else torch.arange(columns)
    reverse = order.flip(0)
    if hessian is None and h.dtype == dtype and h.is_contiguous():  # handed over and needed no more: its own memory
        _permute_symmetric(h, reverse)
        hessians = [h]
    else:
        hessians = [h[reverse[:, None], reverse].to(dtype)]  # P H P in processing order: one copy
    del h
    hessians[0][dead[reverse], dead[reverse]] = 1
    u, lam = _inverse_factor(hessians, damp)
    slices = _row_slices(parts)
    wt = torch.empty(columns, shape[0], dtype=dtype)  # [in, out] in processing order: a column is a contiguous row
    for part, rows in zip(parts, slices):
        wt[:, rows].copy_(part.t().index_select(0, order) if act_order else part.t())
    dead = dead[order]
    wt[dead] = 0
    position = torch.empty_like(order)
    position[order] = torch.arange(columns)
    group_of, within = (order // size).tolist(), (order % size).tolist()  # a column's group, its place in it
    opener = _group_opener(number_format, params, dtype) if size > 1 else None
    elementwise = (_elementwise(number_format, params, dtype) if number_format is not None else torch.clone) if size == 1 else None
    opened: dict[int, Quantizer] = {}
    sides: dict[int, dict | None] = {}
    diagonal = u.diagonal().tolist()
    drop = torch.zeros_like(wt, dtype=torch.bool) if sparsity is not None else None
    errors = torch.empty(min(block_size, columns), wt.shape[1], dtype=dtype)
    loss = torch.zeros(wt.shape[1], dtype=dtype)
    for start in range(0, columns, block_size):
        stop = min(start + block_size, columns)
        if sparsity is not None and not sparsity.m:
            _choose_in_block(drop, wt, u, sparsity.fraction, start, stop)
        for sub in range(start, stop, SUB_BLOCK):
            end = min(sub + SUB_BLOCK, stop)
            for k in range(sub, end):
                if sparsity is not None and sparsity.m and k % sparsity.m == 0:
                    _choose_n_of_m(drop, _current(wt, errors, u, torch.arange(k, k + sparsity.m), start, sub, end, stop, k),
                                   u, sparsity.n, k)
                if elementwise is not None:
                    quantize = elementwise
                else:
                    g = group_of[k]
                    quantize = opened.get(g)
                    if quantize is None:  # the group's first column: none of its columns is quantized yet
                        values = _current(wt, errors, u, position[g * size : (g + 1) * size], start, sub, end, stop, k)
                        sides[g], quantize = opener(values, curvature[g * size : (g + 1) * size])
                        opened[g] = quantize
                column = wt[k]
                value = quantize(column, column=within[k]) if getattr(quantize, "positional", False) else quantize(column)
                if drop is not None:
                    value.masked_fill_(drop[k], 0.0)  # +0.0, as the codes decode
                err = errors[k - start]
                torch.sub(column, value, out=err).div_(diagonal[k])
                column.copy_(value)  # a done column is read no more: wt becomes the result, row by row
                if k + 1 < end:
                    wt[k + 1 : end].addr_(u[k, k + 1 : end], err, alpha=-1)
            if end < stop:
                wt[end:stop].addmm_(u[sub:end, end:stop].t(), errors[sub - start : end - start], alpha=-1)
        if stop < columns:
            wt[stop:].addmm_(u[start:stop, stop:].t(), errors[: stop - start], alpha=-1)
        loss.add_(errors[: stop - start].square().sum(0))
    del errors, u
    mask = ~(drop.index_select(0, position) if act_order else drop).t() if drop is not None else None
    side = _assemble(sides) if number_format is not None and number_format.group_quantizer is not None else None
    dead = dead[position]  # dead inputs carry no error
    row_baseline = torch.full((shape[0],), float("nan"), dtype=dtype)
    if baseline:  # before the result is written: ``into`` may be the weights themselves
        whole = torch.cat(parts) if len(parts) > 1 else parts[0]
        reference = whole.to(torch.float32)
        if sparsity is not None:
            reference = reference * lowest_mask(reference.abs(), sparsity)
        if number_format is not None:
            reference = apply_format(reference, number_format, params)
        row_baseline = _row_error(whole.to(dtype) - reference.to(dtype), hessian.detach().to(dtype))
    if probed:  # a value of the format as a whole, its error computed
        q = torch.empty(shape, dtype=dtype)
        q.t().index_copy_(0, order, wt)
        del wt
        q = apply_format(q.to(torch.float32), number_format, params).to(dtype)
        row_error = _row_error(torch.sub(torch.cat(parts).to(dtype), q).masked_fill_(dead, 0), hessian.detach().to(dtype))
        for target, rows in zip(into or [], slices):
            target.copy_(q[rows])
    else:  # row chunk by row chunk: its error, then its values in the weight's layout, in input order
        q = torch.empty(shape, dtype=dtype) if into is None else None
        for index, (part, rows) in enumerate(zip(parts, slices)):
            for start in range(0, part.shape[0], ROWS_AT_ONCE):  # no other buffer as large as the weight
                chunk = slice(rows.start + start, min(rows.start + start + ROWS_AT_ONCE, rows.stop))
                values = wt[:, chunk].index_select(0, position).t()
                diff = torch.sub(part[start : start + ROWS_AT_ONCE].to(dtype), values).masked_fill_(dead, 0)
                loss[chunk].sub_(diff.square().sum(1), alpha=lam)
                (q[chunk] if into is None else into[index][start : start + ROWS_AT_ONCE]).copy_(values)
        del wt
        row_error = loss
    return GPTQResult(weight=q.to(out_dtype) if into is None else None, side=side, row_error=row_error.to(torch.float64),
                      row_rtn_error=row_baseline, mask=mask)


def _row_slices(parts: list[Tensor]) -> list[slice]:
    """Where each of the stacked weights' rows lie."""
    starts = [0]
    for part in parts:
        starts.append(starts[-1] + part.shape[0])
    return [slice(a, b) for a, b in zip(starts, starts[1:])]


def _choose_in_block(drop: Tensor, wt: Tensor, u: Tensor, fraction: float, start: int, stop: int) -> None:
    """Unstructured SparseGPT: the block's columns (rows ``start:stop`` of ``wt``) lose their share of the
    pruned count, the weights of least saliency ``w² / U[i, i]²``; the shares add up to ``round(fraction · numel)``."""
    rows = wt.shape[1]
    count = round(fraction * rows * stop) - round(fraction * rows * start)
    saliency = wt[start:stop].square() / u.diagonal()[start:stop, None].square()
    drop[start:stop].view(-1)[saliency.flatten().argsort(stable=True)[:count]] = True


def _choose_n_of_m(drop: Tensor, values: Tensor, u: Tensor, n: int, k: int) -> None:
    """n:m SparseGPT: of the ``m`` columns from ``k`` (their current ``values``, ``[rows, m]``), each row loses the
    ``n`` of least saliency."""
    m = values.shape[1]
    saliency = values.square() / u.diagonal()[k : k + m].square()
    lowest = saliency.argsort(dim=1, stable=True)[:, :n]
    drop[k : k + m].t().scatter_(1, lowest, True)


def _current(wt: Tensor, errors: Tensor, u: Tensor, positions: Tensor, start: int, sub: int, end: int, stop: int,
             k: int) -> Tensor:
    """The current values (``[rows, len(positions)]``) of the columns at ``positions`` (all at or after ``k``):
    those in the sub-block are up to date, the block's later ones lack the sub-block's errors so far, the
    later blocks' lack the block's."""
    values = wt.index_select(0, positions)
    later = (positions >= end) & (positions < stop)
    if k > sub and bool(later.any()):
        values[later] -= u[sub:k][:, positions[later]].t() @ errors[sub - start : k - start]
    beyond = positions >= stop
    if k > start and bool(beyond.any()):
        values[beyond] -= u[start:k][:, positions[beyond]].t() @ errors[: k - start]
    return values.t()


def _assemble(sides: dict[int, dict | None]) -> dict[str, Tensor] | None:
    """The per-group shared values side by side, in group order (one group: as it is)."""
    groups = [sides[g] for g in sorted(sides)]
    if not groups or any(s is None for s in groups):
        return None
    if len(groups) == 1:
        return groups[0]
    return {key: torch.cat([s[key] for s in groups], dim=-1) for key in groups[0]}


def _row_error(diff: Tensor, h: Tensor) -> Tensor:
    return ((diff @ h) * diff).sum(1).to(torch.float64)
