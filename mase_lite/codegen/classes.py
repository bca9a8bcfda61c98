"""The captured graph as nested module classes: one class per distinct submodule, its forward cut from the graph.

The emitted tree has every module path of the model, so state-dict keys are the model's. A module's
``forward`` is its calls' nodes (:mod:`mase_lite.codegen.scopes`), printed by
:class:`~mase_lite.codegen.printer.Printer`; identical modules (twelve ``BertLayer``) share one class.
A module whose calls cannot be one forward (calls that differ, a call split by another's nodes, a
leaf it cannot reach through ``self``) is inlined into its caller.
"""

from __future__ import annotations

import ast
import keyword
import re
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from mase_lite.codegen.leaves import LeafSource, empty_source, leaf_source, parameter_source
from mase_lite.codegen.modules import CodegenError, module_class
from mase_lite.codegen.printer import Printer
from mase_lite.codegen.scopes import Call, call_tree, containers
from mase_lite.ir.modules import ScaledDotProductAttention

_RESERVED = {"self", "torch", "nn", "F", "math", "float", "super", "input", "range", "len", "type", "max", "min", "sum", "abs", "all", "any"}
_LINE = 90  # longest right-hand side a folded value may make
_RENAMED = {"slice": "sliced", "and": "both", "or": "either", "sym_size": "size", "scaled_dot_product_attention": "attn_output"}


class _Unreachable(Exception):
    """A call's code names a module or tensor outside its own module."""


