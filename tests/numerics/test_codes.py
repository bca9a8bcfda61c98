"""Stored codes (mase_lite.numerics.codes): bit packing by hand, codes by the formats' definitions, and every
format's codes decoding to its fake-quantized values bit for bit on the edges (zeros of both signs,
subnormals, ties, saturation, NaN, Inf, scales from 2**-140 to 2**120), ranks 0-4, float16 and bfloat16."""

import math

import pytest
import torch

from mase_lite.numerics import bits_per_element, format_names, get_format, quantize
from mase_lite.numerics.codes import decode, encode, float_grid_codes, pack_bits, same_bits, unpack_bits
from mase_lite.numerics.ggml import TYPES as GGML_FORMATS

FORMATS = [
    {"name": "integer", "width": 8, "frac_width": 4},
    {"name": "integer", "width": 3, "frac_width": 1, "floor": True},
    {"name": "integer", "width": 5, "frac_width": 0, "signed": False},
    {"name": "integer", "width": 32, "frac_width": 0},
    {"name": "minifloat_ieee", "width": 8, "exponent_width": 4},
    {"name": "minifloat_ieee", "width": 16, "exponent_width": 5},
    {"name": "minifloat_ieee", "width": 26, "exponent_width": 3},
    {"name": "minifloat_denorm", "width": 8, "exponent_width": 4},
    {"name": "minifloat_denorm", "width": 5, "exponent_width": 3, "exponent_bias": -2},
    {"name": "log", "width": 4},
    {"name": "log", "width": 9},
    {"name": "block_fp", "width": 8, "exponent_width": 8, "block_size": 16},
    {"name": "block_fp", "width": 4, "exponent_width": 4, "block_size": 5},
    {"name": "block_minifloat", "width": 8, "exponent_width": 4, "block_size": 16},
    {"name": "block_minifloat", "width": 6, "exponent_width": 2, "exponent_bias_width": 4, "block_size": 7},
    {"name": "block_log", "width": 4, "block_size": 16},
    {"name": "mxint", "element_width": 8},
    {"name": "mxint", "element_width": 4, "block_size": 7, "scale_rule": "ceil"},
    {"name": "mxint", "element_width": 6, "scale_rule": "rceil"},
    {"name": "mxfp", "element_format": "e4m3"},
    {"name": "mxfp", "element_format": "e5m2", "scale_rule": "even"},
    {"name": "mxfp", "element_format": "e3m2", "block_size": 16},
    {"name": "mxfp", "element_format": "e2m3"},
    {"name": "mxfp", "element_format": "e2m1"},
    {"name": "nvfp4"},
    {"name": "nvfp4", "tensor_amax": 3.0},
    {"name": "nvfp4", "per_tensor": "global_scale"},
    {"name": "nvfp4", "per_tensor": "global_scale", "tensor_amax": 3.0},
    {"name": "scaled_float"},
    {"name": "scaled_float", "element": "e5m2", "granularity": "group", "group_size": 7},
    {"name": "scaled_float", "granularity": "tensor", "scale": 0.05},
    {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "scale_dtype": "float16"},
    {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group", "group_size": 7},
    {"name": "scaled_integer", "width": 8, "granularity": "channel", "clip": 0.9, "scale_dtype": "bfloat16"},
    {"name": "scaled_integer", "width": 16, "symmetric": False, "granularity": "tensor"},
    {"name": "scaled_integer", "width": 2, "granularity": "group", "group_size": 32, "scale_dtype": "pow2"},
    {"name": "scaled_integer", "width": 8, "granularity": "tensor", "scale": 0.05},
    {"name": "binary"},
    {"name": "binary", "bipolar": False},
    {"name": "binary_scaling"},
    {"name": "ternary"},
    {"name": "ternary", "threshold": 0.5},
    {"name": "ternary", "scaling": False},
    {"name": "binary_residual_sign", "levels": 3},
]


def edge_tensor() -> torch.Tensor:
    """Rows of 37 float32 values: the edges of every format, then values at every binade."""
    torch.manual_seed(0)
    specials = torch.tensor([0.0, -0.0, 1e-45, -1e-40, 1.1754942e-38, 0.5, 1.5, 2.5, -3.5, 15.999999, 16.0, 448.0,
                             500.0, 3.4028235e38, -3.4028235e38, math.inf, -math.inf, math.nan])
    rows = [specials.repeat(3)[:37], torch.randn(37), torch.zeros(37), torch.full((37,), -0.0),
            torch.randn(37) * 2.0 ** torch.randint(-140, 120, (37,)).float(), torch.randint(-300, 300, (37,)).float() / 64,
            torch.randn(37) * 1e-3]
    return torch.stack(rows)


def shapes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"rank2": x, "rank0": x[1, 3], "rank1": x[1], "rank3": x.reshape(7, 1, 37), "rank4": x[:, :36].reshape(7, 2, 3, 6),
            "float16": x.half(), "bfloat16": x.bfloat16(), "all_nan": torch.full((2, 33), math.nan),
            "finite": x[[1, 5, 6]]}


def test_the_list_covers_every_format_with_a_codec():
    """ggml's block formats take whole super-blocks only: tests/numerics/test_ggml_formats.py covers their codes."""
    assert {f["name"] for f in FORMATS} | set(GGML_FORMATS) == {n for n in format_names() if get_format(n).codec is not None}
    assert all(get_format(n).codec is not None for n in format_names())


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_codes_decode_to_the_quantized_values_bit_for_bit(fmt):
    for label, x in shapes(edge_tensor()).items():
        encoded = encode(x, fmt)
        expected = quantize(x, fmt)
        if encoded is None:  # values the codes cannot hold: only beyond the format's range in a narrower dtype
            assert fmt["name"] in ("log", "minifloat_ieee") and x.dtype != torch.float32, (fmt, label)
            continue
        assert same_bits(decode(encoded), expected), (fmt, label)
        assert encoded.shape == tuple(x.shape) and encoded.dtype == x.dtype


