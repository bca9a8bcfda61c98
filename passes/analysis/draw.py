"""The ``draw`` pass: render the graph with graphviz, or write it as a networkx graph.

Example::

    ml.passes.draw(mg, {"path": "bert.svg", "depth": 3, "fold_repeats": True, "color_by": "format"})
    ml.passes.draw(mg, {"path": "bert.graphml"})      # for Gephi, yEd or a notebook
"""

from __future__ import annotations

from mase_lite.viz.draw import DrawOptions, render
from mase_lite.passes.registry import PassParams, PassResult, register_pass


class DrawParams(PassParams, DrawOptions):
    """The options of :class:`mase_lite.viz.draw.DrawOptions`; ``path`` is relative to the run."""


@register_pass("draw", kind="analysis", params=DrawParams)
def draw_pass(mg, params: DrawParams, ctx):
    """Draw the graph: module clusters, collapsed depth, folded repeats, colour by type/format/sparsity/profile."""
    path, drawing = render(mg, params.model_copy(update={"path": str(ctx.path(params.path))}))
    info = {"path": str(path)}
    if drawing is not None:
        info.update(boxes=drawing.boxes, folded=drawing.folded, note=drawing.note)
    return PassResult(info)
