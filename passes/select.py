"""Node selection shared by every pass that targets part of a graph: by op type, node name or regex.

One language for both modes: a graph's ``call_module`` nodes and a plain module's leaves (module mode,
:mod:`mase_lite.ir.module_model`) answer to their node name (``encoder_layer_0_query``) and to their
module path (``encoder.layer.0.query``), by name or by a regex matching either.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> [n.name for n in select_nodes(mg, by="type", targets=["linear", "relu"])]
['fc1', 'act', 'fc2']
>>> [n.name for n in select_nodes(mg, by="regex", targets=["fc[0-9]$"])]
['fc1', 'fc2']

On BERT: ``select_nodes(mg, by="regex", targets=[r".*attention_self_(query|key)$"])``. By type, ``"head"``
is the output head (an LLM's ``lm_head``, a classifier's last Linear), e.g. to leave it alone.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

import torch.fx as fx
from pydantic import Field

from mase_lite.passes.registry import PassError, PassParams

logger = logging.getLogger(__name__)

SelectBy = Literal["type", "name", "regex"]


class Selection(PassParams):
    """Which nodes a pass acts on."""

    by: SelectBy = Field("type", description="match targets against op types, node names, or regexes on node names")
    targets: list[str] = Field(default_factory=lambda: ["linear"], description="op types, node names or patterns")
    allow_empty: bool = Field(False, description="warn instead of failing when nothing matches")


HEAD = "head"


def is_output_head(node: fx.Node) -> bool:
    """Whether ``node`` is a module whose result reaches the graph's output through functions only (no other
    module): a language model's ``lm_head``, a classifier's last Linear.

    >>> from collections import OrderedDict
    >>> import torch, torch.nn as nn, mase_lite as ml
    >>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 2)))
    >>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
    >>> [n.name for n in mg.nodes if is_output_head(n)]
    ['fc2']
    """
    if node.op != "call_module":
        return False
    if hasattr(node, "head"):  # module mode: no data flow to follow (see mase_lite.ir.module_model)
        return node.head
    seen, frontier = set(), list(node.users)
    while frontier:
        user = frontier.pop()
        if user.op == "output":
            return True
        if user.op == "call_function" and user not in seen:
            seen.add(user)
            frontier.extend(user.users)
    return False


def node_matches(node: fx.Node, by: SelectBy, target: str) -> bool:
    """Whether ``node`` is selected by one ``target`` under rule ``by``; by type, ``"head"`` selects the
    output head (:func:`is_output_head`)."""
    meta = node.meta.get("mase", {})
    if by == "type":
        if target == HEAD:
            return is_output_head(node)
        return target in (meta.get("op"), meta.get("module"))
    if by == "name":
        return target in (node.name, node.target if node.op == "call_module" else None)
    return re.fullmatch(target, node.name) is not None or (
        node.op == "call_module" and re.fullmatch(target, str(node.target)) is not None
    )


def select_nodes(
    mg, by: SelectBy, targets: list[str], allow_empty: bool = False, modules_only: bool = False
) -> list[fx.Node]:
    """Nodes of ``mg`` matched by any of ``targets``; a clear error (or a warning) when none match."""
    if by == "regex":
        for t in targets:
            try:
                re.compile(t)
            except re.error as err:
                raise PassError(f"{t!r} is not a valid regex ({err})", location=("targets",)) from None
    candidates = [n for n in mg.nodes if not modules_only or n.op == "call_module"]
    chosen = [n for n in candidates if any(node_matches(n, by, t) for t in targets)]
    if not chosen:
        if by == "type":
            known = sorted({str(n.meta.get("mase", {}).get("op")) for n in candidates})
        else:
            known = [n.name for n in candidates][:40]
        msg = f"selection by {by} with targets {targets} matches no node; available: {', '.join(known)}"
        if not allow_empty:
            raise PassError(msg)
        logger.warning(msg)
    return chosen


def select_modules(mg, selection: Selection) -> dict[str, str]:
    """``{module target: first node calling it}`` for the modules ``selection`` picks, in graph order."""
    chosen: dict[str, str] = {}
    for node in select_nodes(mg, selection.by, selection.targets, selection.allow_empty, modules_only=True):
        chosen.setdefault(node.target, node.name)
    return chosen
