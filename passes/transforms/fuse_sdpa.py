"""``fuse_sdpa`` and ``unfuse_sdpa``: naive attention <-> ``F.scaled_dot_product_attention``.

The naive pattern is ``matmul(q, kᵀ)`` → ``· scale`` (mul or div by a number; optional) →
a mask (optional) → ``softmax(-1)`` → dropout (optional: a Dropout module node or an eval-mode
``aten.dropout``) → ``matmul(·, v)``; ``kᵀ`` may be a transpose or permute of k. The mask is either
added (``+ mask``, a float tensor) or filled in (``masked_fill(where, value)`` with a bool ``where`` and
``value`` = ``-inf`` or the dtype's lowest finite number, ``torch.finfo(dtype).min``); other fill values
are left alone, since the fused kernel cannot reproduce them on a row whose keys are all masked.
A ``-inf`` fill becomes a bool mask, so such a row gives zeros fused where the naive softmax gives NaN.
The chain becomes one ``ScaledDotProductAttention`` module node whose dropout follows the module's
train/eval mode, like the Dropout it replaces. ``unfuse_sdpa`` writes the same chain back as aten
nodes (a bool mask becomes ``masked_fill(not mask, -inf)``, which ``fuse_sdpa`` matches again; the
dropout becomes an ``nn.Dropout`` module node).

>>> import math, torch, torch.nn as nn, mase_lite as ml
>>> class Attention(nn.Module):
...     def forward(self, q, k, v, mask):  # mask: True where a key may be attended to
...         scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
...         return torch.softmax(scores, dim=-1) @ v
>>> q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)
>>> mask = torch.rand(2, 1, 6, 6) > 0.3
>>> mask[..., 0] = True                     # every query sees at least one key
>>> mg = ml.MaseGraph(Attention(), example_inputs={"q": q, "k": k, "v": v, "mask": mask})
>>> naive = mg.model(q=q, k=k, v=v, mask=mask)
>>> mg, info = ml.passes.fuse_sdpa(mg)
>>> info
{'fused': [{'node': 'sdpa', 'scale': 0.35355339059327373, 'dropout_p': 0.0, 'masked': True}]}
>>> torch.allclose(mg.model(q=q, k=k, v=v, mask=mask), naive, atol=1e-6)
True
>>> mg, info = ml.passes.unfuse_sdpa(mg)
>>> info
{'unfused': ['sdpa'], 'kept': []}

An eager-attention BERT (``attn_implementation="eager"``) gets one fused node per layer.
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.ir.modules import ScaledDotProductAttention
from mase_lite.passes.registry import NoParams, PassResult, register_pass

logger = logging.getLogger(__name__)

_ATEN = torch.ops.aten
_MATMULS = (_ATEN.matmul.default, _ATEN.bmm.default)
_SOFTMAXES = (_ATEN.softmax.int, _ATEN._softmax.default, _ATEN._safe_softmax.default)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_NOTS = (_ATEN.bitwise_not.default, _ATEN.logical_not.default)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _is_call(node: Any, targets: tuple) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _last_dim(node: fx.Node, dim: Any) -> bool:
    val = _val(node)
    return isinstance(dim, int) and val is not None and dim in (-1, val.dim() - 1)


def _swaps_last_two(node: fx.Node) -> bool:
    """Whether ``node`` is a transpose/permute of its input swapping only the last two dims."""
    val = _val(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    if val is None or val.dim() < 2:
        return False
    rank = val.dim()
    if _is_call(node, (_ATEN.transpose.int,)):
        return sorted(d % rank for d in node.args[1:3]) == [rank - 2, rank - 1]
    if _is_call(node, (_ATEN.permute.default,)):
        return [d % rank for d in node.args[1]] == [*range(rank - 2), rank - 1, rank - 2]
    return False


def _owner(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0].replace(".", "_") if stack else ""


def _add_module(gm: fx.GraphModule, base: str, module: nn.Module) -> str:
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    module.train(gm.training)
    gm.add_submodule(name, module)
    return name


def _single_user(node: fx.Node) -> bool:
    return len(node.users) == 1


@dataclass
class NaiveAttention:
    """One matched naive-attention chain."""

    output: fx.Node
    query: fx.Node
    key_t: fx.Node
    value: fx.Node
    mask: fx.Node | None  # an additive float mask, or the bool ``where`` of a masked_fill (then ``fill`` is set)
    fill: float | None
    scale: float
    dropout_p: float
    chain: list[fx.Node] = field(default_factory=list)


def _scaled_scores(node: Any) -> tuple[fx.Node, float] | None:
    """``(matmul node, scale)`` when ``node`` is ``matmul(q, kᵀ)``, optionally times or over a number."""
    if _is_call(node, (_ATEN.mul.Tensor, _ATEN.mul.Scalar)):
        a, b = node.args[:2]
        inner, number = (a, b) if isinstance(b, (int, float)) else (b, a)
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            return None
        scale = float(number)
    elif _is_call(node, (_ATEN.div.Tensor, _ATEN.div.Scalar)) and not node.kwargs:
        inner, number = node.args[:2]
        if not isinstance(number, (int, float)) or isinstance(number, bool) or number == 0:
            return None
        scale = 1.0 / float(number)
    else:
        inner, scale = node, 1.0
    if inner is not node and not _single_user(inner):
        return None
    if not _is_call(inner, _MATMULS):
        return None
    return inner, scale


def _masked_scores(node: Any) -> tuple[fx.Node, fx.Node, float | None] | None:
    """``(scores, mask, fill)`` when ``node`` masks scaled scores: ``scores + mask`` (fill None) or
    ``masked_fill(scores, mask, fill)`` with a bool mask and a fill of -inf or the dtype's lowest number."""
    if _is_call(node, (_ATEN.add.Tensor,)) and not node.kwargs and _single_user(node):
        for candidate, other in (node.args[:2], node.args[1::-1]):
            if isinstance(other, fx.Node) and isinstance(candidate, fx.Node) and _scaled_scores(candidate):
                return candidate, other, None
        return None
    if _is_call(node, (_ATEN.masked_fill.Scalar,)) and not node.kwargs and _single_user(node):
        scores, where, fill = node.args[:3]
        where_val, scores_val = _val(where), _val(scores)
        if where_val is None or scores_val is None or where_val.dtype != torch.bool:
            return None
        if not isinstance(fill, float) or fill not in (-math.inf, torch.finfo(scores_val.dtype).min):
            return None
        if isinstance(scores, fx.Node) and _scaled_scores(scores):
            return scores, where, fill
    return None


