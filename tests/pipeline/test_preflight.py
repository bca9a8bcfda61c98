"""A format in one file: a plug-in format quantizes, calibrates, saves, loads and exports through the mapping it
declares; an export its quantize steps cannot meet is refused before the first step, naming the layer, its shape,
the constraint and what fits; export targets register like formats."""

import json
import shutil
from pathlib import Path

import pytest
import torch

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.deploy import ExportError, register_target, target_names

DATA = Path(__file__).resolve().parents[1] / "numerics" / "data"
MODEL = {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
                                            "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 172,
                                            "max_position_embeddings": 32}}


def spec(tmp_path, rule, target="compressed-tensors", steps=None, model=MODEL, **extra):
    return {"model": model, "data": {"block_size": 16, "n_train": 16, "n_test": 8},
            "steps": steps or [{"pass": "train", "params": {"max_steps": 1}},
                               {"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": rule}}},
                               {"pass": "export", "params": {"format": target, "path": "out"}}],
            "output_dir": str(tmp_path / "run"), **extra}


@pytest.mark.parametrize(("rule", "target", "message"), [
    ({"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128}}, "compressed-tensors",
     "compressed-tensors cannot hold layer 'model.layers.0.mlp.down_proj' [64, 172] in scaled_integer: groups of 128 "
     "over 172 columns (a short last group); use groups of 86, or granularity channel"),
    ({"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}}, "gguf",
     "gguf cannot hold layer 'model.layers.0.mlp.down_proj' [64, 172] in scaled_integer: groups of 32 over 172 "
     "columns (a short last group); leave this layer float (a null rule for it)"),
    ({"weight": {"name": "block_log", "width": 4}}, "gguf",
     "gguf cannot hold layer 'model.layers.0.self_attn.q_proj' [64, 64] in block_log: it has no type for block_log"),
])
def test_an_export_its_quantize_steps_cannot_meet_is_refused_before_any_step(tmp_path, capsys, rule, target, message):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(tmp_path, rule, target)))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "steps.2.params.format" in err
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["status"] == "failed" and report["steps"] == []  # the training step never ran


@pytest.mark.parametrize(("rule", "message", "layers"), [
    ({"weight": {"name": "q4_k"}, "storage": "packed", "activations": "int8"},
     "storage 'packed' cannot hold layer 'model.layers.0.mlp.down_proj' [64, 172] in q4_k: a packed K-quant weight "
     "takes q2_k, q3_k, q4_k, q5_k or q6_k over inputs a multiple of 256", 7),  # 64 inputs are no super-block either
    ({"weight": {"name": "q8_0"}, "storage": "packed"},
     "storage 'packed' cannot hold layer 'model.layers.0.mlp.down_proj' [64, 172] in q8_0: a packed Q8_0 weight takes "
     "q8_0 over inputs a multiple of 32", 1),
    ({"weight": {"name": "mxint", "element_width": 8}, "storage": "packed", "activations": "int8"},
     "storage 'packed' cannot hold layer 'model.layers.0.mlp.down_proj' [64, 172] in mxint: MXInt8Linear with int8 "
     "activations needs blocks of 32 over inputs a multiple of 32, got block_size=32, in_features=172", 1),
])
def test_a_packed_rule_over_a_layer_its_packed_layer_cannot_hold_is_refused_before_any_step(tmp_path, capsys, rule,
                                                                                            message, layers):
    """The packed layers' limits (a K-quant's super-blocks of 256 inputs, Q8_0's and int8 activations' blocks of 32)
    are checked before the first step, as an export target's are: the training step never runs."""
    steps = [{"pass": "train", "params": {"max_steps": 1}},
             {"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": rule}}}]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(tmp_path, rule, steps=steps)))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "steps.1.params" in err
    assert err.count("storage 'packed' cannot hold") == layers
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["status"] == "failed" and report["steps"] == []


