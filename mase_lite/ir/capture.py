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
import copy
import inspect
import logging
import operator
import os
import re
import traceback
from collections import OrderedDict
from typing import Any, Iterator

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim
from torch.overrides import TorchFunctionMode

from mase_lite.errors import UserError
from mase_lite.ir.capture_cache import CACHE, LogRecorder, Template, architecture_key, copy_graph, replay
from mase_lite.ir.inputs import sequence_dims
from mase_lite.ir.modules import ScaledDotProductAttention
from mase_lite.ir.ops import is_leaf_class

logger = logging.getLogger(__name__)

_ATEN = torch.ops.aten


class CaptureError(UserError):
    """torch.export could not capture the model, or the inputs do not fit it."""


class MaseGraphModule(fx.GraphModule):
    """The captured GraphModule: rooted at the original model, called with the captured inputs."""


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


@contextlib.contextmanager
def _export_modes(model: nn.Module, plan: LeafPlan | None) -> Iterator[None]:
    """Non-leaf modules in train mode, leaf modules in eval mode; restored afterwards.

    Functional dropout inside non-leaf modules is then visible as ``dropout(x, p, True)`` and
    can be turned into a module node, while leaf modules regain run-time control as nodes.
    With ``plan=None`` every module is in eval mode: the graph is the model's eval, exactly.
    """
    saved = {m: m.training for m in model.modules()}
    try:
        for name, m in model.named_modules():
            m.training = plan is not None and (name in plan.stochastic or not plan.is_leaf(name, m))
        yield
    finally:
        for m, mode in saved.items():
            m.training = mode


@contextlib.contextmanager
def caches_off(model: nn.Module) -> Iterator[None]:
    """``use_cache = False`` on every config of the model (decoders keep copies); restored afterwards.

    A cache object is not a tensor pytree, so export cannot return it: the graph is the model's
    forward without its key/value cache, and equals that bit for bit. The model's forward *with*
    a cache concatenates keys into fresh contiguous tensors, and a matmul on another memory layout
    may round differently on some CPUs (GPT-Neo on AMD EPYC: 6e-8), so compare under this context.
    """
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    changed = [c for c in configs.values() if getattr(c, "use_cache", False) is True]
    for c in changed:
        c.use_cache = False
    try:
        yield
    finally:
        for c in changed:
            c.use_cache = True


TRAIN_DROPOUT = "mase_train_dropout_p"
_DROPOUT = inspect.signature(F.dropout)


class DropoutRecorder(TorchFunctionMode):
    """Traces functional dropout and SDPA as in eval mode, recording train mode's probabilities.

    Tracing dropout is costly (its random mask is traced with symbolic shapes), so during export
    they run with dropout off; the probability each call would use in train mode is recorded in
    call order and attached to the matching nodes by :meth:`annotate`. A torch-function mode sees
    only the calls of the thread that entered it: ``torch.nn.functional`` itself is never changed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dropout: list[float] = []
        self.sdpa: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.dropout:
            call = _DROPOUT.bind(*args, **kwargs)
            call.apply_defaults()
            self.dropout.append(float(call.arguments["p"]) if call.arguments["training"] else 0.0)
            call.arguments["training"] = False
            args, kwargs = call.args, call.kwargs
        elif func is F.scaled_dot_product_attention:
            self.sdpa.append(float(args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)))
            if len(args) > 4:
                args = args[:4] + (0.0,) + args[5:]
            else:
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)

    def annotate(self, graph: fx.Graph) -> bool:
        """Attach the recorded probabilities to the nodes; False when the calls do not match them."""
        drops = [n for n in graph.nodes if n.target is _ATEN.dropout.default]
        sdpas = [n for n in graph.nodes if n.target is _ATEN.scaled_dot_product_attention.default]
        if len(drops) != len(self.dropout) or len(sdpas) != len(self.sdpa):
            return False
        for node, p in zip(drops + sdpas, self.dropout + self.sdpa):
            node.meta[TRAIN_DROPOUT] = p
        return True


def _owner_of_line(model: nn.Module, path: str, line: int) -> str | None:
    """The class (and qualified name) of the model's module whose forward holds ``path:line``."""
    seen: set[type] = set()
    for name, m in model.named_modules():
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            forward = inspect.unwrap(cls.forward)
            lines, start = inspect.getsourcelines(forward)
            source = inspect.getsourcefile(forward)
        except (OSError, TypeError):
            continue
        if source and os.path.samefile(source, path) and start <= line < start + len(lines):
            return f"{cls.__name__} ({name or 'the model'})"
    return None


