"""One fx node as a line of plain PyTorch: aten calls as torch functions, tensor methods or operators.

Arguments print as Python literals (``torch.float32``, ``float('-inf')``); an aten ``slice`` or
``select`` prints as indexing with the full-range ends left out (``x[:, 1:]``, ``x[..., 0]``).

Example::

    >>> import torch.fx as fx
    >>> g = fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.ops.aten.slice.Tensor, (x, 1, 2, 9223372036854775807))
    >>> Printer({x: "x"}).expression(y)
    'x[:, 2:]'
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from mase_lite.codegen.modules import CodegenError

_MAX_INDEX = 2**63 - 1
_DROPPED_KWARGS = {"pin_memory": False, "layout": torch.strided, "non_blocking": False}
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "matmul": "@", "pow": "**", "__and__": "&",
           "__or__": "|", "__xor__": "^", "bitwise_and": "&", "bitwise_or": "|", "eq": "==", "ne": "!=",
           "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "floor_divide": "//", "remainder": "%"}
_OPERATORS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
              operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
              operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.eq: "==", operator.ne: "!=",
              operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}
_UNARY = {"neg": "-", "bitwise_not": "~", operator.neg: "-", operator.invert: "~", operator.not_: "not "}
# aten ops printed as torch.nn.functional calls (same argument order as the aten schema).
_FUNCTIONAL = {"linear", "layer_norm", "group_norm", "scaled_dot_product_attention", "gelu", "silu", "pad",
               "conv1d", "conv2d", "conv3d", "max_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d"}
# Tensor methods read better than torch functions for these.
_METHODS = {"view", "reshape", "transpose", "permute", "expand", "unsqueeze", "squeeze", "contiguous", "flatten",
            "unflatten", "type_as", "masked_fill", "new_ones", "new_zeros", "new_full", "new_empty", "split", "chunk",
            "unbind", "sum", "mean", "amax", "max", "min", "clone", "t", "narrow", "cumsum", "item", "expand_as",
            "view_as", "repeat", "repeat_interleave", "clamp", "float", "long", "bool", "int", "size", "softmax",
            "log_softmax", "rsqrt", "sqrt", "pow", "exp", "tanh", "sigmoid", "cos", "sin", "abs", "log", "relu",
            "index_select", "gather", "masked_scatter", "triu", "tril", "flip", "roll", "all", "any", "detach",
            "to", "new_tensor", "scatter", "numel", "dim", "erf", "neg", "sign", "round", "floor", "ceil"}
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _namespace_names() -> dict[int, str]:
    names: dict[int, str] = {}
    for prefix, space in (("torch", torch), ("F", F)):
        for name in dir(space):
            value = getattr(space, name, None)
            if callable(value) and not name.startswith("_"):
                names.setdefault(id(value), f"{prefix}.{name}")
    return names


_NAMES = _namespace_names()


def literal(value: Any, device: Callable[[], str] | None = None) -> str:
    """Python source for a constant argument (``torch.float32``, ``float('inf')``, ``(1, 2)``)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        if device is None:
            return f"torch.device({str(value)!r})"
        return device()
    if isinstance(value, (torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, (tuple, list)):
        items = [literal(v, device) for v in value]
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(value, slice):
        return f"slice({literal(value.start)}, {literal(value.stop)}, {literal(value.step)})"
    raise CodegenError(f"codegen cannot print the constant {value!r} ({type(value).__name__})")


def is_operation(expression: str) -> bool:
    """Whether ``expression`` needs parentheses to be an operand (``a + b``, ``-x``, ``p if c else q``)."""
    body = ast.parse(expression, mode="eval").body
    return isinstance(body, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp))


