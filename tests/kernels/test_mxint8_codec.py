"""MXINT8 codec: every (element, scale) code pair against the format definition, encoder edge cases."""

import math

import pytest
import torch

from mase_lite.infra.errors import UserError
from mase_lite.kernels.mxint8 import dequantize, dequantize_reference, quantize
from tests.kernels.mxint8_cases import all_code_pairs, assert_bitwise_equal


def definition_float64() -> torch.Tensor:
    """value = q * 2**-6 * 2**(E - 127), NaN for E = 0xFF, in Python float64 arithmetic."""
    rows = [[math.nan] * 256 if e == 255 else [math.ldexp(q, e - 127 - 6) for q in range(-128, 128)]
            for e in range(256)]
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_exhaustive_decode_matches_definition(dtype):
    codes, scales = all_code_pairs()
    expected = definition_float64().to(dtype)  # one rounding of the exact value
    assert_bitwise_equal(dequantize_reference(codes, scales, dtype=dtype), expected)
    assert_bitwise_equal(dequantize(codes, scales, dtype=dtype), expected)


def test_decode_special_codes():
    codes, scales = all_code_pairs()
    out = dequantize(codes, scales)
    assert out[255].isnan().all()                       # scale 0xFF: NaN, not Inf
    assert out[127, 0].item() == -2.0                   # element -128 at X = 1: -2·X, not 0
    assert out[0, 129].item() == 2.0 ** -133            # smallest step, a float32 subnormal
    assert out[254, 255].item() == 127 * 2.0 ** 121     # largest finite value
    assert out[254, 0].item() == -math.inf              # -2 * 2**127 overflows float32...
    assert dequantize(codes, scales, dtype=torch.float64)[254, 0].item() == -(2.0 ** 128)  # ...not float64


def test_ties_round_to_even():
    w = torch.tensor([[1.0, 0.5 / 64, 1.5 / 64, 2.5 / 64, -0.5 / 64, -1.5 / 64, -2.5 / 64]])
    codes, scales = quantize(w)
    assert scales.tolist() == [[127]]
    assert codes.tolist() == [[64, 0, 2, 2, 0, -2, -2]]


def test_saturates_at_plus_minus_127():
    w = torch.tensor([[1.999, -1.999, 127.5 / 64, -127.5 / 64, 1.0]])
    codes, scales = quantize(w)
    assert scales.tolist() == [[127]]
    assert codes.tolist() == [[127, -127, 127, -127, 64]]
    torch.manual_seed(0)
    assert quantize(torch.randn(64, 256) * 100)[0].min().item() >= -127  # encoder never emits -128


def test_powers_of_two_and_just_below():
    k = torch.arange(-126, 128, dtype=torch.float64)
    powers = torch.pow(2.0, k).float()
    below = torch.nextafter(powers, torch.zeros(()))
    codes, scales = quantize(torch.stack([powers, below], dim=1).unsqueeze(-1))
    assert torch.equal(scales[:, 0, 0].long(), (k.long() + 127).clamp(max=254))
    assert torch.equal(scales[:, 1, 0].long(), k.long() + 126)
    assert codes[:, 0, 0].tolist() == [64] * 253 + [64]
    assert set(codes[:, 1, 0].tolist()) == {127}   # 1.99999 * 64 rounds to 128, saturates
    codes, scales = quantize(torch.tensor([[15.999999]]))
    assert scales.item() == 127 + 3 and codes.item() == 127


def test_subnormal_inputs():
    w = torch.tensor([[2.0 ** -130, -(2.0 ** -133), 2.0 ** -134, 3 * 2.0 ** -134, 2.0 ** -149]])
    codes, scales = quantize(w)
    assert scales.tolist() == [[0]]
    assert codes.tolist() == [[8, -1, 0, 2, 0]]       # 0.5 -> 0 and 1.5 -> 2: ties to even
    assert dequantize(codes, scales).tolist() == [[2.0 ** -130, -(2.0 ** -133), 0.0, 2.0 ** -132, 0.0]]


def test_all_zero_and_non_finite_blocks():
    w = torch.zeros(3, 64)
    w[1, 40] = math.inf
    w[2, 0] = math.nan
    w[2, 33] = 0.5
    codes, scales = quantize(w)
    assert scales.tolist() == [[0, 0], [0, 255], [255, 126]]
    assert codes[1, 32:].eq(0).all() and codes[2, :32].eq(0).all()
    out = dequantize(codes, scales)
    assert torch.equal(out[0], torch.zeros(64))
    assert out[1, 32:].isnan().all() and out[2, :32].isnan().all()
    assert out[2, 33].item() == 0.5


@pytest.mark.parametrize(("shape", "scales_shape"), [
    ((3, 33), (3, 2)), ((5, 1), (5, 1)), ((2, 65), (2, 3)), ((2, 3, 31), (2, 3, 1)), ((96,), (3,))])
def test_shapes_and_independent_rows(shape, scales_shape):
    torch.manual_seed(0)
    w = torch.randn(shape)
    codes, scales = quantize(w)
    assert codes.shape == w.shape and codes.dtype == torch.int8
    assert scales.shape == scales_shape and scales.dtype == torch.uint8
    rows = w.reshape(-1, shape[-1])
    for row, row_codes in zip(rows, codes.reshape(-1, shape[-1])):
        assert torch.equal(quantize(row.unsqueeze(0))[0][0], row_codes)


def test_round_trip_error_is_within_half_a_step():
    torch.manual_seed(3)
    w = torch.randn(32, 200) * torch.logspace(-3, 3, 32).unsqueeze(1)
    codes, scales = quantize(w)
    w_hat = dequantize(codes, scales)
    step = torch.pow(2.0, scales.double() - 127 - 6).repeat_interleave(32, dim=1)[:, :200]
    saturated = codes.abs() == 127
    error = (w.double() - w_hat.double()).abs()
    assert (error[~saturated] <= step[~saturated] / 2).all()
    assert (error[saturated] <= step[saturated]).all()
    assert torch.equal(quantize(w_hat)[0], codes)


def test_block_size_and_scale_rule_options():
    w = torch.tensor([[1.5, 0.1, 3.0, 0.2]])
    codes, scales = quantize(w, block_size=2, scale_rule="ceil")
    assert scales.tolist() == [[128, 129]]
    assert codes.tolist() == [[48, 3, 48, 3]]
    assert dequantize(codes, scales, block_size=2).tolist() == [[1.5, 0.09375, 3.0, 0.1875]]


def test_dequantize_errors():
    codes, scales = quantize(torch.ones(4, 64))
    with pytest.raises(UserError, match=r"scales shape \(4, 2\) does not match codes shape \(4, 64\) "
                                        r"with block_size=16; expected \(4, 4\)"):
        dequantize(codes, scales, block_size=16)
    with pytest.raises(UserError, match="codes must be torch.int8 and scales torch.uint8, got torch.int32 and torch.uint8"):
        dequantize(codes.int(), scales)
    with pytest.raises(UserError, match="dtype=torch.int32 is not a floating-point dtype"):
        dequantize(codes, scales, dtype=torch.int32)