_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, contextlib, np))


def _model_frame(err: BaseException) -> tuple[str | None, int, str]:
    """The innermost frame outside torch, numpy, the standard library and mase_lite, through chained errors."""
    skip = _LIBRARIES + (os.path.dirname(os.path.dirname(__file__)) + os.sep, "<")
    found: tuple[str | None, int, str] = (None, 0, "")
    seen: set[int] = set()
    chain: BaseException | None = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        frames = [f for f in traceback.extract_tb(chain.__traceback__) if not f.filename.startswith(skip)]
        if frames:
            found = (frames[-1].filename, frames[-1].lineno or 0, (frames[-1].line or "").strip())
        chain = chain.__cause__ or chain.__context__
    return found


def describe_export_failure(model: nn.Module, err: Exception) -> str:
    """torch's reason, the model's source line that raised it (and its module), and torch's suggestion."""
    text = str(err)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(err).__name__
    msg = f"torch.export could not capture {type(model).__name__}: {type(err).__name__}: {head}"
    call = re.search(r'raised this error:\s*File "([^"]+)", line (\d+), in \w+\n\s*(.*)', text)
    where = re.findall(r'File "([^"]+)", line (\d+)', text)
    if call:
        path, line, code = call.group(1), int(call.group(2)), call.group(3).strip()
    elif where:
        (path, line), code = (where[-1][0], int(where[-1][1])), ""
    else:
        path, line, code = _model_frame(err)
    if path:
        owner = os.path.exists(path) and _owner_of_line(model, path, line)
        msg += f"\n  at {path}:{line}" + (f" in {owner}" if owner else "") + (f": {code}" if code else "")
    msg += "".join(f"\n  {ln}" for ln in lines if ln.startswith("Caused by"))
    hints = [ln for ln in lines if re.match(r"(consider|suggested fix|you can|try)", ln, re.I)]
    msg += "".join(f"\n  torch suggests: {ln}" for ln in hints[:3])
    return msg


def export_model(
    model: nn.Module,
    example_inputs: dict[str, Any],
    dynamic_shapes: dict[str, Any] | None,
    plan: LeafPlan | None,
    preserve: tuple[str, ...] = (),
) -> torch.export.ExportedProgram:
    """Non-strict export with the modes of :func:`_export_modes` (``plan=None``: the model's eval)."""
    with _export_modes(model, plan), caches_off(model), torch.no_grad():
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
            raise CaptureError(describe_export_failure(model, err)) from err


def default_dynamic_shapes(example_inputs: dict[str, Any]) -> dict[str, Any]:
    """``Dim.AUTO`` on the batch and sequence dims of :func:`~mase_lite.ir.inputs.sequence_dims`."""
    dims = sequence_dims(example_inputs)
    return {name: ({d: Dim.AUTO for d in dims[name]} if name in dims else None) for name in example_inputs}


def dynamic_dims(dynamic_shapes: dict[str, Any] | None) -> dict[str, list[int]]:
    """The dims that ``dynamic_shapes`` makes dynamic, per input, in a JSON-friendly form.

    >>> dynamic_dims({"input_ids": {0: Dim.AUTO, 1: Dim.AUTO}, "x": None})
    {'input_ids': [0, 1]}
    """
    dims: dict[str, list[int]] = {}
    for name, spec in (dynamic_shapes or {}).items():
        if isinstance(spec, dict):
            dims[name] = sorted(int(d) for d, v in spec.items() if v is not None)
        elif isinstance(spec, (list, tuple)):
            dims[name] = [i for i, v in enumerate(spec) if v is not None]
    return {k: v for k, v in dims.items() if v}


def dynamic_shapes_of(dims: dict[str, list[int]], example_inputs: dict[str, Any]) -> dict[str, Any]:
    """``torch.export`` dynamic shapes (``Dim.AUTO``) from :func:`dynamic_dims`'s form."""
    return {name: ({int(d): Dim.AUTO for d in dims[name]} if dims.get(name) else None) for name in example_inputs}


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


