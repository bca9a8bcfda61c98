"""The native CPU path of Linears with int8 activations (``int8_linear.c`` of the CPU kernel library,
:mod:`mase_lite.kernels.cpu`).

The input is quantized per block of 32 (:func:`quantize_activations`), each block of 32 products summed exactly
as integers (VNNI's ``vpdpbusd`` where the CPU has it, AVX2's ``vpmaddubsw`` otherwise) and the block sums
accumulated in float32 in the kernel's own order: the same bits at every level and thread count, within float32
accumulation of :func:`reference_nibbles` / :func:`reference_codes`, which state the product in torch. Weights:
packed 4-bit nibbles with a float32 or float16 scale per block and an integer table (:func:`linear_nibbles`), or 8-bit
codes with E8M0 scales (MXINT8) or float16 ones (GGUF's Q8_0) (:func:`linear_codes`). At batch 1 it reads the weights
from memory faster than the float kernels: fewer instructions per weight, none of them a float multiply per weight.

The vector level is the library's (:func:`mase_lite.kernels.cpu.level`: AVX-512 with VNNI, AVX2, plain C; ``torch``
for the reference). Functions return None where the kernel does not apply
(an input dtype it does not compute, a traced call, no compiled kernel): the caller runs the reference.
"""

from __future__ import annotations

import ctypes
import threading

import torch
from torch import Tensor

from mase_lite.kernels.cpu import level_index as _level
from mase_lite.kernels.cpu import library as _library
from mase_lite.numerics.native import threads
from mase_lite.numerics.native.launch import plain_cpu, scratch

BLOCK = 32
PARALLEL_FROM_MACS = 1 << 18
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def integer_table(table: Tensor) -> tuple[Tensor, float] | None:
    """The 16 table values as int8 integers times a power of two ``unit`` (Q4_0: -8..7 times 1; MXINT4: codes
    times 1/4; MXFP4: twice the E2M1 values times 1/2), or None where no unit down to 2**-8 makes them integers
    of at most 127 in magnitude.

    >>> values, unit = integer_table(torch.tensor([0.0, 0.5, 1.5, -6.0] * 4))
    >>> values[:4].tolist(), unit
    ([0, 1, 3, -12], 0.5)
    """
    for shift in range(9):
        scaled = table.double() * 2**shift
        if bool(torch.isfinite(scaled).all()) and torch.equal(scaled, scaled.round()) and float(scaled.abs().max()) <= 127:
            return scaled.to(torch.int8), 2.0**-shift
    return None


def _prepared(x: Tensor, in_features: int) -> tuple[int, int, Tensor] | None:
    """(level index, rows, x as contiguous float32 rows) where the kernel applies to ``x``; else None."""
    rows = x.numel() // in_features if in_features else 0
    if not rows or x.dtype not in INPUT_DTYPES or not plain_cpu(x) or in_features % BLOCK:
        return None
    chosen = _level()
    if chosen is None:
        return None
    flat = x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous()  # a decoding step's input as it is
    return chosen, rows, x if flat else x.reshape(rows, in_features).to(torch.float32).contiguous()


def _out(out: Tensor, x: Tensor) -> Tensor:
    if x.dim() == 2 and x.dtype == torch.float32:
        return out
    return (out if x.dtype == torch.float32 else out.to(x.dtype)).view(*x.shape[:-1], out.shape[1])


MAX_LAYERS = 8
_Pointers = ctypes.c_void_p * MAX_LAYERS
_Rows = ctypes.c_int64 * MAX_LAYERS
_local = threading.local()  # this thread's argument arrays


