"""The generate step: greedy decoding with the key/value cache equals transformers' generate token for token on a
float model; on a packed or fake-quantized model it equals that model's own argmax loop without a cache; stop
strings cut completions; sampling is seeded; tokens per second are reported."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.runtime.generation import Sampling, generate
from mase_lite.workloads.tokenizer import train_wordpiece

TEXTS = ["the cat sat on the mat .", "a dog ran to the big tree .", "the small bird sang a song ."]


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(TEXTS, vocab_size=90)


def argmax_loop(model, ids, steps):
    """Greedy decoding without a cache: the whole sequence through the model for every token."""
    out = ids
    for _ in range(steps):
        with torch.no_grad():
            token = model(input_ids=out).logits[0, -1].argmax()
        out = torch.cat([out, token.view(1, 1)], 1)
    return out[0, ids.shape[1]:].tolist()


def test_greedy_equals_transformers_generate(tokenizer):
    model = llama()
    prompt = "the cat sat"
    out = generate(model, tokenizer, [prompt], max_new_tokens=10)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.completions[0]["tokens"] == expected[0, ids.shape[1]:].tolist() and out.runner == "decoder"


def test_a_model_outside_the_llama_family_runs_its_own_forward_with_the_cache(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=2, n_positions=64)).eval()
    out = generate(model, tokenizer, ["the cat sat"], max_new_tokens=8)
    ids = tokenizer("the cat sat", add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert out.runner == "model" and out.completions[0]["tokens"] == argmax_loop(model, ids, 8)


@pytest.mark.parametrize("preset", ["MXINT8", "W4A16"])
def test_a_quantized_or_packed_model_decodes_as_its_own_argmax_loop(tokenizer, preset):
    model, _ = ml.passes.quantize(llama(), {"preset": preset, "ignore": ["lm_head"]})
    if preset == "MXINT8":
        model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"head": {"name": "mxint", "element_width": 8,
                                                                               "storage": "packed"}}})
        assert type(model.lm_head).__name__ == "MXInt8Linear"
    ids = tokenizer("a dog", add_special_tokens=False, return_tensors="pt")["input_ids"]
    got = generate(model, tokenizer, ["a dog"], max_new_tokens=6)
    assert got.completions[0]["tokens"] == argmax_loop(model, ids, 6)
    assert got.decode_tokens == 6 and got.prefill_tokens == ids.shape[1] and got.decode_tokens_per_second > 0


def test_stop_strings_and_seeded_sampling(tokenizer):
    model = llama()
    first = generate(model, tokenizer, ["the"], max_new_tokens=12, sampling=Sampling(do_sample=True, top_k=8, seed=3))
    again = generate(model, tokenizer, ["the"], max_new_tokens=12, sampling=Sampling(do_sample=True, top_k=8, seed=3))
    assert first.completions[0]["tokens"] == again.completions[0]["tokens"]
    text = first.completions[0]["completion"]
    word = text.split()[1] if len(text.split()) > 1 else text.split()[0]
    cut = generate(model, tokenizer, ["the"], max_new_tokens=12, sampling=Sampling(do_sample=True, top_k=8, seed=3),
                   stop=[word])
    assert cut.completions[0]["stopped"] == "stop" and word not in cut.completions[0]["completion"]


def test_the_step_in_a_pipeline_reports_completions_and_speed(tmp_path):
    result = ml.run_pipeline({
        "model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                                     "num_attention_heads": 2, "num_key_value_heads": 1,
                                                     "intermediate_size": 64, "max_position_embeddings": 64}},
        "data": {"block_size": 16, "n_train": 16, "n_test": 8},
        "steps": [{"pass": "generate", "params": {"prompts": ["the dog"], "max_new_tokens": 4}},
                  {"pass": "quantize", "params": {"preset": "W8A16"}},
                  {"pass": "generate", "params": {"prompts": ["the dog"], "max_new_tokens": 4, "label": "w8"}}],
        "output_dir": str(tmp_path / "run")})
    (float_info, _, quantized) = [s["info"] for s in result.report["steps"]]
    assert float_info["completions"][0]["prompt"] == "the dog" and len(float_info["completions"]) == 1
    assert set(result.report["metrics"]["w8"]) == {"prefill_tokens_per_second", "decode_tokens_per_second", "new_tokens"}
    assert result.report["metrics"]["w8"]["new_tokens"] <= 4


def test_completions_are_printed_and_a_one_token_completion_reports_no_decode_rate(tmp_path, capsys):
    """A one-token completion comes from its prefill alone: no decoding step to time, so no rate (it read 8,000 to
    16,000 tokens/s, one interval's); each completion is printed as it is reported."""
    spec = {
        "model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                                     "num_attention_heads": 2, "num_key_value_heads": 1,
                                                     "intermediate_size": 64, "max_position_embeddings": 64}},
        "data": {"block_size": 16, "n_train": 16, "n_test": 8},
        "steps": [{"pass": "generate", "params": {"prompts": ["the dog"], "max_new_tokens": 1, "label": "one"}},
                  {"pass": "generate", "params": {"prompts": ["the cat"], "max_new_tokens": 3, "label": "three"}}],
        "output_dir": str(tmp_path / "run")}
    result = ml.run_pipeline(spec)
    one, three = result.report["metrics"]["one"], result.report["metrics"]["three"]
    assert one["new_tokens"] == 1 and one["decode_tokens_per_second"] is None
    assert three["decode_tokens_per_second"] > 0
    printed = capsys.readouterr().out.splitlines()
    for step in result.report["steps"]:
        (c,) = step["info"]["completions"]
        assert f"{c['prompt']!r} -> {c['completion']!r} ({c['stopped']})" in printed


def test_prompts_are_required():
    with pytest.raises(UserError, match="give prompts or a prompts_file"):
        ml.passes.generate(llama(), {}, data=object())


def test_int8_activations_from_a_spec_decode_natively_and_reload(tmp_path):
    from mase_lite.kernels.mxint8 import MXInt8Linear
    from mase_lite.passes.replay import load_graph

    packed = {"name": "mxint", "element_width": 8, "storage": "packed", "activations": "int8"}
    result = ml.run_pipeline({
        "model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                                     "num_attention_heads": 2, "num_key_value_heads": 1,
                                                     "intermediate_size": 64, "max_position_embeddings": 64}},
        "data": {"block_size": 16, "n_train": 16, "n_test": 8},
        "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": packed}}},
                  {"pass": "generate", "params": {"prompts": ["the dog"], "max_new_tokens": 4}}],
        "output_dir": str(tmp_path / "run")})
    assert result.report["steps"][1]["info"]["runner"] == "native decoder"
    layers = [m for m in result.mg.model.modules() if isinstance(m, MXInt8Linear)]
    assert len(layers) == 8 and {m.activations for m in layers} == {"int8"}
    result.mg.save(tmp_path / "saved")
    loaded = load_graph(tmp_path / "saved")
    assert [m.activations for m in loaded.model.modules() if isinstance(m, MXInt8Linear)] == ["int8"] * 8
