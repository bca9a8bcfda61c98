"""AWQ: the folded scales leave the float model's function unchanged, no group's calibration error grows,
and on a model with outlier channels 3-bit weights lose less than by rounding alone (with GPTQ after it too)."""

import pytest
import torch

import mase_lite as ml
from mase_lite.errors import UserError
from tests.transforms.llms import TokenBatches, tiny_llama

W3 = {"name": "scaled_integer", "width": 3, "granularity": "group", "group_size": 32}
RULES = {"by": "type", "rules": {"head": None, "linear": {"weight": W3}}}


def with_outliers():
    mg = ml.MaseGraph(tiny_llama(), hf_input_names=["input_ids", "attention_mask"])
    mg, _ = ml.passes.outliers(mg, {"channels": 4})
    return mg


def logits(model):
    with torch.no_grad():
        return torch.cat([model(**b).logits for b in TokenBatches(labels=False).batches])


def test_awq_keeps_the_float_function_and_beats_rounding():
    reference = logits(with_outliers().model)
    rounded = ml.passes.quantize(with_outliers(), RULES)[0]
    mg, _ = ml.passes.quantize(with_outliers(), RULES)
    mg, info = ml.passes.awq(mg, {"num_batches": 4, "clip": False}, data=TokenBatches(labels=False))
    assert len(info["groups"]) == 4 and all(g["error"] <= g["unscaled_error"] for g in info["groups"].values())
    assert any(g["alpha"] > 0 for g in info["groups"].values())
    assert info["skipped"]["lm_head"] == "no weight format (run quantize with one first)"
    assert info["skipped"]["model_layers_1_self_attn_o_proj"].startswith("its input comes from reshape_7")
    # the float model: every quantizer off computes what it computed before the scales
    float_view = {name: m.weight_quantizer for name, m in mg.modules.items() if getattr(m, "weight_quantizer", None)}
    for name in float_view:
        mg.modules[name].weight_quantizer = None
    torch.testing.assert_close(logits(mg.model), reference, rtol=1e-4, atol=1e-4)
    for name, quantizer in float_view.items():
        mg.modules[name].weight_quantizer = quantizer
    error = lambda model: float((logits(model) - reference).square().mean())  # noqa: E731
    scaled = error(mg.model)
    assert scaled < 0.8 * error(rounded.model)
    clipped, info = ml.passes.awq(ml.passes.quantize(with_outliers(), RULES)[0], {"num_batches": 4}, data=TokenBatches(labels=False))
    assert all(g["clip_error"] <= g["clip_error_before"] for g in info["groups"].values())
    assert error(clipped.model) < scaled
    mg, _ = ml.passes.gptq(mg, {"num_batches": 4}, data=TokenBatches(labels=False))
    assert error(mg.model) < scaled


def test_awq_needs_weight_formats_and_data():
    mg = ml.MaseGraph(tiny_llama(), hf_input_names=["input_ids", "attention_mask"])
    with pytest.raises(UserError, match=r"pass 'awq' needs 'data'"):
        ml.passes.awq(mg, {})
    with pytest.raises(UserError, match=r"awq: no selected Linear has a weight format: run quantize"):
        ml.passes.awq(mg, {}, data=TokenBatches(labels=False))
