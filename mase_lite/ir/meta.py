"""Node metadata (``node.meta["mase"]``) derived from export's fake tensors, with no eager run.

Each node gets::

    {"op": "linear", "type": "module", "module": "Linear",
     "args": [{"shape": ["batch", "seq", 128], "dtype": "float32", "format": "float32"}],
     "results": [{"shape": ["batch", "seq", 128], "dtype": "float32", "format": "float32"}],
     "params": {"weight": {"shape": [128, 128], "dtype": "float32", "format": "float32", "trainable": True},
                "mask": {..., "buffer": True}}}

A module that stores its weight packed (no ``weight`` parameter) describes it with a
``mase_weight_meta()`` method returning the same kind of dict.

Example::

    refresh(mg)                       # after a transform
    mg.nodes[5].meta["mase"]["op"]
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx as fx
from torch.nn.utils import parametrize

from mase_lite.ir.ops import function_packet_name, op_of_function, op_of_module

_NODE_TYPES = {
    "call_module": "module",
    "call_function": "function",
    "call_method": "method",
    "placeholder": "placeholder",
    "get_attr": "get_attr",
    "output": "output",
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.lru_cache(maxsize=4096)
def _expr_text(expr: Any) -> str:
    """A shape expression as text (sympy's printer is slow, and a graph repeats few expressions)."""
    return str(expr)


def _dim(d: Any, names: dict[str, str]) -> int | str:
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        if expr.is_number:
            return int(expr)
        text = _expr_text(expr)
        for sym, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(sym, name)
        return text
    return str(d)


def tensor_meta(value: Any, names: dict[str, str], fmt: Any = None) -> dict[str, Any] | None:
    """Shape, dtype and format of a (fake) tensor; ``None`` for non-tensors."""
    if isinstance(value, torch.Tensor):
        dtype = dtype_name(value.dtype)
        return {"shape": [_dim(d, names) for d in value.shape], "dtype": dtype, "format": fmt or dtype}
    if isinstance(value, (torch.SymInt, int, float, bool)):
        return {"shape": [], "dtype": type(value).__name__.lower(), "format": type(value).__name__.lower()}
    return None


def _values(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _values(item)]
    return [value]


def _arg_values(node: fx.Node) -> list[Any]:
    vals = []
    for a in node.all_input_nodes:
        vals.append(a.meta.get("val"))
    return vals


def _previous_formats(node: fx.Node, module: torch.nn.Module | None) -> dict[str, Any]:
    """Formats set by transforms survive a refresh, unless the node now calls a module of another class.

    A quantized module's own operand formats override them (``data_in``, ``data_out``, ``weight``, ``bias``).
    """
    old = node.meta.get("mase") or {}
    if module is not None and old.get("module") != module_class(module).__name__:
        old = {}
    keep: dict[str, Any] = {}
    for key in ("args", "results"):
        keep[key] = [e.get("format") if isinstance(e, dict) else None for e in old.get(key, [])]
    keep["params"] = {k: v.get("format") for k, v in (old.get("params") or {}).items()}
    if hasattr(module, "quant_formats"):
        _module_formats(keep, module.quant_formats())
    return keep


def _module_formats(keep: dict[str, Any], formats: dict[str, Any]) -> None:
    """Write a quantized module's operand formats into ``keep`` (the first arg and the first result)."""
    for key, operand in (("args", "data_in"), ("results", "data_out")):
        if operand in formats:
            keep[key] = [formats[operand]] + keep[key][1:]
    keep["params"].update({p: formats[p] for p in ("weight", "bias") if p in formats})


def module_class(module: torch.nn.Module) -> type:
    """The module's own class, not the subclass ``torch.nn.utils.parametrize`` makes for it."""
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def logical_name(name: str) -> str:
    """The metadata name of a module's parameter or buffer.

    ``parametrizations.weight.original`` -> ``weight``; ``parametrizations.weight.0.mask`` -> ``weight_mask``.
    """
    parts = name.split(".")
    if parts[0] != "parametrizations" or len(parts) < 3:
        return name
    if parts[2] == "original":
        return parts[1]
    return f"{parts[1]}_{parts[-1]}"


def node_meta(node: fx.Node, modules: dict[str, torch.nn.Module], names: dict[str, str]) -> dict[str, Any]:
    """The ``meta["mase"]`` dict of one node."""
    module = modules[node.target] if node.op == "call_module" else None
    previous = _previous_formats(node, module)
    meta: dict[str, Any] = {"type": _NODE_TYPES.get(node.op, node.op), "module": None}
    if node.op == "call_module":
        meta["op"] = op_of_module(module)
        meta["module"] = module_class(module).__name__
        params = {}
        for pname, p in module.named_parameters():
            pname = logical_name(pname)
            params[pname] = tensor_meta(p, names, previous["params"].get(pname)) | {"trainable": p.requires_grad}
        for pname, b in module.named_buffers():
            pname = logical_name(pname)
            params[pname] = tensor_meta(b, names, previous["params"].get(pname)) | {"buffer": True}
        if hasattr(module, "mase_weight_meta"):
            params["weight"] = module.mase_weight_meta()
        meta["params"] = params
    elif node.op == "call_function":
        meta["op"] = op_of_function(node.target)
        if meta["op"] == "unknown":
            meta["target"] = function_packet_name(node.target)
    elif node.op == "placeholder":
        meta["op"] = "placeholder"
    elif node.op == "output":
        meta["op"] = "output"
    elif node.op == "get_attr":
        meta["op"] = "constant"
    else:
        meta["op"] = "unknown"
        meta["target"] = str(node.target)
    arg_fmts = previous["args"]
    meta["args"] = [
        tensor_meta(v, names, arg_fmts[i] if i < len(arg_fmts) else None)
        for i, v in enumerate(_arg_values(node))
    ]
    res_fmts = previous["results"]
    results = [] if node.op == "output" else _values(node.meta.get("val"))
    meta["results"] = [
        tensor_meta(v, names, res_fmts[i] if i < len(res_fmts) else None) for i, v in enumerate(results)
    ]
    meta.setdefault("params", {})
    return meta


def symbol_names(graph: fx.Graph, input_dims: dict[str, dict[int, str]]) -> dict[str, str]:
    """Map export's shape symbols (``s0``) to names (``batch``) from the inputs' dimensions."""
    names: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        for dim, name in input_dims.get(node.target, {}).items():
            if isinstance(val, torch.Tensor) and dim < val.dim():
                d = val.shape[dim]
                if isinstance(d, torch.SymInt) and d.node.expr.is_symbol:
                    names.setdefault(str(d.node.expr), name)
    return names


def refresh(mg) -> None:
    """Re-derive ``meta["mase"]`` for every node of ``mg``; keeps formats set by transforms and the
    per-node results of the analyses the graph still holds (``mg.analyses``: its pass manager drops
    those a transform invalidates)."""
    modules = dict(mg.model.named_modules())
    held = set(getattr(mg, "analyses", ()))
    for node in mg.model.graph.nodes:
        old = node.meta.get("mase") or {}
        meta = node_meta(node, modules, mg.symbol_names)
        meta.update({key: old[key] for key in held if key in old})
        node.meta["mase"] = meta