def _many(kind: str, x: Tensor, in_features: int, layers: list[tuple[Tensor, Tensor, Tensor | None]],
          launch, formats: tuple = ()) -> list[Tensor] | None:
    """Each layer's ``x @ W.T + bias`` (``layers``: weights (a row each), scales, bias; at most 8, all of
    ``in_features`` inputs) from one call: x quantized once, the layers' rows split over the threads together.
    ``formats``: what else sets the call's cost (its thread count is chosen per kernel, sizes and formats)."""
    prepared = _prepared(x, in_features)
    if prepared is None or len(layers) > MAX_LAYERS:
        return None
    lvl, rows, x32 = prepared
    lib = _library()
    sizes = [data.shape[0] for data, _, _ in layers]
    outs = [torch.empty(rows, n) for n in sizes]
    biases = [None if bias is None else bias.to(torch.float32).contiguous() for _, _, bias in layers]
    total = sum(sizes)
    most = torch.get_num_threads() if rows * total * in_features >= PARALLEL_FROM_MACS else 1
    workers, probe = threads.begin((kind, formats, rows, *sizes, in_features, lvl), most)
    arrays = getattr(_local, "arrays", None)
    if arrays is None:  # this thread's argument arrays, filled in place (building them costs microseconds)
        arrays = _local.arrays = (_Pointers(), _Pointers(), _Pointers(), _Pointers(), _Rows())
    weights, scale_ptrs, bias_ptrs, out_ptrs, counts = arrays
    for i, ((w, s, _), b, o) in enumerate(zip(layers, biases, outs)):
        weights[i], scale_ptrs[i], out_ptrs[i], counts[i] = w.data_ptr(), s.data_ptr(), o.data_ptr(), o.shape[1]
        bias_ptrs[i] = None if b is None else b.data_ptr()
    status = launch(lib, x32.data_ptr(), rows, len(layers), weights, scale_ptrs, bias_ptrs, out_ptrs, counts, lvl,
                    workers if lib.openmp else 1,
                    scratch(lib.int8_scratch_bytes(rows, in_features, int(kind == "int8_kquants"))).data_ptr())
    threads.end(probe)
    return None if status else [_out(o, x) for o in outs]


def linear_nibbles(x: Tensor, nibbles: Tensor, scales: Tensor, itable: Tensor, unit: float,
                   bias: Tensor | None, tiled: bool = False) -> Tensor | None:
    """``x @ W.T + bias`` for packed 4-bit W (``nibbles`` ``[out, in / 2]``, float32 or float16 ``scales``
    ``[out, in / 32]``, ``itable`` the 16 integers a nibble stands for, times ``unit``), ``x`` quantized to int8; in
    ``x``'s dtype. ``tiled``: the nibbles and scales in :func:`tile`'s order. None where the kernel does not apply."""
    out = linear_nibbles_many(x, [(nibbles, scales, bias)], itable, unit, tiled)
    return None if out is None else out[0]


def linear_nibbles_many(x: Tensor, layers: list[tuple[Tensor, Tensor, Tensor | None]], itable: Tensor,
                        unit: float, tiled: bool = False) -> list[Tensor] | None:
    """:func:`linear_nibbles` of layers that share ``x`` and their table, in one call (``layers``: nibbles, scales,
    bias; at most 8)."""
    in_features = layers[0][0].shape[1] * 2
    half = layers[0][1].dtype == torch.float16
    if any(scales.dtype != layers[0][1].dtype for _, scales, _ in layers):
        return None

    def launch(lib, x, rows, count, q, scales, bias, out, n, lvl, workers, scratch):
        return lib.int8_linear_nibbles(x, rows, in_features, count, q, scales, int(half), bias, out, n,
                                       itable.data_ptr(), unit, int(tiled), lvl, workers, scratch)
    return _many("int8_nibbles", x, in_features, layers, launch, (half, tiled))


def linear_codes(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, tiled: bool = False) -> Tensor | None:
    """``x @ W.T + bias`` for 8-bit W (int8 ``codes`` ``[out, in]`` in -127..127, ``scales`` ``[out, in / 32]``:
    MXINT8's E8M0 exponents, uint8, or GGUF Q8_0's float16 ``d``; ``tiled``: in :func:`tile`'s order), ``x``
    quantized to int8; in ``x``'s dtype. None where the kernel does not apply."""
    out = linear_codes_many(x, [(codes, scales, bias)], tiled)
    return None if out is None else out[0]


