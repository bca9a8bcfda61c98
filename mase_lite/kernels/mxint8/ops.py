"""Torch custom ops ``mase_lite::mxint8_dequantize`` and ``mase_lite::mxint8_linear``.

Each op has a CPU kernel (the native ``mxint8.c`` of :mod:`mase_lite.kernels.cpu` through :mod:`~mase_lite.kernels.mxint8.cpu_kernel`,
or the torch reference where that does not apply), a CUDA kernel (the JIT-built ``mxint8_kernels.cu``,
or the same torch code on the GPU where it cannot be built) and a fake kernel, so both ops trace
under ``torch.export`` and ``torch.compile`` as single nodes: traced code holds the op, and the
native code runs only when the op is called on real tensors.

CUDA strategy for the linear: up to ``GEMV_MAX_ROWS`` rows of input, a GEMV kernel dequantizes
inside the dot product and never materialises the float weight; above that the layer is
compute-bound, so the weight is dequantized (exactly) into a temporary of the input's dtype and
multiplied by cuBLAS through ``F.linear``. The temporary lives for one call: the persistent
saving of the packed weight is kept, and cuBLAS tensor cores beat a hand-written fused GEMM.

Example::

    >>> import torch
    >>> from mase_lite.kernels.mxint8 import mxint8_linear, quantize
    >>> codes, scales = quantize(torch.ones(4, 64))
    >>> mxint8_linear(torch.ones(2, 64), codes, scales).tolist()
    [[64.0, 64.0, 64.0, 64.0], [64.0, 64.0, 64.0, 64.0]]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mase_lite.infra.errors import UserError
import mase_lite.kernels.mxint8.cpu_kernel as cpu_kernel
from mase_lite.kernels.mxint8.codec import DEFAULT_BLOCK_SIZE, dequantize_reference
from mase_lite.kernels.mxint8.cuda_build import cuda_extension
from mase_lite.numerics.mx import check_decode_args

GEMV_MAX_ROWS = 16
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

__all__ = ["GEMV_MAX_ROWS", "dequantize", "mxint8_linear"]


def dequantize(codes: Tensor, scales: Tensor, block_size: int = DEFAULT_BLOCK_SIZE,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """MXINT8 codes and E8M0 scales back to ``dtype`` values, via ``mase_lite::mxint8_dequantize``."""
    return torch.ops.mase_lite.mxint8_dequantize(codes, scales, block_size, dtype)


def mxint8_linear(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None = None,
                  block_size: int = DEFAULT_BLOCK_SIZE) -> Tensor:
    """``x @ dequantize(codes, scales).T + bias`` in ``x``'s dtype, via ``mase_lite::mxint8_linear``.

    Differentiable in ``x`` and ``bias``; the packed weight is frozen. An eager call on plain CPU
    tensors that autograd does not track runs the op's CPU kernel directly: the same result without
    the dispatcher's tens of microseconds, which a batch-1 layer of a few megabytes would feel.
    """
    if (cpu_kernel.applies(x) and not torch._C._functorch.is_functorch_wrapped_tensor(x)
            and not (torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)))):
        _check_linear_args(x, codes, scales, bias, block_size)
        native = cpu_kernel.linear(x, codes, scales, bias, block_size)
        if native is not None:
            return native
    return torch.ops.mase_lite.mxint8_linear(x, codes, scales, bias, block_size)


@torch.library.custom_op("mase_lite::mxint8_dequantize", mutates_args=(), device_types="cpu")
def _dequantize_op(codes: Tensor, scales: Tensor, block_size: int, dtype: torch.dtype) -> Tensor:
    check_decode_args(codes, scales, block_size, dtype)
    native = cpu_kernel.dequantize(codes, scales, block_size, dtype)
    return dequantize_reference(codes, scales, block_size, dtype) if native is None else native


@_dequantize_op.register_kernel("cuda")
def _dequantize_cuda(codes: Tensor, scales: Tensor, block_size: int, dtype: torch.dtype) -> Tensor:
    check_decode_args(codes, scales, block_size, dtype)
    extension = cuda_extension()
    if extension is None or dtype not in KERNEL_DTYPES:
        return dequantize_reference(codes, scales, block_size, dtype)
    codes, scales = codes.contiguous(), scales.contiguous()
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    with torch.cuda.device(codes.device):
        extension.dequantize(codes, scales, out, block_size, torch.cuda.current_stream().cuda_stream)
    return out


@_dequantize_op.register_fake
def _dequantize_fake(codes: Tensor, scales: Tensor, block_size: int, dtype: torch.dtype) -> Tensor:
    check_decode_args(codes, scales, block_size, dtype)
    return codes.new_empty(codes.shape, dtype=dtype)


@torch.library.custom_op("mase_lite::mxint8_linear", mutates_args=(), device_types="cpu")
def _linear_op(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int) -> Tensor:
    _check_linear_args(x, codes, scales, bias, block_size)
    native = cpu_kernel.linear(x, codes, scales, bias, block_size)
    return F.linear(x, dequantize_reference(codes, scales, block_size, x.dtype), bias) if native is None else native


@_linear_op.register_kernel("cuda")
def _linear_cuda(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int) -> Tensor:
    _check_linear_args(x, codes, scales, bias, block_size)
    out_features, in_features = codes.shape
    x_rows = x.reshape(x.numel() // in_features if in_features else 0, in_features).contiguous()
    codes = codes.contiguous()
    extension = cuda_extension()
    if extension is None or not _gemv_fits(x_rows, codes, block_size):
        return F.linear(x, _dequantize_cuda(codes, scales, block_size, x.dtype), bias)
    out = torch.empty((x_rows.shape[0], out_features), dtype=x.dtype, device=x.device)
    with torch.cuda.device(x.device):
        extension.linear_gemv(x_rows, codes, scales.contiguous(), None if bias is None else bias.contiguous(), out,
                              torch.cuda.current_stream().cuda_stream)
    return out.reshape(*x.shape[:-1], out_features)


def _gemv_fits(x_rows: Tensor, codes: Tensor, block_size: int) -> bool:
    """Whether the small-batch kernel takes the call: <= 16 rows, block size 32, 16-byte aligned rows."""
    return (x_rows.dtype in KERNEL_DTYPES and block_size == 32 and codes.shape[1] % 32 == 0
            and 0 < x_rows.shape[0] <= GEMV_MAX_ROWS and x_rows.data_ptr() % 16 == 0 and codes.data_ptr() % 16 == 0)


@_linear_op.register_fake
def _linear_fake(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int) -> Tensor:
    _check_linear_args(x, codes, scales, bias, block_size)
    return x.new_empty((*x.shape[:-1], codes.shape[0]))


def _linear_setup_context(ctx, inputs, output) -> None:
    _, codes, scales, bias, block_size = inputs
    ctx.save_for_backward(codes, scales)
    ctx.block_size = block_size
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad_output: Tensor):
    codes, scales = ctx.saved_tensors
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0]:
        weight = torch.ops.mase_lite.mxint8_dequantize(codes, scales, ctx.block_size, grad_output.dtype)
        grad_x = grad_output @ weight
    if ctx.has_bias and ctx.needs_input_grad[3]:
        grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
    return grad_x, None, None, grad_bias, None


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup_context)


def _check_linear_args(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, block_size: int) -> None:
    if codes.dim() != 2:
        raise UserError(f"mxint8_linear needs 2-D codes [out_features, in_features], got shape {tuple(codes.shape)}")
    if not x.dtype.is_floating_point or x.dim() < 1 or x.shape[-1] != codes.shape[1]:
        raise UserError(f"mxint8_linear input of shape {tuple(x.shape)} and dtype {x.dtype} does not fit a weight "
                        f"with in_features={codes.shape[1]}; need a floating-point tensor [..., {codes.shape[1]}]")
    if bias is not None and (tuple(bias.shape) != (codes.shape[0],) or bias.dtype != x.dtype):
        raise UserError(f"mxint8_linear bias must have shape ({codes.shape[0]},) and the input's dtype {x.dtype}, "
                        f"got shape {tuple(bias.shape)} and dtype {bias.dtype}")
    check_decode_args(codes, scales, block_size, x.dtype)
