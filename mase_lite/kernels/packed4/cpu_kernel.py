"""The native CPU path of packed 4-bit Linears (``packed4.c`` of the CPU kernel library, :mod:`mase_lite.kernels.cpu`).

For up to ``FUSED_MAX_ROWS`` rows of input (decoding: one token per sequence), :func:`linear` decodes each
weight inside the dot product, reading half a byte per weight; above, panels of W (about ``PANEL_BYTES``) are
decoded into a buffer and handed to torch's GEMM. Rows of W are split over up to ``torch.get_num_threads()``
threads (torch's own OpenMP team), or run on one where the timings of :mod:`mase_lite.numerics.native.threads`
say one is faster (a busy machine; the panel path then runs torch's GEMM on one thread too). Weights are exact;
the fused path's sums are float32 in the kernel's own order, never split over threads: the result equals the
float64 reference up to float32 accumulation, the same at any thread count (the panel path's sums are torch's
GEMM's, whose order may depend on its thread count).

The vector level is the library's (:func:`mase_lite.kernels.cpu.level`; ``torch`` for the reference). Functions
return None where the kernel does not apply (an input dtype it does not compute, a traced call, no compiled kernel):
the caller runs the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mase_lite.kernels.cpu import LEVELS, level
from mase_lite.kernels.cpu import library as _library
from mase_lite.numerics.native import threads
from mase_lite.numerics.native.launch import plain_cpu

FUSED_MAX_ROWS = 32
PANEL_BYTES = 8 << 20
PARALLEL_FROM_MACS = 1 << 18
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def linear(x: Tensor, nibbles: Tensor, scales: Tensor, table: Tensor, bias: Tensor | None) -> Tensor | None:
    """``x @ W.T + bias`` in ``x``'s dtype for packed 4-bit W; None where the kernel does not apply."""
    out_features, in_features = scales.shape[0], nibbles.shape[1] * 2
    rows = x.numel() // in_features if in_features else 0
    if not rows or x.dtype not in INPUT_DTYPES or not plain_cpu(x) or in_features % 32 or not _fits(scales):
        return None
    chosen = level()
    if chosen is None:
        return None
    lvl, lib = LEVELS.index(chosen), _library()
    x32 = x.reshape(rows, in_features).to(torch.float32).contiguous()
    bias32 = None if bias is None else bias.to(torch.float32).contiguous()
    if rows <= FUSED_MAX_ROWS:
        out, scratch = torch.empty(rows, out_features), torch.empty(rows, in_features)
        most = torch.get_num_threads() if rows * out_features * in_features >= PARALLEL_FROM_MACS else 1
        workers, probe = threads.begin(("packed4_fused", rows, out_features, in_features, lvl), most)
        lib.packed4_linear(x32.data_ptr(), rows, in_features, nibbles.data_ptr(), scales.data_ptr(), _half(scales),
                           table.data_ptr(), None if bias32 is None else bias32.data_ptr(), out.data_ptr(),
                           out_features, 0, out_features, lvl, workers if lib.openmp else 1, scratch.data_ptr())
        threads.end(probe)
    else:
        workers, probe = threads.begin(("packed4_panels", rows, out_features, in_features, lvl), torch.get_num_threads())
        with threads.torch_threads(workers):
            out = _panels(x32, nibbles, scales, table, bias32, lvl)
        threads.end(probe)
    out = out if x.dtype == torch.float32 else out.to(x.dtype)
    return out.view(*x.shape[:-1], out_features)


def _panels(x: Tensor, nibbles: Tensor, scales: Tensor, table: Tensor, bias: Tensor | None, lvl: int) -> Tensor:
    """``out.T`` one panel of rows of W at a time: the panel decoded, then ``panel @ x.T`` by torch's GEMM."""
    in_features, out_features = x.shape[1], scales.shape[0]
    panel_rows = min(out_features, max(8, PANEL_BYTES // (4 * in_features)))
    buffer = torch.empty(panel_rows, in_features)
    out_t = torch.empty(out_features, x.shape[0])
    for first in range(0, out_features, panel_rows):
        last = min(first + panel_rows, out_features)
        panel = buffer[: last - first]
        _dequantize_into(nibbles[first:last], scales[first:last], table, panel, lvl)
        if bias is None:
            torch.mm(panel, x.t(), out=out_t[first:last])
        else:
            torch.addmm(bias[first:last, None], panel, x.t(), out=out_t[first:last])
    return out_t.t().contiguous()


def dequantize(nibbles: Tensor, scales: Tensor, table: Tensor) -> Tensor | None:
    """The float32 weights, bit for bit ``table[nibble] * scale``; None where the kernel does not apply."""
    chosen = level()
    if chosen is None or not plain_cpu(nibbles) or not _fits(scales):
        return None
    out = torch.empty(scales.shape[0], nibbles.shape[1] * 2)
    _dequantize_into(nibbles, scales, table, out, LEVELS.index(chosen))
    return out


def _dequantize_into(nibbles: Tensor, scales: Tensor, table: Tensor, out: Tensor, lvl: int) -> None:
    lib = _library()
    workers = torch.get_num_threads() if out.numel() >= PARALLEL_FROM_MACS and lib.openmp else 1
    lib.packed4_dequantize(nibbles.data_ptr(), scales.data_ptr(), _half(scales), table.data_ptr(), out.shape[1],
                           out.shape[0], out.data_ptr(), lvl, workers)


def _fits(scales: Tensor) -> bool:
    """Whether the kernel takes these scales: float32, or float16 over at most 131072 inputs (a run of rows' float16
    scales is widened on its stack)."""
    return scales.dtype == torch.float32 or (scales.dtype == torch.float16 and scales.shape[1] * 32 <= 131072)


def _half(scales: Tensor) -> int:
    """The kernels' flag for float16 scales (else float32)."""
    return int(scales.dtype == torch.float16)
