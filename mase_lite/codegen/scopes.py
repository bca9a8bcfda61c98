"""The flat graph cut back into module calls: which nodes each submodule's ``forward`` computes.

Every node records the stack of modules it ran in (``meta["nn_module_stack"]``). Consecutive nodes
under one call key form a :class:`Call` of that module; a module whose calls are not contiguous,
or whose calls would need different code, is inlined into its parent (see ``classes``).

Example::

    root = call_tree(graph, containers(model))
    [c.fqn for c in root.calls()]          # ['bert', 'bert.embeddings', 'bert.encoder', ...]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Union

import torch.fx as fx
import torch.nn as nn

_NO_STACK = "_empty_nn_module_stack_from_metadata_hook"


@dataclass(eq=False)
class Call:
    """One call of the module at ``fqn``: its own nodes and its sub-calls, in graph order."""

    fqn: str
    key: str
    parent: "Call | None" = None
    items: list[Union[fx.Node, "Call"]] = field(default_factory=list)

    def calls(self) -> Iterator["Call"]:
        for item in self.items:
            if isinstance(item, Call):
                yield item
                yield from item.calls()

    def nodes(self) -> Iterator[fx.Node]:
        for item in self.items:
            if isinstance(item, Call):
                yield from item.nodes()
            else:
                yield item

    def inline(self) -> None:
        """Put this call's items into its parent, in its place."""
        parent = self.parent
        at = parent.items.index(self)
        for item in self.items:
            if isinstance(item, Call):
                item.parent = parent
        parent.items[at:at + 1] = self.items


def _scope(node: fx.Node) -> list[tuple[str, str]]:
    """(call key, module fqn) of the modules ``node`` ran in, outermost first, root and the leaf itself left out."""
    stack = node.meta.get("nn_module_stack") or {}
    path = []
    for key, (fqn, _) in stack.items():
        if not fqn or key == _NO_STACK:
            continue
        if node.op == "call_module" and (fqn == node.target or fqn.startswith(f"{node.target}.")):
            break
        path.append((key, fqn))
    return path


def call_tree(graph: fx.Graph, containers: set[str]) -> Call:
    """The root call; modules named in ``containers`` (ModuleList, ...) get no call of their own."""
    root = Call("", "")
    open_calls = [root]
    closed: set[str] = set()
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        path = [(k, f) for k, f in _scope(node) if f not in containers]
        depth = 0
        while depth < len(path) and depth + 1 < len(open_calls) and open_calls[depth + 1].key == path[depth][0]:
            depth += 1
        closed.update(c.key for c in open_calls[depth + 1:])
        del open_calls[depth + 1:]
        for key, fqn in path[depth:]:
            if key in closed:  # a call split in two: mark it so that emit inlines it
                key = f"{key}#split"
            call = Call(fqn, key, open_calls[-1])
            open_calls[-1].items.append(call)
            open_calls.append(call)
        open_calls[-1].items.append(node)
    return root


def containers(model: nn.Module) -> set[str]:
    """Paths of the model's ModuleList, ModuleDict and Sequential modules."""
    kinds = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
    return {name for name, m in model.named_modules() if name and isinstance(m, kinds)}
