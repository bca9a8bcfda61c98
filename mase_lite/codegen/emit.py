"""A MaseGraph as a standalone package: ``model.py`` (readable nested ``nn.Module`` classes),
``weights.safetensors`` and ``__init__.py`` with ``load(device=...)``.

The module tree is the model's own, so state-dict keys are the model's and a checkpoint of it loads;
each submodule's forward is cut from the graph (:mod:`mase_lite.codegen.classes`), aten calls print as
torch functions, tensor methods and operators, and identical blocks share one class. Packed MXINT8
Linear layers call ``mase_lite.kernels.mxint8.mxint8_linear`` (the op ``torch.ops.mase_lite.mxint8_linear``);
fake-quantized layers come from ``mase_lite.layers``, their weights stored as codes and scales (decoded bit for bit at
load). The package imports torch, safetensors and (for those layers) ``mase_lite.kernels`` and ``mase_lite.layers`` only;
packed layers run without mase_lite too, through the package's own torch version of the op (``_mxint8.py``: exact
weights, torch's float32 sums).

Example::

    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"name": "mxint",
                                   "element_width": 8, "storage": "packed"}}})
    write_package(mg, "out/bert_mx")
    # python -c "import sys; sys.path.insert(0, 'out'); import bert_mx; model = bert_mx.load('cpu')"
"""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from safetensors.torch import save_file

from mase_lite.codegen.classes import ClassBuilder, Emitted
from mase_lite.codegen.forwards import Names
from mase_lite.codegen.leaves import PACKED_RUNTIME
from mase_lite.codegen.modules import CodegenError
from mase_lite.infra.files import staged_directory
from mase_lite.layers.storage import flatten, stored_codes

_DROPPED = (torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten._assert_scalar.default)

INIT_TEMPLATE = '''"""{doc}

Example::

    import {package}
    model = {package}.load("cpu")          # or "cuda"; weights load on any device
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .model import {exports}

WEIGHTS = Path(__file__).with_name("weights.safetensors")
# Buffers the model does not save in its state dict (constants the graph computes with).
NON_PERSISTENT = {non_persistent}


def load(device: str | torch.device = "cpu") -> {class_name}:
    """The model with its weights on ``device``, in eval mode; quantized weights stored as codes are decoded bit
    for bit (by mase_lite, which the quantized layers come from)."""
    with torch.device("meta"):
        model = {class_name}()
    tensors = load_file(WEIGHTS, device="cpu")
    with safe_open(WEIGHTS, "pt") as file:
        manifest = json.loads((file.metadata() or {{}}).get("stored", "{{}}"))
    stored = {{}}
    if manifest:
        from mase_lite.layers.storage import unflatten

        stored = unflatten(tensors, manifest, str(WEIGHTS))
        tensors = {{k: v for k, v in tensors.items() if k.rpartition(".")[0] not in manifest}}
        shapes = dict(model.state_dict(keep_vars=True))
        tensors.update({{name: torch.empty(shapes[name].shape, dtype=shapes[name].dtype) for name in stored}})
    buffers = {{name: tensors.pop(name) for name in NON_PERSISTENT}}
    model.load_state_dict(tensors, strict=True, assign=True)
    for name, value in buffers.items():
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attr, value, persistent=False)
    if stored:
        from mase_lite.layers.storage import restore_codes

        restore_codes(model, stored)
    return model.to(device).eval()


__all__ = [{all}"load"]
'''


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