def _snake(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    name = re.sub(r"\W+", "_", name).strip("_") or "x"
    return f"_{name}" if name[0].isdigit() else name


class _Names:
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
    if not owner or path == owner:
        return path if not owner else ""
    return path[len(owner) + 1:] if path.startswith(owner + ".") else None


def _base_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname.strip("_") or "value"
    return getattr(target, "__name__", None) or re.sub(r"_\d+$", "", node.name)


def _param_base(node: fx.Node) -> str:
    if node.op == "placeholder":
        return node.name
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        return "size"
    if isinstance(val, torch.Tensor):
        if val.dtype == torch.bool:
            return "mask"
        return "hidden_states" if val.dtype.is_floating_point else "indices"
    return "arg"


@dataclass
class Emitted:
    """Everything model.py needs besides the root's forward."""

    classes: dict[str, str] = field(default_factory=dict)  # name -> source, in definition order
    imports: set[str] = field(default_factory=set)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    non_persistent: list[str] = field(default_factory=list)
    packed: int = 0

    def define(self, name: str, source_of) -> str:
        """Register a class under ``name`` (``name_1`` when another class took it); returns the name used."""
        candidate, i = name, 1
        while candidate in self.classes:
            if self.classes[candidate] == source_of(candidate):
                return candidate
            candidate, i = f"{name}_{i}", i + 1
        self.classes[candidate] = source_of(candidate)
        return candidate


def _leaves(tree) -> list:
    return pytree.tree_leaves(tree, is_leaf=lambda x: isinstance(x, fx.Node))


def _wrapped(target: str, expression: str) -> list[str]:
    """``target = f(a, b)``, one argument a line when it runs past 100 characters."""
    tree = ast.parse(expression, mode="eval").body
    if len(target) + len(expression) <= 100 or not isinstance(tree, ast.Call) or any(k.arg is None for k in tree.keywords):
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


class ClassBuilder:
    """Builds the classes of ``gm``'s module tree (the source model's part of it) and the root's forward."""

    def __init__(self, gm: fx.GraphModule, graph: fx.Graph, source: nn.Module):
        self.gm, self.graph, self.source = gm, graph, source
        self.paths: dict[str, nn.Module] = {}
        self._walk("", gm, list(source._modules))
        self.aliases: dict[int, list[str]] = defaultdict(list)
        for path, module in self.paths.items():
            self.aliases[id(module)].append(path)
        modules = dict(gm.named_modules(remove_duplicate=False))
        self.leaf_ids = {id(modules[n.target]) for n in graph.nodes
                         if n.op == "call_module" and n.target in self.paths}
        self.containers = containers(gm)
        self.root = call_tree(graph, self.containers)
        self.calls: dict[str, list[Call]] = defaultdict(list)
        for call in self.root.calls():
            self.calls[call.fqn].append(call)
        self.out = Emitted()
        self._io: dict[Call, tuple[list[fx.Node], list[fx.Node]]] = {}
        self._sizes: dict[Call, dict[fx.Node, tuple[fx.Node, int]]] = {}
        self.class_of: dict[str, str] = {}

    def _walk(self, prefix: str, module: nn.Module, keep: list[str] | None) -> None:
        names = list(module._modules) if keep is None else [k for k in keep if k in module._modules]
        for name in names:
            child = module._modules[name]
            if child is None:
                continue
            path = f"{prefix}.{name}" if prefix else name
            self.paths[path] = child
            self._walk(path, child, None)

    # ---- what each module becomes ------------------------------------------------------------------

    def _is_torch_layer(self, module: nn.Module) -> bool:
        cls = module_class(module)
        return cls.__module__.startswith("torch.nn.modules") and getattr(nn, cls.__name__, None) is cls

    def kind(self, path: str) -> str:
        module = self.paths[path]
        if path in self.containers:
            return "container"
        if id(module) in self.leaf_ids or self._is_torch_layer(module):
            return "leaf"
        if any(self.calls.get(p) for p in self.aliases[id(module)]) or module._modules:
            return "class"
        return "leaf"

    def build(self) -> str:
        """Build every class; returns the root's class body (``__init__`` lines and forward)."""
        for calls in list(self.calls.values()):  # torch layers traced through (not leaves): their ops go inline
            for call in calls:
                if call.fqn not in self.paths or self.kind(call.fqn) != "class":
                    call.inline()
        self.calls = defaultdict(list)
        for call in self.root.calls():
            self.calls[call.fqn].append(call)
        return self._init_lines("")

    def expression(self, path: str) -> str:
        """Source that builds the module at ``path`` (its classes defined on the way)."""
        module, kind = self.paths[path], self.kind(path)
        if kind == "container":
            items = [self.expression(f"{path}.{name}") for name, m in module._modules.items() if m is not None]
            names = [name for name, m in module._modules.items() if m is not None]
            if isinstance(module, nn.ModuleDict):
                return "nn.ModuleDict({" + ", ".join(f"{n!r}: {e}" for n, e in zip(names, items)) + "})"
            if names != [str(i) for i in range(len(names))]:
                raise CodegenError(f"codegen cannot express module {path!r}: a {type(module).__name__} with names {names}")
            if isinstance(module, nn.ModuleList):
                if len(items) > 1 and len(set(items)) == 1:
                    return f"nn.ModuleList([{items[0]} for _ in range({len(items)})])"
                return f"nn.ModuleList([{', '.join(items)}])"
            return f"nn.Sequential({', '.join(items)})"
        if kind == "leaf":
            return self._leaf(path, module)
        return self._class(path, module) + "()"

    def _leaf(self, path: str, module: nn.Module) -> str:
        try:
            leaf = leaf_source(module, path)
        except CodegenError:
            if id(module) in self.leaf_ids:
                raise
            leaf = self._holder(module)  # never called: its tensors are kept, its forward is not needed
        self.out.imports |= leaf.imports
        expression = leaf.expression
        for name, source in leaf.classes.items():
            defined = self.out.define(name, lambda n, s=source: s.replace(f"class {name}(", f"class {n}(", 1))
            if expression.startswith(f"{name}("):
                expression = defined + expression[len(name):]
        self.out.packed += expression.startswith("PackedLinear(")
        self.out.state.update({f"{path}.{k}": v for k, v in leaf.state.items()})
        return expression

    def _holder(self, module: nn.Module) -> LeafSource:
        name = module_class(module).__name__
        lines = self._tensor_lines(module)
        body = "\n".join(f"        {line}" for line in ["super().__init__()", *lines])
        source = (f"class {name}(nn.Module):\n    \"\"\"The tensors of the model's {name}, which the graph never "
                  f"calls.\"\"\"\n\n    def __init__(self) -> None:\n{body}")
        return LeafSource(f"{name}()", {k: v.detach() for k, v in module.state_dict().items()}, set(), {name: source})

    def _tensor_lines(self, module: nn.Module) -> list[str]:
        lines = [f"self.{n} = {parameter_source(p)}" for n, p in module._parameters.items() if p is not None]
        for n, b in module._buffers.items():
            if b is not None:
                persistent = "" if n not in module._non_persistent_buffers_set else ", persistent=False"
                lines.append(f"self.register_buffer({n!r}, {empty_source(b)}{persistent})")
        return lines

    def _init_lines(self, path: str) -> list[str]:
        module = self.paths[path] if path else self.gm
        lines = []
        for child_path in [p for p in self.paths if p.rpartition(".")[0] == path]:
            lines.append(f"self.{child_path.rpartition('.')[2]} = {self.expression(child_path)}")
        tensors = module if path else self._root_tensors()
        lines += self._tensor_lines(tensors)
        for n, p in list(tensors._parameters.items()) + list(tensors._buffers.items()):
            if p is None:
                continue
            key = f"{path}.{n}" if path else n
            self.out.state[key] = p.detach()
            if n in tensors._non_persistent_buffers_set:
                self.out.non_persistent.append(key)
        return lines

    def _root_tensors(self) -> nn.Module:
        """The root's own tensors: the model's, plus constants export lifted out of a forward (not saved in the state dict)."""
        holder = nn.Module()
        for name, value in self.source._parameters.items():
            holder.register_parameter(name, getattr(self.gm, name) if value is not None else None)
        for name, value in self.source._buffers.items():
            holder.register_buffer(name, getattr(self.gm, name) if value is not None else None,
                                   persistent=name not in self.source._non_persistent_buffers_set)
        for node in self.graph.nodes:
            if node.op == "get_attr" and "." not in node.target and node.target not in holder._parameters \
                    and node.target not in holder._buffers:
                holder.register_buffer(node.target, getattr(self.gm, node.target), persistent=False)
        return holder

    def _class(self, path: str, module: nn.Module) -> str:
        init = self._init_lines(path)
        forward = self._module_forward(path)
        body = "\n".join(f"        {line}" for line in ["super().__init__()", *init])
        name = module_class(module).__name__
        self.class_of[path] = self.out.define(name, lambda n: f"class {n}(nn.Module):\n    def __init__(self) -> None:\n"
                                              f"{body}" + (f"\n\n{forward}" if forward else ""))
        return self.class_of[path]

    def _module_forward(self, path: str) -> str | None:
        calls = [c for p in self.aliases[id(self.paths[path])] for c in self.calls.get(p, [])]
        if not calls:
            return None
        try:
            texts = {self.forward(call, path) for call in calls if not call.key.endswith("#split")}
        except _Unreachable:
            texts = set()
        if len(texts) == 1 and not any(call.key.endswith("#split") for call in calls):
            return texts.pop()
        for call in calls:
            call.inline()
        return None

    # ---- forwards ----------------------------------------------------------------------------------

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
        raise _Unreachable

    def forward(self, call: Call, owner: str) -> str:
        """``def forward`` of ``call`` in the class of the module at ``owner``."""
        inputs, outputs = self.io(call)
        local = _Names()
        params = [local.fresh(_param_base(n)) for n in inputs]
        names = dict(zip(inputs, params))
        sizes = []
        for size, (tensor, dim) in self._sizes[call].items():
            names[size] = local.fresh("size")
            sizes.append(f"{names[size]} = {names[tensor]}.size({dim})")
        lines, printer = self.body(call, owner, names, local)
        lines = sizes + lines + [f"return {', '.join(printer.arg(o) for o in outputs)}"]
        return f"    def forward(self, {', '.join(params)}):\n" + "\n".join(f"        {line}" for line in lines)

    def body(self, call: Call, owner: str, names: dict[fx.Node, str], local: _Names) -> tuple[list[str], Printer]:
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
            if isinstance(item, list):  # blocks of one ModuleList, each feeding the next
                if pending is not None:
                    flush()
                pending = None
                lines.extend(self._loop_lines(item, owner, names, local, printer))
                continue
            used = self.io(item)[0] if isinstance(item, Call) else item.all_input_nodes
            for a in used:
                if a.op == "get_attr" and a not in names and a not in inline:
                    ref = self._tensor_ref(a, owner)
                    if ref is None:
                        raise _Unreachable
                    inline[a] = ref
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

    def _loop_lines(self, run: list[Call], owner: str, names, local: _Names, printer: Printer) -> list[str]:
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
