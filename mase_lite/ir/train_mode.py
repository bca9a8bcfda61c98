"""Train mode in the graph: dropout and attention dropout as module nodes that follow the mode,
modules drawing random numbers found, and a graph that cannot follow train mode refusing it.
"""

from __future__ import annotations

import inspect
import re

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mase_lite.ir.export import CaptureError
from mase_lite.ir.modules import ScaledDotProductAttention

_ATEN = torch.ops.aten
TRAIN_DROPOUT = "mase_train_dropout_p"  # node meta: the dropout probability a call uses in train mode
_DROPOUT = inspect.signature(F.dropout)


class DropoutRecorder(TorchFunctionMode):
    """Traces functional dropout and SDPA as in eval mode, recording train mode's probabilities.

    Tracing dropout is costly (its random mask is traced with symbolic shapes), so during export
    they run with dropout off; the probability each call would use in train mode is recorded in
    call order and attached to the matching nodes by :meth:`annotate`. A torch-function mode sees
    only the calls of the thread that entered it: ``torch.nn.functional`` itself is never changed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dropout: list[float] = []
        self.sdpa: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.dropout:
            call = _DROPOUT.bind(*args, **kwargs)
            call.apply_defaults()
            self.dropout.append(float(call.arguments["p"]) if call.arguments["training"] else 0.0)
            call.arguments["training"] = False
            args, kwargs = call.args, call.kwargs
        elif func is F.scaled_dot_product_attention:
            self.sdpa.append(float(args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)))
            if len(args) > 4:
                args = args[:4] + (0.0,) + args[5:]
            else:
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)

    def annotate(self, graph: fx.Graph) -> bool:
        """Attach the recorded probabilities to the nodes; False when the calls do not match them."""
        drops = [n for n in graph.nodes if n.target is _ATEN.dropout.default]
        sdpas = [n for n in graph.nodes if n.target is _ATEN.scaled_dot_product_attention.default]
        if len(drops) != len(self.dropout) or len(sdpas) != len(self.sdpa):
            return False
        for node, p in zip(drops + sdpas, self.dropout + self.sdpa):
            node.meta[TRAIN_DROPOUT] = p
        return True


def _owner_name(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    fqn = list(stack.values())[-1][0]
    return fqn.replace(".", "_")


def _unique_attr(root: nn.Module, base: str) -> str:
    name, i = base, 1
    while hasattr(root, name):
        name, i = f"{base}_{i}", i + 1
    return name


def modularise_training_constants(gm: fx.GraphModule) -> int:
    """Turn dropout and SDPA whose train-mode ``p > 0`` into modules that follow train/eval mode."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _ATEN.dropout.default:
            traced = float(node.args[1]) if len(node.args) == 3 and node.args[2] is True else 0.0
            dropout_p = node.meta.get(TRAIN_DROPOUT, traced)
            if not dropout_p:
                continue
            module = nn.Dropout(dropout_p)
            args, kwargs, suffix = (node.args[0],), {}, "dropout"
        elif node.target is _ATEN.scaled_dot_product_attention.default:
            traced = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
            dropout_p = node.meta.get(TRAIN_DROPOUT, traced)
            if not dropout_p:
                continue
            module = ScaledDotProductAttention(float(dropout_p))
            q, k, v = node.args[:3]
            kwargs = {"attn_mask": node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")}
            if len(node.args) > 5 or "is_causal" in node.kwargs:
                kwargs["is_causal"] = node.args[5] if len(node.args) > 5 else node.kwargs["is_causal"]
            for name in ("scale", "enable_gqa"):
                if name in node.kwargs:
                    kwargs[name] = node.kwargs[name]
            args, suffix = (q, k, v), "sdpa"
        else:
            continue
        name = _unique_attr(gm, f"{_owner_name(node)}_{suffix}".strip("_"))
        gm.add_submodule(name, module)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, args, kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed += 1
    return changed


# aten ops that draw random numbers (dropout is handled on its own).
_RANDOM_OPS = {
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
    "bernoulli_", "uniform_", "normal", "normal_", "exponential_", "multinomial", "native_dropout",
}


def _random_nodes(graph: fx.Graph) -> list[fx.Node]:
    return [
        n for n in graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._opname in _RANDOM_OPS
    ]


def _source_line(node: fx.Node) -> str:
    """``file:line: code`` of the model's source that made ``node`` (the innermost frame)."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)', node.meta.get("stack_trace") or "")
    if not frames:
        return "an unknown source line"
    path, line, code = frames[-1]
    return f"{path}:{line}: {code.strip()}"


def _innermost(node: fx.Node) -> tuple[str, str]:
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if not stack:
        return "", "the model"
    fqn, cls = stack[-1]
    return fqn, getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1].strip("'>"))


def stochastic_modules(graph: fx.Graph, modules: dict[str, nn.Module]) -> tuple[set[str], list[str]]:
    """Modules whose train mode draws random numbers: parameter-free ones (become leaves), and the rest (reasons)."""
    leaves, reasons = set(), []
    for node in _random_nodes(graph):
        fqn, cls = _innermost(node)
        module = modules.get(fqn)
        if fqn and module is not None and next(module.parameters(), None) is None:
            leaves.add(fqn)
        else:
            reasons.append(f"{cls} ({fqn or 'the model'}) draws random numbers in train mode at {_source_line(node)}")
    return leaves, reasons


class TrainModeLimit:
    """Forward pre-hook refusing train mode on a graph that follows the model in eval mode only."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons

    def message(self) -> str:
        return (
            "this graph follows the model in eval mode only; its train mode could not be captured:\n  "
            + "\n  ".join(self.reasons)
            + "\nTo train through the graph, turn that train-only branch off (e.g. config.layerdrop = 0, "
            "drop_path_rate = 0) or make its module a leaf (leaf_modules=[...]), and capture again."
        )

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if module.training:
            raise CaptureError(self.message())
