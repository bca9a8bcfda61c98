"""The export step at the end of a pipeline and ``mase-lite export`` on a run or a checkpoint: what they write,
and the exit code 2 with one line for a wrong source or a format the target cannot hold."""

import json

import pytest

import mase_lite as ml
from mase_lite.cli import main

pytest.importorskip("compressed_tensors")

MODEL = {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                            "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
                                            "max_position_embeddings": 32}}
W4 = {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}}


def run(tmp_path, rules, steps=()):
    return ml.run_pipeline({
        "model": MODEL, "data": {"block_size": 16, "n_train": 16, "n_test": 8},
        "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, **rules}}},
                  {"pass": "save", "params": {"path": "ckpt"}}, *steps],
        "output_dir": str(tmp_path / "run")})


def test_a_pipeline_exports_with_its_tokenizer(tmp_path):
    result = run(tmp_path, {"linear": W4}, [{"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}}])
    info = result.report["steps"][-1]["info"]
    assert info["format"] == "compressed-tensors" and info["ignore"] == ["lm_head"]
    written = {p.name for p in (tmp_path / "run" / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= written


def test_the_command_exports_a_run_and_a_checkpoint(tmp_path, capsys):
    run(tmp_path, {"linear": W4})
    assert main(["export", str(tmp_path / "run"), "--format", "compressed-tensors", "-o", str(tmp_path / "a")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "run" / "ckpt"), "--format", "compressed-tensors", "-o", str(tmp_path / "b")]) == 0
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    assert (tmp_path / "a" / "tokenizer.json").is_file()


def test_the_command_refuses_in_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--format", "compressed-tensors", "-o", str(tmp_path / "x")]) == 2
    assert "is neither a checkpoint" in capsys.readouterr().err
    run(tmp_path, {"linear": {"weight": {"name": "block_log", "width": 4}}})
    assert main(["export", str(tmp_path / "run"), "--format", "compressed-tensors", "-o", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "cannot hold layer 'model.layers.0.self_attn.q_proj': weight format block_log" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "hf").exists()


def test_a_report_naming_a_checkpoint_outside_its_run_is_not_followed(tmp_path, capsys):
    run(tmp_path, {"linear": W4})
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for step in report["steps"]:
        if step["pass"] == "save":
            step["info"]["path"] = str(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "recipe.json").write_text("{}")
    (tmp_path / "run" / "report.json").write_text(json.dumps(report))
    assert main(["export", str(tmp_path / "run"), "--format", "compressed-tensors", "-o", str(tmp_path / "hf")]) == 2
    assert "saved no checkpoint inside its directory" in capsys.readouterr().err


def test_a_run_with_a_relative_output_dir_exports_by_its_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the deploy guide's route: "output_dir": "runs/w4a16", then export runs/w4a16
    ml.run_pipeline({"model": MODEL, "data": {"block_size": 16, "n_train": 16, "n_test": 8},
                     "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": W4}}},
                               {"pass": "save", "params": {"path": "checkpoint"}}],
                     "output_dir": "runs/w4a16"})
    assert main(["export", "runs/w4a16", "--format", "compressed-tensors", "-o", "llama-w4"]) == 0
    assert "from runs/w4a16/checkpoint" in capsys.readouterr().out
    assert (tmp_path / "llama-w4" / "config.json").is_file()


def test_argument_errors_are_named_before_torch_and_transformers_load(tmp_path):
    """A misspelt source, an impossible destination or a missing or broken spec: exit 2 and one line, decided before
    the heavy imports (under load these took a minute)."""
    import subprocess
    import sys

    run(tmp_path, {"linear": W4})
    (tmp_path / "file").write_text("x")
    (tmp_path / "broken.json").write_text("{")
    cases = [
        (["export", str(tmp_path / "rnu"), "--format", "gguf", "-o", str(tmp_path / "m.gguf")], "is neither a checkpoint"),
        (["export", str(tmp_path / "run"), "--format", "gguf", "-o", str(tmp_path / "file" / "m.gguf")], "is not a directory"),
        (["export", str(tmp_path / "run"), "--format", "onnx", "-o", str(tmp_path / "run" / "ckpt" / "m.onnx")], "the model's source"),
        (["run", str(tmp_path / "spec.jsn")], "no such spec file"),
        (["search", str(tmp_path / "broken.json")], "not valid JSON"),
    ]
    probe = "import sys, mase_lite.cli as c; code = c.main(sys.argv[1:]); print(code, 'torch' in sys.modules, 'transformers' in sys.modules)"
    for argv, message in cases:
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["2", "False", "False"], (argv, done.stdout, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (argv, done.stderr)
