"""MX fake quantization (mase_lite.numerics.mx) against values derived by hand from the OCP MX spec."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mase_lite.infra.errors import UserError
from mase_lite.numerics.mx import (
    MXFP_FORMATS,
    e8m0_decode,
    mx_bits_per_element,
    mxfp,
    mxint,
    mxint_decode,
    mxint_element,
    mxint_encode,
    pow2,
    shared_exponents,
)


def values(x: torch.Tensor) -> list[float]:
    return x.float().tolist()


# ---- MXINT: hand-derived values -------------------------------------------------------------

@pytest.mark.parametrize(("width", "expected"), [
    # amax 2.5 -> E = 1, X = 2; codes x/2 * 2**(w-2), rounded half to even
    (8, [1.0, 0.3125, -2.5]),   # 32, 9.6 -> 10, -80
    (6, [1.0, 0.25, -2.5]),     # 8, 2.4 -> 2, -20
    (4, [1.0, 0.5, -2.5]),      # 2, 0.6 -> 1, -5
])
def test_mxint_hand_values(width, expected):
    assert values(mxint(torch.tensor([1.0, 0.3, -2.5]), element_width=width)) == expected


@pytest.mark.parametrize(("width", "largest"), [(8, 127 / 64), (6, 31 / 16), (4, 7 / 4)])
def test_mxint_saturates_at_symmetric_max(width, largest):
    # amax 1.999 -> X = 1; 1.999 * 2**(w-2) rounds to 2**(w-1), clamped to 2**(w-1) - 1
    assert values(mxint(torch.tensor([1.999, -1.999]), element_width=width)) == [largest, -largest]


def test_mxint8_ties_round_to_even():
    x = torch.tensor([1.0, 0.5 / 64, 1.5 / 64, 2.5 / 64, -1.5 / 64, -0.5 / 64])
    assert values(mxint(x)) == [1.0, 0.0, 2 / 64, 2 / 64, -2 / 64, 0.0]


def test_mxint_zero_dim_is_one_element_block():
    # 0.3 -> E = -2, X = 0.25; 1.2 * 64 = 76.8 -> 77
    out = mxint(torch.tensor(0.3))
    assert out.shape == () and out.item() == 77 / 64 / 4
    codes, scales = mxint_encode(torch.tensor(0.3))
    assert codes.shape == () and codes.item() == 77 and scales.tolist() == [127 - 2]
    assert torch.equal(mxint_decode(codes, scales), out)


def test_shared_exponent_uses_exponent_bits_below_powers_of_two():
    codes, scales = mxint_encode(torch.tensor([15.999999, 1.0]))
    assert scales.tolist() == [127 + 3]
    assert codes.tolist() == [127, 8]
    assert mxint_encode(torch.tensor([16.0]))[1].tolist() == [127 + 4]


def test_shared_exponent_at_every_power_of_two():
    k = torch.arange(-126, 128)
    powers = pow2(k)
    below = torch.nextafter(powers, torch.zeros(()))
    _, scales_at = mxint_encode(powers.unsqueeze(-1))
    _, scales_below = mxint_encode(below.unsqueeze(-1))
    assert torch.equal(scales_at.squeeze(-1).long(), (k + 127).clamp(0, 254))
    assert torch.equal(scales_below.squeeze(-1).long(), (k + 126).clamp(0, 254))


def test_subnormal_inputs():
    # float32 subnormals; E clamps to -127 (X = 2**-127) and elements keep 2**-133 resolution
    x = torch.tensor([2.0 ** -130, 1.5 * 2.0 ** -127, 2.0 ** -134, 2.0 ** -149])
    codes, scales = mxint_encode(x)
    assert scales.tolist() == [0]
    assert codes.tolist() == [8, 96, 0, 0]  # 2**-134 is half a step: tie to even -> 0
    assert values(mxint(x)) == [2.0 ** -130, 1.5 * 2.0 ** -127, 0.0, 0.0]


def test_all_zero_block_gives_zeros_and_smallest_scale():
    x = torch.zeros(2, 40)
    codes, scales = mxint_encode(x)
    assert scales.tolist() == [[0, 0], [0, 0]]
    assert not codes.any()
    assert torch.equal(mxint(x), x)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_poisons_only_its_block(bad):
    x = torch.ones(2, 64)
    x[0, 3] = bad
    codes, scales = mxint_encode(x)
    assert scales.tolist() == [[255, 127], [127, 127]]
    assert not codes[0, :32].any()
    out = mxint(x)
    assert out[0, :32].isnan().all()
    assert torch.equal(out[0, 32:], x[0, 32:]) and torch.equal(out[1], x[1])
    assert mxfp(x, "e4m3")[0, :32].isnan().all()


def test_rows_are_padded_independently():
    # a block spanning rows would quantize row 0's tail with row 1's scale (-> 0)
    x = torch.full((2, 33), 0.01)
    x[1, 0] = 1000.0
    codes, scales = mxint_encode(x)
    assert codes.shape == (2, 33) and scales.shape == (2, 2)
    out = mxint(x)
    assert out[0, 32].item() == pytest.approx(0.01, rel=2 ** -6)
    assert scales[0, 1].item() == scales[0, 0].item()


@pytest.mark.parametrize("shape", [(), (7,), (3, 33), (2, 3, 40), (2, 1, 3, 65)])
def test_any_rank_matches_row_by_row(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 10
    out = mxint(x, element_width=6)
    assert out.shape == x.shape and out.dtype == x.dtype
    rows = x.reshape(-1, x.shape[-1] if x.dim() else 1)
    expected = torch.stack([mxint(row, element_width=6) for row in rows]).reshape(shape)
    assert torch.equal(out, expected)
    fp = mxfp(x, "e2m3")
    assert torch.equal(fp, torch.stack([mxfp(row, "e2m3") for row in rows]).reshape(shape))


def test_empty_rows_keep_shape():
    x = torch.zeros(3, 0)
    assert mxint(x).shape == (3, 0)
    assert mxint_encode(x)[1].shape == (3, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    x = torch.tensor([60000.0, 1.0, -0.3], dtype=dtype)
    out = mxint(x)
    assert out.dtype == dtype
    # amax 60000 -> E = 15, X = 32768: 117.19 -> 117 -> 59904; 1.0 and -0.3 fall below half a step
    assert values(out) == [59904.0, 0.0, -0.0]
    assert torch.equal(mxfp(x, "e4m3"), mxfp(x.float(), "e4m3").to(dtype))


def test_float64_input_saturates_beyond_float32_range():
    x = torch.tensor([1e300, 1.0], dtype=torch.float64)
    out = mxint(x)
    assert out.dtype == torch.float64
    assert out.tolist() == [127 * 2.0 ** (127 - 6), 0.0]


# ---- MXFP: hand-derived values --------------------------------------------------------------

def test_mxfp_format_table():
    assert {name: f.max_value for name, f in MXFP_FORMATS.items()} == {
        "e4m3": 448.0, "e5m2": 57344.0, "e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0}
    assert {name: f.emax for name, f in MXFP_FORMATS.items()} == {
        "e4m3": 8, "e5m2": 15, "e3m2": 4, "e2m3": 2, "e2m1": 2}


@pytest.mark.parametrize("name", list(MXFP_FORMATS))
def test_mxfp_max_is_kept_and_saturates(name):
    fmt = MXFP_FORMATS[name]
    assert values(mxfp(torch.tensor([fmt.max_value, -fmt.max_value]), name)) == [fmt.max_value, -fmt.max_value]
    # just below 2**(emax+1): X = 1 and the element rounds up to 2**(emax+1), then clamps to max
    top = 2.0 ** (fmt.emax + 1) * (1 - 2.0 ** -(fmt.mbits + 3))
    assert values(mxfp(torch.tensor([top, -top]), name)) == [fmt.max_value, -fmt.max_value]


def test_e2m1_value_set_and_ties():
    x = torch.tensor([6, 0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, -5, -0.75])
    assert values(mxfp(x, "e2m1")) == [6, 0, 0, 0.5, 1, 1, 1, 1.5, 2, 2, 2, 3, 4, 4, 4, -4, -1]


def test_e2m1_grid_is_exactly_the_spec_set():
    grid = torch.linspace(-6, 6, 4801)  # one block: X = 1
    assert sorted(set(values(mxfp(grid, "e2m1", block_size=4801)))) == [
        -6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_e4m3_subnormals_and_rounding():
    # amax 448 -> X = 1; subnormal step 2**-9
    x = torch.tensor([448.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 17.0, 19.0, 300.0])
    # 17 and 19: step 2 in [16, 32) -> ties to 16 and 20; 300: step 32 -> 288 (9.375 -> 9)
    assert values(mxfp(x, "e4m3")) == [448.0, 2.0 ** -9, 0.0, 2.0 ** -8, 16.0, 20.0, 288.0]


@pytest.mark.parametrize(("name", "x", "expected"), [
    ("e5m2", [57344.0, 1.125, 1.375], [57344.0, 1.0, 1.5]),  # X = 1, step 0.25 near 1
    ("e3m2", [28.0, 0.2, 0.3], [28.0, 0.1875, 0.3125]),      # X = 1, subnormal step 2**-4: 3.2, 4.8
    ("e2m3", [7.5, 0.0625, 0.1875], [7.5, 0.0, 0.25]),       # X = 1, subnormal step 0.125
])
def test_mxfp_hand_values(name, x, expected):
    assert values(mxfp(torch.tensor(x), name)) == expected


def test_mxfp_scales_the_block():
    # amax 1000 -> floor(log2) = 9, e2m1 emax 2 -> X = 128; 1000/128 = 7.8 -> 8 -> clamp 6
    assert values(mxfp(torch.tensor([1000.0, 300.0, 1.0]), "e2m1")) == [768.0, 256.0, 0.0]


# ---- scale rules -----------------------------------------------------------------------------

@pytest.mark.parametrize(("amax", "expected"), [
    # amax         floor ceil even rceil   (MXINT8: emax 0, 6 fraction bits, max 127/64)
    (1.0,         (0, 0, 0, 0)),
    (1.5,         (0, 1, 0, 0)),
    (1.99,        (0, 1, 0, 1)),     # 127.36 rounds to 127: even keeps X; rceil sees 1.99 > 127/64
    (127.5 / 64,  (0, 1, 1, 1)),     # 127.5 ties to 128: even moves up
    (126.5 / 64,  (0, 1, 0, 0)),     # 126.5 ties to 126: even stays; below 127/64, rceil too
    (2.0,         (1, 1, 1, 1)),
    (127 / 64,    (0, 1, 0, 0)),     # exactly max: rceil needs no bigger scale
])
def test_scale_rules_mxint8(amax, expected):
    for rule, exponent in zip(("floor", "ceil", "even", "rceil"), expected):
        _, scales = mxint_encode(torch.tensor([amax, 0.1]), scale_rule=rule)
        assert scales.item() - 127 == exponent, rule


def test_scale_rules_mxfp():
    x = torch.tensor([7.0, 1.0])
    assert values(mxfp(x, "e2m1", scale_rule="floor")) == [6.0, 1.0]
    for rule in ("ceil", "even", "rceil"):
        assert values(mxfp(x, "e2m1", scale_rule=rule)) == [8.0, 1.0], rule
    # e4m3 "even": 496/512 = 0.96875 has 4 significant bits -> rounds to 1 -> X = 2
    assert shared_exponents(torch.tensor([496.0, 480.0]), MXFP_FORMATS["e4m3"], "even").tolist() == [1, 0]


def test_shared_exponent_clamps():
    element = mxint_element(8)
    amax = torch.tensor([0.0, 2.0 ** -140, 3.0e38])
    assert shared_exponents(amax, element, "floor").tolist() == [-127, -127, 127]
    assert shared_exponents(amax, element, "ceil").tolist() == [-127, -127, 127]


# ---- codes, scales and bits ------------------------------------------------------------------

def test_encode_decode_round_trip_is_exact_on_representable_values():
    torch.manual_seed(1)
    codes = torch.randint(-127, 128, (4, 96), dtype=torch.int8)
    codes[:, ::32] = 100  # every block holds a code >= 64, so re-encoding finds the same scale
    scales = torch.randint(1, 255, (4, 3), dtype=torch.uint8)
    decoded = mxint_decode(codes, scales)
    codes2, scales2 = mxint_encode(decoded)
    assert torch.equal(codes2, codes) and torch.equal(scales2, scales)


@pytest.mark.parametrize("width", [6, 4])
def test_narrow_widths_encode_into_their_range(width):
    torch.manual_seed(2)
    x = torch.randn(8, 64)
    codes, scales = mxint_encode(x, element_width=width)
    limit = 2 ** (width - 1) - 1
    assert codes.abs().max().item() == limit
    assert torch.equal(mxint_decode(codes, scales, element_width=width), mxint(x, element_width=width))


def test_e8m0_decode():
    scales = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    out = e8m0_decode(scales)
    assert out[:-1].tolist() == [2.0 ** -127, 2.0 ** -126, 0.5, 1.0, 2.0, 2.0 ** 127]
    assert out[-1].isnan()


def test_pow2_is_exact_over_float32_range():
    k = torch.arange(-152, 130)
    expected = [math.ldexp(1.0, int(i)) if -149 <= i <= 127 else (0.0 if i < 0 else math.inf) for i in k]
    assert pow2(k).tolist() == expected
    assert pow2(torch.tensor([-1074, 1023]), torch.float64).tolist() == [5e-324, 2.0 ** 1023]


def test_bits_per_element():
    assert mx_bits_per_element(8, 32) == 8.25
    assert mx_bits_per_element(4, 32) == 4.25
    assert mx_bits_per_element(6, 16) == 6.5


# ---- user errors -----------------------------------------------------------------------------

def test_errors_name_the_bad_value_and_allowed_values():
    x = torch.ones(4)
    with pytest.raises(UserError, match=r"element_width=5 .*allowed: \[8, 6, 4\]"):
        mxint(x, element_width=5)
    with pytest.raises(UserError, match=r"scale_rule='round' .*allowed: \['floor', 'ceil', 'even', 'rceil'\]"):
        mxint(x, scale_rule="round")
    with pytest.raises(UserError, match=r"element_format='e4m4' .*allowed: \['e4m3', 'e5m2'"):
        mxfp(x, element_format="e4m4")
    with pytest.raises(UserError, match=r"block_size=0 must be a positive integer"):
        mxint(x, block_size=0)
    with pytest.raises(UserError, match=r"floating-point tensor, got torch.int64"):
        mxint(torch.ones(4, dtype=torch.int64))
    with pytest.raises(UserError, match=r"scales shape \(3,\) does not match codes shape \(40,\).*expected \(2,\)"):
        mxint_decode(torch.zeros(40, dtype=torch.int8), torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(UserError, match=r"codes must be torch.int8 and scales torch.uint8, got torch.float32"):
        mxint_decode(torch.zeros(4), torch.zeros(1, dtype=torch.uint8))


# ---- independent per-element reference (Python floats, float64) ------------------------------

def reference_block(block: list[float], emax: int, quantize_element) -> list[float]:
    amax = max(abs(v) for v in block)
    exponent = -127 if amax == 0 else max(-127, min(127, math.frexp(amax)[1] - 1 - emax))
    return [quantize_element(math.ldexp(v, -exponent)) * 2.0 ** exponent for v in block]


def reference_mxint(row: list[float], width: int) -> list[float]:
    limit = 2 ** (width - 1) - 1

    def element(v: float) -> float:
        return max(-limit, min(limit, round(math.ldexp(v, width - 2)))) * 2.0 ** -(width - 2)

    return [y for i in range(0, len(row), 32) for y in reference_block(row[i:i + 32], 0, element)]


def reference_mxfp(row: list[float], name: str) -> list[float]:
    fmt = MXFP_FORMATS[name]

    def element(v: float) -> float:
        e = fmt.emin if v == 0 else max(math.frexp(v)[1] - 1, fmt.emin)
        q = math.ldexp(round(math.ldexp(v, fmt.mbits - e)), e - fmt.mbits)
        return max(-fmt.max_value, min(fmt.max_value, q))

    return [y for i in range(0, len(row), 32) for y in reference_block(row[i:i + 32], fmt.emax, element)]


float32s = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@settings(max_examples=60, deadline=None)
@given(row=st.lists(float32s, min_size=1, max_size=70), width=st.sampled_from([8, 6, 4]))
def test_mxint_matches_float64_reference(row, width):
    assert values(mxint(torch.tensor(row), element_width=width)) == reference_mxint(row, width)


@settings(max_examples=60, deadline=None)
@given(row=st.lists(float32s, min_size=1, max_size=70), name=st.sampled_from(list(MXFP_FORMATS)))
def test_mxfp_matches_float64_reference(row, name):
    assert values(mxfp(torch.tensor(row), name)) == reference_mxfp(row, name)


def test_mxint_zero_is_positive_like_its_code():
    # code 0 carries no sign: values that round to zero, and -0.0 itself, are +0.0 in fake quantization
    # too, so quantize and encode -> decode agree bit for bit (amax 1: step 2**-6, -0.004 -> code 0)
    x = torch.tensor([[1.0, -0.004, -0.0, 0.004, -2.0**-8, -3 * 2.0**-8]])
    out = mxint(x)
    assert out.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0, -2.0**-6]]
    assert not out.signbit()[0, :5].any()
    codes, scales = mxint_encode(x)
    assert torch.equal(mxint_decode(codes, scales).view(torch.int32), out.view(torch.int32))
