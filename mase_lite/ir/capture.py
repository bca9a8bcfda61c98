"""Capture: non-strict ``torch.export``, then raise the aten graph back to module level.

Every call of a leaf module (Linear, Conv, Embedding, LayerNorm, Dropout, activations, ...)
becomes one ``call_module`` node; the GraphModule is rooted at the original model, so its
parameters are the model's own Parameter objects.

Example::

    gm = capture(model, {"x": torch.randn(4, 16)})
    gm(x=torch.randn(7, 16))
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import OrderedDict
from typing import Any, Iterator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim

from mase_lite.errors import UserError
from mase_lite.ir.modules import ScaledDotProductAttention
from mase_lite.ir.ops import is_leaf_class

logger = logging.getLogger(__name__)

_ATEN = torch.ops.aten


class CaptureError(UserError):
    """torch.export could not capture the model, or the inputs do not fit it."""


class MaseGraphModule(fx.GraphModule):
    """The captured GraphModule: rooted at the original model, called with the captured inputs."""


@contextlib.contextmanager
def _export_modes(model: nn.Module, leaf_types: tuple[type, ...]) -> Iterator[None]:
    """Non-leaf modules in train mode, leaf modules in eval mode; restored afterwards.

    Functional dropout inside non-leaf modules is then visible as ``dropout(x, p, True)`` and
    can be turned into a module node, while leaf modules regain run-time control as nodes.
    """
    saved = {m: m.training for m in model.modules()}
    try:
        for m in model.modules():
            m.training = not is_leaf_class(type(m), leaf_types)
        yield
    finally:
        for m, mode in saved.items():
            m.training = mode


TRAIN_DROPOUT = "mase_train_dropout_p"


class DropoutRecorder:
    """Traces functional dropout and SDPA as in eval mode, recording train mode's probabilities.

    Tracing dropout is costly (its random mask is traced with symbolic shapes), so during export
    they run with dropout off; the probability each call would use in train mode is recorded in
    call order and attached to the matching nodes by :meth:`annotate`.
    """

    def __init__(self) -> None:
        self.dropout: list[float] = []
        self.sdpa: list[float] = []
        self._depth = 0

    def _record(self, into: list[float], p: float, call):
        """Record ``p`` for the outermost call only: torch-function modes re-enter these functions."""
        if self._depth == 0:
            into.append(p)
        self._depth += 1
        try:
            return call()
        finally:
            self._depth -= 1

    @contextlib.contextmanager
    def patch(self) -> Iterator[None]:
        dropout, sdpa = F.dropout, F.scaled_dot_product_attention

        def recorded_dropout(input, p=0.5, training=True, inplace=False):
            return self._record(self.dropout, float(p) if training else 0.0, lambda: dropout(input, p, False, inplace))

        def recorded_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            return self._record(
                self.sdpa,
                float(dropout_p),
                lambda: sdpa(query, key, value, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa),
            )

        F.dropout, F.scaled_dot_product_attention = recorded_dropout, recorded_sdpa
        try:
            yield
        finally:
            F.dropout, F.scaled_dot_product_attention = dropout, sdpa

    def annotate(self, graph: fx.Graph) -> bool:
        """Attach the recorded probabilities to the nodes; False when the calls do not match them."""
        drops = [n for n in graph.nodes if n.target is _ATEN.dropout.default]
        sdpas = [n for n in graph.nodes if n.target is _ATEN.scaled_dot_product_attention.default]
        if len(drops) != len(self.dropout) or len(sdpas) != len(self.sdpa):
            return False
        for node, p in zip(drops + sdpas, self.dropout + self.sdpa):
            node.meta[TRAIN_DROPOUT] = p
        return True


def _describe_export_failure(model: nn.Module, err: Exception) -> str:
    text = str(err)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    where = re.findall(r'File "([^"]+)", line (\d+)', text)
    head = lines[0] if lines else type(err).__name__
    msg = f"torch.export could not capture {type(model).__name__}: {type(err).__name__}: {head}"
    if where:
        path, line = where[-1]
        msg += f" (at {path}:{line})"
    return msg


def export_model(
    model: nn.Module,
    example_inputs: dict[str, Any],
    dynamic_shapes: dict[str, Any] | None,
    leaf_types: tuple[type, ...],
    preserve: tuple[str, ...] = (),
) -> torch.export.ExportedProgram:
    """Non-strict export with the train/eval split of :func:`_export_modes`."""
    with _export_modes(model, leaf_types), torch.no_grad():
        try:
            return torch.export.export(
                model,
                (),
                dict(example_inputs),
                strict=False,
                dynamic_shapes=dynamic_shapes,
                preserve_module_call_signature=preserve,
            )
        except Exception as err:
            raise CaptureError(_describe_export_failure(model, err)) from err


def default_dynamic_shapes(example_inputs: dict[str, Any], seq_inputs: set[str]) -> dict[str, Any]:
    """Dim 0 of every tensor input is the batch; dim 1 of token-like inputs is the sequence."""
    shapes: dict[str, Any] = {}
    for name, value in example_inputs.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            dims = {0: Dim.AUTO}
            if name in seq_inputs and value.dim() >= 2:
                dims[1] = Dim.AUTO
            shapes[name] = dims
        else:
            shapes[name] = None
    return shapes


def _leaf_of(node: fx.Node, modules: dict[str, nn.Module], leaf_types: tuple[type, ...]) -> tuple[str, str] | None:
    """(call key, module fqn) of the outermost leaf module that ``node`` belongs to."""
    stack = node.meta.get("nn_module_stack") or {}
    for key, (fqn, _) in stack.items():
        module = modules.get(fqn)
        if module is not None and is_leaf_class(type(module), leaf_types):
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
    leaf_types: tuple[type, ...],
    signatures: dict[str, list] | None = None,
) -> int:
    """Replace each leaf-module call's aten nodes by one ``call_module`` node; returns how many."""
    groups: OrderedDict[str, tuple[str, list[fx.Node]]] = OrderedDict()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        leaf = _leaf_of(node, modules, leaf_types)
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
        if len(outputs) != 1 or not inputs:
            logger.debug("leaving %s (%s) inlined: %d outputs, inputs not matched", key, fqn, len(outputs))
            continue
        out = outputs[0]
        if any(order[a] > order[out] for a in inputs):
            continue
        with graph.inserting_before(out):
            new = graph.create_node("call_module", fqn, tuple(inputs))
        new.meta = dict(out.meta)
        order[new] = order[out]
        replaced[out] = new
        out.replace_all_uses_with(new)
        for n in sorted(nodes, key=order.__getitem__, reverse=True):
            graph.erase_node(n)
        raised += 1
    return raised


