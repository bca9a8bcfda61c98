"""MXInt8Linear: packed storage, outputs, safetensors round trip."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from mase_lite.infra.errors import UserError
from mase_lite.kernels.mxint8 import MXInt8Linear, dequantize_reference, quantize

from tests.kernels.mxint8_cases import assert_within_accumulation_error


@pytest.fixture
def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(80, 12)


def test_from_linear_stores_codes_and_scales_not_float_weights(linear):
    packed = MXInt8Linear.from_linear(linear)
    assert [name for name, _ in packed.named_parameters()] == ["bias"]
    buffers = dict(packed.named_buffers())
    assert buffers["codes"].dtype == torch.int8 and buffers["codes"].shape == (12, 80)
    assert buffers["scales"].dtype == torch.uint8 and buffers["scales"].shape == (12, 3)
    codes, scales = quantize(linear.weight.detach())
    assert torch.equal(packed.codes, codes) and torch.equal(packed.scales, scales)
    assert torch.equal(packed.bias, linear.bias) and packed.bias is not linear.bias


def test_forward_matches_linear_on_dequantized_weight(linear):
    packed = MXInt8Linear.from_linear(linear)
    x = torch.randn(2, 5, 80)
    weight = dequantize_reference(packed.codes, packed.scales)
    assert_within_accumulation_error(packed(x), x, packed.codes, packed.scales, linear.bias)
    assert torch.equal(packed.dequantized_weight(), weight)
    torch.testing.assert_close(packed(x), linear(x), rtol=0.05, atol=0.05)


def test_packed_bytes_are_a_quarter_plus_scales():
    packed = MXInt8Linear.from_linear(torch.nn.Linear(768, 768, bias=False))
    weight_bytes = sum(b.numel() * b.element_size() for b in packed.buffers())
    assert weight_bytes == 768 * 768 + 768 * 768 // 32
    assert 1 - weight_bytes / (768 * 768 * 4) == pytest.approx(0.7421875)


def test_safetensors_round_trip(linear, tmp_path):
    packed = MXInt8Linear.from_linear(linear, block_size=16)
    path = tmp_path / "packed.safetensors"
    save_file(packed.state_dict(), str(path))
    state = load_file(str(path))
    assert {k: v.dtype for k, v in state.items()} == {
        "codes": torch.int8, "scales": torch.uint8, "bias": torch.float32}
    restored = MXInt8Linear(80, 12, block_size=16)
    restored.load_state_dict(state)
    x = torch.randn(3, 80)
    assert torch.equal(restored(x), packed(x))


def test_no_bias_and_half_precision():
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 4, bias=False).to(torch.bfloat16)
    packed = MXInt8Linear.from_linear(linear)
    assert packed.bias is None
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    out = packed(x)
    assert out.dtype == torch.bfloat16
    assert_within_accumulation_error(out, x, packed.codes, packed.scales)
    half = MXInt8Linear.from_linear(torch.nn.Linear(64, 4).half())
    assert half.bias.dtype == torch.float16


def test_bad_sizes_are_user_errors():
    with pytest.raises(UserError, match="in_features=0"):
        MXInt8Linear(0, 4)


def test_repr_names_the_format(linear):
    assert repr(MXInt8Linear.from_linear(linear, scale_rule="rceil")) == (
        "MXInt8Linear(in_features=80, out_features=12, bias=True, block_size=32, scale_rule='rceil')")
