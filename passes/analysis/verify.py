"""The ``verify`` pass: graph lint plus metadata consistency."""

from __future__ import annotations

import torch
from pydantic import Field

from mase_lite.ir.capture import compare_with_model
from mase_lite.ir.meta import dtype_name, logical_name
from mase_lite.passes.registry import PassError, PassParams, PassResult, register_pass


class VerifyParams(PassParams):
    strict: bool = Field(True, description="raise on the first inconsistency instead of only reporting it")
    against_model: bool = Field(
        False,
        description="also run the graph and the captured model on the capture's example inputs (eval mode) and "
        "report where they differ; for graphs whose numerics no transform has changed",
    )


def _check_node(node, modules) -> list[str]:
    problems = []
    meta = node.meta.get("mase")
    if meta is None:
        return [f"{node.name}: no meta['mase'] (run the metadata pass)"]
    if node.op == "call_module":
        module = modules.get(node.target)
        if module is None:
            return [f"{node.name}: calls missing submodule {node.target!r}"]
        for raw_name, p in list(module.named_parameters()) + list(module.named_buffers()):
            name = logical_name(raw_name)
            recorded = meta["params"].get(name)
            if recorded is None:
                problems.append(f"{node.name}: parameter {name!r} missing from metadata")
            elif recorded["dtype"] != dtype_name(p.dtype) or recorded["shape"] != list(p.shape):
                problems.append(f"{node.name}: parameter {name!r} metadata {recorded['shape']} does not match {list(p.shape)}")
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and meta["results"]:
        res = meta["results"][0]
        if res is None or len(res["shape"]) != val.dim() or res["dtype"] != dtype_name(val.dtype):
            problems.append(f"{node.name}: result metadata {res} does not match the traced value")
    if meta.get("op") == "unknown" and "target" not in meta:
        problems.append(f"{node.name}: unknown op without a target")
    return problems


def stale_code(mg) -> bool:
    """Whether the module runs code generated from an older version of its graph (a missing recompile)."""
    return mg.model.code != mg.model.graph.python_code(root_module="self").src


def verify_graph(mg) -> list[str]:
    """Every problem found: graph lint, stale generated code, and each node's metadata."""
    problems = []
    try:
        mg.model.graph.lint()
    except Exception as err:
        problems.append(f"graph lint: {err}")
    if stale_code(mg):
        problems.append("the module's forward was generated from an older graph: call mg.recompile()")
    modules = mg.modules
    for node in mg.model.graph.nodes:
        problems.extend(_check_node(node, modules))
    return problems


@register_pass("verify", kind="analysis", params=VerifyParams)
def verify_pass(mg, params: VerifyParams):
    """Lint the graph and check every node's metadata against the graph and its modules.

    Example: ``mg, info = ml.passes.verify(mg, {"strict": False}); info["problems"]``.
    """
    problems = verify_graph(mg)
    if params.against_model:
        difference = compare_with_model(mg.model, mg.source_model, mg.example_inputs)
        if difference is not None:
            problems.append(f"graph vs model in eval mode: {difference}")
    unknown = sorted({n.meta["mase"].get("target", "") for n in mg.model.graph.nodes if n.meta.get("mase", {}).get("op") == "unknown"})
    if problems and params.strict:
        raise PassError("verify found problems:\n" + "\n".join(problems))
    return PassResult({"ok": not problems, "problems": problems, "unknown_ops": unknown})
