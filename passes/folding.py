"""Per-input-channel factors folded into what produces a group of Linears' shared input.

A pre-norm transformer's q/k/v projections (and gate/up) read one tensor, the output of a norm. Scaling
that tensor's channel ``j`` by ``1/s_j`` where it is made (a LayerNorm's weight and bias, an RMSNorm's
weight: the ``mul`` by a parameter that ends it, or a preceding Linear's rows — also through a gated MLP's
product ``act(gate(x)) * up(x)``, where up's rows scale down's input, as llm-compressor maps a Llama) and the readers' weight
columns ``j`` by ``s_j`` leaves the float model's function unchanged (bit for bit with powers of two)
while moving magnitude between activations and weights: SmoothQuant and AWQ choose ``s`` to make
quantization easier; the ``outliers`` pass chooses it to make it harder.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.ir.ops import function_packet_name, op_of_module


def linear_weight(module: nn.Module) -> torch.Tensor:
    """The ``[out, in]`` weight of a Linear (or transformers' Conv1D, stored ``[in, out]``)."""
    return module.weight.t() if op_of_module(module) == "hf_conv1d" else module.weight


def input_groups(nodes: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """The module nodes grouped by the node making their first input, in graph order."""
    groups: dict[fx.Node, list[fx.Node]] = {}
    for node in nodes:
        if isinstance(node.args[0], fx.Node):
            groups.setdefault(node.args[0], []).append(node)
    return groups


def fold_target(mg, producer: fx.Node, group: list[fx.Node], modules: dict[str, nn.Module]
                ) -> tuple[Callable[[torch.Tensor], None] | None, str]:
    """``(divide(s), description)`` dividing the output channels of the node making ``group``'s input by ``s``,
    or ``(None, reason)``: no such producer, or the input is also read outside the group."""
    outside = [u.name for u in producer.users if u not in group]
    if outside:
        return None, f"its input is also read by {', '.join(outside[:3])}"
    channels = linear_weight(modules[group[0].target]).shape[1]
    if producer.op == "call_module":
        module = modules[producer.target]
        if isinstance(module, nn.LayerNorm) and module.weight is not None and module.weight.shape == (channels,):
            def divide(s):
                module.weight.div_(s)
                if module.bias is not None:
                    module.bias.div_(s)
            return divide, f"LayerNorm {producer.target}"
        rows = _rows_divider(module, channels)
        if rows is not None:
            return rows, f"Linear {producer.target}"
    if producer.op == "call_function" and function_packet_name(producer.target) == "mul":
        for arg in producer.args:
            if isinstance(arg, fx.Node) and arg.op == "get_attr":
                try:
                    param = mg.model.get_parameter(arg.target)
                except AttributeError:  # a buffer or a constant
                    continue
                if param.shape == (channels,):
                    return (lambda s, p=param: p.div_(s)), f"norm weight {arg.target}"
        for arg in producer.args:  # a gated MLP's act(gate(x)) * up(x): up's rows scale the product's channels
            if isinstance(arg, fx.Node) and arg.op == "call_module" and list(arg.users) == [producer]:
                rows = _rows_divider(modules[arg.target], channels)
                if rows is not None:
                    return rows, f"Linear {arg.target} (a factor of the product {producer.name})"
    return None, f"its input comes from {producer.name} ({producer.op} {producer.target}), which no factor folds into"


def _rows_divider(module: nn.Module, channels: int) -> Callable[[torch.Tensor], None] | None:
    """``divide(s)`` dividing a Linear's output channels (weight rows and bias) by ``s``; None for another module."""
    if not hasattr(module, "weight") or op_of_module(module) not in ("linear", "hf_conv1d") \
            or linear_weight(module).shape[0] != channels:
        return None
    weight, bias = linear_weight(module), getattr(module, "bias", None)

    def divide(s):
        weight.div_(s.unsqueeze(1))
        if bias is not None:
            bias.div_(s)
    return divide
