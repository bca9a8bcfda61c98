"""The ``draw`` pass: render the graph with graphviz."""

from __future__ import annotations

from pydantic import Field

from mase_lite.passes.paths import run_path
from mase_lite.passes.registry import PassParams, register_pass


class DrawParams(PassParams):
    path: str = Field("graph.svg", description="output file (.svg, .png, .pdf or .dot), relative to the run")
    timeout: float = Field(60.0, gt=0, description="seconds dot may take")


@register_pass("draw", kind="analysis", params=DrawParams)
def draw_pass(mg, params: DrawParams):
    """Draw the graph: one box per node with op and output shape.

    Example: ``ml.passes.draw(mg, {"path": "bert.svg"})``.
    """
    path = mg.draw(run_path(mg, params.path), timeout=params.timeout)
    return mg, {"path": str(path)}
