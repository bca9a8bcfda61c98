import json
import subprocess
import sys

import pytest
import torch

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.passes import PassError, PassParams, PassResult, register_pass

SMALL_DATA = {"dataset": "synthetic-sentiment", "n_train": 64, "n_test": 32}


class ScaleParams(PassParams):
    factor: float = 2.0


@register_pass("test_double_classifier", kind="transform", params=ScaleParams)
def double_classifier(mg, params):
    """Third-party transform: scale the classifier and append a mul node after it."""
    with torch.no_grad():
        mg.model.classifier.weight.mul_(params.factor)
    node = next(n for n in mg.nodes if n.name == "classifier")
    with mg.model.graph.inserting_after(node):
        scaled = mg.model.graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.0))
    node.replace_all_uses_with(scaled)
    scaled.args = (node, 1.0)
    scaled.meta = dict(node.meta)
    mg.recompile()
    return PassResult({"factor": params.factor}, metrics={"factor": params.factor}, label="scaled")


@register_pass("test_explode", kind="analysis")
def explode(mg, params):
    """Fail like a user error would."""
    raise PassError("boom: the test pass failed on purpose")


def spec(tmp_path, steps, **extra):
    return {"name": "t", "seed": 3, "data": SMALL_DATA, "steps": steps, "output_dir": str(tmp_path / "out"), **extra}


def test_third_party_pass_runs_in_a_pipeline_and_report_is_complete(tmp_path):
    result = ml.run_pipeline(
        spec(tmp_path, [{"pass": "count"}, {"pass": "test_double_classifier", "params": {"factor": 3}, "draw_after": True}])
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "ok" and report["seed"] == 3 and report["name"] == "t"
    assert report["spec"]["steps"][1] == {"pass": "test_double_classifier", "params": {"factor": 3}, "draw_after": True, "label": None}
    assert set(report["versions"]) >= {"python", "torch", "transformers", "mase-lite"}
    assert [s["pass"] for s in report["steps"]] == ["count", "test_double_classifier"]
    assert all(s["seconds"] >= 0 for s in report["steps"]) and report["capture"]["seconds"] > 0
    change = report["steps"][1]["graph_change"]
    assert change["ops"] == {"mul": [0, 1]} and change["nodes"][1] == change["nodes"][0] + 1
    assert report["steps"][0]["graph_change"] == {"nodes": change["nodes"][:1] * 2, "ops": {}}
    assert report["metrics"]["scaled"] == {"factor": 3.0} and set(report["metrics"]) == {"count", "scaled"}
    assert (tmp_path / "out" / "step01_test_double_classifier.svg").is_file()
    assert result.mg.history == [
        {"pass": "test_double_classifier", "params": {"factor": 3.0}, "module": "tests.pipeline.test_runner"}
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []


def test_failing_step_still_writes_report_naming_it(tmp_path):
    with pytest.raises(PassError, match="boom"):
        ml.run_pipeline(spec(tmp_path, [{"pass": "count"}, {"pass": "test_explode"}]))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "failed"
    assert report["failed_step"] == "steps.1 (test_explode)"
    assert report["error"] == "PassError: steps.1 (test_explode): boom: the test pass failed on purpose"
    assert len(report["steps"]) == 1


def test_invalid_pipeline_runs_nothing(tmp_path):
    with pytest.raises(ml.UserError, match="unknown pass 'nope'"):
        ml.run_pipeline(spec(tmp_path, [{"pass": "nope"}]))
    assert not (tmp_path / "out").exists()


def test_reproduce_from_report(tmp_path):
    first = ml.run_pipeline(spec(tmp_path, [{"pass": "test_double_classifier"}, {"pass": "count"}]))
    again = ml.run_pipeline(tmp_path / "out" / "report.json", output_dir=tmp_path / "again")
    assert again.report["spec"] == first.report["spec"]
    assert again.report["steps"][1]["info"]["macs"] == first.report["steps"][1]["info"]["macs"]


def test_cli_run_and_errors(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(spec(tmp_path, [{"pass": "count"}])))
    assert main(["run", str(path)]) == 0
    assert "t: ok; report:" in capsys.readouterr().out
    path.write_text(json.dumps({"steps": [{"pass": "count", "params": {"dimz": 1}}]}))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mase-lite: error: invalid pipeline spec {path}:\nsteps.0.params.dimz: unknown key; allowed keys: dims")


def test_cli_passes_schema_version(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert "profile (analysis): " in out and "    num_batches: int = 4" in out
    assert "    path: str (required)" in out and "    weight: WeightPruning | None = WeightPruning(" in out
    assert main(["passes", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["count"]["params"]["dims"]["default"] == {"batch": 1, "seq": 128}
    assert listing["load"]["params"]["path"] == {"type": "str", "required": True, "default": None}
    assert main(["schema", "pipeline"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["additionalProperties"] is False and "steps" in schema["properties"]
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("mase-lite 0.1.0")


def test_console_script_exit_code_two(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    proc = subprocess.run([sys.executable, "-m", "mase_lite.cli", "run", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("mase-lite: error: ") and "not valid JSON at line 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_draw_default_and_config(tmp_path, capsys):
    assert main(["draw", "-o", str(tmp_path / "bert.svg")]) == 0
    assert "bert_encoder_layer_1_output_dense" in (tmp_path / "bert.svg").read_text()
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'bert.svg'} (")
    config = tmp_path / "model.json"
    config.write_text(json.dumps({"hf_config": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}}))
    assert main(["draw", "--model", str(config), "-o", str(tmp_path / "small.dot")]) == 0
    assert "bert_encoder_layer_1" not in (tmp_path / "small.dot").read_text()
    config.write_text(json.dumps({"hf_confg": {}}))
    assert main(["draw", "--model", str(config), "-o", str(tmp_path / "bad.svg")]) == 2
    assert "model.hf_confg: unknown key; allowed keys: " in capsys.readouterr().err
    assert not (tmp_path / "bad.svg").exists()