class Printer:
    """Renders nodes with the local names given in ``names``; ``inline`` holds expressions (``self.weight``)."""

    def __init__(self, names: dict[fx.Node, str], inline: dict[fx.Node, str] | None = None,
                 device: Callable[[], str] | None = None):
        self.names = names
        self.inline = inline if inline is not None else {}
        self.device = device

    def arg(self, a: Any) -> str:
        if isinstance(a, fx.Node):
            if a in self.inline:
                return self.inline[a]
            return self.names[a]
        if isinstance(a, tuple):
            items = [self.arg(x) for x in a]
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(a, list):
            return f"[{', '.join(self.arg(x) for x in a)}]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.arg(v)}" for k, v in a.items()) + "}"
        return literal(a, self.device)

    def operand(self, a: Any) -> str:
        """``a`` where an operator or a method call applies to it: a folded operator expression in parentheses."""
        text = self.arg(a)
        if isinstance(a, fx.Node) and a in self.inline and is_operation(text):
            return f"({text})"
        return text

    def call(self, fn: str, args: tuple, kwargs: dict) -> str:
        parts = [self.arg(a) for a in args]
        parts += [f"{k}={self.arg(v)}" for k, v in kwargs.items()
                  if not (k in _DROPPED_KWARGS and _DROPPED_KWARGS[k] == v)]
        return f"{fn}({', '.join(parts)})"

    def _index(self, base: fx.Node, dim: int, item: str, rank: int | None) -> str:
        if dim < 0:
            return f"{self.operand(base)}[..., {item}{', :' * (-dim - 1)}]"
        return f"{self.operand(base)}[{':, ' * dim}{item}]"

    def _slice(self, start: Any, end: Any, step: Any) -> str:
        start_s = "" if start in (None, 0) else self.arg(start)
        end_s = "" if end is None or (isinstance(end, int) and end >= _MAX_INDEX) else self.arg(end)
        step_s = "" if step in (None, 1) else f":{self.arg(step)}"
        return f"{start_s}:{end_s}{step_s}"

    def expression(self, node: fx.Node) -> str:
        """The right-hand side for ``node`` (a call_function or call_method)."""
        if node.op == "call_method":
            return self.call(f"{self.operand(node.args[0])}.{node.target}", node.args[1:], node.kwargs)
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            return self._aten(node, target)
        return self._python(node, target)

    def _python(self, node: fx.Node, target: Any) -> str:
        args, kwargs = node.args, node.kwargs
        if target in _OPERATORS and len(args) == 2 and not kwargs:
            return f"{self.operand(args[0])} {_OPERATORS[target]} {self.operand(args[1])}"
        if target in _UNARY and len(args) == 1:
            return f"{_UNARY[target]}{self.operand(args[0])}"
        if target is operator.getitem:
            index = args[1]
            if isinstance(index, tuple):
                return f"{self.operand(args[0])}[{', '.join(self._item(i) for i in index)}]"
            return f"{self.operand(args[0])}[{self._item(index)}]"
        if target is getattr:
            return f"{self.operand(args[0])}.{args[1]}"
        name = _NAMES.get(id(target))
        if name is None:
            module = getattr(target, "__module__", None) or ""
            if module in ("builtins", "math"):
                name = target.__name__ if module == "builtins" else f"math.{target.__name__}"
            else:
                raise CodegenError(f"codegen cannot express node {node.name!r}: it calls "
                                   f"{getattr(target, '__qualname__', target)} from {module or 'an unknown module'}; "
                                   "the emitted code calls torch and operator functions only")
        return self.call(name, args, kwargs)

    def _item(self, index: Any) -> str:
        if isinstance(index, slice):
            return self._slice(index.start, index.stop, index.step)
        if index is Ellipsis:
            return "..."
        if index is None:
            return "None"
        return self.arg(index)

    def _aten(self, node: fx.Node, op: torch._ops.OpOverload) -> str:
        name, args, kwargs = op._opname, list(node.args), dict(node.kwargs)
        schema = op._schema.arguments
        if name == "sym_size":
            return f"{self.operand(args[0])}.size({self.arg(args[1])})"
        if name == "slice":
            dim, start, end, step = (args[1:] + [0, None, None, 1][len(args) - 1:])[:4]
            return self._index(args[0], dim, self._slice(start, end, step), None)
        if name == "select":
            return self._index(args[0], args[1], self.arg(args[2]), None)
        if name == "index" and len(args) == 2:
            items = ", ".join(":" if i is None else self.arg(i) for i in args[1])
            return f"{self.operand(args[0])}[{items}]"
        if name == "embedding":
            padding = args[2] if len(args) > 2 else -1
            return self.call("F.embedding", (args[1], args[0]), {"padding_idx": padding} if padding != -1 else {})
        if name == "cross_entropy_loss":
            names = ["weight", "reduction", "ignore_index", "label_smoothing"]
            extra = dict(zip(names, args[2:]), **kwargs)
            if "reduction" in extra:
                extra["reduction"] = _REDUCTIONS[extra["reduction"]]
            defaults = {"weight": None, "reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0}
            extra = {k: v for k, v in extra.items() if defaults.get(k, object()) != v}
            return self.call("F.cross_entropy", tuple(args[:2]), extra)
        if name in ("_to_copy", "to"):
            kwargs.pop("layout", None)
            return self.call(f"{self.operand(args[0])}.to", tuple(args[1:]), kwargs)
        if name in ("lift_fresh_copy", "alias"):
            return f"{self.operand(args[0])}.clone()" if name == "lift_fresh_copy" else self.arg(args[0])
        if name == "_softmax" and len(args) == 3 and args[2] is False:
            return f"{self.operand(args[0])}.softmax({self.arg(args[1])})"
        if name == "dropout":
            return self.call("F.dropout", (args[0],), {"p": args[1], "training": args[2]})
        if name in _BINARY and len(args) == 2 and not kwargs and any(isinstance(a, fx.Node) for a in args):
            return f"{self.operand(args[0])} {_BINARY[name]} {self.operand(args[1])}"
        if name == "rsub" and len(args) == 2 and not kwargs:
            return f"{self.operand(args[1])} - {self.operand(args[0])}"
        if name in _UNARY and len(args) == 1 and not kwargs:
            return f"{_UNARY[name]}{self.operand(args[0])}"
        is_self = bool(schema) and schema[0].name == "self" and isinstance(args[0] if args else None, fx.Node)
        if name.endswith("_") and is_self:  # in-place: the method keeps the mutation
            return self.call(f"{self.operand(args[0])}.{name}", tuple(args[1:]), kwargs)
        if name in ("layer_norm", "group_norm") and len(args) == 6:
            args = args[:5]  # cudnn_enable: not an argument of the functional form
        if name in _FUNCTIONAL:
            return self.call(f"F.{name}", tuple(args), kwargs)
        if is_self and name in _METHODS and hasattr(torch.Tensor, name):
            return self.call(f"{self.operand(args[0])}.{name}", tuple(args[1:]), kwargs)
        if hasattr(torch, name) and not name.startswith("_"):
            return self.call(f"torch.{name}", tuple(args), kwargs)
        if is_self and hasattr(torch.Tensor, name):
            return self.call(f"{self.operand(args[0])}.{name}", tuple(args[1:]), kwargs)
        return self.call(f"torch.ops.aten.{name}.{op._overloadname}", tuple(args), kwargs)