def emit(mg, class_name: str | None = None) -> tuple[str, Emitted, str]:
    """``(model.py source, emitted classes and state, class name)`` for ``mg``; raises CodegenError naming the node."""
    gm = mg.model
    class_name = class_name or type(mg.source_model).__name__
    graph = fx.Graph(owning_module=gm)
    output_value = graph.graph_copy(gm.graph, {})
    graph.output(output_value)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _DROPPED:
            graph.erase_node(node)
        elif node.op == "call_method":
            raise CodegenError(f"codegen cannot express node {node.name!r}: method call {node.target!r}")
    graph.eliminate_dead_code()
    builder = ClassBuilder(gm, graph, mg.source_model)
    init = builder.build()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    local = Names()
    local.used |= {n.name for n in placeholders}
    lines, printer = builder.body(builder.root, "", {n: n.name for n in placeholders}, local)
    output = _Output(getattr(gm, "_out_spec", None))
    result = next(n for n in graph.nodes if n.op == "output").args[0]
    leaves = list(result) if isinstance(result, (tuple, list)) else [result]
    lines.append(f"return {output.render([printer.arg(a) for a in leaves])}")
    signature = f"    def forward(self, {', '.join(n.name for n in placeholders)}):"
    forward = "\n".join([signature, *(f"        {ln}" for ln in lines)])
    return _model_source(mg, class_name, builder.out, output, init, forward), builder.out, class_name


def _model_source(mg, class_name: str, out: Emitted, output: _Output, init: list[str], forward: str) -> str:
    text = forward + "\n".join(out.classes.values())
    imports = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    if output.classes:
        imports.insert(0, "from typing import NamedTuple")
    if "math." in text:
        imports.insert(0, "import math")
    imports += sorted(out.imports)
    parts = [f'"""{class_name}, generated by mase-lite codegen from a captured '
             f'{type(mg.source_model).__name__}.\n\nInputs: {", ".join(mg.input_names)}. '
             'Outputs are bit-identical to the graph\'s in eval mode.\n"""', "", "\n".join(imports)]
    for name, fields in output.classes.items():
        annotated = "\n".join(f"    {f}: torch.Tensor" for f in fields)
        parts.append(f"\n\nclass {name}(NamedTuple):\n    \"\"\"The model's outputs by name.\"\"\"\n\n{annotated}")
    parts += [f"\n\n{source}" for source in out.classes.values()]
    body = "\n".join(f"        {line}" for line in ["super().__init__()", *init])
    parts.append(f"\n\nclass {class_name}(nn.Module):\n    \"\"\"The captured graph as plain PyTorch.\"\"\"\n\n"
                 f"    def __init__(self) -> None:\n{body}\n\n{forward}\n")
    return "\n".join(parts)


def write_package(mg, path: str | Path, class_name: str | None = None) -> dict[str, Any]:
    """Write ``path/`` as an importable package (all or nothing); returns what was written."""
    path = Path(path)
    if not path.name.isidentifier() or keyword.iskeyword(path.name):
        raise CodegenError(f"the package name {path.name!r} is not a Python identifier; use letters, digits and "
                           "underscores, not starting with a digit", location=("path",))
    source, out, class_name = emit(mg, class_name)
    exports = [class_name, *re.findall(r"^class (\w+)\(NamedTuple\)", source, flags=re.M)]
    init = INIT_TEMPLATE.format(doc=f"{class_name} generated by mase-lite codegen: ``load(device)`` builds it.",
                                package=path.name, exports=", ".join(exports), class_name=class_name,
                                all="".join(f"{e!r}, " for e in exports).replace("'", '"'),
                                non_persistent=repr(tuple(out.non_persistent)))
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in out.state.items()}
    codes, manifest = flatten({k: v for k, v in stored_codes(mg.model).items() if k in tensors})
    tensors = {k: v for k, v in tensors.items() if k not in manifest} | codes
    with staged_directory(path) as staging:
        (staging / "model.py").write_text(source)
        (staging / "__init__.py").write_text(init)
        save_file(tensors, str(staging / "weights.safetensors"), metadata={"stored": json.dumps(manifest)})
        if out.packed:
            (staging / "_mxint8.py").write_text(PACKED_RUNTIME)
    return {"path": str(path), "class_name": class_name, "tensors": len(tensors), "codes": len(manifest),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "packed_linears": out.packed}
