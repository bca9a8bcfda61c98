"""The native CPU path of the MXINT8 ops (``mxint8.c`` of the CPU kernel library, :mod:`mase_lite.kernels.cpu`).

For a few rows of input (up to ``FUSED_MAX_ROWS``), :func:`linear` decodes each weight inside the dot
product (reads one byte per weight instead of four, never materialises the float weight). From
``GEMM_FROM_ROWS`` rows the layer is compute-bound: with AVX-512 the kernel's own GEMM decodes each
weight into the core's caches just before it multiplies; elsewhere (and for bfloat16 input) panels of
W, about ``PANEL_BYTES`` each, are dequantized into a buffer kept per calling thread and handed to
torch's GEMM. Rows of W are split over up to ``torch.get_num_threads()`` threads: torch's own OpenMP team
where the kernel was built with OpenMP, else Python threads (ctypes lets go of the GIL); the fused kernel, the
GEMM and the panel path (torch's GEMM included) run each kind of call on one thread or on all, whichever its
timings say is faster (:mod:`mase_lite.numerics.native.threads`: on a busy machine, often one). Weights are
exact (see ``mxint8.c``); sums are float32 sums in the kernel's own order, so the result equals
the float64 reference up to float32 accumulation error (the tolerance the tests hold it to is in
``tests/kernels/mxint8_cases.py``). The fused kernel and the kernel's GEMM never split a dot product,
so they give the same bits at any thread count; the panel path's sums are in the order of torch's
GEMM, which may change with the thread count (it does on AMD EPYC).

The vector level is the library's (:func:`mase_lite.kernels.cpu.level`: the best this CPU runs, or the one
``MASE_LITE_CPU_KERNELS`` forces; ``torch`` for the torch reference). Functions return None where
the kernel does not apply (an input dtype it does not compute, a traced or mode-wrapped call, no
compiled kernel) and the caller runs the torch reference.

>>> import torch
>>> from mase_lite.kernels.mxint8.codec import quantize
>>> codes, scales = quantize(torch.ones(4, 64))
>>> y = linear(torch.ones(2, 64), codes, scales, None, 32)
>>> y is None or y.tolist() == [[64.0] * 4] * 2
True
"""

from __future__ import annotations

import torch
from torch import Tensor

from mase_lite.kernels.cpu import LEVELS, level
from mase_lite.kernels.cpu import library as _library
from mase_lite.numerics.native import threads
from mase_lite.numerics.native.launch import plain_cpu, run_split, scratch

FUSED_MAX_ROWS = 32
"""Input rows up to which the fused kernel runs; above, dequantized panels go to torch's GEMM."""
GEMM_FROM_ROWS = 14
"""Input rows from which the kernel's own GEMM runs where it applies (AVX-512, float32 or float16 input,
blocks of a multiple of 16 that tile a row): it overtakes the fused kernel between 12 and 16 rows
(4096 x 4096, benchmarks/RESULTS.md)."""
PANEL_BYTES = 8 << 20
"""Bytes of one dequantized panel of W: it stays in the last-level cache while the GEMM reads it.
Smaller panels cost more: torch's GEMM packs the input again for every panel (measured in
benchmarks/RESULTS.md, MXINT8 on CPU)."""
PARALLEL_FROM_MACS = 1 << 18
"""Smaller products run in the calling thread (a hand-off costs more than it saves)."""
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ALIGN = 8  # thread bounds on multiples of the kernel's widest tile of rows of W


applies = plain_cpu  # whether the kernel may compute on a tensor (see launch.plain_cpu)


def linear(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int) -> Tensor | None:
    """``x @ W.T + bias`` in ``x``'s dtype, W = MXINT8 ``codes`` and ``scales``; None where it does not apply."""
    out_features, in_features = codes.shape
    rows = x.numel() // in_features if in_features else 0
    if not rows or not out_features or x.dtype not in INPUT_DTYPES or not applies(x):
        return None
    chosen = level()
    if chosen is None:
        return None
    x_rows = x if x.dim() == 2 else x.reshape(rows, in_features)
    codes, scales = codes.contiguous(), scales.contiguous()
    out = None
    if rows >= GEMM_FROM_ROWS and x.dtype != torch.bfloat16 and chosen == "avx512":
        out = _gemm(x_rows, codes, scales, bias, block_size)
    if out is None and rows <= FUSED_MAX_ROWS:
        out = _fused(x_rows, codes, scales, bias, block_size, LEVELS.index(chosen))
    if out is None:
        lvl = LEVELS.index(chosen)
        workers, probe = threads.begin(("mxint8_panels", rows, out_features, in_features, lvl, x.dtype),
                                       torch.get_num_threads())
        with threads.torch_threads(workers):
            out = _panels(x_rows, codes, scales, bias, block_size, lvl)
        threads.end(probe)
    if x.dtype != torch.float32:
        out = out.to(x.dtype)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out_features)


