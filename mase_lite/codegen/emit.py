"""A MaseGraph as a standalone package: ``model.py`` (a readable ``nn.Module``), ``weights.safetensors``
and ``__init__.py`` with ``load(device=...)``.

The forward is the graph's own code, node for node, with the captured input names and the model's
output fields. Leaf modules are rebuilt from constructor source (:mod:`mase_lite.codegen.modules`);
packed MXINT8 Linear layers become ``torch.ops.mase_lite.mxint8_linear`` calls on their buffers;
fused attention becomes ``F.scaled_dot_product_attention``. The package imports torch, safetensors,
``mase_lite.kernels`` (for packed layers) and ``mase_lite.nn`` (for fake-quantized layers) only.

Example::

    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"name": "mxint",
                                   "element_width": 8, "storage": "packed"}}})
    write_package(mg, "out/bert_mx")
    # python -c "import sys; sys.path.insert(0, 'out'); import bert_mx; model = bert_mx.load('cpu')"
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from safetensors.torch import save_file

from mase_lite.codegen.modules import (
    CodegenError,
    check_constructor,
    constructor_source,
    import_line,
    module_class,
    state_tensors,
)
from mase_lite.files import staged_directory
from mase_lite.ir.modules import ScaledDotProductAttention
from mase_lite.kernels.mxint8 import MXInt8Linear

_ATEN = torch.ops.aten
_DROPPED = (_ATEN._assert_tensor_metadata.default,)
_FUNCTION_MODULES = ("torch", "operator", "_operator", "math", "builtins")
PACKED_HELPER = '''

def packed_linear(out_features: int, in_features: int, blocks: int, bias: bool) -> nn.Module:
    """Holder of one packed MXINT8 Linear: int8 ``codes``, uint8 E8M0 ``scales`` and a float ``bias``."""
    holder = nn.Module()
    holder.register_buffer("codes", torch.empty(out_features, in_features, dtype=torch.int8))
    holder.register_buffer("scales", torch.empty(out_features, blocks, dtype=torch.uint8))
    holder.bias = nn.Parameter(torch.empty(out_features)) if bias else None
    return holder
'''

INIT_TEMPLATE = '''"""{doc}

Example::

    import {package}
    model = {package}.load("cpu")          # or "cuda"; weights load on any device
