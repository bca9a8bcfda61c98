"""Leaf modules as source: a torch.nn constructor where one rebuilds the module, else a class re-created here.

torch.nn layers print as their constructor (``nn.Linear(128, 128)``), and so do the transformers
activations that are a torch.nn module under another name (``GELUActivation`` is ``nn.GELU()``).
Any other leaf (``Conv1D``, ``NewGELUActivation``, an RMSNorm, a drop-path) is re-created: its
eval-mode forward traced with ``torch.fx`` becomes the ``forward`` of a class of the same name,
which holds the same tensors — so the emitted package needs neither transformers nor the model's code.

Example::

    >>> leaf = leaf_source(torch.nn.Linear(4, 2, bias=False), "fc")
    >>> leaf.expression
    'nn.Linear(4, 2, bias=False)'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from mase_lite.codegen.modules import (
    CodegenError,
    torch_arguments,
    check_constructor,
    constructor_source,
    import_line,
    module_class,
    state_tensors,
)
from mase_lite.codegen.printer import Printer, literal
from mase_lite.kernels.mxint8 import MXInt8Linear

PACKED_CLASS = '''class PackedLinear(nn.Module):
    """A packed MXINT8 Linear: int8 ``codes``, uint8 E8M0 ``scales`` (one per block) and a float ``bias``."""

    def __init__(self, in_features: int, out_features: int, blocks: int, block_size: int, bias: bool = True) -> None:
        super().__init__()
        self.block_size = block_size
        self.register_buffer("codes", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features, blocks, dtype=torch.uint8))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mxint8_linear(x, self.codes, self.scales, self.bias, self.block_size)'''
PACKED_IMPORT = """try:  # mase_lite's op (torch.ops.mase_lite.mxint8_linear) and its native kernels: the graph's bits
    from mase_lite.kernels.mxint8 import mxint8_linear
