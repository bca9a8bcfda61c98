"""Transform passes applied one after another keep what the earlier pass did (masks, hooks, formats)."""

import pytest
import torch
import torch.nn.functional as F

import mase_lite as ml
from mase_lite.layers.pruning import activation_pruner_of, weight_mask_of
from mase_lite.layers.quantized import QuantizedConv2d, QuantizedLinear, quantize_module
from tests.ir.models import TwiceMLP, small_cnn

INT4 = {"name": "integer", "data_in_width": 4, "data_in_frac_width": 2, "weight_width": 4, "weight_frac_width": 2}
INT4_FORMAT = {"name": "integer", "width": 4, "frac_width": 2, "signed": True, "floor": False}


def mlp_graph():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    return ml.MaseGraph(TwiceMLP().eval(), example_inputs={"x": x}), x


def cnn_graph():
    torch.manual_seed(1)
    model = small_cnn()
    with torch.no_grad():  # non-trivial running statistics, so folding changes the weights
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 8, 8)
    return ml.MaseGraph(model.eval(), example_inputs={"x": x}), x


@pytest.mark.parametrize("then", ["remove_dropout", "dead_code", "quantize", "prune"])
def test_verify_accepts_a_pruned_graph(then):
    mg, _ = mlp_graph()
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5}})
    mg, _ = getattr(ml.passes, then)(mg, {"default": INT4} if then == "quantize" else {})
    _, info = ml.passes.verify(mg)
    assert info["problems"] == []
    assert set(mg.nodes[1].meta["mase"]["params"]) == {"weight", "weight_mask", "bias"}


def test_verify_still_reports_a_stale_mask_entry():
    mg, _ = mlp_graph()
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5}})
    del mg.nodes[1].meta["mase"]["params"]["weight_mask"]
    _, info = ml.passes.verify(mg, {"strict": False})
    assert info["problems"] == ["inp: parameter 'weight_mask' missing from metadata"]


def test_fold_batchnorm_keeps_quantization():
    mg, x = cnn_graph()
    mg, _ = ml.passes.quantize(mg, {"default": INT4})
    mg, info = ml.passes.fold_batchnorm(mg)
    assert [f["into"] for f in info["folded"]] == ["conv1", "conv2"]
    ref, _ = cnn_graph()
    ref, _ = ml.passes.fold_batchnorm(ref)
    ref, _ = ml.passes.quantize(ref, {"default": INT4})
    assert isinstance(mg.modules["conv1"], QuantizedConv2d)
    assert torch.equal(mg.model(x=x), ref.model(x=x))
    conv = next(n for n in mg.nodes if n.name == "conv1").meta["mase"]
    assert conv["args"][0]["format"] == INT4_FORMAT and conv["params"]["weight"]["format"] == INT4_FORMAT
    ml.passes.verify(mg)


def test_fold_batchnorm_keeps_weight_mask_and_activation_pruning():
    mg, x = cnn_graph()
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5}, "activation": {"sparsity": 0.25}})
    masks = {t: weight_mask_of(mg.modules[t]).mask.clone() for t in ("conv1", "conv2")}
    pruners = {t: activation_pruner_of(mg.modules[t]) for t in ("conv1", "conv2")}
    mg, _ = ml.passes.fold_batchnorm(mg)
    for target in ("conv1", "conv2"):
        conv = mg.modules[target]
        assert torch.equal(weight_mask_of(conv).mask, masks[target])
        assert activation_pruner_of(conv) is pruners[target]
    assert next(n for n in mg.nodes if n.name == "conv1").meta["mase"]["module"] == "Conv2d"
    mg.model.train()
    mg.model(x=x).sum().backward()
    grad = mg.modules["conv1"].parametrizations.weight.original.grad
    assert torch.count_nonzero(grad[~masks["conv1"]]) == 0
    assert torch.count_nonzero(mg.modules["conv1"].weight[~masks["conv1"]]) == 0


def _train_adapters(mg):
    with torch.no_grad():
        for name, p in mg.model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))


