"""The search space expands per-layer entries over the graph a run captures: one build_graph for both."""

import json

import mase_lite as ml
from mase_lite.search.space import captured_nodes
from tests.search.conftest import TINY_PIPELINE


def test_the_space_sees_the_nodes_of_the_graph_the_run_captures(tmp_path):
    pipeline = {**TINY_PIPELINE, "steps": []}
    result = ml.run_pipeline({**pipeline, "output_dir": str(tmp_path / "run")})
    run_nodes = [n.name for n in result.mg.model.graph.nodes]
    assert [n.name for n in captured_nodes(json.loads(json.dumps(pipeline)))] == run_nodes
    assert "labels" in run_nodes  # the data's labels are an input, so the loss is in the graph both see
