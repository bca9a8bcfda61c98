"""Inputs and comparisons shared by the MXINT8 CPU and CUDA tests."""

import torch


def all_code_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """codes[s, j] = element j - 128 and scales[s, :] = s: all 256 x 256 pairs, 8 blocks per row."""
    codes = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8).repeat(256, 1)
    scales = torch.arange(256, dtype=torch.int16).to(torch.uint8).unsqueeze(1).repeat(1, 8)
    return codes, scales


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype, shape, NaN positions, and bits everywhere else (so -0.0 differs from 0.0)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
    assert torch.equal(actual[~nan].view(width), expected[~nan].view(width))


UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
SMALLEST_STEP = {torch.float32: 2.0**-149, torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}


def assert_within_accumulation_error(actual, x, codes, scales, bias=None, block_size=32):
    """``actual`` against the reference (weights dequantized to float32, ``F.linear`` in float64):
    NaN exactly where the reference has one, elsewhere within float32 accumulation error

        |y - y_ref| <= (K + 2) * 2**-24 * (sum_k |x_k * w_k| + |b|)       float32 sums in any order
                       + u * |y_ref| + step                              one rounding to the output dtype
                       + 2**-133 * sum_k |x_k| + (K + 1) * 2**-149       underflow below float32's normals

    (u and step: unit roundoff and smallest subnormal of ``actual``'s dtype)."""
    import torch.nn.functional as F

    from mase_lite.kernels.mxint8 import dequantize_reference

    weight = dequantize_reference(codes, scales, block_size).double()
    x64, b64 = x.double(), None if bias is None else bias.double()
    expected = F.linear(x64, weight, b64)
    magnitude = F.linear(x64.abs(), weight.abs(), None if b64 is None else b64.abs())
    k = codes.shape[1]
    bound = ((k + 2) * 2.0**-24 * magnitude + UNIT_ROUNDOFF[actual.dtype] * expected.abs()
             + SMALLEST_STEP[actual.dtype] + 2.0**-133 * x64.abs().sum(-1, keepdim=True) + (k + 1) * 2.0**-149)
    assert actual.shape == expected.shape
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    error = (actual.double() - expected).abs()[~nan]
    assert bool((error <= bound[~nan]).all()), f"max error / bound {(error / bound[~nan]).max().item():.3g}"
