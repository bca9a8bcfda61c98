"""The captured graph as nested module classes: one class per distinct submodule, its forward cut from the graph.

The emitted tree has every module path of the model, so state-dict keys are the model's. A module's
``forward`` is its calls' nodes (:mod:`mase_lite.codegen.scopes`, :mod:`mase_lite.codegen.forwards`);
identical modules (twelve ``BertLayer``) share one class. A module whose calls cannot be one forward
(calls that differ, a call split by another's nodes, a leaf it cannot reach through ``self``) is
inlined into its caller.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.codegen.forwards import ForwardWriter, Unreachable
from mase_lite.codegen.leaves import LeafSource, empty_source, leaf_source, parameter_source
from mase_lite.codegen.modules import CodegenError, module_class
from mase_lite.codegen.scopes import Call, call_tree, containers



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




class ClassBuilder(ForwardWriter):
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
        """Build every class; returns the lines of the root's ``__init__``."""
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
        except Unreachable:
            texts = set()
        if len(texts) == 1 and not any(call.key.endswith("#split") for call in calls):
            return texts.pop()
        for call in calls:
            call.inline()
        return None
