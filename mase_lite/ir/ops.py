"""Op classification: which modules are leaves of the IR, and the op name of every node.

Example::

    >>> op_of_module(torch.nn.Linear(2, 2))
    'linear'
    >>> op_of_function(torch.ops.aten.matmul.default)
    'matmul'
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn as nn

# Leaf module class name -> op name. Class names (not classes) so optional libraries
# (transformers' GELUActivation, Conv1D, ...) need not be imported.
MODULE_OPS: dict[str, str] = {
    "Linear": "linear",
    "LazyLinear": "linear",
    "Bilinear": "bilinear",
    "Conv1d": "conv1d",
    "Conv2d": "conv2d",
    "Conv3d": "conv3d",
    "ConvTranspose1d": "conv_transpose1d",
    "ConvTranspose2d": "conv_transpose2d",
    "Conv1D": "hf_conv1d",
    "Embedding": "embedding",
    "LayerNorm": "layer_norm",
    "RMSNorm": "rms_norm",
    "GroupNorm": "group_norm",
    "BatchNorm1d": "batch_norm",
    "BatchNorm2d": "batch_norm",
    "BatchNorm3d": "batch_norm",
    "Dropout": "dropout",
    "Dropout1d": "dropout",
    "Dropout2d": "dropout",
    "ReLU": "relu",
    "ReLU6": "relu6",
    "LeakyReLU": "leaky_relu",
    "GELU": "gelu",
    "GELUActivation": "gelu",
    "NewGELUActivation": "gelu",
    "FastGELUActivation": "gelu",
    "QuickGELUActivation": "gelu",
    "GELUTanh": "gelu",
    "SiLU": "silu",
    "SiLUActivation": "silu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Softmax": "softmax",
    "Hardswish": "hardswish",
    "Hardtanh": "hardtanh",
    "ELU": "elu",
    "MaxPool1d": "max_pool1d",
    "MaxPool2d": "max_pool2d",
    "AvgPool1d": "avg_pool1d",
    "AvgPool2d": "avg_pool2d",
    "AdaptiveAvgPool1d": "adaptive_avg_pool1d",
    "AdaptiveAvgPool2d": "adaptive_avg_pool2d",
    "Flatten": "flatten",
    "Identity": "identity",
    "ScaledDotProductAttention": "sdpa",
}

# aten overload packet name -> op name, where the two differ or the op matters to passes.
FUNCTION_OPS: dict[str, str] = {
    "matmul": "matmul",
    "bmm": "bmm",
    "mm": "matmul",
    "addmm": "linear",
    "linear": "linear",
    "baddbmm": "bmm",
    "add": "add",
    "add_": "add",
    "sub": "sub",
    "rsub": "sub",
    "mul": "mul",
    "mul_": "mul",
    "div": "div",
    "neg": "neg",
    "pow": "pow",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "exp": "exp",
    "log": "log",
    "mean": "mean",
    "sum": "sum",
    "max": "max",
    "amax": "max",
    "min": "min",
    "softmax": "softmax",
    "_softmax": "softmax",
    "_safe_softmax": "softmax",
    "log_softmax": "log_softmax",
    "scaled_dot_product_attention": "sdpa",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
    "view": "view",
    "reshape": "view",
    "_unsafe_view": "view",
    "flatten": "view",
    "unflatten": "view",
    "squeeze": "view",
    "unsqueeze": "view",
    "permute": "permute",
    "transpose": "transpose",
    "t": "transpose",
    "contiguous": "contiguous",
    "clone": "clone",
    "expand": "expand",
    "slice": "slice",
    "select": "select",
    "index": "index",
    "gather": "gather",
    "cat": "cat",
    "stack": "stack",
    "split": "split",
    "split_with_sizes": "split",
    "chunk": "split",
    "to": "cast",
    "_to_copy": "cast",
    "type_as": "cast",
    "masked_fill": "masked_fill",
    "where": "where",
    "full": "constant",
    "zeros": "constant",
    "ones": "constant",
    "arange": "constant",
    "full_like": "constant",
    "zeros_like": "constant",
    "ones_like": "constant",
    "scalar_tensor": "constant",
    "lift_fresh_copy": "constant",
    "embedding": "embedding",
    "layer_norm": "layer_norm",
    "native_layer_norm": "layer_norm",
    "batch_norm": "batch_norm",
    "dropout": "dropout",
    "native_dropout": "dropout",
    "relu": "relu",
    "relu_": "relu",
    "gelu": "gelu",
    "silu": "silu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "conv1d": "conv1d",
    "conv2d": "conv2d",
    "cross_entropy_loss": "cross_entropy",
    "nll_loss": "nll_loss",
    "mse_loss": "mse_loss",
    "sym_size": "sym_size",
    "sym_numel": "sym_size",
    "_assert_tensor_metadata": "assert",
    "_assert_scalar": "assert",
    "sym_constrain_range_for_size": "assert",
    "eq": "compare",
    "ne": "compare",
    "lt": "compare",
    "gt": "compare",
    "le": "compare",
    "ge": "compare",
    "bitwise_not": "logical",
    "bitwise_and": "logical",
    "bitwise_or": "logical",
    "logical_not": "logical",
    "__and__": "logical",
    "__or__": "logical",
    "__invert__": "logical",
    "new_ones": "constant",
    "new_zeros": "constant",
    "new_full": "constant",
    "empty": "constant",
    "any": "reduce",
    "all": "reduce",
    "cumsum": "cumsum",
    "clamp": "clamp",
    "clip": "clamp",
    "abs": "abs",
    "floor": "floor",
    "round": "round",
    "sign": "sign",
    "erf": "erf",
    "sin": "sin",
    "cos": "cos",
    "hardtanh": "hardtanh",
    "max_pool2d": "max_pool2d",
    "avg_pool2d": "avg_pool2d",
    "adaptive_avg_pool2d": "adaptive_avg_pool2d",
    "argmax": "argmax",
    "tril": "tril",
    "triu": "triu",
}

_PYTHON_OPS = {
    operator.getitem: "getitem",
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.floordiv: "div",
    operator.truediv: "div",
}


def _known_base(cls: type) -> str | None:
    for base in cls.__mro__:
        if base.__name__ in MODULE_OPS:
            return base.__name__
    return None


def is_leaf_class(cls: type, extra: tuple[type, ...] = ()) -> bool:
    """Whether modules of class ``cls`` (or a subclass of a leaf class) become one ``call_module`` node."""
    return _known_base(cls) is not None or hasattr(cls, "mase_op") or (bool(extra) and issubclass(cls, extra))


def op_of_module(module: nn.Module) -> str:
    """The op name of a leaf module: its ``mase_op`` attribute, its (base) class's op, or its class name."""
    if hasattr(module, "mase_op"):
        return module.mase_op
    base = _known_base(type(module))
    return MODULE_OPS[base] if base else type(module).__name__.lower()


def function_packet_name(target: Any) -> str:
    """``aten.add.Tensor`` -> ``add``; a Python callable -> its name."""
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def op_of_function(target: Any) -> str:
    """The op name of a ``call_function`` target; ``"unknown"`` when it has none."""
    if target in _PYTHON_OPS:
        return _PYTHON_OPS[target]
    name = function_packet_name(target)
    if name in FUNCTION_OPS:
        return FUNCTION_OPS[name]
    stripped = name.rstrip("_")
    return FUNCTION_OPS.get(stripped, "unknown")