"""

from pathlib import Path

import torch
from safetensors.torch import load_file

from .model import {exports}

WEIGHTS = Path(__file__).with_name("weights.safetensors")


def load(device: str | torch.device = "cpu") -> {class_name}:
    """The model with its weights on ``device``, in eval mode."""
    with torch.device("meta"):
        model = {class_name}()
    model.load_state_dict(load_file(WEIGHTS, device=str(device)), strict=True, assign=True)
    return model.eval()


__all__ = [{all}"load"]
'''


@dataclass
class Emitted:
    """What the emitted ``__init__`` of the model builds, and the tensors it loads."""

    lines: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    packed: bool = False


def _attr_name(target: str, taken: dict[str, str]) -> str:
    """A flat attribute name for a module path (``bert.encoder.layer.0.x`` -> ``bert_encoder_layer_0_x``)."""
    if target in taken:
        return taken[target]
    base = re.sub(r"\W", "_", target)
    base = f"_{base}" if base[0].isdigit() or keyword.iskeyword(base) else base
    name, i = base, 1
    while name in taken.values():
        name, i = f"{base}_{i}", i + 1
    taken[target] = name
    return name


def _check_function(node: fx.Node) -> None:
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return
    module = getattr(target, "__module__", None) or ""
    if module.split(".")[0] in _FUNCTION_MODULES:
        return
    raise CodegenError(f"codegen cannot express node {node.name!r}: it calls {getattr(target, '__qualname__', target)} "
                       f"from {module or 'an unknown module'}; the emitted code calls torch and operator functions only")


def _emit_module(node: fx.Node, module: nn.Module, attr: str, out: Emitted, graph: fx.Graph) -> None:
    """Record how to build the leaf module that ``node`` calls, rewriting ``node`` where the module goes."""
    if isinstance(module, MXInt8Linear):
        out.packed = True
        out.lines.append(f"self.{attr} = packed_linear({module.out_features}, {module.in_features}, "
                         f"{module.scales.shape[1]}, bias={module.bias is not None})")
        with graph.inserting_before(node):
            tensors = [graph.get_attr(f"{attr}.{name}") for name in ("codes", "scales")]
            bias = graph.get_attr(f"{attr}.bias") if module.bias is not None else None
            call = graph.call_function(torch.ops.mase_lite.mxint8_linear.default,
                                       (node.args[0], *tensors, bias, module.block_size))
        out.state.update({f"{attr}.{k}": v.detach() for k, v in module.state_dict().items()})
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        return
    if isinstance(module, ScaledDotProductAttention):
        with graph.inserting_before(node):
            call = graph.call_function(F.scaled_dot_product_attention, node.args, dict(node.kwargs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        return
    cls = module_class(module)
    try:
        source = constructor_source(module)
    except CodegenError:
        raise CodegenError(f"codegen cannot express node {node.name!r}: module {node.target!r} is a "
                           f"{cls.__module__}.{cls.__name__}, which the emitted code cannot build "
                           "(torch.nn layers, quantized layers and packed MXINT8 Linear are supported)") from None
    problem = check_constructor(module, source)
    if problem is not None:
        raise CodegenError(f"codegen cannot express node {node.name!r} (module {node.target!r}): {problem}")
    buffers = [n for n, _ in module.named_buffers() if n.split(".")[-1] in module._non_persistent_buffers_set]
    if buffers:
        raise CodegenError(f"codegen cannot express node {node.name!r}: non-persistent buffers {buffers}")
    out.lines.append(f"self.{attr} = {source}")
    line = import_line(module)
    if line is not None:
        out.imports.add(line)
    out.state.update({f"{attr}.{k}": v for k, v in state_tensors(module).items()})
    node.target = attr


def _emit_attribute(node: fx.Node, value: Any, attr: str, out: Emitted) -> None:
    if not isinstance(value, torch.Tensor):
        raise CodegenError(f"codegen cannot express node {node.name!r}: attribute {node.target!r} is a "
                           f"{type(value).__name__}, not a tensor")
    shape, dtype = tuple(value.shape), str(value.dtype)
    if isinstance(value, nn.Parameter):
        out.lines.append(f"self.{attr} = nn.Parameter(torch.empty({shape}, dtype={dtype}), "
                         f"requires_grad={value.requires_grad})")
    else:
        out.lines.append(f"self.register_buffer({attr!r}, torch.empty({shape}, dtype={dtype}))")
    out.state[attr] = value.detach()
    node.target = attr


def _retarget_devices(graph: fx.Graph) -> None:
    """Every device constant becomes the device of the first input, so the code runs on any device."""
    first = next((n for n in graph.nodes if n.op == "placeholder"), None)
    users = [n for n in graph.nodes if any(isinstance(a, torch.device) for a in pytree.tree_leaves((n.args, n.kwargs)))]
    if first is None or not users:
        return
    with graph.inserting_after(first):
        device = graph.create_node("call_function", getattr, (first, "device"), name="input_device")

    def swap(a: Any) -> Any:
        return device if isinstance(a, torch.device) else a

    for node in users:
        node.args, node.kwargs = fx.node.map_aggregate(node.args, swap), fx.node.map_aggregate(node.kwargs, swap)


class _Output:
    """Renders the graph's flat outputs back into the model's output structure."""

    def __init__(self, spec: pytree.TreeSpec | None):
        self.spec = spec
        self.classes: dict[str, list[str]] = {}

    def render(self, leaves: list[str]) -> str:
        if self.spec is None:
            return f"({', '.join(leaves)},)" if len(leaves) != 1 else leaves[0]
        return self._render(self.spec, iter(leaves))

    def _render(self, spec: pytree.TreeSpec, leaves) -> str:
        if spec.is_leaf():
            return next(leaves)
        children = [self._render(child, leaves) for child in spec.children()]
        if spec.type in (tuple, list):
            body = ", ".join(children) + ("," if spec.type is tuple and len(children) == 1 else "")
            return f"({body})" if spec.type is tuple else f"[{body}]"
        if spec.type is dict:
            return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(spec.context, children)) + "}"
        keys = spec.context if isinstance(spec.context, list) else None
        if keys and all(isinstance(k, str) and k.isidentifier() for k in keys):
            name = spec.type.__name__
            self.classes[name] = list(keys)
            return f"{name}({', '.join(f'{k}={c}' for k, c in zip(keys, children))})"
        raise CodegenError(f"codegen cannot express the graph's output of type {spec.type.__name__}")


class _ModelCodeGen(fx.graph.CodeGen):
    """Plain keyword-argument forward; the return statement rebuilds the output structure."""

    def __init__(self, output: _Output):
        super().__init__()
        self.output = output

    def generate_output(self, output_args: Any, *, descs=None, repr_fn=None) -> str:
        leaves = list(output_args) if isinstance(output_args, (tuple, list)) else [output_args]
        return f"return {self.output.render([(repr_fn or repr)(a) for a in leaves])}"


def _import_lines(globals_: dict[str, Any], body: str) -> list[str]:
    """Imports of the names the forward's code uses beyond torch, builtins and math constants."""
    lines = []
    for name, value in sorted(globals_.items()):
        if name in ("torch", "inf", "nan") or getattr(value, "__module__", None) == "builtins":
            continue
        if not re.search(rf"(?<![\w.]){name}\b(?!\s*=[^=])", body):  # used, not a keyword argument
            continue
        if isinstance(value, type(torch)):
            lines.append(f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}")
        elif value is torch.device:
            lines.append("from torch import device")
        elif getattr(value, "__module__", None) and getattr(value, "__name__", None):
            lines.append(f"from {value.__module__} import {value.__name__} as {name}")
    return lines