def match_naive_attention(node: fx.Node, modules: dict[str, nn.Module]) -> NaiveAttention | None:
    """The naive-attention chain ending at ``node`` (the ``matmul(probs, v)``), or None."""
    if not _is_call(node, _MATMULS):
        return None
    probs, value = node.args[:2]
    chain = [node]
    dropout_p = 0.0
    if isinstance(probs, fx.Node) and probs.op == "call_module" and isinstance(modules.get(probs.target), nn.Dropout):
        dropout_p = float(modules[probs.target].p)
        chain.append(probs)
        probs = probs.args[0]
    elif _is_call(probs, (_ATEN.dropout.default,)):
        if probs.args[2] is not False:
            return None
        chain.append(probs)
        probs = probs.args[0]
    if not _is_call(probs, _SOFTMAXES) or not _single_user(probs) or not _last_dim(probs.args[0], probs.args[1]):
        return None
    if (len(probs.args) > 2 and probs.args[2] not in (None, False)) or probs.kwargs:
        return None
    chain.append(probs)
    scores, mask, fill = probs.args[0], None, None
    if _is_call(scores, (_ATEN.add.Tensor, _ATEN.masked_fill.Scalar)):
        masked = _masked_scores(scores)
        if masked is None:
            return None
        chain.append(scores)
        scores, mask, fill = masked
    matched = _scaled_scores(scores) if _single_user(scores) else None
    if matched is None:
        return None
    qk, scale = matched
    chain.extend([scores, qk] if scores is not qk else [qk])
    query, key_t = qk.args[:2]
    if not all(isinstance(n, fx.Node) for n in (query, key_t, value)):
        return None
    vals = [_val(n) for n in (query, key_t, value, node)]
    if any(v is None for v in vals) or len({v.dim() for v in vals}) != 1 or vals[0].dim() < 2:
        return None
    if len({v.dtype for v in vals}) != 1 or not vals[0].is_floating_point():
        return None
    if mask is not None:
        mask_val, add_val = _val(mask), _val(probs.args[0])
        if mask_val is None or add_val is None or mask_val.dtype != (vals[0].dtype if fill is None else torch.bool):
            return None
        if mask_val.dim() > vals[0].dim() or add_val.shape != _val(qk).shape:
            return None
    return NaiveAttention(node, query, key_t, value, mask, fill, scale, dropout_p, chain)


