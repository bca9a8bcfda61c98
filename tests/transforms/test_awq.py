"""AWQ: the folded scales leave the float model's function unchanged, no group's calibration error grows,
and on a model with outlier channels 3-bit weights lose less than by rounding alone (with GPTQ after it too)."""

from unittest import mock

import pytest
import torch

import mase_lite as ml
from mase_lite.infra.errors import UserError
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
    assert len(info["groups"]) == 6 and all(g["error"] <= g["unscaled_error"] for g in info["groups"].values())
    # down's input is act(gate) * up: its scales go into up's rows
    assert info["groups"]["model_layers_0_mlp_down_proj"]["into"].startswith("Linear model.layers.0.mlp.up_proj")
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


def test_duo_scales_widen_the_search_and_weigh_weights_by_their_group():
    from mase_lite.passes.transforms.awq import _weight_magnitude

    # groups of 2: |w| over its group's largest, then the mean over the rows (of both layers)
    w1, w2 = torch.tensor([[1.0, -2.0, 3.0, 4.0]]), torch.tensor([[0.0, 1.0, -1.0, 0.5]])
    fmt = {**W3, "group_size": 2}
    assert _weight_magnitude([w1, w2], [fmt, fmt]).tolist() == [0.25, 1.0, 0.875, 0.75]
    runs = {}
    for duo in (False, True):
        mg, _ = ml.passes.quantize(with_outliers(), RULES)
        runs[duo] = ml.passes.awq(mg, {"num_batches": 2, "clip": False, "duo": duo}, data=TokenBatches(labels=False))[1]
    assert {g["scales"] for g in runs[False]["groups"].values()} == {"activation"}
    assert "duo" in {g["scales"] for g in runs[True]["groups"].values()}
    # the same first group's candidates and more: no group's error grows (the later groups see other inputs)
    first = next(iter(runs[True]["groups"]))
    assert runs[True]["groups"][first]["error"] <= runs[False]["groups"][first]["error"]


def test_awq_optimises_in_llama_cpps_own_types():
    """The scales are searched under the GGML type's own quantizer (its block scale search, which makes each try
    costly: a short grid here): on the outlier model the logits' error falls well below rounding's."""
    name = "iq4_nl"
    rules = {"by": "type", "rules": {"head": None, "linear": {"weight": {"name": name}}}}
    reference = logits(with_outliers().model)
    rounded = ml.passes.quantize(with_outliers(), rules)[0]
    mg, info = ml.passes.awq(ml.passes.quantize(with_outliers(), rules)[0],
                             {"num_batches": 2, "grid": 4, "duo": False, "clip": False}, data=TokenBatches(labels=False))
    assert len(info["groups"]) == 6
    error = lambda model: float((logits(model) - reference).square().mean())  # noqa: E731
    assert error(mg.model) < 0.5 * error(rounded.model)