def emit(mg, class_name: str | None = None) -> tuple[str, dict[str, torch.Tensor], str]:
    """``(model.py source, state tensors, class name)`` for ``mg``; raises CodegenError naming the node."""
    gm = mg.model
    modules = dict(gm.named_modules())
    class_name = class_name or type(mg.source_model).__name__
    graph = fx.Graph()
    value_map: dict[fx.Node, fx.Node] = {}
    output_value = graph.graph_copy(gm.graph, value_map)
    graph.output(output_value)
    out, taken = Emitted(), {}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _DROPPED:
            graph.erase_node(node)
        elif node.op == "call_function":
            _check_function(node)
        elif node.op == "call_module":
            _emit_module(node, modules[node.target], _attr_name(node.target, taken), out, graph)
        elif node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            _emit_attribute(node, value, _attr_name(node.target, taken), out)
        elif node.op == "call_method":
            raise CodegenError(f"codegen cannot express node {node.name!r}: method call {node.target!r}")
    _retarget_devices(graph)
    output = _Output(getattr(gm, "_out_spec", None))
    graph.set_codegen(_ModelCodeGen(output))
    code = graph.python_code(root_module="self")
    body = code.src.strip("\n").replace("torch._C._nn.scaled_dot_product_attention(", "F.scaled_dot_product_attention(")
    return _model_source(mg, class_name, out, output, body, _import_lines(code.globals, body)), out.state, class_name


def _model_source(mg, class_name: str, out: Emitted, output: _Output, body: str, extra_imports: list[str]) -> str:
    imports = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    if output.classes:
        imports.insert(0, "from typing import NamedTuple")
    if "inf" in body or "nan" in body:
        imports.insert(0, "from math import inf, nan")
    if out.packed:
        imports.append("import mase_lite.kernels.mxint8  # registers torch.ops.mase_lite.mxint8_linear")
    imports += sorted(out.imports) + [i for i in extra_imports if i not in imports]
    parts = [f'"""{class_name}, generated by mase-lite codegen from a captured '
             f'{type(mg.source_model).__name__}.\n\nInputs: {", ".join(mg.input_names)}. '
             'Outputs are bit-identical to the graph\'s in eval mode; attention dropout is not applied.\n"""',
             "", "\n".join(imports)]
    for name, fields in output.classes.items():
        annotated = "\n".join(f"    {f}: torch.Tensor" for f in fields)
        parts.append(f"\n\nclass {name}(NamedTuple):\n    \"\"\"The model's outputs by name.\"\"\"\n\n{annotated}")
    if out.packed:
        parts.append(PACKED_HELPER.rstrip("\n"))
    init = "\n".join(f"        {line}" for line in out.lines)
    forward = "\n".join(f"    {line}" if line else "" for line in body.splitlines())
    parts.append(f"\n\nclass {class_name}(nn.Module):\n    \"\"\"The captured graph as plain PyTorch.\"\"\"\n\n"
                 f"    def __init__(self) -> None:\n        super().__init__()\n{init}\n\n{forward}\n")
    return "\n".join(parts)


def write_package(mg, path: str | Path, class_name: str | None = None) -> dict[str, Any]:
    """Write ``path/`` as an importable package (all or nothing); returns what was written."""
    path = Path(path)
    if not path.name.isidentifier() or keyword.iskeyword(path.name):
        raise CodegenError(f"the package name {path.name!r} is not a Python identifier; use letters, digits and "
                           "underscores, not starting with a digit", location=("path",))
    source, state, class_name = emit(mg, class_name)
    exports = [class_name, *re.findall(r"^class (\w+)\(NamedTuple\)", source, flags=re.M)]
    init = INIT_TEMPLATE.format(doc=f"{class_name} generated by mase-lite codegen: ``load(device)`` builds it.",
                                package=path.name, exports=", ".join(exports), class_name=class_name,
                                all="".join(f"{e!r}, " for e in exports).replace("'", '"'))
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    with staged_directory(path) as staging:
        (staging / "model.py").write_text(source)
        (staging / "__init__.py").write_text(init)
        save_file(tensors, str(staging / "weights.safetensors"))
    return {"path": str(path), "class_name": class_name, "tensors": len(tensors),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "packed_linears": source.count("torch.ops.mase_lite.mxint8_linear.default(")}
