"""The ``avg_bits`` pass: element-weighted average stored bits of weights and activations."""

from __future__ import annotations

from typing import Any

import math

from pydantic import Field

from mase_lite.ir.shapes import check_dims, concrete
from mase_lite.numerics import bits_per_element
from mase_lite.passes.registry import PassParams, PassResult, register_pass

# Ops whose inputs are the activations a precision search cares about.
COMPUTE_OPS = ("linear", "hf_conv1d", "conv1d", "conv2d", "conv3d", "matmul", "bmm")


class AvgBitsParams(PassParams):
    ops: list[str] = Field(default_factory=lambda: list(COMPUTE_OPS), description="ops whose weights and inputs count")
    dims: dict[str, int] = Field(
        default_factory=lambda: {"batch": 1, "seq": 128}, description="values of symbolic dims for activation sizes"
    )


def _sized(entry: dict[str, Any], dims: dict[str, int]) -> tuple[int, float]:
    """(elements, stored bits per element) of one tensor's metadata entry."""
    shape = concrete(entry["shape"], dims)
    return math.prod(shape), bits_per_element(entry["format"], shape)


def _average(pairs: list[tuple[int, float]]) -> float | None:
    total = sum(n for n, _ in pairs)
    return sum(n * b for n, b in pairs) / total if total else None


@register_pass("avg_bits", kind="analysis", params=AvgBitsParams, metrics=("weights", "activations"), needs_graph=False)
def avg_bits_pass(mg, params: AvgBitsParams):
    """Average stored bits per element of weights and of activations (inputs) of compute ops.

    Shared scales count (an MXINT8 weight is 8.25 bits). ``weights`` and ``activations`` are also the
    run's metrics (``avg_bits.weights`` in report.json). Example:
    ``ml.passes.avg_bits(mg)[1]["weights"]`` → 32.0 before quantization. In module mode activations are
    sized by one run on the model's example inputs (``None`` without examples).
    """
    observe = getattr(mg, "observed_nodes", None)  # module mode: concrete shapes, no symbolic dims
    if "dims" in params.model_fields_set and observe is None:  # the defaults name dims a graph may lack
        check_dims(params.dims, mg, "dims")
    weights: list[tuple[int, float]] = []
    acts: list[tuple[int, float]] = []
    per_node = {}
    for node in observe() if observe is not None else mg.nodes:
        meta = node.meta["mase"]
        if meta["op"] not in params.ops:
            continue
        w = [_sized(p, params.dims) for p in meta["params"].values() if p and not p.get("buffer")]
        a = [_sized(x, params.dims) for x in meta["args"] if x and x["shape"]]
        weights += w
        acts += a
        per_node[node.name] = {"weights": _average(w), "activations": _average(a)}
    summary = {"weights": _average(weights), "activations": _average(acts)}
    return PassResult({
        **summary,
        "weight_elements": sum(n for n, _ in weights),
        "activation_elements": sum(n for n, _ in acts),
        "per_node": per_node,
    }, metrics=summary)
