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