def graph_module(model: nn.Module, graph: fx.Graph, extras: dict[str, Any], specs: dict[str, Any]) -> MaseGraphModule:
    """A GraphModule over ``graph`` whose module tree is ``model``'s own; ``extras`` are the graph's
    targets that are not the model's, ``specs`` the exported module's pytree input/output specs."""
    attrs = {
        node.target: extras[node.target] if node.target in extras else _attr(model, node.target)
        for node in graph.nodes
        if node.op in ("get_attr", "call_module")
    }
    gm = MaseGraphModule(attrs, graph, class_name=type(model).__name__)
    for name, child in model.named_children():
        setattr(gm, name, child)
    for name, value in list(model.named_parameters(recurse=False)) + list(model.named_buffers(recurse=False)):
        setattr(gm, name, value)
    for attr, spec in specs.items():
        setattr(gm, attr, spec)
    return gm


def build_graph_module(model: nn.Module, exported: fx.GraphModule) -> MaseGraphModule:
    """A GraphModule over ``exported.graph`` whose module tree is ``model``'s own.

    Tensors that export lifted out of a forward (``torch.tensor(...)`` made inside a submodule,
    ``<submodule>.lifted_tensor_0``) are not the model's: they move to the root under a
    flat name, so re-attaching the model's children cannot drop them.
    """
    graph = exported.graph
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    lifted: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            try:
                _attr(model, node.target)
            except AttributeError:
                value = _attr(exported, node.target)
                flat = re.sub(r"\W", "_", node.target)
                while hasattr(model, flat) or (flat in lifted and lifted[flat] is not value):
                    flat += "_"
                lifted[flat] = value
                node.target = flat
    specs = {attr: getattr(exported, attr) for attr in ("_in_spec", "_out_spec") if hasattr(exported, attr)}
    return graph_module(model, graph, lifted, specs)


# aten ops that draw random numbers (dropout is handled on its own).
_RANDOM_OPS = {
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
    "bernoulli_", "uniform_", "normal", "normal_", "exponential_", "multinomial", "native_dropout",
}


def _random_nodes(graph: fx.Graph) -> list[fx.Node]:
    return [
        n for n in graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._opname in _RANDOM_OPS
    ]


def _source_line(node: fx.Node) -> str:
    """``file:line: code`` of the model's source that made ``node`` (the innermost frame)."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)', node.meta.get("stack_trace") or "")
    if not frames:
        return "an unknown source line"
    path, line, code = frames[-1]
    return f"{path}:{line}: {code.strip()}"


def _innermost(node: fx.Node) -> tuple[str, str]:
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if not stack:
        return "", "the model"
    fqn, cls = stack[-1]
    return fqn, getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1].strip("'>"))


def _stochastic_modules(graph: fx.Graph, modules: dict[str, nn.Module]) -> tuple[set[str], list[str]]:
    """Modules whose train mode draws random numbers: parameter-free ones (become leaves), and the rest (reasons)."""
    leaves, reasons = set(), []
    for node in _random_nodes(graph):
        fqn, cls = _innermost(node)
        module = modules.get(fqn)
        if fqn and module is not None and next(module.parameters(), None) is None:
            leaves.add(fqn)
        else:
            reasons.append(f"{cls} ({fqn or 'the model'}) draws random numbers in train mode at {_source_line(node)}")
    return leaves, reasons


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def first_difference(expected: Any, got: Any) -> str | None:
    """Where two outputs differ (bit for bit, NaN equal to NaN); ``None`` when identical."""
    a, b = _tensors(expected), _tensors(got)
    if len(a) != len(b):
        return f"{len(b)} output tensors instead of {len(a)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {i}: {tuple(y.shape)} {y.dtype} instead of {tuple(x.shape)} {x.dtype}"
        if not torch.equal(x, y) and not bool(((x == y) | (x.isnan() & y.isnan())).all()):
            diff = (x.double() - y.double()).abs().nan_to_num(nan=float("inf")).max().item()
            return f"output {i} differs (max abs difference {diff:.3g})"
    return None


@contextlib.contextmanager
def _kept_state(*modules: nn.Module) -> Iterator[None]:
    """Modes, buffers (running statistics) and the RNG state, restored afterwards."""
    modes = {m: m.training for root in modules for m in root.modules()}
    buffers = {id(b): (b, b.detach().clone()) for root in modules for b in root.buffers()}
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode
        with torch.no_grad():
            for b, saved in buffers.values():
                b.copy_(saved)
        torch.set_rng_state(rng)


def _seed() -> None:
    """Seed the generators a forward can draw from (``torch.manual_seed`` also wakes every backend: slower)."""
    torch.default_generator.manual_seed(0)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(0)


def compare_with_model(gm: nn.Module, model: nn.Module, inputs: dict[str, Any], train: bool = False) -> str | None:
    """Run graph and model on ``inputs`` (in train mode under one seed) and say how they differ."""
    with _kept_state(gm, model), torch.no_grad(), caches_off(model):
        gm.train(train)
        model.train(train)
        _seed()
        expected = model(**inputs)
        _seed()
        got = gm(**inputs)
        return first_difference(expected, got)


class TrainModeLimit:
    """Forward pre-hook refusing train mode on a graph that follows the model in eval mode only."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons

    def message(self) -> str:
        return (
            "this graph follows the model in eval mode only; its train mode could not be captured:\n  "
            + "\n  ".join(self.reasons)
            + "\nTo train through the graph, turn that train-only branch off (e.g. config.layerdrop = 0, "
            "drop_path_rate = 0) or make its module a leaf (leaf_modules=[...]), and capture again."
        )

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if module.training:
            raise CaptureError(self.message())


