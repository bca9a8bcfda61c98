"""What the labs added to search specs: tied paths (``also``), fixed values (``const``), requested plots."""

import pytest

from mase_lite.infra.errors import UserError
from mase_lite.search import plots
from mase_lite.search.space import Space
from mase_lite.search.spec import SearchSpec
from tests.labs.conftest import TINY_MODEL

RULE = "steps.quantize.params.rules.linear."
PIPELINE = {
    "model": TINY_MODEL,
    "data": {"dataset": "synthetic-sentiment", "n_train": 8, "n_test": 8, "max_length": 16},
    "steps": [
        {"pass": "quantize", "params": {"by": "type", "rules": {"linear": {
            "name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4}}}},
        {"pass": "evaluate"},
    ],
}


def space(entries: list[dict]) -> Space:
    spec = SearchSpec.model_validate({"pipeline": PIPELINE, "space": entries, "objectives": [{"metric": "evaluate.accuracy"}]})
    return Space(PIPELINE, spec.space)


def test_also_sets_scaled_values_and_const_is_no_study_parameter():
    s = space([
        {"name": "width", "path": RULE + "weight_width", "type": "choice", "values": [4, 12],
         "also": [{"path": RULE + "data_in_width"}, {"path": RULE + "weight_frac_width", "scale": 0.5},
                  {"path": RULE + "data_in_frac_width", "scale": 0.5}]},
        {"path": "steps.quantize.params.by", "type": "const", "value": "type"},
    ])
    s.check()
    assert s.grid() == {"width": [4, 12]} and s.grid_names() == ["width"]
    rule = s.materialize({"width": 12})["steps"][0]["params"]["rules"]["linear"]
    assert rule == {"name": "integer", "data_in_width": 12, "data_in_frac_width": 6, "weight_width": 12, "weight_frac_width": 6}
    assert PIPELINE["steps"][0]["params"]["rules"]["linear"]["weight_width"] == 8  # the base is not touched


def test_per_layer_const_and_also_follow_each_node():
    s = space([
        {"path": "steps.quantize.params.rules.{node}.name", "nodes": {"op": "linear", "regex": ".*query|.*key"},
         "type": "const", "value": "log"},
        {"name": "w.{node}", "path": "steps.quantize.params.rules.{node}.weight_width",
         "nodes": {"op": "linear", "regex": ".*query|.*key"}, "type": "choice", "values": [4, 6],
         "also": [{"path": "steps.quantize.params.rules.{node}.data_in_width"}]},
    ])
    pipeline = PIPELINE | {"steps": [{"pass": "quantize", "params": {"by": "name", "rules": {}}}, {"pass": "evaluate"}]}
    s = Space(pipeline, s.entries)
    s.check()
    q, k = "bert_encoder_layer_0_attention_self_query", "bert_encoder_layer_0_attention_self_key"
    assert s.grid() == {f"w.{q}": [4, 6], f"w.{k}": [4, 6]}
    rules = s.materialize({f"w.{q}": 4, f"w.{k}": 6})["steps"][0]["params"]["rules"]
    assert rules == {q: {"name": "log", "weight_width": 4, "data_in_width": 4}, k: {"name": "log", "weight_width": 6, "data_in_width": 6}}


def test_bad_tied_path_and_node_placeholder_are_named():
    with pytest.raises(UserError) as info:
        space([{"path": RULE + "weight_width", "type": "choice", "values": [8], "also": [{"path": "steps.quantise.params.x"}]}])
    assert "space.0.also.0.path: steps.quantise: no step has this label or pass" in str(info.value)
    with pytest.raises(ValueError, match="'{node}' in the path needs a `nodes` selector"):
        space([{"path": RULE + "weight_width", "type": "choice", "values": [8], "also": [{"path": "steps.{node}.params"}]}])
    with pytest.raises(ValueError, match="an 'include' entry has no value to tie"):
        space([{"path": "steps.quantize.params.rules", "type": "include", "nodes": {"op": "linear"}, "also": [{"path": "seed"}]}])
    with pytest.raises(UserError) as info:
        space([{"path": RULE + "weight_width", "type": "const", "value": 2}]).check()
    assert "space.0.value (steps.quantize.params.rules.linear.weight_width = 2)" in str(info.value)


def test_requested_plot_is_written(tmp_path):
    rows = lambda acc: [  # noqa: E731
        {"number": i, "state": "COMPLETE", "params": {"width": w}, "metrics": {"q.accuracy": a, "fp.accuracy": 0.9}}
        for i, (w, a) in enumerate(zip([4, 8, 16], acc))
    ] + [{"number": 3, "state": "FAIL", "params": {"width": 2}, "metrics": {}}]
    spec = SearchSpec.model_validate({
        "pipeline": PIPELINE, "objectives": [{"metric": "q.accuracy"}],
        "plots": [{"x": "width", "y": ["q.accuracy"], "baseline": "fp.accuracy", "log_x": True, "file": "acc.png"}]})
    path = plots.requested({"s.ptq": rows([0.5, 0.8, 0.9]), "s.qat": rows([0.6, 0.9, 0.9])}, spec.plots[0], tmp_path)
    assert path == tmp_path / "acc.png" and path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 5000
    with pytest.raises(ValueError, match="String should match pattern"):
        SearchSpec.model_validate({"pipeline": PIPELINE, "objectives": [{"metric": "a"}],
                                   "plots": [{"x": "w", "y": ["a"], "file": "../x.png"}]})
