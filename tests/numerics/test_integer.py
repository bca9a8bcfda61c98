"""integer: fixed point, checked against values derived by hand from the format's definition."""

import math

import pytest
import torch

from mase_lite.numerics import FormatError, quantize

INF, NAN = math.inf, math.nan

# width 8, frac 4: step 1/16, codes -128..127, so values -8 .. 7.9375.
INT8_FRAC4 = [
    (0.0, 0.0),
    (0.3, 0.3125),  # 4.8 steps -> 5
    (0.03125, 0.0),  # 0.5 step: tie to even (0)
    (0.09375, 0.125),  # 1.5 steps: tie to even (2)
    (-0.09375, -0.125),
    (0.15625, 0.125),  # 2.5 steps -> 2
    (7.9375, 7.9375),
    (7.96875, 7.9375),  # 127.5 steps rounds to 128, saturates at 127
    (100.0, 7.9375),
    (-8.0, -8.0),
    (-8.03, -8.0),
    (-100.0, -8.0),
    (INF, 7.9375),
    (-INF, -8.0),
]


@pytest.mark.parametrize("x, expected", INT8_FRAC4)
def test_signed_int8_frac4_table(x, expected):
    y = quantize(torch.tensor([x]), "integer", width=8, frac_width=4)
    assert y.item() == expected


def test_nan_stays_nan_and_code_zero_is_positive_zero():
    """A two's complement code has no sign of zero: -0.0 and negative values that round to 0 give +0.0."""
    y = quantize(torch.tensor([NAN, -0.0, -0.01]), "integer", width=8, frac_width=4)
    assert math.isnan(y[0].item())
    assert y[1:].tolist() == [0.0, 0.0] and not y[1:].signbit().any()


def test_floor_rounds_toward_minus_infinity():
    x = torch.tensor([0.09375, -0.01, 0.0624, 7.99, -8.5])
    y = quantize(x, "integer", width=8, frac_width=4, floor=True)
    assert y.tolist() == [0.0625, -0.0625, 0.0, 7.9375, -8.0]


def test_unsigned_codes_saturate_at_zero_and_top():
    x = torch.tensor([-3.0, 0.0, 2.5, 3.5, 15.4, 16.0])
    y = quantize(x, "integer", width=4, frac_width=0, signed=False)
    assert y.tolist() == [0.0, 0.0, 2.0, 4.0, 15.0, 15.0]


def test_one_bit_signed_holds_minus_one_and_zero():
    y = quantize(torch.tensor([0.7, -0.7, -0.4]), "integer", width=1, frac_width=0)
    assert y.tolist() == [0.0, -1.0, 0.0] and not y[2].signbit()


def test_width_32_saturates_at_largest_float32_below_bound():
    y = quantize(torch.tensor([3e9, -3e9]), "integer", width=32, frac_width=0)
    assert y.tolist() == [2.0**31 - 128, -(2.0**31)]


def test_all_fractional_width():
    # frac_width == width: values -0.5 .. 0.5 - 2**-8 with step 2**-8
    y = quantize(torch.tensor([0.7, -0.7, 0.1]), "integer", width=8, frac_width=8)
    assert y.tolist() == [127 / 256, -0.5, 26 / 256]


@pytest.mark.parametrize(
    "params, match",
    [
        ({"width": 8, "frac_width": 9}, r"frac_width=9 must be <= width=8 \(allowed: 0\.\.8\)"),
        ({"width": 0, "frac_width": 0}, r"width=0"),
        ({"width": 8, "frac_width": -1}, r"frac_width=-1"),
        ({"width": 8}, r"frac_width is required"),
        ({"width": 8, "frac_width": 4, "frac": 2}, r"unknown key 'frac'; allowed keys: width, frac_width, signed, floor"),
        ({"width": "8", "frac_width": 4}, r"width='8'"),
        ({"width": 8.0, "frac_width": 4}, r"width=8\.0"),
    ],
)
def test_impossible_params_raise_naming_the_key(params, match):
    with pytest.raises(FormatError, match=match):
        quantize(torch.zeros(2), "integer", **params)


def test_int8_outputs_are_on_the_grid_and_nearest():
    x = torch.linspace(-9, 9, 2001)
    y = quantize(x, "integer", width=8, frac_width=4)
    codes = y * 16
    assert torch.equal(codes, codes.round())
    inside = (x >= -8) & (x <= 7.9375)
    assert (y[inside] - x[inside]).abs().max() <= 1 / 32