except ImportError:  # without mase_lite: this package's torch version, the same weights and torch's float32 sums
    from ._mxint8 import mxint8_linear"""
PACKED_RUNTIME = '''"""The packed MXINT8 Linear in torch alone, for where mase_lite is not installed: each weight decoded exactly
(``code * 2**(scale - 133)``; scale code 0xFF: NaN), then ``F.linear`` (float32 sums in torch's order, so within
float32 accumulation error of mase_lite's kernel)."""

import torch
import torch.nn.functional as F


def mxint8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                  block_size: int) -> torch.Tensor:
    """``x @ W.T + bias`` with W the MXINT8 ``codes`` (int8) and ``scales`` (uint8 E8M0, one per block of a row)."""
    rows, columns = codes.shape
    step = torch.ldexp(torch.ones((), dtype=torch.float32, device=codes.device), scales.to(torch.int32) - 133)
    step = torch.where(scales == 0xFF, torch.full_like(step, float("nan")), step)
    padded = F.pad(codes.to(torch.float32), (0, -columns % block_size)).view(rows, -1, block_size)
    weight = (padded * step.unsqueeze(-1)).view(rows, -1)[:, :columns]
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
'''


@dataclass
class LeafSource:
    """How the emitted ``__init__`` builds one leaf, and what the file needs for it."""

    expression: str
    state: dict[str, torch.Tensor]
    imports: set[str] = field(default_factory=set)
    classes: dict[str, str] = field(default_factory=dict)  # class name -> source


def _torch_twin(module: nn.Module) -> str | None:
    """The torch.nn constructor of a transformers activation that is a torch.nn activation under another name."""
    name = type(module).__name__
    act = getattr(module, "act", None)
    if name == "GELUActivation" and act is F.gelu:
        return "nn.GELU()"
    if name == "GELUTanh" and isinstance(act, functools.partial) and act.func is F.gelu \
            and act.keywords == {"approximate": "tanh"} and not act.args:
        return "nn.GELU(approximate='tanh')"
    if name == "SiLUActivation" and type(module).forward.__module__.startswith("transformers."):
        return "nn.SiLU()"
    return None


def _weight_norm_source(module: nn.Module) -> str | None:
    """``weight_norm(nn.Conv1d(...), dim=d)`` for a layer whose only parametrization is torch's weight norm."""
    plist = getattr(module, "parametrizations", {})
    if set(plist) != {"weight"} or len(plist["weight"]) != 1 or type(plist["weight"][0]).__name__ != "_WeightNorm":
        return None
    cls = module_class(module)
    args = torch_arguments(module, cls) if getattr(nn, cls.__name__, None) is cls else None
    if args is None:
        return None
    return f"nn.utils.parametrizations.weight_norm(nn.{cls.__name__}({', '.join(args)}), dim={plist['weight'][0].dim})"


def leaf_source(module: nn.Module, name: str) -> LeafSource:
    """The constructor source of the leaf at ``name`` (for messages); raises CodegenError when none can be made."""
    if isinstance(module, MXInt8Linear):
        bias = module.bias is not None
        expression = (f"PackedLinear({module.in_features}, {module.out_features}, {module.scales.shape[1]}, "
                      f"{module.block_size}{'' if bias else ', bias=False'})")
        return LeafSource(expression, {k: v.detach() for k, v in module.state_dict().items()},
                          {PACKED_IMPORT}, {"PackedLinear": PACKED_CLASS})
    twin = _torch_twin(module)
    if twin is not None:
        return LeafSource(twin, {})
    weight_norm = _weight_norm_source(module)
    if weight_norm is not None:
        return LeafSource(weight_norm, {k: v.detach() for k, v in module.state_dict().items()})
    cls = module_class(module)
    try:
        source = constructor_source(module)
    except CodegenError:
        if parametrize.is_parametrized(module) or cls.__module__.startswith("torch.nn"):
            raise CodegenError(f"codegen cannot express module {name!r}: a {cls.__module__}.{cls.__name__}, which "
                               "the emitted code cannot build") from None
        return _recreated(module, name)
    problem = check_constructor(module, source)
    if problem is not None:
        raise CodegenError(f"codegen cannot express module {name!r}: {problem}")
    buffers = [n for n, _ in module.named_buffers() if n.split(".")[-1] in module._non_persistent_buffers_set]
    if buffers:
        raise CodegenError(f"codegen cannot express module {name!r}: non-persistent buffers {buffers}")
    line = import_line(module)
    return LeafSource(source, state_tensors(module), {line} if line else set())


def _recreated(module: nn.Module, name: str) -> LeafSource:
    """A class of the module's own name whose forward is its eval-mode forward traced by torch.fx."""
    cls = type(module)
    if cls.__module__ == "mase_lite.layers.lora":
        raise CodegenError(f"codegen cannot express module {name!r}: a LoRA layer ({cls.__name__}); "
                           "merge it first with the lora_merge pass")
    if hasattr(cls, "mase_op") or any(True for _ in module.children()):
        raise CodegenError(f"codegen cannot express module {name!r}: a {cls.__module__}.{cls.__name__}, which the "
                           "emitted code cannot build (torch.nn layers, transformers layers without submodules, "
                           "quantized layers and packed MXINT8 Linear are supported)")
    training = module.training
    module.eval()
    try:
        traced = fx.symbolic_trace(module)
    except Exception as err:
        raise CodegenError(f"codegen cannot express module {name!r}: torch.fx cannot trace its "
                           f"{cls.__name__}.forward ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    finally:
        module.train(training)
    if module._non_persistent_buffers_set:
        raise CodegenError(f"codegen cannot express module {name!r}: non-persistent buffers "
                           f"{sorted(module._non_persistent_buffers_set)}")
    init = ["super().__init__()"]
    init += [f"self.{attr} = {parameter_source(value)}" for attr, value in module.named_parameters(recurse=False)]
    init += [f"self.register_buffer({attr!r}, {empty_source(value)})" for attr, value in module.named_buffers(recurse=False)]
    forward = traced_forward(traced.graph)
    body = "\n".join(f"        {line}" for line in init)
    source = (f"class {cls.__name__}(nn.Module):\n    \"\"\"{cls.__name__} ({cls.__module__}) in eval mode, traced.\"\"\"\n\n"
              f"    def __init__(self) -> None:\n{body}\n\n{forward}")
    state = {k: v.detach() for k, v in module.state_dict().items()}
    return LeafSource(f"{cls.__name__}()", state, set(), {cls.__name__: source})


def empty_source(value: torch.Tensor) -> str:
    dtype = "" if value.dtype == torch.float32 else f", dtype={value.dtype}"
    return f"torch.empty({literal(tuple(value.shape))}{dtype})"


def parameter_source(value: torch.Tensor) -> str:
    grad = "" if value.requires_grad else ", requires_grad=False"
    return f"nn.Parameter({empty_source(value)}{grad})"


def traced_forward(graph: fx.Graph) -> str:
    """``def forward`` of an fx-traced module, without fx's ``x = None`` lines."""
    names: dict[fx.Node, str] = {}
    inline: dict[fx.Node, str] = {}
    params, lines = [], []
    printer = Printer(names, inline, device=lambda: f"{params[0]}.device")
    for node in graph.nodes:
        if node.op == "placeholder":
            names[node] = node.name
            params.append(node.name)
        elif node.op == "get_attr":
            inline[node] = f"self.{node.target}"
        elif node.op == "output":
            lines.append(f"return {printer.arg(node.args[0])}")
        elif node.op == "call_module":
            raise CodegenError(f"codegen cannot re-create a module calling its submodule {node.target!r}")
        else:
            names[node] = node.name
            lines.append(f"{node.name} = {printer.expression(node)}")
    body = "\n".join(f"        {line}" for line in lines)
    return f"    def forward(self, {', '.join(params)}):\n{body}"