def test_a_layer_left_float_or_ignored_passes_the_check(tmp_path):
    rule = {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}}
    steps = [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": rule},
                                             "ignore": ["re:.*down_proj"]}},
             {"pass": "export", "params": {"format": "compressed-tensors", "path": "out"}}]
    result = ml.run_pipeline(spec(tmp_path, rule, steps=steps))
    assert result.report["status"] == "ok" and (tmp_path / "run" / "out" / "config.json").is_file()


def test_a_plug_in_format_quantizes_calibrates_saves_loads_and_exports(tmp_path):
    pytest.importorskip("compressed_tensors")
    plugin = shutil.copy(DATA / "pow2_int4.py", tmp_path / "pow2_int4.py")  # a file outside the package
    rule = {"weight": {"name": "pow2_int4", "max_exponent": "auto"}}
    steps = [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": rule}}},
             {"pass": "save", "params": {"path": "ckpt"}},
             {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}}]
    tiled = {**MODEL, "hf_config": {**MODEL["hf_config"], "intermediate_size": 128}}
    result = ml.run_pipeline(spec(tmp_path, rule, steps=steps, model=tiled, plugins=[str(plugin)]))
    layer = result.mg.model.get_submodule("model.layers.0.self_attn.q_proj")
    fmt = layer.quant_formats()["weight"]
    amax = layer.weight.detach().abs().max().item()
    assert fmt["max_exponent"] == int(torch.ceil(torch.log2(torch.tensor(amax / 7))))  # calibrated from the weight
    quantized = layer._operand("weight", layer.weight).detach()
    exponent = layer.encode_parameters()["weight"].side["exponent"]
    assert exponent.shape == (64, 4) and int(exponent.max()) == fmt["max_exponent"]
    loaded = ml.load(tmp_path / "run" / "ckpt")
    twin = loaded.model.get_submodule("model.layers.0.self_attn.q_proj")
    assert torch.equal(twin._operand("weight", twin.weight).detach(), quantized)
    assert torch.equal(twin.encode_parameters()["weight"].side["exponent"], exponent)
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    config = json.loads((tmp_path / "run" / "hf" / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 16
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf",  # the runtime's own decoder of the export
                                                 quantization_config=CompressedTensorsConfig(dequantize=True))
    assert torch.equal(model.get_submodule("model.layers.0.self_attn.q_proj").weight.detach(), quantized)


def test_export_targets_register_and_are_listed(tmp_path):
    assert {"compressed-tensors", "gguf", "onnx", "pt2"} <= set(target_names())
    register_target("npz", "json")  # a module with neither write nor is_export
    assert "npz" in target_names()
    with pytest.raises(ExportError, match="export target 'npz': json defines no write"):
        ml.deploy.export(torch.nn.Linear(2, 2), "npz", tmp_path / "x.npz")
    with pytest.raises(ExportError, match="already written by json"):
        register_target("npz", "pickle")
    with pytest.raises(ExportError, match="format 'nope' is unknown; allowed: compressed-tensors, gguf, onnx, pt2"):
        ml.deploy.export(torch.nn.Linear(2, 2), "nope", tmp_path / "x")


def test_a_quantized_head_tied_to_the_embedding_is_refused_before_any_step(tmp_path, capsys):
    tied = {**MODEL, "hf_config": {**MODEL["hf_config"], "intermediate_size": 128, "tie_word_embeddings": True}}
    rule = {"weight": {"name": "q8_0"}}
    steps = [{"pass": "train", "params": {"max_steps": 1}},
             {"pass": "quantize", "params": {"by": "type", "rules": {"linear": rule}}},
             {"pass": "export", "params": {"format": "gguf", "path": "m.gguf"}}]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(tmp_path, rule, steps=steps, model=tied)))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "gguf cannot hold layer 'lm_head' [" in err and ("] in q8_0: it shares its weight with 'model.embed_tokens' "
                                                          "(tied), which stays float") in err
    assert "\"ignore\": ['lm_head']" in err
    assert json.loads((tmp_path / "run" / "report.json").read_text())["steps"] == []
