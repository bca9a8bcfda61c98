"""SparseGPT and Wanda: the SparseGPT sweep against a straightforward column-by-column implementation (written
here, float64), exact patterns (2 zeros in every 4, the requested count), layer errors below magnitude
pruning's on correlated inputs, quantization in the same sweep, and the prune pass on a decoder."""

import math

import pytest
import torch

import mase_lite as ml
from mase_lite.infra.errors import UserError
from mase_lite.algorithms.gptq import gptq
from mase_lite.layers.pruning import Sparsity, lowest_mask, wanda_mask
from mase_lite.numerics.codes import decode, encode
from mase_lite.pipeline.spec import check_pipeline, load_spec
from tests.transforms.llms import TokenBatches, tiny_llama


def correlated(n_in=64, n_out=24, rows=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n_in, n_in, generator=g) / math.sqrt(n_in) + torch.eye(n_in)
    x = torch.randn(rows, n_in, generator=g) @ mix * torch.linspace(0.2, 3, n_in)
    w = torch.randn(n_out, n_in, generator=g) * 0.1
    return w, 2 * x.double().t() @ x.double() / rows, x


def reference(w, h, sparsity: Sparsity, block: int, damp=0.01):
    """SparseGPT as its paper states it, one column at a time with full-rank updates, in float64: at each block's
    start (unstructured) the block's share of the pruned count goes by saliency w² / U[i, i]², or at every m-th
    column the n of least saliency of each row's next m; pruned weights become 0 and their error moves forward."""
    w, h = w.double().clone(), h.double().clone()
    rows, n = w.shape
    h += damp * h.diagonal().mean() * torch.eye(n, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    keep, q = torch.ones_like(w, dtype=torch.bool), torch.zeros_like(w)
    for i in range(n):
        if not sparsity.m and i % block == 0:
            stop = min(i + block, n)
            count = round(sparsity.fraction * rows * stop) - round(sparsity.fraction * rows * i)
            saliency = (w[:, i:stop] / u.diagonal()[i:stop]).square().t().flatten()  # column-major, as processed
            chosen = torch.ones(saliency.numel(), dtype=torch.bool)
            chosen[saliency.argsort(stable=True)[:count]] = False
            keep[:, i:stop] = chosen.reshape(stop - i, rows).t()
        if sparsity.m and i % sparsity.m == 0:
            saliency = (w[:, i : i + sparsity.m] / u.diagonal()[i : i + sparsity.m]).square()
            group = torch.ones(rows, sparsity.m, dtype=torch.bool)
            group.scatter_(1, saliency.argsort(dim=1, stable=True)[:, : sparsity.n], False)
            keep[:, i : i + sparsity.m] = group
        q[:, i] = w[:, i] * keep[:, i]
        w[:, i:] -= ((w[:, i] - q[:, i]) / u[i, i]).unsqueeze(1) * u[i, i:].unsqueeze(0)
    return q, keep


@pytest.mark.parametrize("sparsity", [Sparsity(0.5), Sparsity(0.3), Sparsity(n=2, m=4), Sparsity(n=4, m=8)])
@pytest.mark.parametrize("block", [1, 6, 16, 17, 64])
def test_sparsegpt_equals_the_straightforward_algorithm(sparsity, block):
    w, h, _ = correlated()
    got = gptq(w.double(), h, None, sparsity=sparsity, block_size=block)
    expected, keep = reference(w, h, sparsity, block)
    assert torch.equal(got.mask, keep)
    torch.testing.assert_close(got.weight, expected, rtol=0, atol=1e-12)  # float64: the sums' order only


def test_patterns_are_exact():
    w, h, _ = correlated(n_in=64, n_out=30)
    two_four = gptq(w, h, None, sparsity=Sparsity(n=2, m=4), dtype=torch.float32)
    assert ((two_four.weight.reshape(30, 16, 4) == 0).sum(-1) == 2).all()
    assert torch.equal(two_four.weight == 0, ~two_four.mask)
    for fraction in (0.1, 0.5, 0.77):  # round(fraction · 1920) weights, whatever the blocks' shares
        result = gptq(w, h, None, sparsity=Sparsity(fraction), block_size=24, dtype=torch.float32)
        assert int((~result.mask).sum()) == round(fraction * 30 * 64)
    wanda = wanda_mask(w, torch.rand(64), Sparsity(0.3))  # per row: round(0.3 · 64) = 19
    assert ((~wanda).sum(1) == 19).all()
    assert ((~wanda_mask(w, torch.rand(64), Sparsity(n=2, m=4))).reshape(30, 16, 4).sum(-1) == 2).all()


def test_lowest_mask_by_hand():
    scores = torch.tensor([[3.0, 1.0, 2.0, 1.0], [0.0, 5.0, 4.0, 6.0]])
    assert lowest_mask(scores, Sparsity(0.5)).int().tolist() == [[1, 0, 0, 0], [0, 1, 1, 1]]  # 0, 1, 1, 2 go
    assert lowest_mask(scores, Sparsity(0.25), per_row=True).int().tolist() == [[1, 0, 1, 1], [0, 1, 1, 1]]
    assert lowest_mask(scores, Sparsity(n=1, m=2)).int().tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    with pytest.raises(UserError, match="sparsity 4:4: n must be between 1 and m - 1"):
        Sparsity(n=4, m=4)


def layer_error(w, q, h):
    d = (w.double() - q.double())
    return float(((d @ h) * d).sum())


@pytest.mark.parametrize("sparsity", [Sparsity(0.5), Sparsity(n=2, m=4)])
def test_sparsegpt_and_wanda_err_less_than_magnitude_pruning_on_correlated_inputs(sparsity):
    g = torch.Generator().manual_seed(0)  # channels of log-normal scale, as a real model's
    mix = torch.randn(128, 128, generator=g) / math.sqrt(128) + torch.eye(128)
    x = torch.randn(512, 128, generator=g) @ mix * torch.exp(torch.randn(128, generator=g))
    w = torch.randn(64, 128, generator=g) * 0.1
    h = 2 * x.double().t() @ x.double() / 512
    magnitude = w * lowest_mask(w.abs(), sparsity, per_row=True)
    wanda = w * wanda_mask(w, x.norm(dim=0), sparsity)
    sparsegpt = gptq(w, h, None, sparsity=sparsity, dtype=torch.float32)
    errors = {name: layer_error(w, q, h) for name, q in
              (("magnitude", magnitude), ("wanda", wanda), ("sparsegpt", sparsegpt.weight))}
    assert errors["sparsegpt"] < 0.9 * errors["wanda"] and errors["wanda"] < 0.5 * errors["magnitude"], errors


def test_sparsegpt_quantizes_in_the_same_sweep():
    w, h, _ = correlated(n_in=64, n_out=24)
    fmt = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16}
    result = gptq(w, h, fmt, sparsity=Sparsity(n=2, m=4), dtype=torch.float32)
    assert torch.equal(result.weight == 0, ~result.mask)  # no kept weight rounds to zero on these grids
    encoded = encode(result.weight, fmt, result.side, values=result.weight)  # codes under the scales it fixed
    assert torch.equal(decode(encoded), result.weight)
    float_only = gptq(w, h, None, sparsity=Sparsity(n=2, m=4), dtype=torch.float32)
    assert layer_error(w, float_only.weight, h) < result.error < result.rtn_error