def linear_codes_many(x: Tensor, layers: list[tuple[Tensor, Tensor, Tensor | None]],
                      tiled: bool = False) -> list[Tensor] | None:
    """:func:`linear_codes` of layers that share ``x`` and their scales' dtype, in one call (``layers``: codes, scales,
    bias; at most 8)."""
    half = layers[0][1].dtype == torch.float16
    if any(scales.dtype != layers[0][1].dtype for _, scales, _ in layers):
        return None

    def launch(lib, x, rows, count, q, scales, bias, out, n, lvl, workers, scratch):
        return lib.int8_linear_codes(x, rows, layers[0][0].shape[1], count, q, scales, int(half), bias, out, n,
                                     int(tiled), lvl, workers, scratch)
    return _many("int8_codes", x, layers[0][0].shape[1], layers, launch, (half, tiled))


KQUANT_KINDS = {"q2_k": (4, 84), "q3_k": (5, 114), "q4_k": (1, 148), "q5_k": (3, 180), "q6_k": (2, 210)}
"""The K-quants the kernels take (``kquant_dot.h``): their kind number there and the bytes of a record (256 weights)."""
SUPER = 256
_Kinds = ctypes.c_int * MAX_LAYERS


def linear_kquants_many(x: Tensor, layers: list[tuple[Tensor, str, Tensor | None]],
                        tiled: bool = False) -> list[Tensor] | None:
    """Each layer's ``x @ W.T + bias`` for K-quant W (``layers``: records ``[out, in / 256 * bytes]`` in
    ``kquant_dot.h``'s layout, the format's name in :data:`KQUANT_KINDS`, bias; at most 8, ``in`` a multiple of 256;
    ``tiled``: every layer's records paired, ``kernels/kquants/records.py``), ``x``
    quantized to int8 per super-block of 256 (:func:`quantize_activations`, as llama.cpp's Q8_K), from one call; in
    ``x``'s dtype. None where the kernel does not apply."""
    if len(layers) > MAX_LAYERS:
        return None
    first, name = layers[0][0], layers[0][1]
    k = first.shape[1] // KQUANT_KINDS[name][1] * SUPER
    kinds = _Kinds(*(KQUANT_KINDS[name][0] for _, name, _ in layers))

    def launch(lib, x, rows, count, q, scales, bias, out, n, lvl, workers, scratch):
        return lib.int8_linear_kquants(x, rows, k, count, q, kinds, bias, out, n, int(tiled), lvl, workers, scratch)
    return _many("int8_kquants", x, k, [(data, data, bias) for data, _, bias in layers], launch,
                 tuple(name for _, name, _ in layers))


TILE_ROWS = 8


