"""``summarize_quantization``: the number formats of every quantized node, read from its metadata.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> int8_in_int4_w = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
...                   "weight_width": 4, "weight_frac_width": 2}
>>> mg, _ = ml.passes.quantize(mg, {"default": int8_in_int4_w})
>>> mg, info = ml.passes.summarize_quantization(mg)
>>> fc1 = info["nodes"]["fc1"]
>>> fc1["module"], fc1["formats"]["weight"]["width"], fc1["bits"]
('QuantizedLinear', 4, {'data_in': 8.0, 'weight': 4.0})
>>> info["by_format"]
{'integer': 2}
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from mase_lite.numerics import bits_per_element
from mase_lite.passes.registry import NoParams, PassResult, register_pass


def _known_shape(entry: dict[str, Any]) -> list[int] | None:
    shape = entry.get("shape")
    return shape if isinstance(shape, list) and all(isinstance(d, int) for d in shape) else None


def _operand_entries(node: fx.Node) -> dict[str, dict[str, Any]]:
    """Metadata entries named by operand: data_in (data_in_0, data_in_1, ...), data_out, and params."""
    meta = node.meta.get("mase", {})
    args = [a for a in meta.get("args", []) if a is not None]
    named = {("data_in" if len(args) == 1 else f"data_in_{i}"): a for i, a in enumerate(args)}
    results = [r for r in meta.get("results", []) if r is not None]
    if results:
        named["data_out"] = results[0]
    named.update({k: v for k, v in (meta.get("params") or {}).items() if v is not None})
    return named


@register_pass("summarize_quantization", kind="analysis", params=NoParams)
def summarize_quantization(mg, params: NoParams):
    """Per quantized node: op, module, the format of each quantized operand and its stored bits per element."""
    nodes: dict[str, Any] = {}
    by_format: dict[str, int] = {}
    for node in mg.model.graph.nodes:
        entries = _operand_entries(node)
        formats = {k: e["format"] for k, e in entries.items() if isinstance(e.get("format"), dict)}
        if not formats:
            continue
        meta = node.meta["mase"]
        nodes[node.name] = {
            "op": meta.get("op"),
            "module": meta.get("module"),
            "formats": formats,
            "bits": {k: bits_per_element(fmt, _known_shape(entries[k])) for k, fmt in formats.items()},
        }
        for name in sorted({fmt["name"] for fmt in formats.values()}):
            by_format[name] = by_format.get(name, 0) + 1
    return PassResult({"nodes": nodes, "count": len(nodes), "by_format": dict(sorted(by_format.items()))})
