"""scaled_float (FP8 with a float32 scale) against values derived by hand and against compressed-tensors' FP8."""

import math

import pytest
import torch

from mase_lite.numerics import FormatError, bits_per_element, quantize
from mase_lite.numerics.calibration import choose


def fp8(x, **params):
    x = x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)
    return quantize(x, {"name": "scaled_float", **params})


def test_by_hand_per_row():
    # row 0: amax 448 -> scale 1: 1.0 exact, -3.3 between 3.25 and 3.5 (E4M3 step 0.25 in [2, 4)): 3.25;
    # 0.0107 below E4M3's smallest normal 2**-6: subnormal step 2**-9, 0.0107 * 512 = 5.48 -> 5 * 2**-9
    # row 1: amax 4.48 -> scale 0.01: 1.0 / 0.01 = 100 -> 96 (step 8 in [64, 128), 100 ties? no: 96 nearer)
    y = fp8([[448.0, 1.0, -3.3, 0.0107], [4.48, 1.0, 0.0, -0.0]])
    assert y[0].tolist() == [448.0, 1.0, -3.25, 5 * 2**-9]
    scale = torch.tensor(4.48) / 448
    assert y[1].tolist() == [(448 * scale).item(), (96 * scale).item(), 0.0, 0.0]
    assert math.copysign(1.0, y[1, 3].item()) == 1.0  # a zero element gives +0.0, as scaled_integer's


def test_ties_saturation_nan_inf_and_zero():
    # 1.0625 lies halfway between E4M3 neighbours 1.0 and 1.125: ties to the even mantissa, 1.0;
    # 1.1875 halfway between 1.125 and 1.25: 1.25
    assert fp8([[448.0, 1.0625, 1.1875]]).tolist() == [[448.0, 1.0, 1.25]]
    got = fp8([[float("nan"), 448.0, float("inf"), -float("inf")]])
    assert math.isnan(got[0, 0].item()) and got[0, 1:].tolist() == [448.0, 448.0, -448.0]
    assert fp8(torch.zeros(3, 4)).abs().sum() == 0
    assert fp8([[1000.0, 2.0]], granularity="tensor", scale=1.0).tolist() == [[448.0, 2.0]]  # static: saturates
    assert fp8([[57344.0, 1.1]], element="e5m2").tolist() == [[57344.0, 1.0]]  # E5M2: two mantissa bits


def test_groups_float16_bfloat16_and_ranks():
    x = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(0))
    y = fp8(x, granularity="group", group_size=4)  # groups of 4, 4, 2 per row
    for row, out in zip(x.reshape(-1, 10), y.reshape(-1, 10)):
        for start in (0, 4, 8):
            assert torch.equal(out[start:start + 4], fp8(row[start:start + 4].reshape(1, -1), granularity="tensor")[0])
    for dtype in (torch.float16, torch.bfloat16):
        half = x.to(dtype)
        assert fp8(half).dtype == dtype and torch.equal(fp8(half), fp8(half.float()).to(dtype))
    assert fp8(torch.tensor(3.0)).item() == 3.0 and fp8(torch.tensor([2.0, -7.0])).tolist() == [2.0, -7.0]


def test_bits_calibration_and_refusals():
    assert bits_per_element({"name": "scaled_float"}, (4, 64)) == 8 + 32 / 64
    assert bits_per_element({"name": "scaled_float", "granularity": "tensor"}, (4, 64)) == 8 + 32 / 256
    assert choose("scaled_float", {"granularity": "tensor", "scale": "auto"}, torch.tensor([2.24, -4.48])) == \
        pytest.approx(0.01)
    with pytest.raises(FormatError, match="a static scale is one per tensor"):
        fp8([[1.0]], scale=0.5)
    with pytest.raises(FormatError, match="element"):
        fp8([[1.0]], element="e3m4")


def test_is_compressed_tensors_fp8():
    """compressed-tensors' own FP8 fake quantization (llm-compressor's FP8 and FP8_DYNAMIC weights) agrees bit for
    bit, per channel and per tensor."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is a dev extra")
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    channel = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"]).weights
    tensor = preset_name_to_scheme("FP8", ["Linear"]).weights
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(32, 64, generator=g) * torch.exp(3 * torch.randn(32, 64, generator=g))
        scale, zero = calculate_qparams(x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), channel)
        assert torch.equal(fp8(x), fake_quantize(x, scale, zero, channel))
        scale, zero = calculate_qparams(x.min().reshape(1), x.max().reshape(1), tensor)
        assert torch.equal(fp8(x, granularity="tensor"), fake_quantize(x, scale, zero, tensor))
