"""minifloat_ieee, minifloat_denorm and log: hand tables, value sets enumerated from the definitions."""

import itertools
import math

import pytest
import torch

from mase_lite.numerics import FormatError, quantize

INF, NAN = math.inf, math.nan

# width 8, exponent 4, bias 7: m = 3, normal exponents -6..8, subnormal quantum 2**-9, largest 480.
E4M3_IEEE = [
    (0.0, 0.0),
    (1.0, 1.0),
    (1.0625, 1.0),  # 8.5 quanta of 1/8: tie to even
    (1.1875, 1.25),  # 9.5 -> 10
    (0.3, 0.3125),  # exponent -2, quantum 2**-5: 9.6 -> 10
    (2.0**-6, 2.0**-6),  # smallest normal
    (2.0**-9, 2.0**-9),  # smallest subnormal
    (2.0**-10, 0.0),  # half the smallest subnormal: tie to even (0)
    (3 * 2.0**-10, 2.0**-8),  # 1.5 subnormal quanta -> 2
    (240.0, 240.0),
    (470.0, 480.0),
    (496.0, 480.0),  # rounds to 512, saturates at 480
    (1e6, 480.0),
    (-1e6, -480.0),
    (INF, 480.0),
    (-INF, -480.0),
]


@pytest.mark.parametrize("x, expected", E4M3_IEEE)
def test_minifloat_ieee_e4m3_table(x, expected):
    y = quantize(torch.tensor([x]), "minifloat_ieee", width=8, exponent_width=4)
    assert y.item() == expected


# width 8, exponent 4, bias 7, no implicit one: 0.M * 2**(E-7), M in 0..7; largest 7/8 * 2**8 = 224.
E4M3_DENORM = [
    (1.0, 1.0),  # MASE maps 1.0 to 0.875
    (2.0, 2.0),
    (0.5, 0.5),
    (128.0, 128.0),
    (2.0**-7, 2.0**-7),
    (2.0**-10, 2.0**-10),  # smallest: 0.001b * 2**-7
    (1.1, 1.0),  # quantum 1/4: 4.4 -> 4
    (1.125, 1.0),  # 4.5: tie to even
    (1.375, 1.5),  # 5.5 -> 6
    (200.0, 192.0),  # quantum 32: 6.25 -> 6
    (220.0, 224.0),
    (240.0, 224.0),  # saturates
    (2.0**-11, 0.0),  # tie to even
    (3 * 2.0**-11, 2.0**-9),
    (-INF, -224.0),
]


@pytest.mark.parametrize("x, expected", E4M3_DENORM)
def test_minifloat_denorm_e4m3_table(x, expected):
    y = quantize(torch.tensor([x]), "minifloat_denorm", width=8, exponent_width=4)
    assert y.item() == expected


def test_powers_of_two_inside_the_denorm_range_are_exact():
    powers = torch.tensor([2.0**k for k in range(-10, 8)])
    assert torch.equal(quantize(powers, "minifloat_denorm", width=8, exponent_width=4), powers)
    assert torch.equal(quantize(-powers, "minifloat_denorm", width=8, exponent_width=4), -powers)


def _ieee_values(width, e, bias):
    m = width - 1 - e
    values = set()
    for code, mant in itertools.product(range(2**e), range(2**m)):
        values.add((mant / 2**m) * 2.0 ** (1 - bias) if code == 0 else (1 + mant / 2**m) * 2.0 ** (code - bias))
    return values


def _denorm_values(width, e, bias):
    m = width - 1 - e
    return {(mant / 2**m) * 2.0 ** (code - bias) for code, mant in itertools.product(range(2**e), range(2**m))}


@pytest.mark.parametrize(
    "name, width, e, bias, enumerate_values",
    [
        ("minifloat_ieee", 6, 3, 3, _ieee_values),
        ("minifloat_ieee", 7, 2, 0, _ieee_values),
        ("minifloat_denorm", 6, 3, 3, _denorm_values),
        ("minifloat_denorm", 7, 4, 9, _denorm_values),
    ],
)
def test_outputs_are_the_nearest_enumerated_value(name, width, e, bias, enumerate_values):
    magnitudes = sorted(enumerate_values(width, e, bias))
    grid = torch.tensor(sorted({-v for v in magnitudes} | set(magnitudes)), dtype=torch.float64)
    largest = magnitudes[-1]
    x = torch.cat([torch.linspace(-1.2 * largest, 1.2 * largest, 4001), torch.logspace(-12, 0, 500, base=2.0) * largest])
    y = quantize(x, name, width=width, exponent_width=e, exponent_bias=bias).double()
    assert torch.isin(y, grid).all()
    distance = (grid[None, :] - x.double()[:, None]).abs().min(dim=1).values
    inside = x.double().abs() <= largest
    assert torch.equal((y - x.double()).abs()[inside], distance[inside])


# log, width 4: bias 3, powers 2**-2 .. 2**4, exponent code 0 = zero.
LOG4 = [
    (0.0, 0.0),
    (0.7, 0.5),
    (1.5, 2.0),  # tie between 1 and 2 goes up (half to even on the significand)
    (1.49, 1.0),
    (-3.0, -4.0),
    (0.1875, 0.25),
    (0.13, 0.25),
    (0.125, 0.0),  # half the smallest power: zero
    (0.1, 0.0),
    (16.0, 16.0),
    (24.0, 16.0),  # saturates
    (INF, 16.0),
    (-INF, -16.0),
]


