"""Forwards cut from the graph: one module call's nodes as the statements of its ``forward``.

Inputs a call takes from outside become parameters (sizes it can read off its own tensors are read
there: ``size = hidden_states.size(1)``), a value used once by the next statement is written into it
(the graph's call order is kept), chained blocks of one ModuleList run as a loop, and a whole-range
slice is the value itself.
"""

from __future__ import annotations

import ast
import keyword
import re

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from mase_lite.codegen.modules import CodegenError
from mase_lite.codegen.printer import Printer
from mase_lite.codegen.scopes import Call
from mase_lite.ir.modules import ScaledDotProductAttention


_RESERVED = {"self", "torch", "nn", "F", "math", "float", "super", "input", "range", "len", "type", "max", "min",
             "sum", "abs", "all", "any"}
_LINE = 90  # longest right-hand side a folded value may make
_RENAMED = {"slice": "sliced", "and": "both", "or": "either", "sym_size": "size",
            "scaled_dot_product_attention": "attn_output"}


class Unreachable(Exception):
    """A call's code names a module or tensor outside its own module."""


def _snake(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    name = re.sub(r"\W+", "_", name).strip("_") or "x"
    return f"_{name}" if name[0].isdigit() else name


class Names:
    """Fresh local names: ``view``, ``view_1``, ..."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        base = _snake(base)
        base = _RENAMED.get(base, base)
        if keyword.iskeyword(base) or base in _RESERVED:
            base = f"{base}_value"
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


def _reference(path: str) -> str:
    """``self.encoder.layer[0].attention`` for the relative path ``encoder.layer.0.attention``."""
    out = "self"
    for part in path.split(".") if path else []:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if part.isidentifier() and not keyword.iskeyword(part)
                                                      else f".get_submodule({part!r})")
    return out


def _relative(path: str, owner: str) -> str | None:
    """``path`` seen from the module at ``owner`` ('' for the module itself); None when outside it."""
    if not owner:
        return path
    if path == owner:
        return ""
    return path[len(owner) + 1:] if path.startswith(owner + ".") else None


def _base_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname.strip("_") or "value"
    return getattr(target, "__name__", None) or re.sub(r"_\d+$", "", node.name)


def _param_base(node: fx.Node) -> str:
    """A parameter's name from its value: a model input keeps its name unless it is a float tensor, which
    a block's first call may take where the next ones take the previous block's output."""
    val = node.meta.get("val")
    if node.op == "placeholder" and not (isinstance(val, torch.Tensor) and val.dtype.is_floating_point):
        return node.name
    if isinstance(val, torch.SymInt):
        return "size"
    if isinstance(val, torch.Tensor):
        if val.dtype == torch.bool:
            return "mask"
        return "hidden_states" if val.dtype.is_floating_point else "indices"
    return "arg"

def _leaves(tree) -> list:
    return pytree.tree_leaves(tree, is_leaf=lambda x: isinstance(x, fx.Node))


def _wrapped(target: str, expression: str) -> list[str]:
    """``target = f(a, b)``, one argument a line when it runs past 100 characters."""
    tree = ast.parse(expression, mode="eval").body
    if len(target) + len(expression) <= 100 or not isinstance(tree, ast.Call) \
            or any(k.arg is None for k in tree.keywords):
        return [target + expression]
    args = [ast.unparse(a) for a in tree.args] + [f"{k.arg}={ast.unparse(k.value)}" for k in tree.keywords]
    return [f"{target}{ast.unparse(tree.func)}(", *(f"    {a}," for a in args), ")"]


def _sizes(inputs: list[fx.Node]) -> dict[fx.Node, tuple[fx.Node, int]]:
    """Sizes among a call's inputs that a tensor input has as a dimension: (that tensor, the dim)."""
    found = {}
    tensors = [n for n in inputs if isinstance(n.meta.get("val"), torch.Tensor)]
    for node in inputs:
        value = node.meta.get("val")
        if not isinstance(value, torch.SymInt):
            continue
        for tensor in tensors:
            dims = [str(d) for d in tensor.meta["val"].shape]
            if str(value) in dims:
                found[node] = (tensor, dims.index(str(value)))
                break
    return found


def _alias(item) -> bool:
    """A slice over the whole of every dimension: the value itself."""
    if isinstance(item, Call) or item.target is not torch.ops.aten.slice.Tensor:
        return False
    dim, start, end, step = (list(item.args[1:]) + [0, None, None, 1][len(item.args) - 1:])[:4]
    return start in (0, None) and (end is None or (isinstance(end, int) and end >= 2**63 - 1)) and step == 1



class ForwardWriter:
    """The forwards of a :class:`~mase_lite.codegen.classes.ClassBuilder` (its module paths, aliases and classes)."""

    def io(self, call: Call) -> tuple[list[fx.Node], list[fx.Node]]:
        """(inputs, outputs) of a call: values it uses from outside, values used outside it."""
        if call not in self._io:
            members = list(call.nodes())
            inside = set(members)
            inputs: list[fx.Node] = []
            for item in call.items:  # a sub-call's inputs, less the sizes it reads off its own tensors
                for a in self.io(item)[0] if isinstance(item, Call) else item.all_input_nodes:
                    if a not in inside and a not in inputs and not (a.op == "get_attr" and self._tensor_ref(a, call.fqn)):
                        inputs.append(a)
            outputs = [n for n in members if any(u not in inside for u in n.users)]
            self._sizes[call] = _sizes(inputs)
            self._io[call] = ([n for n in inputs if n not in self._sizes[call]], outputs)
        return self._io[call]

    def _tensor_ref(self, node: fx.Node, owner: str) -> str | None:
        owner_path, _, name = node.target.rpartition(".")
        if not owner_path:
            return f"self.{name}" if not owner else None
        module = self.paths.get(owner_path)
        for alias in self.aliases[id(module)] if module is not None else [owner_path]:
            rel = _relative(alias, owner)
            if rel is not None:
                return f"{_reference(rel)}.{name}"
        return None

    def _module_ref(self, target: str, owner: str) -> str:
        for alias in self.aliases[id(self.paths[target])]:
            rel = _relative(alias, owner)
            if rel is not None:
                return _reference(rel)
        raise Unreachable

    def forward(self, call: Call, owner: str) -> str:
        """``def forward`` of ``call`` in the class of the module at ``owner``."""
        inputs, outputs = self.io(call)
        local = Names()
        params = [local.fresh(_param_base(n)) for n in inputs]
        names = dict(zip(inputs, params))
        sizes = []
        for size, (tensor, dim) in self._sizes[call].items():
            names[size] = local.fresh("size")
            sizes.append(f"{names[size]} = {names[tensor]}.size({dim})")
        lines, printer = self.body(call, owner, names, local)
        lines = sizes + lines + [f"return {', '.join(printer.arg(o) for o in outputs)}"]
        return f"    def forward(self, {', '.join(params)}):\n" + "\n".join(f"        {line}" for line in lines)

    def body(self, call: Call, owner: str, names: dict[fx.Node, str], local: Names) -> tuple[list[str], Printer]:
        """The statements of ``call``'s forward, given the names of its inputs.

        A value used once, by the very next statement, is written into that statement
        (``self.dropout(self.dense(x))``): the order of the calls stays the graph's.
        """
        inline: dict[fx.Node, str] = {}
        tensors = [p for n, p in names.items() if isinstance(n.meta.get("val"), torch.Tensor)]
        printer = Printer(names, inline, (lambda: f"{tensors[0]}.device") if tensors else None)
        kept = set(self.io(call)[1])
        lines: list[str] = []
        pending: tuple[list[fx.Node], str, str] | None = None  # (values, name base, expression)

        def flush() -> None:
            values, base, expression = pending
            for v in values:
                names[v] = local.fresh(base)
            lines.extend(_wrapped(f"{', '.join(names[v] for v in values)} = ", expression))

        needed = {a for item in call.items for a in (self.io(item)[0] if isinstance(item, Call) else item.all_input_nodes)}
        for item in self._loops(call.items):
            if isinstance(item, fx.Node) and item not in needed and item not in kept and item.op == "call_function" \
                    and not item.is_impure():
                continue  # a size every sub-call reads off its own tensors
            used = [a for c in item for a in self.io(c)[0]] if isinstance(item, list) \
                else self.io(item)[0] if isinstance(item, Call) else item.all_input_nodes
            for a in used:
                if a.op == "get_attr" and a not in names and a not in inline:
                    ref = self._tensor_ref(a, owner)
                    if ref is None:
                        raise Unreachable
                    inline[a] = ref
            if isinstance(item, list):  # blocks of one ModuleList, each feeding the next
                if pending is not None:
                    flush()
                pending = None
                lines.extend(self._loop_lines(item, owner, names, local, printer))
                continue
            statement = self._call_statement if isinstance(item, Call) else self._node_statement
            if pending is not None and self._folds(pending, item, kept):
                inline[pending[0][0]] = pending[2]
                folded = statement(item, owner, printer)
                if len(folded[2]) <= _LINE:
                    pending = folded
                    continue
                del inline[pending[0][0]]
            if pending is not None:
                flush()
            pending = statement(item, owner, printer)
            if _alias(item):
                inline[item] = printer.arg(item.args[0])
                pending = None
        if pending is not None:
            flush()
        return lines, printer

    def _loops(self, items: list) -> list:
        """``items`` with each run of chained calls of one ModuleList's blocks (one class) as a list."""
        out: list = []
        for item in items:
            run = out[-1] if out and isinstance(out[-1], list) else [out[-1]] if out and isinstance(out[-1], Call) else None
            if isinstance(item, Call) and run is not None and self._chains(run[-1], item):
                out[-1] = run + [item]
            else:
                out.append(item)
        return out

    def _chains(self, prev: Call, call: Call) -> bool:
        """Whether ``call`` is the next block after ``prev`` and takes its only output first, the rest alike."""
        container, _, index = prev.fqn.rpartition(".")
        if call.fqn != f"{container}.{int(index) + 1 if index.isdigit() else ''}" or container not in self.containers:
            return False
        if not isinstance(self.paths.get(container), nn.ModuleList) or \
                self.class_of.get(prev.fqn, "?") != self.class_of.get(call.fqn):
            return False
        (p_in, p_out), (c_in, c_out) = self.io(prev), self.io(call)
        inside = set(call.nodes())
        return (len(p_out) == len(c_out) == 1 and c_in[:1] == p_out and p_in[1:] == c_in[1:]
                and all(u in inside for u in p_out[0].users))

    def _loop_lines(self, run: list[Call], owner: str, names, local: Names, printer: Printer) -> list[str]:
        container = run[0].fqn.rpartition(".")[0]
        blocks = self._module_ref(container, owner)
        first, last = int(run[0].fqn.rpartition(".")[2]), int(run[-1].fqn.rpartition(".")[2])
        if (first, last + 1) != (0, len(self.paths[container])):
            blocks += f"[{first}:{last + 1}]"
        inputs = self.io(run[0])[0]
        seed, inside = inputs[0], set(run[0].nodes())
        lines = []
        if seed in names and seed not in printer.inline and all(u in inside for u in seed.users):
            state = names[seed]  # the first block's input is needed nowhere else: the loop carries it
        else:
            state = local.fresh("hidden_states")
            lines.append(f"{state} = {printer.arg(seed)}")
        block = local.fresh("block")
        rest = "".join(f", {printer.arg(i)}" for i in inputs[1:])
        lines += [f"for {block} in {blocks}:", f"    {state} = {block}({state}{rest})"]
        names[self.io(run[-1])[1][0]] = state
        return lines

    def _folds(self, pending: tuple[list[fx.Node], str, str], item, kept: set[fx.Node]) -> bool:
        values, _, expression = pending
        if len(values) != 1 or values[0] in kept or len(values[0].users) != 1 or len(expression) > 70 or _alias(item):
            return False
        value = values[0]
        if isinstance(item, Call):
            return value in self.io(item)[0]
        return next(iter(value.users)) is item and [a for a in _leaves((item.args, item.kwargs)) if a is value] == [value]

    def _call_statement(self, call: Call, owner: str, printer: Printer) -> tuple[list[fx.Node], str, str]:
        inputs, outputs = self.io(call)
        ref = self._module_ref(call.fqn, owner)
        base = ref[len("self."):].replace("[", "_").replace("]", "").replace(".", "_")
        return outputs, base, f"{ref}({', '.join(printer.arg(i) for i in inputs)})"

    def _node_statement(self, node: fx.Node, owner: str, printer: Printer) -> tuple[list[fx.Node], str, str]:
        if node.op == "call_module":
            if node.target not in self.paths:
                expression = self._functional_module(node, printer)
                return [node], ("attn_output" if "scaled_dot" in expression else "dropout"), expression
            expression = printer.call(self._module_ref(node.target, owner), node.args, node.kwargs)
            return [node], node.target.rsplit(".", 1)[-1], expression
        return [node], _base_name(node), printer.expression(node)

    def _functional_module(self, node: fx.Node, printer: Printer) -> str:
        """Modules capture added where the model called a function: the function, following ``self.training``."""
        module = self.gm.get_submodule(node.target)
        if isinstance(module, ScaledDotProductAttention):
            kwargs = dict(node.kwargs)
            text = printer.call("F.scaled_dot_product_attention", node.args, kwargs)
            if module.dropout_p:
                text = text[:-1] + f", dropout_p={module.dropout_p!r} if self.training else 0.0)"
            return text
        if type(module) is nn.Dropout:
            return printer.call("F.dropout", node.args, {"p": module.p}) [:-1] + ", training=self.training)"
        raise CodegenError(f"codegen cannot express node {node.name!r}: module {node.target!r} is a "
                           f"{type(module).__name__} that is not part of the model")
