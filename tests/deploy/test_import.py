"""Others' quantized checkpoints as models of the tool: a compressed-tensors directory written by compressed-tensors'
own compressor, and GGUF files, load as quantized layers of the equivalent formats holding the stored values; their
logits and perplexity are what transformers (with compressed-tensors) gives; a save -> load keeps them; and what
the files name is never run."""

import json
import logging

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export
from mase_lite.importers import hub
from mase_lite.layers.quantized import QuantizedLinear
from mase_lite.workloads.tokenizer import train_wordpiece

ct = pytest.importorskip("compressed_tensors")
gguf = pytest.importorskip("gguf")


def llama(vocab=96):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()


def llm_compressor_checkpoint(path, scheme: dict, ignore=("lm_head",), form="pack-quantized"):
    """What llm-compressor writes: compressed-tensors' schemes applied, scales observed (min-max), the model compressed
    by compressed-tensors' own ModelCompressor and saved by transformers."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme, apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams

    model = llama()
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], **scheme)},
                                ignore=list(ignore))
    logging.getLogger("compressed_tensors").setLevel(logging.ERROR)
    apply_quantization_config(model, config)
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            args = module.quantization_scheme.weights
            w = module.weight.data
            groups = w.reshape(w.shape[0], -1, args.group_size) if args.strategy == "group" else w.unsqueeze(1)
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=form)
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)
    train_wordpiece(["the cat sat on the mat", "a dog ran"], vocab_size=90).save_pretrained(path)


W4A16 = {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}
W8A8 = {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}}


FP8_DYNAMIC = {"weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
               "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                     "dynamic": True}}


@pytest.mark.parametrize("scheme", [W4A16, W8A8, FP8_DYNAMIC], ids=["W4A16", "W8A8-dynamic", "FP8-dynamic"])
def test_a_compressed_tensors_checkpoint_gives_transformers_logits(scheme, tmp_path):
    from compressed_tensors.quantization import QuantizationArgs

    fp8 = scheme["weights"]["type"] == "float"
    llm_compressor_checkpoint(tmp_path / "ct", {k: QuantizationArgs(**v) for k, v in scheme.items()},
                              form="float-quantized" if fp8 else "pack-quantized")
    ours = hub.read_model(tmp_path / "ct", AutoModelForCausalLM)
    layer = ours.model.layers[0].self_attn.q_proj
    assert isinstance(layer, QuantizedLinear) and layer.weight_quantizer.held(layer.weight) is not None
    formats = layer.quant_formats()
    if fp8:
        assert formats["weight"]["name"] == formats["data_in"]["name"] == "scaled_float"
        assert formats["weight"]["granularity"] == "channel" and formats["data_in"]["scale"] is None
    else:
        assert formats["weight"]["full_range"] and formats["weight"]["width"] == scheme["weights"]["num_bits"]
    assert ("data_in" in formats) == ("input_activations" in scheme)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "ct")
    ids = torch.randint(0, 90, (2, 11))
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)


def test_a_pipeline_evaluates_saves_and_reloads_an_imported_model(tmp_path):
    from compressed_tensors.quantization import QuantizationArgs

    llm_compressor_checkpoint(tmp_path / "ct", {"weights": QuantizationArgs(**W4A16["weights"])})
    spec = {"model": {"task": "causal-lm", "pretrained": str(tmp_path / "ct")},
            "data": {"block_size": 16, "n_train": 16, "n_test": 16},
            "steps": [{"pass": "evaluate", "params": {"label": "imported", "progress": False}},
                      {"pass": "avg_bits", "params": {}}, {"pass": "save", "params": {"path": "ckpt"}}],
            "output_dir": str(tmp_path / "run")}
    result = ml.run_pipeline(spec)
    assert result.report["metrics"]["avg_bits"]["weights"] < 32
    mg = ml.load(tmp_path / "run" / "ckpt")
    assert [step["pass"] for step in mg.history] == ["quantize"]
    again = ml.run_pipeline({**spec, "steps": [{"pass": "load", "params": {"path": str(tmp_path / "run" / "ckpt")}},
                                               {"pass": "evaluate", "params": {"label": "imported", "progress": False}}],
                             "output_dir": str(tmp_path / "again")})
    assert again.report["metrics"]["imported"]["perplexity"] == result.report["metrics"]["imported"]["perplexity"]


@pytest.mark.parametrize("fmt", [{"name": "mxint", "element_width": 8}, {"name": "mxfp", "element_format": "e2m1"},
                                 {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32,
                                  "scale_dtype": "float16"}], ids=["Q8_0", "MXFP4", "Q4_0"])
def test_a_gguf_file_comes_back_with_the_same_logits_and_its_vocabulary(fmt, tmp_path):
    model, _ = ml.passes.quantize(llama(), {"by": "type", "rules": {"head": None, "linear": {"weight": fmt}}})
    tokenizer = train_wordpiece(["the cat sat on the mat", "a dog ran"], vocab_size=90)
    export(model, "gguf", tmp_path / "m.gguf", tokenizer=tokenizer)
    back = hub.read_model(tmp_path / "m.gguf", AutoModelForCausalLM)
    ids = torch.randint(0, 90, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(input_ids=ids).logits)
    assert back.mase_transforms[0]["pass"] == "quantize" and len(back.mase_transforms[0]["params"]["rules"]) == 7
    vocabulary = hub.read_tokenizer(tmp_path / "m.gguf")
    text = "the cat sat on a mat"
    assert vocabulary(text)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert vocabulary.eos_token == "[SEP]" and vocabulary.decode(vocabulary(text)["input_ids"]) == text


@pytest.mark.parametrize(("kind", "layer"), [("Q5_0", "q5_0"), ("Q4_1", "q4_1"), ("BF16", None)])
def test_other_ggml_types_are_read_as_their_formats_or_their_dequantized_floats(kind, layer, tmp_path):
    """A Q5_0 or Q4_1 tensor (llama.cpp's own types) becomes a layer of that format, a BF16 one (no format here) float
    weights, either holding what gguf's dequantizer gives."""
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType[kind]
    model = llama()
    export(model, "gguf", tmp_path / "float.gguf")
    reader = gguf.GGUFReader(tmp_path / "float.gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    stored = {}
    for tensor in reader.tensors:
        data = np.array(tensor.data)
        if tensor.name == "blk.0.ffn_up.weight":
            data = quantize(data, qtype)
            stored[tensor.name] = dequantize(data, qtype)
            writer.add_tensor(tensor.name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    back = hub.read_model(tmp_path / "q.gguf", AutoModelForCausalLM)
    up = back.model.layers[0].mlp.up_proj
    if layer is None:
        assert type(up) is torch.nn.Linear
        weight = up.weight.detach()
    else:
        assert up.quant_formats()["weight"] == {"name": layer}
        weight = up._operand("weight", up.weight).detach()
    assert np.array_equal(weight.numpy(), stored["blk.0.ffn_up.weight"])


def test_what_a_file_names_is_never_run(tmp_path, monkeypatch):
    """An auto_map naming a module of the directory's own, and architectures naming a class that does not exist:
    the model is built from model_type through transformers' registry; the module is never imported."""
    from compressed_tensors.quantization import QuantizationArgs

    llm_compressor_checkpoint(tmp_path / "ct", {"weights": QuantizationArgs(**W4A16["weights"])})
    (tmp_path / "ct" / "evil.py").write_text("raise SystemExit('ran')\n")
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    config.update(auto_map={"AutoModelForCausalLM": "evil.Model"}, architectures=["EvilForCausalLM"])
    (tmp_path / "ct" / "config.json").write_text(json.dumps(config))
    monkeypatch.syspath_prepend(str(tmp_path / "ct"))
    model = hub.read_model(tmp_path / "ct", AutoModelForCausalLM)
    assert type(model) is LlamaForCausalLM


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b"GGUF" + b"\x00" * 7), r"is not a readable GGUF file"),
    (lambda p: p.write_bytes(p.read_bytes()[:4000]), r"is not a readable GGUF file"),
])
def test_a_damaged_gguf_file_is_refused_in_one_line(damage, message, tmp_path):
    export(llama(), "gguf", tmp_path / "m.gguf")
    damage(tmp_path / "m.gguf")
    with pytest.raises(UserError, match=message) as caught:
        hub.read_model(tmp_path / "m.gguf", AutoModelForCausalLM)
    assert "\n" not in str(caught.value)


def test_an_unreadable_scheme_is_refused_naming_the_group(tmp_path):
    from compressed_tensors.quantization import QuantizationArgs

    llm_compressor_checkpoint(tmp_path / "ct", {"weights": QuantizationArgs(**W4A16["weights"])})
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"
    (tmp_path / "ct" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config group 'group_0' is in format 'marlin-24', which has no "
                                        r"equivalent here; readable: pack-quantized, int-quantized, float-quantized"):
        hub.read_model(tmp_path / "ct", AutoModelForCausalLM)
    config["quantization_config"]["config_groups"]["group_0"]["format"] = "float-quantized"  # int weights: no FP8
    (tmp_path / "ct" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"layer 'model.layers.0.self_attn.q_proj': weights .*\"type\": \"int\".* have no "
                                        r"equivalent format here"):
        hub.read_model(tmp_path / "ct", AutoModelForCausalLM)