BLOCK_LINEARS = {"by": "regex", "targets": [r"model_layers_.*_proj"]}


def logits_error(model, reference):
    with torch.no_grad():
        return sum(float((model(**b).logits - r).square().sum()) for b, r in zip(TokenBatches().batches, reference))


def test_the_pass_prunes_a_decoder_and_the_checkpoint_loads_without_data(tmp_path):
    float_model = tiny_llama()
    with torch.no_grad():
        reference = [float_model(**b).logits for b in TokenBatches().batches]
    errors = {}
    for method in ("l1-norm", "wanda", "sparsegpt"):
        model = tiny_llama()
        model.load_state_dict(float_model.state_dict())
        mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])
        mg, info = ml.passes.prune(mg, {**BLOCK_LINEARS, "weight": {"method": method, "granularity": "2:4", "num_batches": 4}},
                                   data=TokenBatches())
        assert len(info["nodes"]) == 14
        for name, layer in mg.modules.items():
            if name.startswith("model.layers.") and isinstance(layer, torch.nn.Linear):
                zeros = (layer.weight.detach() == 0).reshape(layer.weight.shape[0], -1, 4).sum(-1)
                assert (zeros == 2).all(), name
        errors[method] = logits_error(mg.model, reference)
        if method == "sparsegpt":
            assert all(entry["error"] < entry["magnitude_error"] for entry in info["nodes"].values())
            with torch.no_grad():
                logits = mg.model(**TokenBatches().batches[0]).logits
            mg.save(tmp_path / "ckpt")
            loaded = ml.load(tmp_path / "ckpt").model
            with torch.no_grad():
                assert torch.equal(loaded(**TokenBatches().batches[0]).logits, logits)
    assert errors["sparsegpt"] < 0.6 * errors["l1-norm"], errors  # (a random model has no outlier channels for wanda)


