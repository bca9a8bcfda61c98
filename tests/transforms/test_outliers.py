"""The outliers pass: the float model's logits stay bit for bit, its Linears' inputs gain channels 16–128×
the others', and per-tensor int8 activations then hurt."""

import pytest
import torch

import mase_lite as ml
from mase_lite.infra.errors import UserError
from tests.transforms.llms import tiny_llama


def graph(model):
    return ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask"])


def inputs():
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def q_proj_inputs(model):
    seen = []
    handle = model.model.layers[1].self_attn.q_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        logits = model(**inputs()).logits
    handle.remove()
    return logits, seen[0].reshape(-1, 64)


def test_float_logits_are_unchanged_and_the_inputs_have_outliers():
    reference, x = q_proj_inputs(tiny_llama())
    mg, info = ml.passes.outliers(graph(tiny_llama()), {"channels": 3, "factors": [20, 100], "seed": 0})
    assert sorted(info["scaled"]) == ["model_layers_0_mlp_gate_proj, model_layers_0_mlp_up_proj",
                                      "model_layers_0_self_attn_q_proj, model_layers_0_self_attn_k_proj, model_layers_0_self_attn_v_proj",
                                      "model_layers_1_mlp_gate_proj, model_layers_1_mlp_up_proj",
                                      "model_layers_1_self_attn_q_proj, model_layers_1_self_attn_k_proj, model_layers_1_self_attn_v_proj"]
    assert all(f in (16.0, 32.0, 64.0, 128.0) for f in info["factors"]) and len(set(info["channels"])) == 3
    logits, y = q_proj_inputs(mg.source_model)
    assert torch.equal(logits, reference)
    with torch.no_grad():
        assert torch.equal(mg.model(**inputs()).logits, reference)
    ratio = y.abs().amax(0) / x.abs().amax(0)
    for channel, factor in zip(info["channels"], info["factors"]):
        assert ratio[channel] == pytest.approx(factor, rel=1e-6)
    others = torch.ones(64, dtype=torch.bool)
    others[info["channels"]] = False
    assert torch.allclose(ratio[others], torch.ones(int(others.sum())), rtol=1e-6)


def test_per_tensor_activations_then_lose_accuracy():
    int8 = {"data_in": {"name": "scaled_integer", "width": 8, "granularity": "tensor"}}
    rules = {"by": "type", "rules": {"head": None, "linear": int8}}
    reference, _ = q_proj_inputs(tiny_llama())
    errors = []
    for steps in ([], [("outliers", {"channels": 4})]):
        mg = graph(tiny_llama())
        for name, params in steps:
            mg, _ = getattr(ml.passes, name)(mg, params)
        mg, _ = ml.passes.quantize(mg, rules)
        with torch.no_grad():
            errors.append(float((mg.model(**inputs()).logits - reference).square().mean()))
    assert errors[1] > 20 * errors[0], errors


def test_bad_params_name_the_field():
    with pytest.raises(UserError, match=r"factors must be \[low, high\] with 1 <= low <= high, got \[50, 20\]"):
        ml.passes.outliers(graph(tiny_llama()), {"factors": [50, 20]})
    with pytest.raises(UserError, match=r"channels = 65: the Linears' inputs have only 64 channels"):
        ml.passes.outliers(graph(tiny_llama()), {"channels": 65})