@pytest.mark.parametrize("x, expected", LOG4)
def test_log_width4_table(x, expected):
    assert quantize(torch.tensor([x]), "log", width=4).item() == expected


def test_log_bias_shifts_the_range():
    # width 3, bias 0: codes 1..3 hold 2, 4, 8; 1.0 is half the smallest power, so zero
    y = quantize(torch.tensor([1.0, 1.01, 3.0, 5.0, 6.0, 9.0, 100.0]), "log", width=3, exponent_bias=0)
    assert y.tolist() == [0.0, 2.0, 4.0, 4.0, 8.0, 8.0, 8.0]


@pytest.mark.parametrize("fmt", ["minifloat_ieee", "minifloat_denorm", "log"])
def test_nan_stays_nan(fmt):
    params = {"width": 6} | ({} if fmt == "log" else {"exponent_width": 3})
    assert math.isnan(quantize(torch.tensor([NAN]), fmt, **params).item())


@pytest.mark.parametrize(
    "fmt, params, match",
    [
        ("minifloat_ieee", {"width": 4, "exponent_width": 4}, r"exponent_width=4 must be < width=4"),
        ("minifloat_ieee", {"width": 8, "exponent_width": 9}, r"exponent_width=9"),
        ("minifloat_ieee", {"width": 16, "exponent_width": 8, "exponent_bias": 160}, r"exponent_bias=160 gives exponents -159\.\.95; the smallest must lie in float32's -149\.\.127"),
        ("minifloat_denorm", {"width": 5, "exponent_width": 4}, r"minifloat_denorm needs exponent_width <= width - 2 = 3"),
        ("minifloat_ieee", {"width": 8}, r"exponent_width is required"),
        ("log", {"width": 9, "exponent_bias": -127}, r"width=9 with exponent_bias=-127 gives exponents 128\.\.382"),
        ("log", {"width": 10}, r"width=10"),
    ],
)
def test_impossible_params(fmt, params, match):
    with pytest.raises(FormatError, match=match):
        quantize(torch.zeros(1), fmt, **params)


def test_bfloat16_layout_is_accepted_and_saturates_below_2_to_128():
    # width 16, e 8, bias 127: binades -126..128 with 7 fraction bits; 2**128 lies beyond float32, so the
    # largest value float32 holds is (2 - 2**-7) * 2**127, bfloat16's largest finite value
    top = (2 - 2.0**-7) * 2.0**127
    x = torch.tensor([1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, top, 3.4e38, INF, -INF, 2.0**-133, 2.0**-134, 3 * 2.0**-134])
    y = quantize(x, "minifloat_ieee", width=16, exponent_width=8)
    assert y.tolist() == [1.0, 1.0, 1 + 2.0**-6, top, top, top, -top, 2.0**-133, 0.0, 2.0**-132]


def test_bfloat16_layout_agrees_with_torch_bfloat16_rounding():
    # an independent reference: torch's float32 -> bfloat16 conversion rounds half to even too
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32) * torch.where(torch.rand(20000, generator=g) < 0.5, -1.0, 1.0)
    x = x[torch.isfinite(x) & (x.abs() <= (2 - 2.0**-7) * 2.0**127)]
    y = quantize(x, "minifloat_ieee", width=16, exponent_width=8)
    assert torch.equal(y.view(torch.int32), x.to(torch.bfloat16).float().view(torch.int32))


def test_log_width_9_is_accepted_and_saturates_at_2_to_127():
    # bias 127: powers 2**-126 .. 2**128; 2**128 lies beyond float32, so magnitudes saturate at 2**127
    x = torch.tensor([1.0, 2.0**127, 1.4 * 2.0**127, 1.5 * 2.0**127, 3e38, INF, 2.0**-126, 2.0**-127, 1.5 * 2.0**-127])
    y = quantize(x, "log", width=9)
    assert y.tolist() == [1.0, 2.0**127, 2.0**127, 2.0**127, 2.0**127, 2.0**127, 2.0**-126, 0.0, 2.0**-126]
    assert quantize(-x, "log", width=9).tolist() == [-v for v in y.tolist()]


def test_eight_bit_exponent_with_moved_bias_is_accepted():
    y = quantize(torch.tensor([1.0, 3e38]), "minifloat_ieee", width=16, exponent_width=8, exponent_bias=128)
    assert y[0].item() == 1.0 and y[1].item() == pytest.approx(3e38, rel=2**-7)


def test_float32_subnormal_inputs_in_a_format_that_reaches_them():
    # e8m7 with bias 128: normal exponents -127..127, subnormal quantum 2**-134 (all float32 subnormals)
    x = torch.tensor([2.0**-140, 2.0**-134, 3 * 2.0**-135, 5 * 2.0**-135, 2.0**-149])
    y = quantize(x, "minifloat_ieee", width=16, exponent_width=8, exponent_bias=128)
    assert y.tolist() == [0.0, 2.0**-134, 2.0**-133, 2.0**-133, 0.0]  # 1.5 and 2.5 quanta: ties to even


def test_float16_subnormal_inputs():
    x = torch.tensor([2.0**-24, 3 * 2.0**-24, 2.0**-15], dtype=torch.float16)
    # e5m2, bias 15: subnormal quantum 2**-16, so 3 * 2**-24 rounds to zero and 2**-15 is exact
    y = quantize(x, "minifloat_ieee", width=8, exponent_width=5)
    assert y.dtype == torch.float16 and y.tolist() == [0.0, 0.0, 2.0**-15]
    assert quantize(x, "integer", width=16, frac_width=16).tolist() == [0.0, 0.0, 2.0**-15]