def test_sparsegpt_on_quantized_layers_holds_their_codes():
    model = tiny_llama()
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])
    fmt = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "full_range": True}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"head": None, "linear": {"weight": fmt}}})
    mg, info = ml.passes.prune(mg, {**BLOCK_LINEARS, "weight": {"method": "sparsegpt", "sparsity": 0.5, "num_batches": 2}},
                               data=TokenBatches())
    layer = mg.modules["model.layers.1.mlp.down_proj"]
    assert layer.weight_quantizer.held(layer.weight) is not None
    assert info["nodes"]["model_layers_1_mlp_down_proj"]["weight_sparsity"] == 0.5
    assert int((layer.weight == 0).sum()) >= layer.weight.numel() // 2  # and kept ones that round to 0
    x = torch.randn(3, 128)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))


def test_calibrated_methods_need_data_and_bad_patterns_name_the_field(tmp_path):
    mg = ml.MaseGraph(tiny_llama(), hf_input_names=["input_ids", "attention_mask", "labels"])
    with pytest.raises(UserError, match=r"pass 'prune' needs 'data', which this call lacks"):
        ml.passes.prune(mg, {"weight": {"method": "wanda"}})
    with pytest.raises(UserError, match=r"steps.0 \(prune\) needs 'data'.*give the pipeline a `data` section"):
        check_pipeline(load_spec({"data": None, "steps": [{"pass": "prune", "params": {"weight": {"method": "sparsegpt"}}}]}))
    check_pipeline(load_spec({"data": None, "steps": [{"pass": "prune", "params": {"weight": {"granularity": "2:4"}}}]}))
    with pytest.raises(UserError, match=r"params.weight: granularity '2:4' prunes 0.5 of the weights; sparsity is 0.3"):
        ml.passes.prune(mg, {"weight": {"granularity": "2:4", "sparsity": 0.3}})
    with pytest.raises(UserError, match=r"granularity '4:2': n of n:m must be between 1 and m - 1"):
        ml.passes.prune(mg, {"weight": {"granularity": "4:2"}})
    with pytest.raises(UserError, match=r"2:4 sparsity needs weights whose inputs are a multiple of 4; '0' has shape \(3, 6\)"):
        ml.passes.prune(ml.MaseGraph(torch.nn.Sequential(torch.nn.Linear(6, 3)), example_inputs={"input": torch.randn(2, 6)}),
                        {"weight": {"granularity": "2:4"}})
    with pytest.raises(UserError, match=r"method 'sparsegpt' prunes each layer on its own: scope must be local"):
        ml.passes.prune(mg, {"weight": {"method": "sparsegpt", "scope": "global"}})
    with pytest.raises(UserError, match=r"params.weight.granularity: should be 'unstructured', 'elementwise', 'row', 'channel' or 'n:m' \(e.g. '2:4'\) \(got 'half'\)$"):
        ml.passes.prune(mg, {"weight": {"granularity": "half"}})
