"""GPTQ: the weights a straightforward column-by-column implementation (written here, float64) gives, lower
layer-output error than rounding on correlated inputs, act-order and groups, and the pass on a decoder."""

import math

import pytest
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.nn.gptq import gptq
from mase_lite.numerics import get_format, parse_format, quantize
from mase_lite.passes.registry import PassError


def reference(w: torch.Tensor, h: torch.Tensor, fmt: dict, act_order=False, damp=0.01) -> torch.Tensor:
    """GPTQ as the paper states it, one column at a time, no lazy batches, in float64.

    A group's scale is fixed when its first column is quantized, from the group's current values (their
    per-row max and min): the column is quantized in a probe [column, max, min] the format sees as one group.
    """
    fmt_obj, params = parse_format(fmt)
    w, h = w.double().clone(), h.double().clone()
    n = w.shape[1]
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    order = torch.argsort(h.diagonal(), descending=True, stable=True) if act_order else torch.arange(n)
    hp = h[order][:, order]
    hp += damp * hp.diagonal().mean() * torch.eye(n, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.linalg.inv(hp), upper=True)
    size = fmt_obj.group(params, n)
    ghost, q = {}, torch.zeros_like(w)
    for k in range(n):
        j = int(order[k])
        g = j // size
        if g not in ghost:
            group = w[:, g * size : (g + 1) * size]
            ghost[g] = (group.amax(1), group.amin(1))
        probe = torch.stack([w[:, j], *ghost[g]], 1).float()
        q[:, j] = quantize(probe, fmt)[:, 0].double()
        err = (w[:, j] - q[:, j]) / u[k, k]
        later = order[k:]
        w[:, later] -= err.unsqueeze(1) * u[k, k:].unsqueeze(0)
    return quantize(q.float(), fmt).double()


def correlated(n_in=64, n_out=24, rows=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n_in, n_in, generator=g) / math.sqrt(n_in) + torch.eye(n_in)
    x = torch.randn(rows, n_in, generator=g) @ mix * torch.linspace(0.2, 3, n_in)
    w = torch.randn(n_out, n_in, generator=g) * 0.1
    return w, 2 * x.double().t() @ x.double() / rows, x


@pytest.mark.parametrize("fmt,act_order,block", [
    ({"name": "integer", "width": 4, "frac_width": 4}, False, 16),
    ({"name": "integer", "width": 4, "frac_width": 4}, True, 7),
    ({"name": "mxint", "element_width": 4, "block_size": 16}, False, 16),
    ({"name": "mxint", "element_width": 4, "block_size": 16}, True, 10),
    ({"name": "scaled_integer", "width": 3, "granularity": "group", "group_size": 24}, True, 9),
    ({"name": "scaled_integer", "width": 3, "symmetric": False}, False, 64),
    ({"name": "mxfp", "element_format": "e2m1", "block_size": 32}, True, 128),
])
def test_equals_the_straightforward_algorithm(fmt, act_order, block):
    w, h, _ = correlated()
    got = gptq(w, h, fmt, block_size=block, act_order=act_order)
    expected = reference(w, h, fmt, act_order)
    assert torch.equal(got.weight, expected.float())
    if fmt.get("symmetric", True):  # a symmetric format's scale follows the values: quantizing again changes nothing
        assert torch.equal(quantize(got.weight, fmt), got.weight)


@pytest.mark.parametrize("fmt", [{"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16},
                                 {"name": "mxint", "element_width": 4, "block_size": 16},
                                 {"name": "minifloat_ieee", "width": 5, "exponent_width": 3}])
def test_layer_output_error_below_rounding_on_correlated_inputs(fmt):
    w, h, x = correlated(rows=2048, seed=1)
    result = gptq(w, h, fmt, act_order=True)
    rtn = quantize(w, fmt)
    out_err = lambda q: float((x @ (w - q).t()).square().sum())  # noqa: E731
    assert out_err(result.weight) < 0.8 * out_err(rtn)
    assert result.error < 0.8 * result.rtn_error
    assert result.rtn_error == pytest.approx(out_err(rtn) * 2 / 2048, rel=1e-6)


def test_dead_inputs_and_formats_without_groups():
    w, h, _ = correlated(n_in=8, n_out=4)
    h[3, :], h[:, 3] = 0, 0
    assert (gptq(w, h, {"name": "integer", "width": 8, "frac_width": 6}).weight[:, 3] == 0).all()
    with pytest.raises(ml.UserError, match="format 'ternary' has no column groups"):
        gptq(w, h, {"name": "ternary"})
    assert get_format("mxint").group is not None and get_format("binary").group is None


class Data:
    seed = 0

    def __init__(self, vocab):
        g = torch.Generator().manual_seed(0)
        self.batches = [{"input_ids": (ids := torch.randint(0, vocab, (4, 16), generator=g)),
                         "attention_mask": torch.ones_like(ids), "labels": ids} for _ in range(4)]

    def loader(self, split, batch_size, shuffle=False, seed=0):
        return self.batches


def test_the_pass_compensates_a_decoder_block_by_block():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=50)
    float_model = LlamaForCausalLM(config).eval()
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(float_model.state_dict())
    data = Data(50)
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])
    fmt = {"name": "mxint", "element_width": 4, "block_size": 32}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"head": None, "linear": {"weight": fmt}}})
    with torch.no_grad():
        reference_logits = [float_model(**b).logits for b in data.batches]
        rtn = sum(float((mg.model(**b).logits - r).square().sum()) for b, r in zip(data.batches, reference_logits))
    mg, info = ml.passes.gptq(mg, {"num_batches": 4, "act_order": True}, data=data)
    assert len(info["layers"]) == 14 and info["skipped"] == ["lm_head"] and info["error"] < info["rtn_error"]
    assert info["calibration_rows"] == 16
    with torch.no_grad():
        compensated = sum(float((mg.model(**b).logits - r).square().sum()) for b, r in zip(data.batches, reference_logits))
    assert compensated < rtn
    q_proj = mg.modules["model.layers.1.self_attn.q_proj"]
    assert torch.equal(quantize(q_proj.weight, fmt), q_proj.weight.detach())


def test_a_layer_without_a_weight_format_is_named():
    mg = ml.MaseGraph(nn.Sequential(nn.Linear(4, 4)), example_inputs={"input": torch.randn(2, 4)})
    with pytest.raises(PassError, match=r"no selected layer has a weight format to quantize to \(0\): run quantize"):
        ml.passes.gptq(mg, {}, data=Data(5))