def _owner_name(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    fqn = list(stack.values())[-1][0]
    return fqn.replace(".", "_")


def _unique_attr(root: nn.Module, base: str) -> str:
    name, i = base, 1
    while hasattr(root, name):
        name, i = f"{base}_{i}", i + 1
    return name


def modularise_training_constants(gm: fx.GraphModule) -> int:
    """Turn dropout and SDPA whose train-mode ``p > 0`` into modules that follow train/eval mode."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _ATEN.dropout.default:
            traced = float(node.args[1]) if len(node.args) == 3 and node.args[2] is True else 0.0
            dropout_p = node.meta.get(TRAIN_DROPOUT, traced)
            if not dropout_p:
                continue
            module = nn.Dropout(dropout_p)
            args, kwargs, suffix = (node.args[0],), {}, "dropout"
        elif node.target is _ATEN.scaled_dot_product_attention.default:
            traced = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
            dropout_p = node.meta.get(TRAIN_DROPOUT, traced)
            if not dropout_p:
                continue
            module = ScaledDotProductAttention(float(dropout_p))
            q, k, v = node.args[:3]
            kwargs = {"attn_mask": node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")}
            if len(node.args) > 5 or "is_causal" in node.kwargs:
                kwargs["is_causal"] = node.args[5] if len(node.args) > 5 else node.kwargs["is_causal"]
            for name in ("scale", "enable_gqa"):
                if name in node.kwargs:
                    kwargs[name] = node.kwargs[name]
            args, suffix = (q, k, v), "sdpa"
        else:
            continue
        name = _unique_attr(gm, f"{_owner_name(node)}_{suffix}".strip("_"))
        gm.add_submodule(name, module)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, args, kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed += 1
    return changed


def _canonical_names(graph: fx.Graph) -> None:
    """Name each ``call_module`` node after its module (``bert.pooler.dense`` -> ``bert_pooler_dense``)."""
    live = {n.name for n in graph.nodes}
    namespace = graph._graph_namespace
    for node in graph.nodes:
        if node.op == "call_module":
            wanted = re.sub(r"\W", "_", graph._target_to_str(node.target))
            if wanted not in live:
                live.discard(node.name)
                live.add(wanted)
                namespace._used_names.add(wanted)
                namespace._rename_object(node, wanted)
                node.name = wanted


def _attr(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def build_graph_module(model: nn.Module, exported: fx.GraphModule) -> MaseGraphModule:
    """A GraphModule over ``exported.graph`` whose module tree is ``model``'s own."""
    graph = exported.graph
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    attrs: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            try:
                attrs[node.target] = _attr(model, node.target)
            except AttributeError:
                attrs[node.target] = _attr(exported, node.target)
    gm = MaseGraphModule(attrs, graph, class_name=type(model).__name__)
    for name, child in model.named_children():
        setattr(gm, name, child)
    for name, value in list(model.named_parameters(recurse=False)) + list(model.named_buffers(recurse=False)):
        setattr(gm, name, value)
    for attr in ("_in_spec", "_out_spec"):
        if hasattr(exported, attr):
            setattr(gm, attr, getattr(exported, attr))
    return gm


def capture(
    model: nn.Module,
    example_inputs: dict[str, Any],
    dynamic_shapes: dict[str, Any] | None = None,
    leaf_modules: tuple[type, ...] = (),
) -> tuple[MaseGraphModule, torch.export.ExportedProgram]:
    """Export ``model`` on keyword ``example_inputs`` and raise it to module level."""
    preserve = tuple(
        name for name, m in model.named_modules() if name and leaf_modules and isinstance(m, leaf_modules)
    )
    recorder = DropoutRecorder()
    with recorder.patch():
        ep = export_model(model, example_inputs, dynamic_shapes, leaf_modules, preserve)
    exported = ep.module(check_guards=False)
    if not recorder.annotate(exported.graph):
        logger.debug("functional dropout calls do not match the graph: tracing dropout instead")
        ep = export_model(model, example_inputs, dynamic_shapes, leaf_modules, preserve)
        exported = ep.module(check_guards=False)
    signatures: dict[str, list] = {}
    for entry in ep.module_call_graph:
        if entry.signature is not None and entry.fqn:
            signatures.setdefault(entry.fqn.split("@")[0], []).append(entry.signature)
    modules = dict(model.named_modules())
    raise_leaf_calls(exported.graph, modules, leaf_modules, signatures)
    gm = build_graph_module(model, exported)
    modularise_training_constants(gm)
    gm.graph.eliminate_dead_code()
    _canonical_names(gm.graph)
    gm.train(model.training)
    gm.graph.lint()
    gm.recompile()
    return gm, ep