def tile(data: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """Weights (nibbles ``[out, in / 2]`` or codes ``[out, in]``) and their block scales (``[out, in / 32]``) in the
    kernel's tiled order, the same shapes: tiles of 8 rows (``out`` a multiple of 8), a tile's blocks in turn, each
    block's bytes as vectors of 32 (vector t: bytes 4t..4t+3 of each of the 8 rows' block), its 8 scales together. A
    decoding step then reads a tile in one stream and sums no vector across its lanes; :func:`untile` undoes it.

    >>> codes, scales = torch.arange(8 * 32, dtype=torch.int32).to(torch.int8).view(8, 32), torch.arange(8).view(8, 1)
    >>> tiled, tiled_scales = tile(codes, scales)
    >>> tiled[0, :8].tolist(), tiled_scales.flatten().tolist()
    ([0, 1, 2, 3, 32, 33, 34, 35], [0, 1, 2, 3, 4, 5, 6, 7])
    >>> all(torch.equal(a, b) for a, b in zip(untile(tiled, tiled_scales), (codes, scales)))
    True
    """
    rows, row_bytes = data.shape
    blocks = scales.shape[1]
    grouped = data.reshape(rows // TILE_ROWS, TILE_ROWS, blocks, row_bytes // blocks // 4, 4).permute(0, 2, 3, 1, 4)
    return (grouped.contiguous().view(rows, row_bytes),
            scales.reshape(rows // TILE_ROWS, TILE_ROWS, blocks).permute(0, 2, 1).contiguous().view(rows, blocks))


def untile(data: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """The weights and scales of :func:`tile`'s order back in rows."""
    rows, row_bytes = data.shape
    blocks = scales.shape[1]
    grouped = data.reshape(rows // TILE_ROWS, blocks, row_bytes // blocks // 4, TILE_ROWS, 4).permute(0, 3, 1, 2, 4)
    return (grouped.contiguous().view(rows, row_bytes),
            scales.reshape(rows // TILE_ROWS, blocks, TILE_ROWS).permute(0, 2, 1).contiguous().view(rows, blocks))


def quantize_activations(x: Tensor, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """``x`` (``[rows, in]``, float32) as the int8 codes (-127..127) and float32 scales of each block of ``block``
    (32; the K-quants' 256, :data:`SUPER`), as the kernel forms them: ``amax / 127`` and
    round-half-even(``x * (127 / amax)``), zero for an all-zero block and for one whose ``127 / amax`` overflows
    float32 (``amax`` below ``127 / FLT_MAX``); a block holding an infinity or a NaN has codes 0 and scale NaN (the
    outputs it reaches are NaN).

    >>> codes, scales = quantize_activations(torch.tensor([[127.0, 2.5, -0.5] + [0.0] * 29]))
    >>> codes[0, :3].tolist(), scales.tolist()
    ([127, 2, 0], [[1.0]])
    """
    blocks = x.reshape(x.shape[0], -1, block)
    finite = blocks.isfinite().all(-1, keepdim=True)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(finite & (amax > 0), 127 / amax, torch.zeros_like(amax))
    inverse = torch.where(inverse.isfinite(), inverse, 0)
    codes = torch.round(torch.where(finite, blocks, 0) * inverse).to(torch.int8)
    return codes.reshape(x.shape), torch.where(finite, amax / 127, float("nan")).squeeze(-1)


def _reference(x: Tensor, weights: Tensor, block_scales: Tensor, bias: Tensor | None) -> Tensor:
    """Exact integer block sums of ``x``'s codes and the integer ``weights``, combined in float64."""
    out_features, in_features = weights.shape
    rows = x.numel() // in_features
    codes, xs = quantize_activations(x.reshape(rows, in_features).to(torch.float32))
    sums = torch.einsum("rbt,obt->rob", codes.reshape(rows, -1, BLOCK).long(),
                        weights.reshape(out_features, -1, BLOCK).long())
    out = (sums.double() * xs.double()[:, None, :] * block_scales[None]).sum(-1)
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype).view(*x.shape[:-1], out_features)


def unpacked(nibbles: Tensor, table: Tensor) -> Tensor:
    """``table[nibble]`` of each weight (``[out, in]``; the low nibble is the even element)."""
    return table[torch.stack([nibbles & 15, nibbles >> 4], -1).reshape(nibbles.shape[0], -1).long()]


def reference_nibbles(x: Tensor, nibbles: Tensor, scales: Tensor, itable: Tensor, unit: float,
                      bias: Tensor | None) -> Tensor:
    """The torch reference of :func:`linear_nibbles`, in ``x``'s dtype (float64 for the exact sums)."""
    return _reference(x, unpacked(nibbles, itable), scales.double() * unit, bias)


def reference_codes(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor:
    """The torch reference of :func:`linear_codes`, in ``x``'s dtype."""
    if scales.dtype == torch.float16:  # GGUF's Q8_0: code * d
        return _reference(x, codes, scales.double(), bias)
    block_scales = torch.where(scales == 255, float("nan"), torch.ldexp(torch.ones_like(scales, dtype=torch.float64),
                                                                         scales.to(torch.int64) - 127 - 6))
    return _reference(x, codes, block_scales, bias)
