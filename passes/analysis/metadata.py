"""The ``metadata`` pass: re-derive every node's ``meta["mase"]`` after transforms."""

from __future__ import annotations

from collections import Counter

from mase_lite.ir import meta
from mase_lite.passes.registry import PassResult, register_pass


@register_pass("metadata", kind="analysis", provides=("metadata",))
def metadata_pass(mg, params):
    """Re-derive node metadata (op, type, shapes, dtypes, formats) from the graph.

    Example: ``mg, info = ml.passes.metadata(mg)``; ``info["ops"]["linear"]`` counts Linear nodes.
    """
    meta.refresh(mg)
    ops = Counter(n.meta["mase"]["op"] for n in mg.model.graph.nodes)
    return PassResult({"nodes": sum(ops.values()), "ops": dict(sorted(ops.items()))})
