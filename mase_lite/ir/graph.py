"""MaseGraph: a captured model, its module-level fx graph, and per-node metadata.

Example::

    import mase_lite as ml
    mg = ml.MaseGraph(bert, hf_input_names=["input_ids", "attention_mask", "labels"])
    out = mg.model(input_ids=ids, attention_mask=mask, labels=labels)   # SequenceClassifierOutput
    [n.name for n in mg.nodes if n.meta["mase"]["op"] == "linear"]
    mg.draw("bert.svg")
    mg.save("runs/bert"); mg2 = ml.MaseGraph.load("runs/bert")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.ir import meta as meta_mod
from mase_lite.ir.capture import MaseGraphModule, capture
from mase_lite.ir.export import default_dynamic_shapes, dynamic_dims
from mase_lite.ir.inputs import forward_parameters, hf_example_inputs, sequence_dims



# inputs a transformers model takes as optional, and the value a call that leaves them out means
OPTIONAL_INPUTS = {"attention_mask": 1, "token_type_ids": 0, "labels": -100}


class _InputCheck:
    """Forward pre-hook naming the captured inputs when a call does not match them. A transformers model's optional
    inputs (:data:`OPTIONAL_INPUTS`) a call leaves out are given as the model means them — every token attended,
    no labels (ignored everywhere: the output carries no loss) — so a graph captured for training is called for
    inference with ``input_ids`` alone (``optional``: ``{name: (rank, dtype)}`` of those captured)."""

    def __init__(self, names: tuple[str, ...], optional: dict[str, tuple[int, torch.dtype]] | None = None):
        self.names = names
        self.optional = optional or {}
        self.dropped_loss = False

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        names = self.names
        given = list(names[: len(args)]) + list(kwargs)
        unknown = [k for k in kwargs if k not in names]
        missing = [n for n in names if n not in given]
        first = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
        filled = {n: self._default(n, first) for n in missing if n in self.optional and first is not None}
        filled = {n: v for n, v in filled.items() if v is not None}
        missing = [n for n in missing if n not in filled]
        self.dropped_loss = "labels" in filled
        if not (unknown or missing or len(args) > len(names)):
            return (args, {**kwargs, **filled}) if filled else None
        detail = []
        if missing:
            detail.append(f"missing: {', '.join(missing)}")
        if unknown:
            detail.append(f"not captured: {', '.join(unknown)}")
        if len(args) > len(names):
            detail.append(f"{len(args)} positional inputs for {len(names)} captured")
        raise UserError(
            f"this graph was captured with inputs ({', '.join(names)}); {'; '.join(detail)}. "
            "Capture again with the inputs you want to call it with."
        )

    def _default(self, name: str, first: torch.Tensor) -> torch.Tensor | None:
        rank, dtype = self.optional[name]
        if rank > first.dim():
            return None
        return torch.full(first.shape[:rank], OPTIONAL_INPUTS[name], dtype=dtype, device=first.device)

    def drop_loss(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        """Forward hook: no loss in the output of a call that gave no labels."""
        if not self.dropped_loss or not hasattr(output, "keys") or "loss" not in output.keys():
            return None
        return type(output)(**{k: v for k, v in output.items() if k != "loss"})


class MaseGraph:
    """A model captured with ``torch.export`` and raised to module level.

    Args:
        model: any ``nn.Module`` taking keyword tensors; HF transformers models included.
        hf_input_names: for a HF model, the inputs to capture with; examples are made from its config.
        example_inputs: for any model, ``{name: tensor}`` examples of its keyword inputs.
        leaf_modules: extra module classes kept as single ``call_module`` nodes.
        dynamic_shapes: ``torch.export`` dynamic shapes; by default dim 0 (batch) of every input
            and dim 1 (sequence) of token inputs and per-token labels are dynamic.
        verify: also run graph and model in train mode under one seed and fail when they differ
            (eval mode is always checked).
        recipe: how to rebuild the model on load (``{"factory": "pkg.mod:fn", "kwargs": {...}}``);
            HF models need none.
    """

    def __init__(
        self,
        model: nn.Module,
        hf_input_names: list[str] | None = None,
        example_inputs: dict[str, Any] | None = None,
        leaf_modules: tuple[type, ...] | list[type] = (),
        dynamic_shapes: dict[str, Any] | None = None,
        recipe: dict[str, Any] | None = None,
        verify: bool = False,
    ):
        if not isinstance(model, nn.Module):
            raise UserError(f"MaseGraph needs an nn.Module, got {type(model).__name__}")
        if hf_input_names is not None and example_inputs is not None:
            raise UserError("give either hf_input_names or example_inputs, not both")
        if example_inputs is None:
            if hf_input_names is None:
                if not hasattr(model, "config"):
                    raise UserError(
                        f"{type(model).__name__} is not a transformers model: pass example_inputs={{name: tensor}}"
                    )
                accepted = forward_parameters(model)
                hf_input_names = [n for n in ("input_ids", "attention_mask") if n in accepted]
                hf_input_names = hf_input_names or [n for n in ("pixel_values", "input_values") if n in accepted][:1]
            example_inputs = hf_example_inputs(model, list(hf_input_names))
        else:
            accepted = forward_parameters(model)
            unknown = [k for k in example_inputs if k not in accepted]
            if unknown:
                raise UserError(
                    f"example_inputs: {type(model).__name__}.forward takes no input {unknown[0]!r}; "
                    f"it accepts: {', '.join(accepted)}"
                )
        device = next(model.parameters(), torch.empty(0)).device
        example_inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in example_inputs.items()}
        self.hf_input_names = list(hf_input_names) if hf_input_names is not None else None
        self.leaf_modules = tuple(leaf_modules)
        self.input_specs = {
            k: {"shape": list(v.shape), "dtype": meta_mod.dtype_name(v.dtype)}
            for k, v in example_inputs.items()
            if isinstance(v, torch.Tensor)
        }
        if dynamic_shapes is None:
            dynamic_shapes = default_dynamic_shapes(example_inputs)
        self.dynamic_dims = dynamic_dims(dynamic_shapes)
        self.example_inputs = example_inputs
        self.source_model = model
        self.recipe = recipe
        # the structural transforms a model went through before it came here (a quantized checkpoint of another
        # tool, read as quantized layers, says so in ``mase_transforms``): a save records them for the load
        self.history: list[dict[str, Any]] = [dict(step) for step in getattr(model, "mase_transforms", ())]
        self.facts: set[str] = {"graph", "metadata"}
        # results of analysis passes by the fact they provide (per node also in node.meta["mase"][fact])
        self.analyses: dict[str, Any] = {}
        self.model: MaseGraphModule
        self.model = capture(model, example_inputs, dynamic_shapes, self.leaf_modules, verify=verify)
        self.input_names = tuple(example_inputs)
        optional = {name: (example_inputs[name].dim(), example_inputs[name].dtype) for name in OPTIONAL_INPUTS
                    if hf_input_names is not None and isinstance(example_inputs.get(name), torch.Tensor)}
        check = _InputCheck(self.input_names, optional)
        self.model.register_forward_pre_hook(check, with_kwargs=True)
        self.model.register_forward_hook(check.drop_loss, with_kwargs=True)
        self.symbol_names = meta_mod.symbol_names(self.model.graph, sequence_dims(example_inputs))
        meta_mod.refresh(self)

    @property
    def nodes(self) -> list[fx.Node]:
        """The graph's nodes in order."""
        return list(self.model.graph.nodes)

    @property
    def modules(self) -> dict[str, nn.Module]:
        """Every submodule of the graph by qualified name."""
        return dict(self.model.named_modules())

    def refresh_metadata(self) -> None:
        """Re-derive ``node.meta["mase"]`` (formats set by transforms are kept)."""
        meta_mod.refresh(self)

    def recompile(self) -> None:
        """Check the graph, regenerate the module's code and refresh metadata."""
        self.model.graph.lint()
        self.model.recompile()
        meta_mod.refresh(self)

    def replace_module(self, target: str, new_module: nn.Module) -> None:
        """Swap submodule ``target`` for ``new_module``; nodes that call it now call the new one, and the model
        (``source_model``) holds it too: below the root the two share their modules, and a child of the root is
        swapped in both, so a pass running the model sees every replacement and no old layer stays alive.

        Metadata is refreshed once when the transform ends (the pass manager recompiles), not per swap.
        """
        modules = self.modules
        if target not in modules or not target:
            raise UserError(f"no submodule named {target!r} in the graph")
        parent_name, _, child = target.rpartition(".")
        parent = modules[parent_name] if parent_name else self.model
        old = modules[target]
        setattr(parent, child, new_module)
        if not parent_name and getattr(self.source_model, child, None) is old:
            setattr(self.source_model, child, new_module)

    def erase_node(self, node: fx.Node) -> None:
        """Remove ``node``; if it still has users, say which and how to rewire them."""
        if node.users:
            users = ", ".join(u.name for u in node.users)
            source = node.all_input_nodes[0].name if node.all_input_nodes else "another node"
            raise UserError(
                f"cannot erase node {node.name!r}: still used by {users}. Rewire them first, "
                f"e.g. node.replace_all_uses_with({source}) to pass its input through, then erase it"
            )
        self.model.graph.erase_node(node)

    def record_transform(self, name: str, params: dict[str, Any], module: str = "") -> None:
        """Append a structural transform (and the module that provides it) to the history a load replays."""
        self.history.append({"pass": name, "params": params, "module": module})

    def to(self, device: torch.device | str) -> "MaseGraph":
        """Move parameters, buffers and every device constant in the graph to ``device``."""
        device = torch.device(device)
        self.model.to(device)
        for node in self.model.graph.nodes:
            node.args = fx.node.map_aggregate(node.args, lambda a: device if isinstance(a, torch.device) else a)
            node.kwargs = fx.node.map_aggregate(
                node.kwargs, lambda a: device if isinstance(a, torch.device) else a
            )
        self.model.recompile()
        return self

    def draw(self, path: str | Path, **options: Any) -> Path:
        """Render the graph to ``path`` (.svg/.png/.pdf/.dot; .graphml/.json write the networkx graph);
        ``options`` are the draw pass's params: ``depth``, ``fold_repeats``, ``color_by``, ``timeout``."""
        from mase_lite.viz.draw import draw

        return draw(self, path, **options)

    def to_networkx(self):
        """The graph as a ``networkx.DiGraph`` keyed by node name, node metadata as attributes."""
        from mase_lite.viz.nx import to_networkx

        return to_networkx(self)

    def save(self, directory: str | Path, weights: str = "codes") -> Path:
        """Write weights (safetensors) and the recipe to rebuild this graph (JSON) to ``directory``: quantized
        weights as their stored codes and scales, or (``weights="float"``) as the float values training needs."""
        from mase_lite.checkpoint import save_checkpoint

        return save_checkpoint(self, directory, weights)

    @classmethod
    def load(
        cls,
        directory: str | Path,
        model: nn.Module | None = None,
        replay: Callable[["MaseGraph", list[dict[str, Any]]], "MaseGraph"] | None = None,
    ) -> "MaseGraph":
        """Rebuild a graph saved by :meth:`save` (``model`` is needed only when no recipe was saved).

        The IR knows no pass: ``replay(mg, transforms)`` re-applies the structural transforms the graph
        went through; :func:`mase_lite.load` passes one that runs them through the pass registry.
        """
        from mase_lite.checkpoint import load_weights, read_checkpoint

        recipe, model, capture_args = read_checkpoint(directory, model)
        mg = cls(model, **capture_args)
        if recipe["transforms"]:
            if replay is None:
                names = ", ".join(str(step.get("pass")) for step in recipe["transforms"])
                raise UserError(
                    f"{directory} was saved after transforms ({names}); load it with mase_lite.load({str(directory)!r}), "
                    "which replays them through the pass registry"
                )
            mg = replay(mg, recipe["transforms"])
        load_weights(mg, directory)
        return mg

    def __repr__(self) -> str:
        ops: dict[str, int] = {}
        for n in self.model.graph.nodes:
            ops[n.op] = ops.get(n.op, 0) + 1
        return f"MaseGraph({type(self.source_model).__name__}, inputs={list(self.input_names)}, nodes={ops})"
