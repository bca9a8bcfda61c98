"""Checkpoints store quantized weights as codes and scales: save -> load rebuilds the same model bit for bit
(every format, graph and module mode, GPT-2's transposed Conv1D, tied weights), without data after gptq and
smooth, and a damaged file is refused naming the tensor."""

import json

import pytest
import safetensors.torch
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.ir.module_model import ModuleModel
from mase_lite.numerics.codes import same_bits
from tests.numerics.test_codes import FORMATS

LAYER_FORMATS = [f for f in FORMATS if f["name"] != "binary_residual_sign"] + [
    {"name": "binary_residual_sign", "levels": 2}]


def mlp(width: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def quantized_mlp(fmt: dict) -> ml.MaseGraph:
    mg = ml.MaseGraph(mlp(), example_inputs={"input": torch.randn(4, 48)})
    config = {"weight": fmt, "bias": {"name": "integer", "width": 8, "frac_width": 5}}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": config}})
    return mg


@pytest.mark.parametrize("fmt", LAYER_FORMATS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_every_format_loads_bit_for_bit_from_its_codes(fmt, tmp_path):
    mg = quantized_mlp(fmt)
    mg.model.eval()
    x = torch.randn(5, 48)
    with torch.no_grad():
        expected = mg.model(input=x)
    mg.save(tmp_path / "ckpt")
    recipe = json.loads((tmp_path / "ckpt" / "recipe.json").read_text())
    assert sorted(recipe["stored"]) == [f"{i}.{p}" for i in (0, 2, 4) for p in ("bias", "weight")]
    loaded = ml.load(tmp_path / "ckpt", model=mlp())
    with torch.no_grad():
        assert same_bits(loaded.model(input=x), expected)
    for name, module in mg.model.named_modules():
        if hasattr(module, "weight_quantizer"):
            mine = dict(loaded.model.named_modules())[name]
            assert same_bits(mine.weight_quantizer(mine.weight), module.weight_quantizer(module.weight))
    saved = safetensors.torch.load_file(tmp_path / "ckpt" / "model.safetensors")
    assert "0.weight" not in saved and saved["0.weight.codes"].dtype == torch.uint8


def test_four_bit_groups_take_an_eighth_of_the_float_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512, bias=False) for _ in range(4)])
    mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(2, 512)})
    mg.save(tmp_path / "float")
    w4 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "scale_dtype": "float16"}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": w4}}})
    mg.save(tmp_path / "codes")
    sizes = {k: (tmp_path / k / "model.safetensors").stat().st_size for k in ("float", "codes")}
    assert sizes["codes"] / sizes["float"] == pytest.approx(4.125 / 32, rel=0.02)


