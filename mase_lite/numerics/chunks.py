"""Quantizer passes run over one cache-sized chunk of a tensor at a time.

This is how the formats' torch implementations run: everywhere the native kernels
(:mod:`mase_lite.numerics.native`) do not apply, and as their reference. A quantizer makes
several elementwise passes (scale, round, clamp, scale back). Over a whole large tensor every pass
streams it through memory; over a chunk the passes after the first find it in cache. On CPU a
chunk holds fewer elements than torch's grain for parallel elementwise work (32768), so each pass
runs in the calling thread without waking (and waiting for) a thread team; other devices take the
tensor whole. Blocks run along the last dimension, so chunks of whole rows are independent, and
elementwise formats have no blocks at all: the result is the same, bit for bit, whatever the
chunk size. Memory: the
result, per-block values, chunk-sized temporaries (and a contiguous copy of a non-contiguous input).
The result is allocated by :func:`~mase_lite.numerics.memory.empty_like_advised` (huge pages).

Block formats work on groups of rows in two sweeps: :func:`map_blocks` reads the group's block
maxima chunk by chunk, the format derives its per-block values (shared exponents, bounds) from them
(a group has few enough blocks for these to run in the calling thread too), and a kernel writes
each chunk with the matching rows of those values.

Example::

    y = map_elements(x, lambda chunk, out: torch.mul(chunk, 2.0, out=out))   # x * 2
    y = map_blocks(x, 32, lambda amax: (kernel, scale_of(amax)))  # kernel(blocks, out, scale_rows)
"""

from __future__ import annotations

import math
import sys
from typing import Callable, Iterator

import torch
from torch import Tensor

from mase_lite.numerics.blocks import amax_and_non_finite
from mase_lite.numerics.memory import empty_like_advised
from mase_lite.numerics.native.block_kernel import BlockGrid, fake_quantize

CHUNK_ELEMENTS = 32767
"""Elements per chunk: below torch's parallel grain, and with a temporary or two within a core's L2."""


def map_elements(x: Tensor, kernel: Callable[[Tensor, Tensor], object]) -> Tensor:
    """A new tensor shaped like ``x``, written by ``kernel(chunk, out)`` on flat chunks of ``x``.

    >>> map_elements(torch.arange(4.0), lambda c, out: torch.mul(c, 2.0, out=out)).tolist()
    [0.0, 2.0, 4.0, 6.0]
    """
    flat = x.contiguous().view(-1)
    out = empty_like_advised(flat)
    size = _chunk_elements(flat)
    for start in range(0, flat.numel(), size):
        kernel(flat[start:start + size], out[start:start + size])
    return out.view(x.shape)


def map_blocks(x: Tensor, block_size: int, prepare: Callable[[Tensor], tuple], grid: BlockGrid | None = None) -> Tensor:
    """A new tensor shaped like ``x``, computed block-wise in groups of rows, chunk by chunk.

    For each group of rows (at most :data:`CHUNK_ELEMENTS` blocks) the blocks' largest magnitudes
    are read chunk by chunk; ``prepare(amax)`` (``amax``: ``(rows, n_blocks, 1)``, NaN or Inf for
    a block holding one) returns ``(kernel, *per_block)``, per-block tensors of the same shape; then
    ``kernel(blocks, out, *rows_of_per_block)`` writes every chunk (``(rows, n_blocks, block_size)``,
    each row zero-padded on its own; the padding is dropped from the result). Blocks holding NaN or
    Inf are NaN throughout (the MX rule), whatever the kernel wrote. Where ``grid`` describes the
    same format to the native kernel and it applies, the kernel's result (the same bits) is returned.

    >>> x = torch.tensor([[1.0, 3.0, 2.0]])
    >>> divide = lambda b, out, m: torch.div(b, m, out=out)
    >>> map_blocks(x, 2, lambda amax: (divide, amax)).tolist()
    [[0.3333333432674408, 1.0, 1.0]]
    """
    native = fake_quantize(x, grid, block_size) if grid is not None else None
    if native is not None:
        return native
    rows = _rows(x)
    out = empty_like_advised(rows)
    if not rows.numel():
        return out.view(x.shape)
    n_blocks = -(-rows.shape[1] // block_size)
    step = _rows_per_chunk(rows, block_size)
    group = max(1, _chunk_elements(rows) // n_blocks // step) * step
    for start in range(0, len(rows), group):
        src, dst = rows[start:start + group], out[start:start + group]
        amax = _group_maxima(src, block_size)
        non_finite = amax.isfinite().logical_not_()
        any_non_finite = bool(non_finite.any())
        kernel, *per_block = prepare(amax)
        for part, blocks, out_blocks in _row_chunks(src, block_size, dst):
            kernel(blocks, out_blocks, *(t[part] for t in per_block))
            if any_non_finite:
                out_blocks.masked_fill_(non_finite[part], torch.nan)
    return out.view(x.shape)


def _group_maxima(rows: Tensor, block_size: int) -> Tensor:
    """The largest magnitude of each block of ``rows`` (``(rows, n_blocks, 1)``); NaN/Inf for a non-finite block."""
    amax = rows.new_empty(len(rows), -(-rows.shape[1] // block_size), 1)
    if rows.dtype != torch.float32:
        for part, blocks, _ in _row_chunks(rows, block_size, None):
            high, non_finite = amax_and_non_finite(blocks)
            amax[part] = high.masked_fill_(non_finite, torch.nan)
        return amax
    # clearing the sign bit orders float32 magnitudes as integers, NaN and Inf above every finite value
    bits = amax.view(torch.int32)
    for part, blocks, _ in _row_chunks(rows, block_size, None):
        torch.amax(torch.bitwise_and(blocks.view(torch.int32), 0x7FFFFFFF), dim=-1, keepdim=True, out=bits[part])
    return amax


def _chunk_elements(t: Tensor) -> int:
    """:data:`CHUNK_ELEMENTS` on CPU; other devices (one kernel launch per operation) take the tensor whole."""
    return CHUNK_ELEMENTS if t.device.type == "cpu" else sys.maxsize


def _rows_per_chunk(rows: Tensor, block_size: int) -> int:
    return max(1, _chunk_elements(rows) // (-(-rows.shape[1] // block_size) * block_size))


def _rows(x: Tensor) -> Tensor:
    return x.contiguous().view(math.prod(_row_shape(x)), x.shape[-1] if x.dim() else 1)


def _row_shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape[:-1]) if x.dim() else (1,)


def _row_chunks(rows: Tensor, block_size: int, out: Tensor | None) -> Iterator[tuple[slice, Tensor, Tensor | None]]:
    """``(rows slice, input blocks, output blocks)`` per chunk of whole rows; output blocks of padded
    rows are scratch, copied into ``out`` (without the padding) once the consumer has written them."""
    length = rows.shape[1]
    if not rows.numel():
        return
    n_blocks = -(-length // block_size)
    width = n_blocks * block_size
    step = _rows_per_chunk(rows, block_size)
    padded = width != length
    if padded:
        padded_in = rows.new_zeros(min(step, len(rows)), width)
        padded_out = torch.empty_like(padded_in)
    for start in range(0, len(rows), step):
        src = rows[start:start + step]
        count = len(src)
        part = slice(start, start + count)
        if not padded:
            dst = out[part].view(count, n_blocks, block_size) if out is not None else None
            yield part, src.view(count, n_blocks, block_size), dst
            continue
        padded_in[:count, :length] = src
        yield part, padded_in[:count].view(count, n_blocks, block_size), padded_out[:count].view(count, n_blocks, block_size)
        if out is not None:
            out[part] = padded_out[:count, :length]