def _fake_call(node: fx.Node) -> None:
    """Fill ``meta["val"]`` of a new call_function node by running it on the inputs' fake values."""
    args = fx.node.map_aggregate(node.args, lambda a: _val(a) if isinstance(a, fx.Node) else a)
    kwargs = fx.node.map_aggregate(node.kwargs, lambda a: _val(a) if isinstance(a, fx.Node) else a)
    if all(_val(n) is not None for n in node.all_input_nodes):
        node.meta["val"] = node.target(*args, **kwargs)


def _attn_mask(graph: fx.Graph, found: NaiveAttention, stack: Any) -> tuple[fx.Node, fx.Node | None]:
    """The SDPA ``attn_mask`` for a matched mask, and a negation node that may become dead.

    Inserted at the graph's current insertion point. ``masked_fill(where, -inf)`` becomes the bool
    mask ``not where`` (``where`` itself when it is a negation); ``masked_fill(where, lowest)``
    becomes the float mask ``zeros.masked_fill(where, lowest)``, added like an additive mask.
    """

    def call(target, args, kwargs=None) -> fx.Node:
        new = graph.call_function(target, args, kwargs or {})
        new.meta["nn_module_stack"] = stack
        _fake_call(new)
        return new

    where = found.mask
    if found.fill is None:
        return where, None
    if found.fill == -math.inf:
        if _is_call(where, _NOTS) and _val(where.args[0]) is not None and _val(where.args[0]).dtype == torch.bool:
            return where.args[0], where
        return call(_ATEN.logical_not.default, (where,)), None
    zeros = call(_ATEN.zeros_like.default, (where,), {"dtype": _val(found.query).dtype})
    return call(_ATEN.masked_fill.Scalar, (zeros, where, found.fill)), None


def fuse_one(gm: fx.GraphModule, found: NaiveAttention) -> str:
    """Replace one matched chain with a ``ScaledDotProductAttention`` module node; returns its name."""
    graph = gm.graph
    stack = found.output.meta.get("nn_module_stack")
    name = _add_module(gm, f"{_owner(found.output)}_sdpa".strip("_"), ScaledDotProductAttention(found.dropout_p))
    with graph.inserting_before(found.output):
        if _swaps_last_two(found.key_t):
            key = found.key_t.args[0]
        else:
            key = graph.call_function(_ATEN.transpose.int, (found.key_t, -2, -1))
            key.meta["nn_module_stack"] = stack
            _fake_call(key)
        kwargs: dict[str, Any] = {"scale": found.scale}
        negation = None
        if found.mask is not None:
            kwargs["attn_mask"], negation = _attn_mask(graph, found, stack)
        fused = graph.call_module(name, (found.query, key, found.value), kwargs)
    fused.meta = dict(found.output.meta)
    found.output.replace_all_uses_with(fused)
    for node in found.chain:
        graph.erase_node(node)
    if not found.key_t.users and key is not found.key_t:
        graph.erase_node(found.key_t)
    if negation is not None and not negation.users:
        graph.erase_node(negation)
    return name


