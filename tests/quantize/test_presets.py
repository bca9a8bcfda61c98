"""The quantize pass's presets (exactly the JSON a user would write), its ignore list, and integer operands a
catch-all rule selects (left alone and listed; a rule naming only such an operand is refused)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.layers.presets import PRESETS
from mase_lite.passes.registry import get_pass

EXPANDED = {
    "W4A16": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128,
                         "full_range": True, "scale_dtype": "float16"}},
    "W8A16": {"weight": {"name": "scaled_integer", "width": 8, "granularity": "channel", "full_range": True}},
    "W8A8": {"weight": {"name": "scaled_integer", "width": 8, "granularity": "channel", "full_range": True},
             "data_in": {"name": "scaled_integer", "width": 8, "granularity": "channel", "full_range": True}},
    "MXINT8": {"weight": {"name": "mxint", "element_width": 8}},
    "MXFP4": {"weight": {"name": "mxfp", "element_format": "e2m1"}},
    "NVFP4": {"weight": {"name": "nvfp4", "per_tensor": "global_scale"}},
    "FP8": {"weight": {"name": "scaled_float"}, "data_in": {"name": "scaled_float"}},
    "Q8_0": {"weight": {"name": "q8_0"}},
    "Q4_0": {"weight": {"name": "q4_0"}},
    "Q4_K": {"weight": {"name": "q4_k"}},
    "Q5_K": {"weight": {"name": "q5_k"}},
    "Q6_K": {"weight": {"name": "q6_k"}},
}


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_is_its_json(preset):
    params = get_pass("quantize").params
    assert set(EXPANDED) == set(PRESETS)
    given = params.model_validate({"preset": preset, "ignore": ["lm_head"]})
    written = params.model_validate({"by": "type", "rules": {"linear": EXPANDED[preset]}, "ignore": ["lm_head"]})
    assert given == written and given.preset is None


def test_a_preset_quantizes_every_linear_but_what_it_ignores():
    model, info = ml.passes.quantize(llama(), {"preset": "W4A16", "ignore": ["lm_head", "re:.*\\.mlp\\.down_proj"]})
    assert info["count"] == 6 and sorted(info["skipped"]) == ["lm_head", "model_layers_0_mlp_down_proj"]  # node names
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert model.model.layers[0].mlp.up_proj.quant_formats()["weight"]["group_size"] == 128


def test_a_preset_with_rules_or_an_unknown_one_is_refused():
    with pytest.raises(UserError, match=r"give a preset or rules, not both \(got preset and rules\)"):
        ml.passes.quantize(llama(), {"preset": "W8A8", "rules": {"linear": None}})
    with pytest.raises(UserError, match=r"preset"):
        ml.passes.quantize(llama(), {"preset": "W3A3"})


def test_a_catch_all_rule_leaves_integer_operands_and_lists_them():
    """Llama's graph adds integers (position ids): a rule for every node quantizes every float operand it selects,
    lists the integer ones it left, and the model runs."""
    mg = ml.MaseGraph(llama(), hf_input_names=["input_ids"])
    mg, info = ml.passes.quantize(mg, {"by": "regex", "rules": {".*": {"name": "mxint", "element_width": 8}}})
    left = {entry["node"] for entry in info["integer_operands"]}
    assert left and left <= set(info["skipped"])
    assert all(entry["operand"] in ("data_in_0", "data_in_1") for entry in info["integer_operands"])
    assert info["count"] > 8  # the Linears and the float matmuls, adds and muls
    assert mg.model(input_ids=torch.randint(0, 96, (2, 9))).logits.shape == (2, 9, 96)
    integer_node = sorted(left)[0]
    with pytest.raises(UserError, match=rf"node .{integer_node}.: its data_in_\d .* is a tensor of int64 values .*selects no float operand"):
        ml.passes.quantize(mg, {"by": "name", "rules": {integer_node: {"name": "mxint", "element_width": 8}}})


def _chosen(model, preset):
    model, info = ml.passes.quantize(model, {"preset": preset})
    return {r["target"]: r["formats"]["weight"]["name"] for r in info["replaced"]}


@pytest.mark.parametrize(("preset", "base", "more"), [("Q4_K_M", "q4_k", "q6_k"), ("Q5_K_M", "q5_k", "q6_k")])
def test_a_mixed_preset_chooses_each_layer_as_llama_quantize(preset, base, more):
    """8 layers: use_more_bits picks layers 0, 3, 6 and 7 (the first and last eighth, every third between) for the
    value and down projections; the untied head takes the larger type; everything else the base type."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                         tie_word_embeddings=False)).eval()
    chosen = _chosen(model, preset)
    expected = {"lm_head": more}
    for i in range(8):
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj"):
            expected[f"model.layers.{i}.{proj}"] = base
        for proj in ("self_attn.v_proj", "mlp.down_proj"):
            expected[f"model.layers.{i}.{proj}"] = more if i in (0, 3, 6, 7) else base
    assert chosen == expected


def test_a_mixed_preset_leaves_a_tied_head_float_and_falls_back_where_256_does_not_tile():
    """A 96-wide model (no row a multiple of 256): llama.cpp's fallbacks, Q5_0 for Q4_K and Q8_0 for Q6_K; the head
    tied to the embedding stays float (the embedding is written once)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=96, intermediate_size=160, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                         tie_word_embeddings=True)).eval()
    chosen = _chosen(model, "Q4_K_M")
    assert "lm_head" not in chosen and type(model.lm_head) is torch.nn.Linear
    assert chosen["model.layers.0.self_attn.q_proj"] == "q5_0" and chosen["model.layers.0.self_attn.v_proj"] == "q8_0"
    assert chosen["model.layers.0.mlp.down_proj"] == "q8_0"  # 160 columns: Q6_K's fallback (layer 0 uses more bits)
