"""block_fp, block_minifloat, block_log: shared exponents/biases per block, checked by hand."""

import math

import pytest
import torch

from mase_lite.numerics import FormatError, quantize

INF, NAN = math.inf, math.nan


def test_block_fp_table():
    # width 4 (|q| <= 7), shared exponent floor(log2(amax)), element = q * 2**(E - 2)
    # a block holding NaN or Inf is NaN throughout (the MX rule)
    x = torch.tensor([[3.0, 0.4], [0.0, 0.0], [NAN, 1.0], [INF, 0.3], [3.9, 0.0], [-3.0, 0.25]])
    y = quantize(x, "block_fp", width=4, exponent_width=8, block_size=2)
    expected = [[3.0, 0.5], [0.0, 0.0], [NAN, NAN], [NAN, NAN], [3.5, 0.0], [-3.0, 0.0]]  # 0.25: half a step, tie to 0
    assert torch.equal(y.isnan(), torch.tensor(expected).isnan())
    assert y.nan_to_num(7.0).tolist() == torch.tensor(expected).nan_to_num(7.0).tolist()


def test_block_fp_pads_each_row_on_its_own():
    x = torch.tensor([[1.0, 2.0, 100.0], [0.1, 0.2, 0.3]])
    y = quantize(x, "block_fp", width=4, block_size=2)
    # row 0: [1, 2] step 1/2 exact; [100, pad] E=6 step 16: 6.25 -> 6 -> 96
    # row 1: [0.1, 0.2] E=-3 step 2**-5: 3.2 -> 3, 6.4 -> 6; [0.3, pad] E=-2 step 2**-4: 4.8 -> 5
    assert y.tolist() == [[1.0, 2.0, 96.0], [3 / 32, 6 / 32, 5 / 16]]


def test_block_fp_shared_exponent_is_clamped_by_its_bias():
    # exponent_width 4, bias 7: shared exponent in [-7, 8]
    x = torch.tensor([0.001, 0.0005, 0.0, 0.0])
    y = quantize(x, "block_fp", width=4, exponent_width=4, block_size=2)
    assert y.tolist() == [2.0**-9, 0.0, 0.0, 0.0]  # step 2**(-7-2)


def test_block_minifloat_small_valued_block_keeps_its_values():
    # MASE flushes blocks whose max is below 1. Here bias = 15 - (-7) = 22, top binade 2**-7.
    x = torch.tensor([[0.01, 0.003, -0.0071, 0.0]])
    y = quantize(x, "block_minifloat", width=8, exponent_width=4, block_size=4)
    assert y.tolist() == [[10 * 2.0**-10, 12 * 2.0**-12, -15 * 2.0**-11, 0.0]]


def test_block_minifloat_large_block_saturates_at_its_top():
    # amax 1000: bias 15 - 9 = 6, largest 1.875 * 2**9 = 960
    y = quantize(torch.tensor([1000.0, 1.0, -1000.0, 0.0]), "block_minifloat", width=8, exponent_width=4, block_size=4)
    assert y.tolist() == [960.0, 1.0, -960.0, 0.0]
    # amax 3000: bias 4, step 2**8 in the top binade (3000 -> 3072), 2**6 one below (1000 -> 1024)
    y = quantize(torch.tensor([1000.0, 1.0, -3000.0, 0.0]), "block_minifloat", width=8, exponent_width=4, block_size=4)
    assert y.tolist() == [1024.0, 1.0, -3072.0, 0.0]


@pytest.mark.parametrize(
    "fmt, params",
    [
        ("block_fp", {"width": 8}),
        ("block_minifloat", {"width": 8, "exponent_width": 4}),
        ("block_log", {"width": 4}),
    ],
)
@pytest.mark.parametrize("bad", [INF, -INF, NAN])
def test_block_holding_inf_or_nan_is_nan_throughout(fmt, params, bad):
    # the MX rule: such a block's shared scale is the NaN code; before, +Inf beside zeros gave about 1
    x = torch.tensor([[bad, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    y = quantize(x, fmt, block_size=4, **params)
    assert y[0].isnan().all() and y[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    # the block next to it in the same row keeps its values
    x = torch.tensor([0.5, bad, 0.0, 0.0, 0.5, 0.25, 0.0, 0.0])
    y = quantize(x, fmt, block_size=4, **params)
    assert y[:4].isnan().all() and y[4:].tolist() == [0.5, 0.25, 0.0, 0.0]


def test_block_minifloat_narrow_bias_range_limits_small_blocks():
    # exponent_bias_width 2: bias in [-2, 1]; amax 0.01 wants 22, gets 1: subnormal quantum 2**-3
    y = quantize(torch.tensor([0.01, 0.1, 0.2]), "block_minifloat", width=8, exponent_width=4, exponent_bias_width=2, block_size=3)
    assert y.tolist() == [0.0, 0.125, 0.25]


def test_block_log_table():
    # width 4: codes 1..7; top code on the power nearest amax (0.01 -> 2**-7), bias 14
    x = torch.tensor([[0.01, 0.003, -0.0071, 0.0], [1.5, 0.1, 0.7, -0.3]])
    y = quantize(x, "block_log", width=4, block_size=4)
    # row 1: amax 1.5 -> nearest power 2 (tie up), powers 2**-5 .. 2**1
    assert y.tolist() == [[2.0**-7, 2.0**-8, -(2.0**-7), 0.0], [2.0, 0.125, 0.5, -0.25]]


def test_block_log_small_values_far_below_the_top_become_zero():
    # width 3: codes 1..3, powers 2**-2 .. 2**0 for a block with amax 1
    y = quantize(torch.tensor([1.0, 0.2, 0.1, 0.05]), "block_log", width=3, block_size=4)
    assert y.tolist() == [1.0, 0.25, 0.0, 0.0]


@pytest.mark.parametrize(
    "fmt, params",
    [
        ("block_fp", {"width": 6, "block_size": 4}),
        ("block_minifloat", {"width": 6, "exponent_width": 3, "block_size": 4}),
        ("block_log", {"width": 5, "block_size": 4}),
    ],
)
def test_block_formats_follow_the_last_dimension(fmt, params):
    x = torch.randn(3, 2, 8)
    whole = quantize(x, fmt, **params)
    for i in range(3):
        for j in range(2):
            for b in range(2):
                block = x[i, j, 4 * b : 4 * b + 4]
                assert torch.equal(whole[i, j, 4 * b : 4 * b + 4], quantize(block, fmt, **params))


@pytest.mark.parametrize(
    "fmt, params, match",
    [
        ("block_minifloat", {"width": 4, "exponent_width": 4}, r"exponent_width=4 must be < width=4"),
        ("block_minifloat", {"width": 12, "exponent_width": 8}, r"exponent_width=8"),
        ("block_fp", {"width": 8, "block_size": 0}, r"block_size=0"),
        ("block_fp", {"width": 8, "exponent_bias": 200}, r"exponent_bias=200"),
        ("block_log", {"width": 9}, r"width=9"),
        ("block_log", {"width": 4, "exponent_width": 3}, r"unknown key 'exponent_width'; allowed keys: width, exponent_bias_width, block_size"),
    ],
)
def test_impossible_block_params(fmt, params, match):
    with pytest.raises(FormatError, match=match):
        quantize(torch.zeros(4), fmt, **params)