def test_the_searches_judge_candidates_by_their_output_error():
    """The scale search's errors from XᵀX (candidates one or two a product, its Cholesky factor or, singular, itself)
    and the clip search's from each group's Gram matrix are the output errors ||X Wᵀ - X Q(W)ᵀ||² computed directly;
    the clip found is the least of the ten clips for each row's group."""
    from mase_lite.numerics import quantize
    from mase_lite.passes.transforms.awq import _clip, _factor, _output_errors

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 64, generator=g), torch.randn(24, 64, generator=g)
    s = torch.rand(64, generator=g) + 0.5
    direct = [sum(float((x @ (v - quantize(v * c, W3) / c).t()).square().sum()) for v in (w, 2 * w)) for c in (s, 1 / s)]
    errors = lambda gram: _output_errors(gram, _factor(gram), [w, 2 * w], [W3, W3], [s, 1 / s])  # noqa: E731
    with mock.patch("mase_lite.passes.transforms.awq.CANDIDATE_ELEMENTS", 48 * 64):  # one candidate a product
        assert errors(x.t() @ x) == pytest.approx(direct, rel=1e-5)
    assert errors(x.t() @ x) == pytest.approx(direct, rel=1e-5)
    x[:, 5] = 0  # an input that never fires: XᵀX singular, no Cholesky factor
    assert _factor(x.t() @ x) is None
    direct = [sum(float((x @ (v - quantize(v * c, W3) / c).t()).square().sum()) for v in (w, 2 * w)) for c in (s, 1 / s)]
    assert errors(x.t() @ x) == pytest.approx(direct, rel=1e-5)
    x = torch.randn(300, 64, generator=g)
    fmt = {**W3, "group_size": 16}  # narrower than x's 300 rows: by Gram matrices
    top = w.reshape(24, 4, 16).abs().amax(-1, keepdim=True)
    direct = []
    for i in range(10):
        bound = (top * (1 - i / 20)).expand(24, 4, 16).reshape(24, 64)
        diff = (w - quantize(torch.maximum(torch.minimum(w, bound), -bound), fmt)).reshape(24, 4, 16)
        direct.append(torch.einsum("ngk,rgk->rgn", x.reshape(300, 4, 16), diff).square().sum(-1))
    clipped, before, after = _clip(x, w, fmt)
    assert before == pytest.approx(float(direct[0].sum()), rel=1e-5)
    assert after == pytest.approx(float(torch.stack(direct).amin(0).sum()), rel=1e-5) and after < before
    assert clipped.abs().le(w.abs()).all()


def test_the_coarse_to_fine_search_finds_the_whole_grids_best_with_17_of_its_39_candidates():
    from mase_lite.passes.transforms import awq

    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 64, generator=g) * torch.linspace(0.2, 4.0, 64)  # channels of growing magnitude
    w = torch.randn(32, 64, generator=g)
    magnitude, w_magnitude = x.abs().mean(0), awq._weight_magnitude([w], [W3])
    grid = [("activation", k, magnitude.pow(k / 20)) for k in range(20)]
    grid += [("duo", k, magnitude.pow(k / 20) / (w_magnitude.pow(1 - k / 20) + 1e-4)) for k in range(1, 20)]
    grid = [(f, k, s.clamp(min=1e-4) / (s.clamp(min=1e-4).max() * s.clamp(min=1e-4).min()).sqrt()) for f, k, s in grid]
    errors = awq._output_errors(x.t() @ x, awq._factor(x.t() @ x), [w], [W3], [s for _, _, s in grid])
    family, step, _ = grid[min(range(len(grid)), key=errors.__getitem__)]
    judged, real = [], awq._output_errors
    counted = lambda gram, factor, ws, fs, scales: judged.extend(scales) or real(gram, factor, ws, fs, scales)  # noqa: E731
    with mock.patch.object(awq, "_output_errors", counted):
        s, alpha, error, unscaled, chosen = awq._best_scales(x, [w], [W3], 20, True)
    assert (chosen, alpha) == (family, step / 20) and error == pytest.approx(min(errors), rel=1e-6)
    assert unscaled == pytest.approx(errors[0], rel=1e-6) and len(judged) == 17


def test_awq_forwards_only_the_batches_holding_its_rows():
    """With ``max_rows`` of 100 and batches of 64 rows, the search needs two of the four batches: each block runs
    on those two only, and the result is the one calibration on those two batches alone gives, bit for bit."""
    def run(num_batches):
        mg, _ = ml.passes.quantize(with_outliers(), RULES)
        calls = []
        handle = mg.model.model.layers[1].register_forward_pre_hook(lambda module, args: calls.append(1))
        mg, info = ml.passes.awq(mg, {"num_batches": num_batches, "max_rows": 100, "clip_rows": 100},
                                 data=TokenBatches(labels=False))
        handle.remove()
        return mg, info, len(calls)

    trimmed, info, calls = run(4)
    alone, alone_info, alone_calls = run(2)
    assert calls == alone_calls == 4  # the search's run and the run giving the next block its inputs, two batches each
    assert info == alone_info
    for (name, a), b in zip(trimmed.model.state_dict().items(), alone.model.state_dict().values()):
        assert torch.equal(a, b), name
