"""Capture: non-strict ``torch.export``, then raise the aten graph back to module level.

Every call of a leaf module (Linear, Conv, Embedding, LayerNorm, Dropout, activations, ...)
becomes one ``call_module`` node; the GraphModule is rooted at the original model, so its
parameters are the model's own Parameter objects. The jobs live in their own modules: export and
its failure diagnostics (:mod:`~mase_lite.ir.export`), raising leaf calls (:mod:`~mase_lite.ir.leaves`),
train mode (:mod:`~mase_lite.ir.train_mode`), the check against the model (:mod:`~mase_lite.ir.compare`)
and the cache of captured architectures (:mod:`~mase_lite.ir.capture_cache`).

Example::

    gm = capture(model, {"x": torch.randn(4, 16)}, {"x": {0: Dim.AUTO}})
    gm(x=torch.randn(7, 16))
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.ir import export_cache
from mase_lite.ir.capture_cache import CACHE, LogRecorder, Template, architecture_key, copy_graph, replay
from mase_lite.ir.compare import compare_with_model, first_difference
from mase_lite.ir.export import CaptureError, caches_off, export_model
from mase_lite.ir.leaves import LeafPlan, canonical_names, raise_leaf_calls
from mase_lite.ir.train_mode import DropoutRecorder, TrainModeLimit, modularise_training_constants, stochastic_modules

# the capture API: what callers of capture also use is re-exported from the job modules
__all__ = ["CaptureError", "MaseGraphModule", "caches_off", "capture", "compare_with_model", "first_difference"]

logger = logging.getLogger(__name__)


class MaseGraphModule(fx.GraphModule):
    """The captured GraphModule: rooted at the original model, called with the captured inputs."""


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
    canonical_names(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return gm


def _export_recorded(model, example_inputs, dynamic_shapes, plan, preserve, stored: str | None = None):
    """Export in the train/eval split, recording functional dropout (traced again with it when they do not
    match); with ``stored`` (an :mod:`~mase_lite.ir.export_cache` entry), the program stored there, else
    exported and stored. Returns the program and whether it was loaded."""
    loaded = export_cache.load(stored) if stored else None
    if loaded is not None:
        ep, recorder = loaded
        if recorder.annotate(ep.graph_module.graph):
            return ep, True
        export_cache.discard(stored)
    recorder = DropoutRecorder()
    with recorder:
        ep = export_model(model, example_inputs, dynamic_shapes, plan, preserve)
    if stored:
        export_cache.store(stored, ep, recorder)
    if not recorder.annotate(ep.graph_module.graph):
        logger.debug("functional dropout calls do not match the graph: tracing dropout instead")
        if stored:
            export_cache.discard(stored)
        ep = export_model(model, example_inputs, dynamic_shapes, plan, preserve)
    return ep, False


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
            CACHE.count(hit=True)
            return gm
    if key is not None:
        CACHE.count(hit=False)
    recorder = LogRecorder()
    ir_logger = logging.getLogger("mase_lite.ir")
    ir_logger.addHandler(recorder)
    stored = export_cache.entry_key(key, model) if key is not None and not leaf_modules else None
    try:
        gm, limits = _capture(model, example_inputs, dynamic_shapes, leaf_modules, verify, stored)
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
    stored: str | None = None,
) -> tuple[MaseGraphModule, list[str]]:
    """The export, raise and checks of :func:`capture`: the graph and why its train mode is refused, if so.
    With ``stored``, the first export may come from the disk cache; a stored program the model does not
    match is removed and the model exported afresh."""
    plan = LeafPlan(model, leaf_modules)
    preserve = tuple(name for name, m in model.named_modules() if name and leaf_modules and isinstance(m, leaf_modules))
    modules = dict(model.named_modules())
    limits: list[str] = []
    loaded = False
    try:
        ep, loaded = _export_recorded(model, example_inputs, dynamic_shapes, plan, preserve, stored)
    except CaptureError as train_err:
        ep = None
        limits.append(str(train_err).replace("torch.export could not capture", "train mode of", 1))
    if ep is not None:
        stochastic, reasons = stochastic_modules(ep.graph_module.graph, modules)
        if stochastic - plan.stochastic:
            plan.stochastic |= stochastic
            logger.info("modules drawing random numbers in train mode become nodes: %s", ", ".join(sorted(stochastic)))
            ep, loaded = _export_recorded(model, example_inputs, dynamic_shapes, plan, preserve)
        try:
            gm = _raise_to_modules(model, ep, plan)
        except Exception as err:
            if not loaded:
                raise
            problem = f"{type(err).__name__}: {err}"
            return _afresh(stored, problem, model, example_inputs, dynamic_shapes, leaf_modules, verify)
        problem = _difference(gm, model, example_inputs, loaded)
        if problem is not None and loaded:
            return _afresh(stored, problem, model, example_inputs, dynamic_shapes, leaf_modules, verify)
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
        problem = _difference(gm, model, example_inputs, loaded, train=True)
        if problem is not None and loaded:
            return _afresh(stored, problem, model, example_inputs, dynamic_shapes, leaf_modules, verify)
        if problem is not None:
            raise CaptureError(f"the captured graph of {type(model).__name__} does not match the model in train mode: {problem}")
    return gm, limits


def _difference(gm: MaseGraphModule, model: nn.Module, inputs: dict[str, Any], loaded: bool,
                train: bool = False) -> str | None:
    """How ``gm`` differs from ``model`` on ``inputs`` (:func:`compare_with_model`); a stored program that fails to
    run on the model differs from it (a fresh export that fails is a capture error, raised)."""
    try:
        return compare_with_model(gm, model, inputs, train=train)
    except Exception as err:
        if not loaded:
            raise
        return f"{type(err).__name__}: {err}"


def _afresh(stored: str, problem: str, *args) -> tuple[MaseGraphModule, list[str]]:
    """:func:`_capture` again, the stored program removed (the model does not match it): exported and stored anew."""
    logger.warning("the stored export %s does not fit %s (%s): removed, exporting again",
                   export_cache.directory() / f"{stored}.pt2", type(args[0]).__name__, problem.splitlines()[0][:200])
    export_cache.discard(stored)
    return _capture(*args, stored=stored)
