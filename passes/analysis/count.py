"""The ``count`` pass: parameters, nodes per op, and multiply-accumulates from shapes."""

from __future__ import annotations

import math
from collections import Counter

from pydantic import Field

from mase_lite.ir.shapes import check_dims, numel
from mase_lite.passes.registry import PassParams, PassResult, register_pass


class CountParams(PassParams):
    dims: dict[str, int] = Field(
        default_factory=lambda: {"batch": 1, "seq": 128},
        description="values of the symbolic dims used to count MACs",
    )


def _shape(entry) -> list:
    return entry["shape"] if entry else []


def node_macs(node, module, dims: dict[str, int]) -> int:
    """Multiply-accumulates of one node for the given symbol values (0 for ops that do none)."""
    meta = node.meta["mase"]
    op, args, results = meta["op"], meta["args"], meta["results"]
    if not results or results[0] is None:
        return 0
    out = numel(_shape(results[0]), dims)
    if op == "linear" and module is not None and hasattr(module, "in_features"):
        return out * module.in_features
    if op == "hf_conv1d" and module is not None:
        return out * module.weight.shape[0]
    if op in ("conv1d", "conv2d", "conv3d") and module is not None:
        return out * (module.in_channels // module.groups) * math.prod(module.kernel_size)
    if op in ("linear", "matmul", "bmm") and args and args[0]:
        return out * numel(_shape(args[0])[-1:], dims)
    if op == "sdpa" and len(args) >= 3 and all(args[:3]):
        q, k, v = (_shape(a) for a in args[:3])
        batch_heads = numel(q[:-2], dims)
        length, source = numel(q[-2:-1], dims), numel(k[-2:-1], dims)
        return batch_heads * length * source * (numel(q[-1:], dims) + numel(v[-1:], dims))
    return 0


@register_pass("count", kind="analysis", params=CountParams, metrics=("parameters", "trainable_parameters", "macs"))
def count_pass(mg, params: CountParams):
    """Count parameters (total, trainable), nodes per op, and MACs of linear/conv/matmul/sdpa.

    Parameters, trainable parameters and MACs are also the run's metrics (``count.macs``). Example:
    ``ml.passes.count(mg, {"dims": {"batch": 8, "seq": 64}})[1]["macs"]``.
    """
    if "dims" in params.model_fields_set:  # the defaults name dims a graph may lack
        check_dims(params.dims, mg, "dims")
    modules = mg.modules
    params_total = sum(p.numel() for p in mg.model.parameters())
    trainable = sum(p.numel() for p in mg.model.parameters() if p.requires_grad)
    ops = Counter(n.meta["mase"]["op"] for n in mg.model.graph.nodes)
    macs_by_node = {}
    for node in mg.model.graph.nodes:
        module = modules.get(node.target) if node.op == "call_module" else None
        macs = node_macs(node, module, params.dims)
        if macs:
            macs_by_node[node.name] = macs
    macs_by_op: Counter = Counter()
    for node in mg.model.graph.nodes:
        macs_by_op[node.meta["mase"]["op"]] += macs_by_node.get(node.name, 0)
    metrics = {"parameters": params_total, "trainable_parameters": trainable, "macs": sum(macs_by_node.values())}
    return PassResult({
        "parameters": params_total,
        "trainable_parameters": trainable,
        "nodes": sum(ops.values()),
        "ops": dict(sorted(ops.items())),
        "dims": dict(params.dims),
        "macs": sum(macs_by_node.values()),
        "macs_by_op": {k: v for k, v in sorted(macs_by_op.items()) if v},
        "macs_by_node": macs_by_node,
    }, metrics=metrics)