def test_held_weights_pass_through_until_training_changes_them(tmp_path):
    fmt = {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group", "group_size": 16}
    mg = quantized_mlp(fmt)
    mg.save(tmp_path / "ckpt")
    layer = ml.load(tmp_path / "ckpt", model=mlp()).model.get_submodule("2")
    quantizer = layer.weight_quantizer
    assert quantizer.held(layer.weight) is not None
    stored = layer.weight.detach().clone()
    assert not torch.equal(ml.numerics.quantize(stored, fmt), stored)  # quantizing again would move values
    assert same_bits(quantizer(layer.weight), stored)
    with torch.no_grad():
        layer.weight.add_(0.01)
    assert quantizer.held(layer.weight) is None
    assert same_bits(quantizer(layer.weight).detach(), ml.numerics.quantize(layer.weight.detach(), fmt))


def test_float_weights_keep_what_training_needs(tmp_path):
    mg = quantized_mlp({"name": "mxint", "element_width": 4})
    mg.save(tmp_path / "float", weights="float")
    recipe = json.loads((tmp_path / "float" / "recipe.json").read_text())
    assert recipe["stored"] == {}
    loaded = ml.load(tmp_path / "float", model=mlp())
    assert torch.equal(loaded.model.get_submodule("0").weight, mg.model.get_submodule("0").weight)
    with pytest.raises(UserError, match="weights='half' is unknown; allowed: codes, float"):
        mg.save(tmp_path / "x", weights="half")


def test_module_mode_checkpoints_store_codes(tmp_path):
    mm = ModuleModel(mlp(), example_inputs={"input": torch.randn(2, 48)})
    fmt = {"weight": {"name": "mxfp", "element_format": "e2m1"}}
    mm, _ = ml.passes.quantize(mm, {"by": "type", "rules": {"linear": fmt}})
    x = torch.randn(3, 48)
    expected = mm.model.eval()(x)
    mm.save(tmp_path / "modules")
    recipe = json.loads((tmp_path / "modules" / "recipe.json").read_text())
    assert recipe["capture"] == "modules" and "4.weight" in recipe["stored"]
    loaded = ml.load(tmp_path / "modules", model=mlp())
    assert torch.equal(loaded.model(x), expected)


def test_gpt2_conv1d_and_a_tied_head(tmp_path):
    """GPT-2's Conv1D stores its weight transposed; a quantized head tied to the embedding stays float."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).eval()
    mg = ml.MaseGraph(model, hf_input_names=["input_ids"])
    fmt = {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16}}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": fmt}})
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        expected = mg.model(input_ids=ids).logits
    mg.save(tmp_path / "gpt2")
    stored = json.loads((tmp_path / "gpt2" / "recipe.json").read_text())["stored"]
    assert "transformer.h.0.attn.c_attn.weight" in stored and stored["transformer.h.0.attn.c_attn.weight"]["shape"] == [96, 32]
    assert "lm_head.weight" not in stored
    loaded = ml.load(tmp_path / "gpt2")
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, expected)


def test_gptq_and_smooth_are_kept_as_weights_and_a_checkpoint_loads_without_data(tmp_path):
    spec = {"seed": 0, "model": {"task": "causal-lm", "hf_config": {
                "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 32}},
            "data": {"dataset": "synthetic-grammar", "block_size": 16, "n_train": 32, "n_test": 8},
            "steps": [{"pass": "calibrate", "params": {"num_batches": 2, "batch_size": 4}},
                      {"pass": "smooth", "params": {"alpha": 0.5}},
                      {"pass": "calibrate", "params": {"num_batches": 2, "batch_size": 4}},
                      {"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {
                          "data_in": {"name": "scaled_integer", "width": 8, "granularity": "tensor", "scale": "auto"},
                          "weight": {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group",
                                     "group_size": 16}}}}},
                      {"pass": "gptq", "params": {"num_batches": 2, "batch_size": 4}},
                      {"pass": "evaluate", "params": {"label": "q", "progress": False}},
                      {"pass": "save", "params": {"path": "ckpt"}}],
            "output_dir": str(tmp_path / "run")}
    result = ml.run_pipeline(spec)
    recipe = json.loads((tmp_path / "run" / "ckpt" / "recipe.json").read_text())
    (quantize,) = recipe["transforms"]
    assert quantize["pass"] == "quantize" and quantize["params"]["by"] == "name"
    scales = {rule["data_in"]["scale"] for rule in quantize["params"]["rules"].values()}
    assert all(isinstance(s, float) for s in scales)  # the calibrated scales, not "auto"
    again = ml.run_pipeline({**spec, "steps": [{"pass": "load", "params": {"path": str(tmp_path / "run" / "ckpt")}},
                                               {"pass": "evaluate", "params": {"label": "q", "progress": False}}],
                             "output_dir": str(tmp_path / "again")})
    assert again.report["metrics"]["q"]["perplexity"] == result.report["metrics"]["q"]["perplexity"]


def _saved(tmp_path):
    mg = quantized_mlp({"name": "mxint", "element_width": 4})
    mg.save(tmp_path / "ckpt")
    return tmp_path / "ckpt" / "model.safetensors", tmp_path / "ckpt" / "recipe.json"


def test_truncated_codes_are_refused_naming_the_tensor(tmp_path):
    weights, _ = _saved(tmp_path)
    tensors = safetensors.torch.load_file(weights)
    tensors["2.weight.codes"] = tensors["2.weight.codes"][:10]
    safetensors.torch.save_file(tensors, weights)
    with pytest.raises(UserError, match=r"stored codes '2.weight': 2.weight.codes is not 4096 packed 4-bit codes"):
        ml.load(tmp_path / "ckpt", model=mlp())


def test_a_missing_scale_or_a_wrong_one_is_refused(tmp_path):
    weights, _ = _saved(tmp_path)
    tensors = safetensors.torch.load_file(weights)
    scale = tensors.pop("4.weight.scale")
    safetensors.torch.save_file(tensors, weights)
    with pytest.raises(UserError, match=r"stored codes '4.weight' lack tensor '4.weight.scale'"):
        ml.load(tmp_path / "ckpt", model=mlp())
    safetensors.torch.save_file({**tensors, "4.weight.scale": scale[:1]}, weights)
    with pytest.raises(UserError, match=r"stored codes '4.weight': scale of format 'mxint' is \[10, 2\] torch.uint8 for a tensor of shape \[10, 64\], got \[1, 2\]"):
        ml.load(tmp_path / "ckpt", model=mlp())


def test_a_manifest_that_does_not_fit_the_model_is_refused(tmp_path):
    _, recipe_path = _saved(tmp_path)
    recipe = json.loads(recipe_path.read_text())
    entry = recipe["stored"]["0.weight"]
    recipe_path.write_text(json.dumps({**recipe, "stored": {**recipe["stored"], "0.weight": {**entry, "bits": 2}}}))
    with pytest.raises(UserError, match=r"format 'mxint' stores 4-bit codes, not 2-bit ones"):
        ml.load(tmp_path / "ckpt", model=mlp())
    recipe_path.write_text(json.dumps({**recipe, "stored": {**recipe["stored"], "1.weight": entry}}))
    with pytest.raises(UserError, match=r"stored codes '1.weight': the model has ReLU at '1', not a quantized layer"):
        ml.load(tmp_path / "ckpt", model=mlp())
    recipe_path.write_text(json.dumps({**recipe, "stored": {**recipe["stored"], "0.weight": {**entry, "dtype": "int8"}}}))
    with pytest.raises(UserError, match=r"stored.0.weight.dtype"):
        ml.load(tmp_path / "ckpt", model=mlp())


def test_a_llama_checkpoint_with_every_linear_at_4_bits_reloads_its_logits(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    mg = ml.MaseGraph(model, hf_input_names=["input_ids"])
    fmt = {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "scale_dtype": "float16"}}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": fmt}})
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        expected = mg.model(input_ids=ids).logits
    mg.save(tmp_path / "llama")
    with torch.no_grad():
        assert torch.equal(ml.load(tmp_path / "llama").model(input_ids=ids).logits, expected)
