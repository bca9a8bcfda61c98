"""A user error carries where it happened as a location tuple that each layer prefixes on the way up
(field of a pass's params -> step -> spec; space entry -> candidate), and is formatted once when shown."""

import json
import pickle

import pytest
import torch

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.infra.errors import Scope, UserError, describe, show_paths_as
from mase_lite.passes.registry import PassError, register_pass
from mase_lite.search.space import Space
from mase_lite.search.spec import SearchSpec

RULE = {"name": "integer", "weight_width": 8, "weight_frac_width": 4}
MODEL = {"model": {"factory": "tests.ir.models:small_cnn"}, "example_inputs": {"x": {"shape": [2, 3, 8, 8]}}, "data": None}


def _pipeline(tmp_path, steps):
    return {"name": "located", **MODEL, "steps": steps, "output_dir": str(tmp_path / "run")}


@register_pass("test_names_staging", kind="analysis")
def names_staging(mg, params, ctx):
    """Fail with an error that names a file of the run being written."""
    raise RuntimeError(f"cannot use {ctx.output_dir / 'weights.bin'}")


def test_location_parts_format_as_a_path_with_scopes_set_apart():
    err = UserError("must be at least 1 (got 0)", location=("rules", "x", "width"))
    assert err.location == ("rules", "x", "width") and err.message == "must be at least 1 (got 0)"
    assert err.within("steps", 1, "params") is err
    assert err.location == ("steps", 1, "params", "rules", "x", "width")
    assert str(err) == "steps.1.params.rules.x.width: must be at least 1 (got 0)"
    grouped = UserError("check failed:", problems=[UserError("bad", location=("a",)), UserError("worse", location=("b", 0))])
    assert str(grouped.within("space", 2, Scope("(seed = 1)"))) == (
        "space.2 (seed = 1): check failed:\nspace.2 (seed = 1): a: bad\nspace.2 (seed = 1): b.0: worse"
    )
    copy = pickle.loads(pickle.dumps(PassError("boom", location=("targets",))))
    assert (type(copy), copy.location, str(copy)) == (PassError, ("targets",), "targets: boom")


def test_a_field_error_of_a_step_is_located_at_the_field_through_pipeline_and_call(tmp_path):
    steps = [{"pass": "report", "params": {"path": "nodes", "console": False}},
             {"pass": "quantize", "params": {"by": "name", "rules": {"nope": RULE}}}]
    with pytest.raises(PassError) as info:
        ml.run_pipeline(_pipeline(tmp_path, steps))
    err = info.value
    assert err.location == ("steps.1", "params", "rules", "nope")
    message = "matches no node (by name); quantizable nodes: conv1, conv2, fc"
    assert err.message == message and str(err) == f"steps.1.params.rules.nope: {message}"
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert (report["failed_step"], report["error"]) == ("steps.1 (quantize)", f"PassError: steps.1.params.rules.nope: {message}")

    mg = ml.MaseGraph(__import__("tests.ir.models", fromlist=["small_cnn"]).small_cnn(),
                      example_inputs={"x": torch.randn(2, 3, 8, 8)})
    with pytest.raises(PassError) as info:
        ml.passes.quantize(mg, {"by": "name", "rules": {"nope": RULE}})
    assert info.value.location == ("pass 'quantize' params", "rules", "nope")
    assert str(info.value) == f"pass 'quantize' params.rules.nope: {message}"


def test_an_error_that_names_no_field_is_located_at_its_step(tmp_path, capsys):
    steps = [{"pass": "load", "params": {"path": "nowhere"}}]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_pipeline(tmp_path, steps)))
    assert main(["run", str(spec)]) == 2
    looked = f"{tmp_path / 'run' / 'nowhere'} and nowhere"
    assert capsys.readouterr().err.strip() == (
        f"mase-lite: error: steps.0 (load): no checkpoint at 'nowhere' (looked for recipe.json in {looked})"
    )


def test_the_run_shows_its_final_directory_without_rewriting_the_error(tmp_path):
    with pytest.raises(RuntimeError) as info:
        ml.run_pipeline(_pipeline(tmp_path, [{"pass": "test_names_staging"}]))
    out = tmp_path / "run"
    assert ".staging-" in info.value.args[0]  # the error is the pass's own
    assert describe(info.value) == f"cannot use {out / 'weights.bin'}"
    report = json.loads((out / "report.json").read_text())
    assert report["error"] == f"RuntimeError: cannot use {out / 'weights.bin'}"
    assert ".staging-" not in json.dumps(report)


def test_describe_shows_aliased_paths_of_user_errors_too():
    err = UserError("'/tmp/.x.staging-1/a' lies outside", location=("path",))
    show_paths_as(err, {"/tmp/.x.staging-1": "/tmp/x"})
    assert str(err) == describe(err) == "path: '/tmp/x/a' lies outside"
    assert err.args == ("'/tmp/.x.staging-1/a' lies outside",)


def test_a_search_candidate_error_is_located_at_the_space_entry_and_value():
    pipeline = {**MODEL, "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"conv2d": RULE}}}]}
    entries = [{"path": "steps.quantize.params.rules.conv2d.weight_width", "type": "choice", "values": [8, 2]},
               {"path": "steps.quantize.params.rulez", "type": "const", "value": 1}]
    spec = SearchSpec.model_validate({"pipeline": pipeline, "space": entries, "objectives": [{"metric": "q.x"}]})
    with pytest.raises(UserError) as info:
        Space(pipeline, spec.space)
    [problem] = info.value.problems
    assert problem.location == ("space", 1, "path")
    assert str(info.value) == (
        "search space check failed:\nspace.1.path: steps.quantize.params.rulez: pass 'quantize' has no parameter "
        "'rulez'; its parameters: by, rules, default, bypass, allow_unmatched, calibration, preset, ignore"
    )
    spec = SearchSpec.model_validate({"pipeline": pipeline, "space": entries[:1], "objectives": [{"metric": "q.x"}]})
    with pytest.raises(UserError) as info:
        Space(pipeline, spec.space).check()
    [problem] = info.value.problems
    assert problem.location == ("space", 0, "values", 1, "(steps.quantize.params.rules.conv2d.weight_width = 2)")
    assert str(info.value) == (
        "search space check failed:\nspace.0.values.1 (steps.quantize.params.rules.conv2d.weight_width = 2): "
        "invalid pipeline spec pipeline:\nsteps.0.params.rules.conv2d.weight: frac_width=4 must be <= width=2 (allowed: 0..2)"
    )