def dequantize(codes: Tensor, scales: Tensor, block_size: int, dtype: torch.dtype) -> Tensor | None:
    """The float32 or bfloat16 weights, bit for bit the reference decoder's; None where it does not apply."""
    if dtype not in (torch.float32, torch.bfloat16) or codes.dim() < 1 or not codes.numel() or not applies(codes):
        return None
    chosen = level()
    if chosen is None:
        return None
    length = codes.shape[-1]
    codes, scales = codes.contiguous(), scales.contiguous()
    out = torch.empty(codes.shape, dtype=dtype)
    _dequantize_into(codes.reshape(-1, length), scales.reshape(codes.numel() // length, -1), block_size,
                     out.reshape(-1, length), LEVELS.index(chosen), torch.get_num_threads())
    return out


def quantize(w: Tensor, block_size: int, scale_rule: str) -> tuple[Tensor, Tensor] | None:
    """MXINT8 codes and scales of float32 ``w`` (rule ``floor``), bit for bit the torch encoder's; None
    where the kernel does not apply (another rule or dtype, no kernel, ``MASE_LITE_CPU_KERNELS=torch``)."""
    if (scale_rule != "floor" or type(block_size) is not int or block_size < 1 or w.dtype != torch.float32
            or w.dim() < 1 or not w.numel() or not applies(w) or level() is None):
        return None
    length = w.shape[-1]
    rows = w.numel() // length
    src = w.detach().contiguous()
    codes = torch.empty(w.shape, dtype=torch.int8)
    scales = torch.empty(*w.shape[:-1], -(-length // block_size), dtype=torch.uint8)
    kernel, blocks = _library().mxint8_quantize_rows, scales.shape[-1]

    def run(first: int, last: int) -> None:
        kernel(src.data_ptr() + first * length * 4, length, block_size, last - first,
               codes.data_ptr() + first * length, scales.data_ptr() + first * blocks)

    run_split(run, rows, torch.get_num_threads() if w.numel() >= PARALLEL_FROM_MACS else 1)
    return codes, scales


def _fused(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int, lvl: int) -> Tensor:
    rows, in_features = x.shape
    out_features = codes.shape[0]
    x32 = x.to(torch.float32).contiguous()
    bias32 = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(rows, out_features)
    args = (x32.data_ptr(), rows, in_features, codes.data_ptr(), scales.data_ptr(), block_size,
            None if bias32 is None else bias32.data_ptr(), out.data_ptr(), out_features)
    kernel = _library().mxint8_linear_rows
    most = torch.get_num_threads() if rows * out_features * in_features >= PARALLEL_FROM_MACS else 1
    workers, probe = threads.begin(("mxint8_fused", rows, out_features, in_features, lvl), most)
    _parallel(lambda first, last, count: kernel(*args, first, last, lvl, count), out_features, workers)
    threads.end(probe)
    return out


def _gemm(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int) -> Tensor | None:
    """``x @ W.T + bias`` in float32 by the kernel's own GEMM (AVX-512, blocks of a multiple of 16 that tile
    a row), which decodes each weight once into the core's caches; None where it does not apply."""
    rows, in_features = x.shape
    out_features = codes.shape[0]
    lib = _library()
    workers, probe = threads.begin(("mxint8_gemm", 1 << (rows - 1).bit_length(), out_features, in_features),
                                   torch.get_num_threads())
    packed_floats = -(-rows // 64) * 64 * in_features  # x^T in tiles of 64 rows, packed by the kernel
    buffer = scratch(4 * (packed_floats + workers * lib.mxint8_gemm_buffer(in_features, block_size)))
    buffer = buffer.view(torch.float32)
    x32 = x.to(torch.float32).contiguous()
    bias32 = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(rows, out_features)
    status = lib.mxint8_gemm(x32.data_ptr(), rows, in_features, codes.data_ptr(), scales.data_ptr(), block_size,
                             None if bias32 is None else bias32.data_ptr(), out.data_ptr(), out_features,
                             buffer.data_ptr(), buffer[packed_floats:].data_ptr(), workers)
    threads.end(probe)
    return out if status == 0 else None


def _panels(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int, lvl: int) -> Tensor:
    """``out.T`` one panel of rows of W at a time: dequantize the panel, then ``panel @ x.T`` by torch's GEMM."""
    rows, in_features = x.shape
    out_features = codes.shape[0]
    dtype = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32  # float16 computes in float32
    x = x.to(dtype).contiguous()  # one layout into torch's GEMM: a strided x may take another BLAS path
    panel_rows = min(out_features, max(_ALIGN, PANEL_BYTES // (in_features * x.element_size())))
    buffer = scratch(panel_rows * in_features * x.element_size()).view(dtype).view(panel_rows, in_features)
    out_t = torch.empty(out_features, rows, dtype=dtype)
    bias = None if bias is None else bias.to(dtype)
    for first in range(0, out_features, panel_rows):
        last = min(first + panel_rows, out_features)
        panel = buffer[: last - first]
        _dequantize_into(codes[first:last], scales[first:last], block_size, panel, lvl, torch.get_num_threads())
        if bias is None:
            torch.mm(panel, x.t(), out=out_t[first:last])
        else:
            torch.addmm(bias[first:last, None], panel, x.t(), out=out_t[first:last])
    return out_t.t().contiguous()  # the strides the fake kernel promises


def _dequantize_into(codes: Tensor, scales: Tensor, block_size: int, out: Tensor, lvl: int, workers: int) -> None:
    """Rows of contiguous ``codes`` decoded into the contiguous float32/bfloat16 rows of ``out``."""
    rows, length = codes.shape
    kernel, bf16 = _library().mxint8_dequantize_rows, int(out.dtype == torch.bfloat16)
    blocks, row_bytes = scales.shape[1], out.element_size() * length

    def run(first: int, last: int, threads: int) -> None:
        kernel(codes.data_ptr() + first * length, scales.data_ptr() + first * blocks, length, block_size,
               last - first, out.data_ptr() + first * row_bytes, bf16, lvl, threads)

    _parallel(run, rows, workers if codes.numel() >= PARALLEL_FROM_MACS else 1)


def _parallel(call, rows: int, workers: int) -> None:
    """``call(first, last, threads)`` over ``rows``: one call on ``workers`` of torch's OpenMP threads where
    the kernel was built with OpenMP, else runs of rows on Python threads (ctypes lets go of the GIL)."""
    if workers == 1 or _library().openmp:
        call(0, rows, workers)
    else:
        run_split(lambda first, last: call(first, last, 1), rows, workers, _ALIGN)