@register_pass("fuse_sdpa", kind="transform", params=NoParams)
def fuse_sdpa(mg, params: NoParams):
    """Replace every naive attention chain with one fused scaled-dot-product-attention node."""
    modules = mg.modules
    fused = []
    for node in list(mg.model.graph.nodes):
        found = match_naive_attention(node, modules)
        if found is not None:
            fused.append({"node": fuse_one(mg.model, found), "scale": found.scale, "dropout_p": found.dropout_p,
                          "masked": found.mask is not None})
    logger.info("fused %d attention blocks", len(fused))
    return PassResult({"fused": fused})


def sdpa_arguments(node: fx.Node, modules: dict[str, nn.Module]) -> dict[str, Any] | None:
    """The SDPA arguments of a fused node (module or aten call), by name; None for other nodes."""
    if node.op == "call_module" and isinstance(modules.get(node.target), ScaledDotProductAttention):
        module = modules[node.target]
        bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
        bound.apply_defaults()
        return dict(bound.arguments) | {"dropout_p": module.dropout_p}
    if _is_call(node, (_ATEN.scaled_dot_product_attention.default,)):
        named = dict(zip(_SDPA_ARGS, node.args)) | dict(node.kwargs)
        defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
        return defaults | named
    return None


def unfuse_one(gm: fx.GraphModule, node: fx.Node, a: dict[str, Any]) -> None:
    """Write one fused attention node as matmul → scale → mask → softmax → dropout → matmul."""
    graph = gm.graph
    stack = node.meta.get("nn_module_stack")
    query, key, value, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(int(_val(query).shape[-1]))

    def call(target, *args) -> fx.Node:
        new = graph.call_function(target, args)
        new.meta["nn_module_stack"] = stack
        _fake_call(new)
        return new

    with graph.inserting_before(node):
        scores = call(_ATEN.mul.Tensor, call(_ATEN.matmul.default, query, call(_ATEN.transpose.int, key, -2, -1)), scale)
        if isinstance(mask, fx.Node) and _val(mask) is not None and _val(mask).dtype == torch.bool:
            scores = call(_ATEN.masked_fill.Scalar, scores, call(_ATEN.logical_not.default, mask), float("-inf"))
        elif mask is not None:
            scores = call(_ATEN.add.Tensor, scores, mask)
        probs = call(_ATEN.softmax.int, scores, -1)
        if a["dropout_p"]:
            name = _add_module(gm, f"{_owner(node)}_attn_dropout".strip("_"), nn.Dropout(float(a["dropout_p"])))
            dropped = graph.call_module(name, (probs,))
            dropped.meta = {"nn_module_stack": stack, "val": _val(probs)}
            probs = dropped
        out = call(_ATEN.matmul.default, probs, value)
    out.meta = dict(node.meta)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    if node.op == "call_module" and not any(n.op == "call_module" and n.target == node.target for n in graph.nodes):
        gm.delete_submodule(node.target)


@register_pass("unfuse_sdpa", kind="transform", params=NoParams)
def unfuse_sdpa(mg, params: NoParams):
    """Write every fused attention node back as naive attention (causal and GQA calls are left fused)."""
    modules = mg.modules
    unfused, kept = [], []
    for node in list(mg.model.graph.nodes):
        a = sdpa_arguments(node, modules)
        if a is None:
            continue
        head_dim = _val(a["query"]).shape[-1] if _val(a["query"]) is not None else None
        if a["is_causal"] or a["enable_gqa"] or (a["scale"] is None and not isinstance(head_dim, int)):
            logger.warning("unfuse_sdpa: leaving %s fused (causal, GQA or unknown head size)", node.name)
            kept.append(node.name)
            continue
        unfused.append(node.name)
        unfuse_one(mg.model, node, a)
    return PassResult({"unfused": unfused, "kept": kept})