def stored_side_bits(fmt: dict) -> dict:
    """``fmt`` with each shared value as wide as it is stored: a shared exponent, bias or zero point of fewer
    than 8 bits takes a byte."""
    widened = {"block_fp": "exponent_width", "block_minifloat": "exponent_bias_width", "block_log": "exponent_bias_width"}
    if fmt["name"] in widened:
        return {**fmt, widened[fmt["name"]]: 8}
    return fmt


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_stored_bytes_follow_the_formats_bits(fmt):
    """Codes and side tensors of an 8 x 4480 tensor (whole blocks and groups, no NaN): the format's own bits
    per element within 2 %, shared values narrower than a byte counted as a byte."""
    torch.manual_seed(1)
    x = torch.randn(8, 4480)
    encoded = encode(x, fmt)
    assert encoded is not None
    expected = bits_per_element(stored_side_bits(fmt), x.shape) * x.numel() / 8
    if fmt["name"] == "scaled_integer" and not fmt.get("symmetric", True) and fmt["width"] < 8:
        expected += (8 - fmt["width"]) * encoded.side["zero_point"].numel() / 8  # a zero point takes a byte
    assert abs(encoded.nbytes() - expected) <= 0.02 * expected, (encoded.nbytes(), expected)


def test_a_shared_exponent_narrower_than_a_byte_takes_one():
    """block_fp width 4 with 4-bit exponents in blocks of 5: half a byte per element and a byte per block."""
    encoded = encode(torch.randn(3, 20), {"name": "block_fp", "width": 4, "exponent_width": 4, "block_size": 5})
    assert encoded.packed.numel() == 30 and encoded.side["exponent"].shape == (3, 4)
    assert encoded.side["exponent"].dtype == torch.uint8


def test_four_bit_groups_of_128_with_float16_scales_take_4_125_bits():
    x = torch.randn(256, 1024)
    encoded = encode(x, {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128,
                         "scale_dtype": "float16"})
    assert encoded.nbytes() == 256 * 1024 // 2 + 256 * 8 * 2
    assert encoded.nbytes() / (x.numel() * 4) == pytest.approx(4.125 / 32)


def test_random_draws_store_no_codes():
    assert encode(torch.randn(4, 8), {"name": "binary", "stochastic": True}) is None


@pytest.mark.parametrize("bits", range(1, 33))
def test_packing_round_trips_every_width(bits):
    torch.manual_seed(bits)
    high = (1 << bits) - 1
    codes = torch.cat([torch.randint(0, min(high, 2**62) + 1, (1001,), dtype=torch.int64), torch.tensor([0, high])])
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(len(codes) * bits / 8)
    assert torch.equal(unpack_bits(packed, bits, len(codes)), codes)


def test_packing_is_little_endian_by_hand():
    assert pack_bits(torch.tensor([1, 2, 3]), 4).tolist() == [0x21, 0x03]
    # 5, 0, 7, 1 in 3 bits, least significant bit first: 101 000 11|1 100 -> bytes 0b11000101, 0b00000011
    assert pack_bits(torch.tensor([5, 0, 7, 1]), 3).tolist() == [197, 3]
    assert pack_bits(torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1]), 1).tolist() == [0b00001101, 1]
    assert pack_bits(torch.tensor([0x1234]), 16).tolist() == [0x34, 0x12]


def test_codes_follow_the_formats_definitions():
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -6.0])
    assert float_grid_codes(e2m1, 4, 1, 0).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15]
    # integer width 4, frac 1: two's complement codes offset by 8 (0.5 -> 1 -> 9, -4.0 -> -8 -> 0)
    stored = encode(torch.tensor([0.5, -4.0, 3.5, -0.2]), {"name": "integer", "width": 4, "frac_width": 1})
    assert stored.unpacked().tolist() == [9, 0, 15, 8]
    # MXINT8: scale 2**0 (code 127), elements 1.0 = 64 * 2**-6 and -0.5 = -32 * 2**-6, offset by 128
    stored = encode(torch.tensor([[1.0, -0.5]]), {"name": "mxint", "element_width": 8})
    assert stored.side["scale"].tolist() == [[127]] and stored.unpacked().tolist() == [[192, 96]]
    # scaled_integer width 4 symmetric: scale 7 / 7 = 1, codes 4 (3.5 ties to even), -7, 1, 0 offset by 8
    stored = encode(torch.tensor([[3.5, -7.0, 1.2, 0.0]]), {"name": "scaled_integer", "width": 4})
    assert stored.side["scale"].tolist() == [[1.0]] and stored.unpacked().tolist() == [[12, 1, 9, 8]]  # one scale per row
    # ternary: 0 -> 0, +alpha -> 1, -alpha -> 2
    stored = encode(torch.tensor([0.1, -0.9, 0.5, 0.0]), {"name": "ternary", "threshold": 0.3})
    assert stored.unpacked().tolist() == [0, 2, 1, 0] and stored.side["alpha"].item() == pytest.approx(0.7)


def test_a_held_value_re_encodes_to_the_same_codes_where_quantizing_again_would_move_it():
    """Asymmetric scaled integers recompute their scale from the values: quantizing the stored values again
    moves some of them; encoding them with the stored scales gives the same codes back."""
    torch.manual_seed(2)
    fmt = {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group", "group_size": 32}
    x = torch.randn(64, 256)
    stored = encode(x, fmt)
    values = decode(stored)
    assert not torch.equal(quantize(values, fmt), values)
    again = encode(values, fmt, side=stored.side, values=values)
    assert torch.equal(again.packed, stored.packed)
