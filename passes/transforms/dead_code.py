"""``dead_code``: erase nodes whose results nobody uses; optionally delete modules no node calls.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> mg, _ = ml.passes.remove_dropout(mg)       # leaves the Dropout module in the tree, uncalled
>>> mg, info = ml.passes.dead_code(mg, {"delete_unused_modules": True})
>>> info["removed_nodes"], info["deleted_modules"]
([], ['drop'])
"""

from __future__ import annotations

import logging

from pydantic import Field

from mase_lite.passes.registry import PassParams, PassResult, register_pass

logger = logging.getLogger(__name__)


class DeadCodeParams(PassParams):
    """Whether to also delete submodules that no node calls or reads."""

    delete_unused_modules: bool = Field(
        False, description="also delete submodules no node uses (edits the model tree, changing its state dict)"
    )


@register_pass("dead_code", kind="transform", params=DeadCodeParams)
def dead_code(mg, params: DeadCodeParams):
    """Erase side-effect-free nodes without users (and, if asked, the submodules left unused)."""
    graph = mg.model.graph
    before = {n.name for n in graph.nodes}
    graph.eliminate_dead_code()
    removed = [name for name in before if name not in {n.name for n in graph.nodes}]
    deleted = []
    if params.delete_unused_modules:
        modules_before = set(dict(mg.model.named_modules()))
        mg.model.delete_all_unused_submodules()
        deleted = sorted(modules_before - set(dict(mg.model.named_modules())))
    logger.info("dead code: %d nodes erased, %d modules deleted", len(removed), len(deleted))
    return PassResult({"removed_nodes": sorted(removed), "deleted_modules": deleted})
