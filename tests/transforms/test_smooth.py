"""SmoothQuant: the float model is unchanged (bit for bit with power-of-two factors), the factors are those
the definition gives, and the groups whose input cannot take a factor are left alone with the reason."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.passes.registry import PassError


class Data:
    seed = 0

    def __init__(self, vocab=50):
        g = torch.Generator().manual_seed(0)
        self.batches = [{"input_ids": (ids := torch.randint(0, vocab, (2, 12), generator=g)),
                         "attention_mask": torch.ones_like(ids), "labels": ids} for _ in range(3)]

    def loader(self, split, batch_size, shuffle=False, seed=0):
        return self.batches


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # outlier channels, as in real LLM activations
        model.model.embed_tokens.weight[:, 3] *= 20
    return ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"]), model


@pytest.mark.parametrize("power_of_two", [False, True])
def test_float_outputs_do_not_change(power_of_two):
    mg, model = llama()
    data = Data()
    with torch.no_grad():
        before = [mg.model(**b).logits for b in data.batches]
    mg, _ = ml.passes.calibrate(mg, {"num_batches": 3}, data=data)
    mg, info = ml.passes.smooth(mg, {"alpha": 0.5, "power_of_two": power_of_two})
    assert len(info["smoothed"]) == 6  # q/k/v, gate/up and down (into up's rows) of two layers
    assert info["smoothed"]["model_layers_1_mlp_down_proj"]["into"] == \
        "Linear model.layers.1.mlp.up_proj (a factor of the product mul_36)"
    with torch.no_grad():
        after = [mg.model(**b).logits for b in data.batches]
    for a, b in zip(before, after):
        if power_of_two:
            assert torch.equal(a, b)
        else:
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_factors_follow_the_definition_and_unfoldable_groups_are_named():
    mg, model = llama()
    data = Data()
    mg, _ = ml.passes.calibrate(mg, {"num_batches": 3}, data=data)
    x_max = mg.analyses["calibration"]["model_layers_0_self_attn_q_proj"]["data_in"]["channel_absmax"]
    attn = model.model.layers[0].self_attn
    w_max = torch.stack([m.weight.abs().amax(0) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]).amax(0)
    norm = model.model.layers[0].input_layernorm.weight.detach().clone()
    q = attn.q_proj.weight.detach().clone()
    mg, info = ml.passes.smooth(mg, {"alpha": 0.75})
    s = x_max.pow(0.75) / w_max.pow(0.25)
    assert torch.allclose(model.model.layers[0].input_layernorm.weight, norm / s)
    assert torch.allclose(attn.q_proj.weight, q * s)
    key = "model_layers_0_self_attn_q_proj, model_layers_0_self_attn_k_proj, model_layers_0_self_attn_v_proj"
    assert info["smoothed"][key]["into"] == "norm weight model.layers.0.input_layernorm.weight"
    assert "which no factor folds into" in info["skipped"]["model_layers_0_self_attn_o_proj"]
    assert "calibration" not in mg.analyses  # the activations changed: calibrate again before quantizing them


def test_needs_calibration():
    mg, _ = llama()
    with pytest.raises(PassError, match="needs 'calibration'.*run one of: calibrate"):
        ml.passes.smooth(mg)
