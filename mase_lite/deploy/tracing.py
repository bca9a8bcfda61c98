"""Tracing a quantized model for a runtime: its quantized weights as plain values for the duration, in eval mode,
called as a runtime calls it — its inputs but ``labels``, in order, returning its ``logits`` — with batch and
sequence dimensions free."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.deploy.layers import ExportError
from mase_lite.infra.errors import UserError
from mase_lite.ir.export import without_partial_graphs
from mase_lite.kernels.mxint8 import MXInt8Linear
from mase_lite.layers.quantized import QuantizedLayer


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode (a deployed model does not train), its modules' modes as they were after."""
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


TRAINING_INPUTS = ("labels",)  # what a runtime does not give: the loss's targets


class Inference(nn.Module):
    """The model as a runtime calls it: its inference inputs in order (:attr:`names`, the parameters of its
    forward, which torch.export names the program's inputs by), returning its ``logits`` (a model output without
    logits: its tensors in order, one alone as itself). Made by :meth:`of`."""

    names: tuple[str, ...] = ()

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @classmethod
    def of(cls, model: nn.Module, names: list[str]) -> "Inference":
        """An :class:`Inference` of ``model`` whose forward takes ``names``."""
        p = inspect.Parameter

        def forward(self, *inputs: Tensor):
            return cls.forward(self, *inputs)

        forward.__signature__ = inspect.Signature([p(n, p.POSITIONAL_OR_KEYWORD) for n in ("self", *names)])
        return type(cls.__name__, (cls,), {"forward": forward, "names": tuple(names)})(model)

    def forward(self, *inputs: Tensor):
        return returned(self.model(**dict(zip(self.names, inputs))))[1]


def returned(out: Any) -> tuple[list[str], Tensor | tuple[Tensor, ...]]:
    """What an export returns of a model's output, with its names: ``logits`` where the output has them, else its
    tensors (a model output's fields, ``output_<i>`` of a tuple; ``output``, one tensor alone)."""
    if isinstance(out, Tensor):
        return ["output"], out
    if hasattr(out, "keys") and "logits" in out.keys():
        return ["logits"], out["logits"]
    named = out.items() if hasattr(out, "items") else ((f"output_{i}", v) for i, v in enumerate(out))
    named = [(k, v) for k, v in named if isinstance(v, Tensor)]
    return [k for k, _ in named], named[0][1] if len(named) == 1 else tuple(v for _, v in named)


def example_inputs(mg) -> dict[str, Tensor]:
    """The tensors the model was captured with (module mode: its example inputs), by name."""
    inputs = {k: v for k, v in (getattr(mg, "example_inputs", None) or {}).items() if isinstance(v, Tensor)}
    if not inputs:
        raise ExportError("the model has no example inputs to trace it with (module mode: give example_inputs)")
    return inputs


def inference_inputs(mg) -> dict[str, Tensor]:
    """The example inputs a runtime gives (by name): all but ``labels``, which an encoder-decoder keeps (its
    decoder reads the targets)."""
    inputs = example_inputs(mg)
    source = getattr(mg, "source_model", None)
    config = getattr(mg.model if source is None else source, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return inputs
    return {k: v for k, v in inputs.items() if k not in TRAINING_INPUTS}


def inference_program(mg, target: str, unpack: bool) -> tuple[torch.export.ExportedProgram, list[str], list[str]]:
    """``mg``'s model as a runtime calls it (:class:`Inference`), traced by ``torch.export`` with its quantized
    weights as values (``unpack``: packed MXINT8 layers decoded), batch and sequence dimensions free, and what it
    does not return (a captured training graph's loss) removed; with its input and output names."""
    inputs = inference_inputs(mg)
    wrapper = Inference.of(mg.model, list(inputs))
    with quantized_values(mg.model, unpack=unpack), evaluating(wrapper), torch.no_grad():
        try:
            outputs = returned(mg.model(**inputs))[0]
        except UserError as err:  # a graph captured with labels it cannot leave out
            raise ExportError(f"{target}: the model is exported as a runtime calls it, with {', '.join(inputs)} and "
                              f"no labels: {err}") from None
        try:
            with without_partial_graphs():
                program = torch.export.export(wrapper, tuple(inputs.values()), strict=False,
                                              dynamic_shapes={k: dynamic(v) for k, v in inputs.items()})
        except Exception as err:  # torch.export's refusal of this model, in one line
            raise ExportError(f"{target}: torch.export cannot trace this model: {str(err).splitlines()[0]}") from None
    program.graph.eliminate_dead_code()
    program.graph_module.recompile()
    return program, list(inputs), outputs


def dynamic(t: Tensor) -> dict[int, Any]:
    """Batch and sequence dimensions free; the others (features, channels, image sizes) as given."""
    free = range(min(t.dim(), 2)) if not t.is_floating_point() else range(min(t.dim(), 1))
    return {d: torch.export.Dim.AUTO for d in free}


@contextlib.contextmanager
def quantized_values(model: nn.Module, unpack: bool = True) -> Iterator[None]:
    """Within the block, each quantized weight and bias is a plain parameter holding its quantized values (the
    quantizer set aside) and, with ``unpack``, each packed MXINT8 layer a Linear with its decoded weight; restored
    after."""
    restore = []
    try:
        for name, module in list(model.named_modules()):
            if isinstance(module, QuantizedLayer):
                for operand in ("weight", "bias"):
                    quantizer = getattr(module, f"{operand}_quantizer", None)
                    param = module._parameters.get(operand)
                    if quantizer is None or param is None:
                        continue
                    values = module._operand(operand, param).detach()
                    restore.append((module, operand, param, quantizer))
                    module._parameters[operand] = nn.Parameter(values, requires_grad=False)
                    setattr(module, f"{operand}_quantizer", None)
            elif unpack and isinstance(module, MXInt8Linear):
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
                linear.weight = nn.Parameter(module.dequantized_weight(), requires_grad=False)
                linear.bias = None if module.bias is None else nn.Parameter(module.bias.detach(), requires_grad=False)
                setattr(parent, child, linear)
                restore.append((parent, child, module, None))
        yield
    finally:
        for owner, key, original, quantizer in reversed(restore):
            if quantizer is None:
                setattr(owner, key, original)
            else:
                owner._parameters[key] = original
                setattr(owner, f"{key}_quantizer", quantizer)