def test_lora_merge_keeps_quantization():
    mg, x = mlp_graph()
    mg, _ = ml.passes.quantize(mg, {"default": INT4})
    mg, _ = ml.passes.lora(mg, {"rank": 2})
    _train_adapters(mg)
    lora = mg.modules["inp"]
    expected = quantize_module(lora.merged(), INT4)(x)
    mg, _ = ml.passes.lora_merge(mg)
    merged = mg.modules["inp"]
    assert isinstance(merged, QuantizedLinear)
    assert merged.quant_formats() == {"data_in": INT4_FORMAT, "weight": INT4_FORMAT}
    assert torch.equal(merged(x), expected)
    node = next(n for n in mg.nodes if n.name == "inp").meta["mase"]
    assert node["module"] == "QuantizedLinear" and node["params"]["weight"]["format"] == INT4_FORMAT
    assert ml.passes.avg_bits(mg)[1]["activations"] == 4.0


def test_lora_merge_keeps_activation_pruning():
    mg, x = mlp_graph()
    mg, _ = ml.passes.prune(mg, {"weight": None, "activation": {"sparsity": 0.5}})
    pruner = activation_pruner_of(mg.modules["out"])
    mg, _ = ml.passes.lora(mg, {"rank": 2})
    _train_adapters(mg)
    mg, _ = ml.passes.lora_merge(mg)
    out = mg.modules["out"]
    assert activation_pruner_of(out) is pruner
    h = torch.randn(3, 32)
    assert torch.equal(out(h), F.linear(pruner.prune(h), out.weight, out.bias))


@pytest.mark.parametrize("quantized", [False, True])
def test_lora_merge_keeps_the_weight_mask(quantized):
    mg, x = mlp_graph()
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5}})
    masks = {t: weight_mask_of(mg.modules[t]).mask.clone() for t in ("inp", "hidden", "out")}
    if quantized:
        mg, _ = ml.passes.quantize(mg, {"default": INT4})
    mg, _ = ml.passes.lora(mg, {"rank": 2})
    _train_adapters(mg)
    adapted = mg.model(x=x)
    mg, _ = ml.passes.lora_merge(mg)
    for target, keep in masks.items():
        layer = mg.modules[target]
        assert isinstance(layer, torch.nn.Linear) and isinstance(layer, QuantizedLinear) == quantized
        assert torch.equal(weight_mask_of(layer).mask, keep) and torch.count_nonzero(layer.weight[~keep]) == 0
        assert not quantized or layer.quant_formats() == {"data_in": INT4_FORMAT, "weight": INT4_FORMAT}
    if not quantized:  # a quantized merge re-quantizes the merged weight, so it is equal only up to quantization
        torch.testing.assert_close(mg.model(x=x), adapted, rtol=1e-5, atol=1e-5)
    assert ml.passes.verify(mg)[1]["problems"] == []
    assert mg.nodes[1].meta["mase"]["params"]["weight_mask"]["shape"] == [32, 16]
    mg.model.train()  # training the merged model keeps the pruned weights at zero
    mg.model(x=x).square().sum().backward()
    with torch.no_grad():
        for target in masks:
            original = mg.modules[target].parametrizations.weight.original
            original -= 0.1 * original.grad
    for target, keep in masks.items():
        assert torch.count_nonzero(mg.modules[target].weight[~keep]) == 0


def test_replacing_a_quantized_layer_drops_its_formats():
    mg, _ = mlp_graph()
    mg, _ = ml.passes.quantize(mg, {"default": INT4})
    mg, _ = ml.passes.replace(mg, {"by": "name", "targets": ["hidden"], "with_": "identity"})
    for node in mg.nodes:
        if node.name.startswith("hidden"):
            assert node.meta["mase"]["module"] == "Identity"
            assert node.meta["mase"]["args"][0]["format"] == "float32"
    assert next(n for n in mg.nodes if n.name == "out").meta["mase"]["args"][0]["format"] == INT4_FORMAT


def test_quantize_default_after_lora_says_it_quantizes_nothing():
    mg, _ = mlp_graph()
    mg, _ = ml.passes.lora(mg, {"rank": 2})
    with pytest.raises(ml.passes.PassError, match=r"^pass 'quantize' params.default: the graph has no Linear/Conv1d/Conv2d node for it to "
                       r"quantize \(module ops: dropout, gelu, lora_linear\); merge LoRA adapters first"):
        ml.passes.quantize(mg, {"default": INT4})
    mg, info = ml.passes.quantize(mg, {"default": INT4, "allow_unmatched": True})
    assert info["count"] == 0
