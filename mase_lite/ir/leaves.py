"""Raising leaf-module calls: each call's aten nodes in the exported graph become one ``call_module`` node.

Which modules are leaves is :class:`LeafPlan`'s decision; a call whose nodes cannot be matched to
one input and one output stays inlined, with a warning.
"""

from __future__ import annotations

import logging
import operator
import re
from collections import OrderedDict

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.ir.ops import is_leaf_class

logger = logging.getLogger(__name__)


def overrides_forward(cls: type) -> bool:
    """Whether ``cls`` subclasses a known leaf class (Embedding, Linear, ...) with a forward of its own."""
    from mase_lite.ir.ops import MODULE_OPS

    for base in cls.__mro__[1:]:
        if base.__module__.startswith("torch.nn") and base.__name__ in MODULE_OPS:
            return cls.forward is not base.forward
    return False


class LeafPlan:
    """Which modules become one ``call_module`` node, and which of them export in train mode.

    A subclass of a leaf class with its own ``forward`` (a positional embedding taking the mask)
    is traced through, unless the user lists it in ``leaf_modules``. ``stochastic`` names
    parameter-free modules that draw random numbers in train mode (drop-path): they export in
    train mode so their random work is inside the node, and follow train/eval mode as nodes.
    """

    def __init__(self, model: nn.Module, leaf_types: tuple[type, ...]):
        self.leaf_types = leaf_types
        self.stochastic: set[str] = set()
        self._leaf: dict[type, bool] = {}
        for name, m in model.named_modules():
            cls = type(m)
            if cls not in self._leaf:
                leaf = is_leaf_class(cls, leaf_types)
                if leaf and overrides_forward(cls) and not issubclass(cls, leaf_types) and not hasattr(cls, "mase_op"):
                    logger.info("%s (%s) subclasses a leaf class with its own forward: traced through", name, cls.__name__)
                    leaf = False
                self._leaf[cls] = leaf

    def is_leaf(self, fqn: str, module: nn.Module) -> bool:
        """The root is never a leaf (a bare ``nn.Linear`` captured alone is its own aten ops)."""
        return bool(fqn) and (fqn in self.stochastic or self._leaf.get(type(module), False))


def _leaf_of(node: fx.Node, modules: dict[str, nn.Module], plan: LeafPlan) -> tuple[str, str] | None:
    """(call key, module fqn) of the outermost leaf module that ``node`` belongs to."""
    stack = node.meta.get("nn_module_stack") or {}
    for key, (fqn, _) in stack.items():
        module = modules.get(fqn)
        if module is not None and plan.is_leaf(fqn, module):
            return key, fqn
    return None


def _is_shape_symbol(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt) or node.op == "get_attr"


def _group_inputs(nodes: list[fx.Node]) -> list[fx.Node]:
    members = set(nodes)
    inputs: list[fx.Node] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in members and not _is_shape_symbol(a) and a not in inputs:
                inputs.append(a)
    return inputs


def _order_by_signature(
    inputs: list[fx.Node], signature, by_name: dict[str, fx.Node], replaced: dict[fx.Node, fx.Node]
) -> list[fx.Node]:
    """``inputs`` in the order of the module's recorded call signature; [] when they do not match."""
    ordered = []
    for arg in signature.inputs:
        node = by_name.get(getattr(arg, "name", None))
        while node in replaced:
            node = replaced[node]
        if node in inputs:
            ordered.append(node)
    return ordered if len(ordered) == len(inputs) else []


def raise_leaf_calls(
    graph: fx.Graph,
    modules: dict[str, nn.Module],
    plan: LeafPlan,
    signatures: dict[str, list] | None = None,
) -> int:
    """Replace each leaf-module call's aten nodes by one ``call_module`` node; returns how many."""
    groups: OrderedDict[str, tuple[str, list[fx.Node]]] = OrderedDict()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        leaf = _leaf_of(node, modules, plan)
        if leaf is not None:
            key, fqn = leaf
            groups.setdefault(key, (fqn, []))[1].append(node)

    order = {n: i for i, n in enumerate(graph.nodes)}
    by_name = {n.name: n for n in graph.nodes}
    replaced: dict[fx.Node, fx.Node] = {}
    calls_seen: dict[str, int] = {}
    raised = 0
    for key, (fqn, nodes) in groups.items():
        call_index = calls_seen.get(fqn, 0)
        calls_seen[fqn] = call_index + 1
        members = set(nodes)
        inputs = _group_inputs(nodes)
        outputs = [n for n in nodes if any(u not in members for u in n.users)]
        if len(inputs) > 1:
            calls = (signatures or {}).get(fqn, [])
            sig = calls[call_index] if call_index < len(calls) else None
            inputs = _order_by_signature(inputs, sig, by_name, replaced) if sig is not None else []
        source = _tuple_source(outputs, members)
        if not inputs or (len(outputs) != 1 and source is None):
            why = "its inputs could not be matched to its call" if not inputs else f"it has {len(outputs)} separate outputs"
            logger.warning("capture: leaf module %s (%s) stays inlined as aten ops: %s", fqn, type(modules[fqn]).__name__, why)
            continue
        out = source if source is not None else outputs[0]
        if any(order[a] > order[out] for a in inputs):
            logger.warning("capture: leaf module %s stays inlined: an input is computed after its output", fqn)
            continue
        with graph.inserting_before(out):
            new = graph.create_node("call_module", fqn, tuple(inputs))
        new.meta = dict(out.meta)
        order[new] = order[out]
        replaced[out] = new
        if source is not None:  # a tuple result (MaxPool2d with indices): its items become getitems of the call
            for item in outputs:
                with graph.inserting_before(item):
                    picked = graph.call_function(operator.getitem, (new, item.args[1]))
                picked.meta = dict(item.meta)
                order[picked] = order[item]
                item.replace_all_uses_with(picked)
        else:
            out.replace_all_uses_with(new)
        for n in sorted(nodes, key=order.__getitem__, reverse=True):
            graph.erase_node(n)
        raised += 1
    return raised


def _tuple_source(outputs: list[fx.Node], members: set[fx.Node]) -> fx.Node | None:
    """The group node whose tuple result the outputs pick items from (``getitem`` of one node), if so."""
    sources = {o.args[0] for o in outputs if o.target is operator.getitem and isinstance(o.args[0], fx.Node)}
    if len(outputs) < 2 or len(sources) != 1 or any(o.target is not operator.getitem for o in outputs):
        return None
    (source,) = sources
    return source if source in members and isinstance(source.meta.get("val"), (tuple, list)) else None


def rename_node(graph: fx.Graph, node: fx.Node, name: str) -> None:
    """Give ``node`` exactly ``name`` (fx's own renaming would make ``0`` into ``_0``); the caller keeps names unique."""
    namespace = graph._graph_namespace
    namespace._used_names.add(name)
    namespace._rename_object(node, name)
    node.name = name


def canonical_names(graph: fx.Graph) -> None:
    """Name each ``call_module`` node after its module (``bert.pooler.dense`` -> ``bert_pooler_dense``)."""
    live = {n.name for n in graph.nodes}
    for node in graph.nodes:
        if node.op == "call_module":
            wanted = re.sub(r"\W", "_", graph._target_to_str(node.target))
            if wanted not in live:
                live.discard(node.name)
                live.add(wanted)
                rename_node(graph, node, wanted)