def _raise_to_modules(model: nn.Module, ep: torch.export.ExportedProgram, plan: LeafPlan) -> MaseGraphModule:
    exported = ep.module(check_guards=False)
    signatures: dict[str, list] = {}
    for entry in ep.module_call_graph:
        if entry.signature is not None and entry.fqn:
            signatures.setdefault(entry.fqn.split("@")[0], []).append(entry.signature)
    modules = dict(model.named_modules())
    raise_leaf_calls(exported.graph, modules, plan, signatures)
    gm = build_graph_module(model, exported)
    modularise_training_constants(gm)
    gm.graph.eliminate_dead_code()
    _canonical_names(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return gm


def _export_recorded(model, example_inputs, dynamic_shapes, plan, preserve):
    """Export in the train/eval split, recording functional dropout (traced again with it when they do not match)."""
    recorder = DropoutRecorder()
    with recorder:
        ep = export_model(model, example_inputs, dynamic_shapes, plan, preserve)
    if not recorder.annotate(ep.graph_module.graph):
        logger.debug("functional dropout calls do not match the graph: tracing dropout instead")
        ep = export_model(model, example_inputs, dynamic_shapes, plan, preserve)
    return ep


def _template(model: nn.Module, gm: MaseGraphModule, limits: list[str], records: list) -> Template:
    """``gm``'s graph and its own modules and constants, copied, without the model's weights."""
    extras = {}
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            try:
                _attr(model, node.target)
            except AttributeError:
                extras[node.target] = copy.deepcopy(_attr(gm, node.target))
    specs = {attr: getattr(gm, attr) for attr in ("_in_spec", "_out_spec") if hasattr(gm, attr)}
    return Template(copy_graph(gm.graph), extras, specs, list(limits), records)


def _from_template(
    model: nn.Module, template: Template, example_inputs: dict[str, Any], verify: bool
) -> MaseGraphModule | None:
    """The stored graph bound to ``model``, checked as a fresh capture is; ``None`` when the check fails."""
    extras = {k: copy.deepcopy(v) for k, v in template.extras.items()}
    try:
        gm = graph_module(model, copy_graph(template.graph), extras, template.specs)
        problem = compare_with_model(gm, model, example_inputs)
        if problem is None and verify and not template.train_limits:
            problem = compare_with_model(gm, model, example_inputs, train=True)
    except Exception as err:  # a size or attribute the stored graph does not fit: capture afresh
        problem = f"{type(err).__name__}: {err}"
    if problem is not None:
        logger.info("the stored graph of %s does not fit this model (%s): capturing afresh", type(model).__name__, problem)
        return None
    replay(template.records)
    if template.train_limits:
        gm.register_forward_pre_hook(TrainModeLimit(list(template.train_limits)), with_kwargs=True)
    gm.train_limits = list(template.train_limits)
    gm.train(model.training)
    return gm


def capture(
    model: nn.Module,
    example_inputs: dict[str, Any],
    dynamic_shapes: dict[str, Any] | None = None,
    leaf_modules: tuple[type, ...] = (),
    verify: bool = False,
    cache: bool = True,
) -> MaseGraphModule:
    """Export ``model`` on keyword ``example_inputs`` and raise it to module level.

    The graph in eval mode is the model's eval, bit for bit (checked on the example inputs).
    Train mode keeps dropout and drop-path as module nodes; where the model's train mode cannot
    be a graph (layerdrop: control flow on a random number), the graph refuses train mode with
    the reason. ``verify`` also checks train mode against the model under the same seed.
    With ``cache``, a model whose architecture was captured before in the process reuses that
    graph (:mod:`mase_lite.ir.capture_cache`), bound to its own weights and checked the same way.
    """
    leaf_modules = tuple(leaf_modules)
    key = architecture_key(model, example_inputs, dynamic_shapes, leaf_modules) if cache else None
    template = CACHE.get(key) if key is not None else None
    if template is not None:
        gm = _from_template(model, template, example_inputs, verify)
        if gm is not None:
            return gm
    recorder = LogRecorder()
    ir_logger = logging.getLogger("mase_lite.ir")
    ir_logger.addHandler(recorder)
    try:
        gm, limits = _capture(model, example_inputs, dynamic_shapes, leaf_modules, verify)
    finally:
        ir_logger.removeHandler(recorder)
    if key is not None:  # also under the key of the model as the capture left it (a forward may set config fields)
        template = _template(model, gm, limits, recorder.records)
        for k in {key, architecture_key(model, example_inputs, dynamic_shapes, leaf_modules)}:
            CACHE.put(k, template)
    gm.train_limits = limits
    gm.train(model.training)
    return gm


def _capture(
    model: nn.Module,
    example_inputs: dict[str, Any],
    dynamic_shapes: dict[str, Any] | None,
    leaf_modules: tuple[type, ...],
    verify: bool,
) -> tuple[MaseGraphModule, list[str]]:
    """The export, raise and checks of :func:`capture`: the graph and why its train mode is refused, if so."""
    plan = LeafPlan(model, leaf_modules)
    preserve = tuple(name for name, m in model.named_modules() if name and leaf_modules and isinstance(m, leaf_modules))
    modules = dict(model.named_modules())
    limits: list[str] = []
    try:
        ep = _export_recorded(model, example_inputs, dynamic_shapes, plan, preserve)
    except CaptureError as train_err:
        ep = None
        limits.append(str(train_err).replace("torch.export could not capture", "train mode of", 1))
    if ep is not None:
        stochastic, reasons = _stochastic_modules(ep.graph_module.graph, modules)
        if stochastic - plan.stochastic:
            plan.stochastic |= stochastic
            logger.info("modules drawing random numbers in train mode become nodes: %s", ", ".join(sorted(stochastic)))
            ep = _export_recorded(model, example_inputs, dynamic_shapes, plan, preserve)
        gm = _raise_to_modules(model, ep, plan)
        problem = compare_with_model(gm, model, example_inputs)
        if problem is not None:
            limits.extend(reasons or [f"traced in train mode, the graph's eval differs from the model's: {problem}"])
    if limits:
        logger.warning("%s: capturing its eval mode only (%s)", type(model).__name__, limits[0].splitlines()[0])
        ep = export_model(model, example_inputs, dynamic_shapes, None, preserve)
        gm = _raise_to_modules(model, ep, plan)
        gm.register_forward_pre_hook(TrainModeLimit(limits), with_kwargs=True)
        problem = compare_with_model(gm, model, example_inputs)
        if problem is not None:
            raise CaptureError(
                f"the captured graph of {type(model).__name__} does not match the model in eval mode: {problem}. "
                "Capture with verify=True after making the differing module a leaf (leaf_modules=[...])."
            )
    elif verify:
        problem = compare_with_model(gm, model, example_inputs, train=True)
        if problem is not None:
            raise CaptureError(f"the captured graph of {type(model).__name__} does not match the model in train mode: {problem}")
    return gm, limits
