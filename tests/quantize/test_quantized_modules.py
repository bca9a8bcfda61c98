"""Quantized Linear/Conv and functional ops: exact outputs, shared parameters, dtype, training."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mase_lite.layers.quant_config import QuantConfigError
from mase_lite.layers.quant_functional import QuantizedAdd, QuantizedMatmul, quantized_add, quantized_bmm, quantized_matmul, quantized_mul
from mase_lite.layers.quantized import QuantizedConv1d, QuantizedConv2d, QuantizedLinear, quantize_module
from mase_lite.numerics import quantize, residual_level_means


def q8(x):
    """integer width 8, frac 4, by its definition."""
    return (x * 16).round().clamp(-128, 127) / 16


def q4(x):
    """integer width 4, frac 2, by its definition."""
    return (x * 4).round().clamp(-8, 7) / 4


MASE_INT8 = {
    "name": "integer",
    "data_in_width": 8, "data_in_frac_width": 4,
    "weight_width": 8, "weight_frac_width": 4,
    "bias_width": 8, "bias_frac_width": 4,
}


def test_quantized_linear_equals_the_manual_computation():
    torch.manual_seed(0)
    linear = nn.Linear(12, 5)
    x = torch.randn(3, 7, 12) * 3
    layer = quantize_module(linear, MASE_INT8 | {"data_out_width": 4, "data_out_frac_width": 2})
    assert isinstance(layer, QuantizedLinear)
    expected = q4(F.linear(q8(x), q8(linear.weight), q8(linear.bias)))
    assert torch.equal(layer(x), expected)


def test_from_float_shares_parameters_and_keeps_mode():
    linear = nn.Linear(4, 3).eval()
    layer = QuantizedLinear.from_float(linear, MASE_INT8)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    assert not layer.training
    assert sorted(n for n, _ in layer.named_parameters()) == ["bias", "weight"]


def test_linear_without_bias_ignores_a_bias_config():
    layer = quantize_module(nn.Linear(4, 3, bias=False), MASE_INT8)
    assert layer.bias is None and layer.bias_quantizer is None
    assert set(layer.quant_formats()) == {"data_in", "weight"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_layers_keep_their_dtype(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(8, 4).to(dtype)
    layer = quantize_module(linear, MASE_INT8)
    x = torch.randn(2, 8).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and layer.weight.dtype == dtype
    expected = F.linear(q8(x.float()).to(dtype), q8(linear.weight.float()).to(dtype), q8(linear.bias.float()).to(dtype))
    assert torch.equal(y, expected)


def test_conv2d_and_conv1d_keep_their_geometry_and_quantize_operands():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect", groups=1, bias=True)
    layer = quantize_module(conv, MASE_INT8)
    assert isinstance(layer, QuantizedConv2d) and layer.weight is conv.weight
    assert (layer.stride, layer.padding, layer.padding_mode) == ((2, 2), (1, 1), "reflect")
    x = torch.randn(2, 3, 9, 9)
    expected = F.conv2d(F.pad(q8(x), (1, 1, 1, 1), mode="reflect"), q8(conv.weight), q8(conv.bias), stride=2)
    assert torch.equal(layer(x), expected)
    conv1 = nn.Conv1d(4, 6, 3, dilation=2, groups=2, bias=False)
    layer1 = quantize_module(conv1, {"weight": {"name": "binary"}})
    assert isinstance(layer1, QuantizedConv1d) and layer1.groups == 2
    x1 = torch.randn(2, 4, 10)
    assert torch.equal(layer1(x1), F.conv1d(x1, torch.where(conv1.weight >= 0, 1.0, -1.0), dilation=2, groups=2))


def test_constructors_build_fresh_quantized_layers():
    layer = QuantizedLinear(6, 2, config=MASE_INT8)
    assert layer(torch.randn(1, 6)).shape == (1, 2)
    conv = QuantizedConv2d(3, 2, 3, padding=1, config={"weight": {"name": "ternary"}})
    assert conv(torch.randn(1, 3, 5, 5)).shape == (1, 2, 5, 5)


def test_qat_gradients_reach_the_shared_float_weight():
    torch.manual_seed(0)
    linear = nn.Linear(4, 2)
    layer = quantize_module(linear, MASE_INT8)
    layer(torch.randn(5, 4)).sum().backward()
    assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0


def test_clipped_ste_in_a_layer_zeroes_the_gradient_of_saturated_weights():
    linear = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[0.5, 100.0]]))
    layer = quantize_module(linear, {"weight": {"name": "integer", "width": 8, "frac_width": 4, "ste": "clipped"}})
    layer(torch.ones(1, 2)).sum().backward()
    assert linear.weight.grad.tolist() == [[1.0, 0.0]]


def test_residual_sign_weight_trains_in_a_linear():
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = x @ torch.randn(16, 4)
    layer = quantize_module(nn.Linear(16, 4, bias=False), {"weight": {"name": "binary_residual_sign", "levels": 2}})
    means = layer.weight_quantizer.level_means
    assert torch.equal(means.detach(), residual_level_means(layer.weight.detach(), 2))
    start = means.detach().clone()
    losses = []
    for _ in range(60):
        loss = F.mse_loss(layer(x), y)
        layer.zero_grad()
        loss.backward()
        assert means.grad is not None and means.grad.abs().sum() > 0
        with torch.no_grad():
            layer.weight -= 0.05 * layer.weight.grad
            means -= 0.002 * means.grad
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert not torch.equal(means.detach(), start)
    assert "weight_quantizer.level_means" in layer.state_dict()


def test_residual_sign_on_activations_initializes_from_the_first_batch():
    layer = quantize_module(nn.Linear(4, 2), {"data_in": {"name": "binary_residual_sign", "levels": 1}})
    assert not layer.data_in_quantizer.initialized
    x = torch.tensor([[1.0, -3.0, 2.0, 2.0]])
    layer(x)
    assert layer.data_in_quantizer.initialized and layer.data_in_quantizer.level_means.tolist() == [2.0]
    assert torch.equal(layer(torch.tensor([[5.0, -1.0, 0.0, 1.0]])), layer.weight.new_tensor([[2.0, -2.0, 2.0, 2.0]]) @ layer.weight.t() + layer.bias)


def test_packed_mxint8_storage_gives_the_packed_linear():
    mxint8 = pytest.importorskip("mase_lite.kernels.mxint8")
    linear = nn.Linear(64, 8)
    layer = quantize_module(linear, {"name": "mxint", "element_width": 8, "storage": "packed", "block_size": 16})
    assert isinstance(layer, mxint8.MXInt8Linear) and layer.block_size == 16
    with pytest.raises(QuantConfigError, match=r"storage 'packed' is available for Linear only, not Conv2d"):
        quantize_module(nn.Conv2d(2, 2, 1), {"name": "mxint", "element_width": 8, "storage": "packed"})


def test_unquantizable_modules_and_empty_configs_are_refused():
    with pytest.raises(QuantConfigError, match=r"no quantized version of LayerNorm; quantizable modules: Linear, Conv1d, Conv2d"):
        quantize_module(nn.LayerNorm(4), MASE_INT8)
    with pytest.raises(QuantConfigError, match=r"quantizes nothing"):
        quantize_module(nn.Linear(2, 2), {"name": None})


def test_functional_ops_quantize_each_operand():
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 4) * 3, torch.randn(2, 4, 5) * 3
    cfg = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 4, "weight_frac_width": 2}
    assert torch.equal(quantized_matmul(a, b, cfg), q8(a) @ q4(b))
    assert torch.equal(quantized_bmm(a, b, cfg), torch.bmm(q8(a), q4(b)))
    assert torch.equal(quantized_add(a, a, cfg, alpha=2), q8(a) + 2 * q4(a))
    assert torch.equal(quantized_mul(a, 0.3, cfg), q8(a) * 0.3)
    assert torch.equal(QuantizedMatmul(cfg)(a, b), q8(a) @ q4(b))
    out = QuantizedAdd({"data_out": {"name": "integer", "width": 4, "frac_width": 2}})(a, b[:, :3, :4])
    assert torch.equal(out, q4(a + b[:, :3, :4]))


def test_functional_op_configs_are_validated():
    with pytest.raises(QuantConfigError, match=r"config\.bias: not an operand here; allowed keys: inputs, data_in_0, data_in_1, data_out, data_in, weight, storage"):
        quantized_matmul(torch.ones(2, 2), torch.ones(2, 2), {"name": "integer", "bias_width": 8, "bias_frac_width": 4})


def test_matches_the_numerics_entry_point_for_other_formats():
    torch.manual_seed(0)
    linear = nn.Linear(32, 3)
    fmt = {"name": "block_minifloat", "width": 8, "exponent_width": 4, "block_size": 16}
    layer = quantize_module(linear, {"data_in": fmt, "weight": fmt})
    x = torch.randn(4, 32)
    assert torch.equal(layer(x), F.linear(quantize(x, fmt), quantize(linear.weight, fmt), linear.bias))
