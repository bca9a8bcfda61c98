"""``remove_dropout``: take dropout out of the graph (module nodes and ``aten.dropout`` calls).

Each removed node's users read its input instead. The Dropout modules stay in the model tree,
unused; ``dead_code`` with ``delete_unused_modules`` deletes them.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> mg, info = ml.passes.remove_dropout(mg)
>>> info["removed"], [n.name for n in mg.nodes]
(['drop'], ['input_1', 'fc1', 'act', 'fc2', 'output'])
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
from pydantic import Field

from mase_lite.passes.registry import PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes

logger = logging.getLogger(__name__)

_DROPOUT_FUNCTIONS = (torch.ops.aten.dropout.default, torch.ops.aten.feature_dropout.default, torch.nn.functional.dropout)


class RemoveDropoutParams(Selection):
    """Which dropout nodes to remove (all by default; a graph without dropout only logs a warning)."""

    targets: list[str] = Field(default_factory=lambda: ["dropout"], description="ops, node names or patterns")
    allow_empty: bool = Field(True, description="warn instead of failing when nothing matches")


def _is_dropout(node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return isinstance(modules.get(node.target), nn.modules.dropout._DropoutNd)
    return node.op == "call_function" and node.target in _DROPOUT_FUNCTIONS


@register_pass("remove_dropout", kind="transform", params=RemoveDropoutParams)
def remove_dropout(mg, params: RemoveDropoutParams):
    """Rewire every selected dropout node's users to its input and erase the node."""
    modules = mg.modules
    removed = []
    for node in select_nodes(mg, params.by, params.targets, params.allow_empty):
        if not _is_dropout(node, modules):
            continue
        node.replace_all_uses_with(node.args[0])
        mg.model.graph.erase_node(node)
        removed.append(node.name)
    logger.info("removed %d dropout nodes", len(removed))
    return PassResult({"removed": removed})
