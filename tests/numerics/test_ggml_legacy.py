"""GGML's Q4_1, Q5_0 and Q5_1 (mase_lite.numerics.ggml) against llama.cpp's definition (ggml-common.h's block_q4_1,
block_q5_0 and block_q5_1) and its reference quantizers as gguf runs them bit for bit (quantize_row_q4_1_ref,
quantize_row_q5_0_ref, quantize_row_q5_1_ref): the block bytes both ways, no block's error above the reference's,
the nearest code of every weight (q4_1, q5_1: of the float32 values ``d·q + m`` decode to), the edges, and GPTQ on
the block's stored grid."""

import math

import numpy as np
import pytest
import torch
from gguf import quants

from mase_lite.algorithms.gptq import gptq
from mase_lite.numerics import FormatError, bits_per_element, get_format, quantize
from mase_lite.numerics.codes import decode, encode
from mase_lite.numerics.ggml import GGML_TYPE_NAMES, TYPES, from_ggml_blocks, ggml_quantize, ggml_values, to_ggml_blocks
from mase_lite.numerics.registry import target_mapping
from tests.numerics.ggml_reference import bits_of, block_errors, correlated, gguf_type, reference

NAMES = ["q4_1", "q5_0", "q5_1"]
LAYOUT = {"q4_1": (20, 5.0), "q5_0": (22, 5.5), "q5_1": (24, 6.0)}  # bytes per block of 32, bits per weight
F16_MAX = 65504.0


def edge_blocks():
    """Blocks of 32 at the edges, each one row; the reference's values are finite for all of them but q4_1's and q5_1's
    of ``largest_q5_0`` (its min, -16·65504, is -Inf in float16: NaN values)."""
    g = torch.Generator().manual_seed(21)
    small = torch.randn(32, generator=g) * 0.01
    outlier = small.clone()
    outlier[5] = 40.0
    ties = (torch.arange(32) % 16 - 8 + 0.5) * 0.125  # midpoints of a grid of step 0.125
    ties[0] = -1.0
    first_wins = torch.randn(32, generator=g) * 0.1
    first_wins[3], first_wins[9] = 2.0, -2.0  # equal magnitudes: the first is q5_0's signed extreme
    holey = torch.rand(32, generator=g)
    holey[::5] = 0.0
    return {
        "zeros": torch.zeros(32),
        "outlier": outlier,
        "negative_outlier": -outlier,
        "constant": torch.full((32,), 0.37),
        "negative_constant": torch.full((32,), -0.37),
        "ties": ties,
        "first_wins": first_wins,
        "subnormal_d": torch.randn(32, generator=g) * 1e-6,  # d in float16's subnormal range
        "below_float16": torch.randn(32, generator=g) * 1e-9,
        "float16_max": torch.tensor([F16_MAX, -F16_MAX] * 16),
        "largest_q5_0": torch.tensor([16 * F16_MAX, -16 * F16_MAX] * 16),  # q5_0's d = ∓65504 exactly
        "sparse": torch.randn(32, generator=g) * (torch.rand(32, generator=g) > 0.5),
        "non_negative_with_zeros": holey,
        "positive": torch.rand(32, generator=g) + 3.0,  # q4_1's and q5_1's min above zero
        "one_weight": torch.zeros(32).index_fill_(0, torch.tensor([17]), -3.0),
    }


EDGES = edge_blocks()
EDGE_MATRIX = torch.stack(list(EDGES.values()))


def weights(kind, rows=64, cols=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        return torch.randn(rows, cols, generator=g)
    if kind == "laplace":
        return torch.empty(rows, cols).exponential_(generator=g) - torch.empty(rows, cols).exponential_(generator=g)
    if kind == "student_t2":  # heavy tails: Z / sqrt(χ²₂ / 2), χ²₂ / 2 ~ Exp(1)
        return torch.randn(rows, cols, generator=g) / torch.empty(rows, cols).exponential_(generator=g).sqrt()
    if kind == "shifted":  # blocks off zero: the _1 types' min at work
        return torch.randn(rows, cols, generator=g) * 0.1 + torch.randn(rows, cols // 32, 1, generator=g).expand(
            rows, cols // 32, 32).reshape(rows, cols)
    return EDGE_MATRIX


def decoded(d, m, q):
    """llama.cpp's (and gguf's) value of code ``q`` under float16 ``d`` and ``m``: ``d·q + m`` in float32."""
    return np.float32(d) * np.float32(q) + np.float32(m)


def test_the_types_are_registered_with_llama_cpps_layout():
    for name in NAMES:
        t = TYPES[name]
        assert GGML_TYPE_NAMES[name] == name.upper()
        assert quants.GGML_QUANT_SIZES[gguf_type(name)] == (32, LAYOUT[name][0]) == (t.block, t.type_size)
        assert bits_per_element(name) == LAYOUT[name][1]
        fmt = get_format(name)
        params = fmt.validate({})
        assert fmt.group(params, 4096) == 32 and fmt.group_quantizer is not None
        assert fmt.codec.bits(params) == t.code_bits == (4 if name == "q4_1" else 5)
        gguf_mapping = target_mapping(name, "gguf")  # GGUF export: the type's name and its block bytes
        x = weights("shifted", 2, 64)
        assert gguf_mapping.scheme({"name": name}, (2, 64)) == name.upper()
        raw = gguf_mapping.tensors(encode(x, name), name.upper())
        assert np.array_equal(bits_of(quants.dequantize(raw, gguf_type(name))), bits_of(quantize(x, name).numpy()))
        # the 4-bit packed layer holds table·d, no min: q4_1 (d·q + m) has no packed mapping, q4_0 has
        assert target_mapping(name, "packed") is None
    assert target_mapping("q4_0", "packed") is not None


# Bytes -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_block_layout_by_hand(name):
    """block_q4_1: float16 d, float16 m, then byte j holds q[j] (low nibble) and q[j + 16] (high); block_q5_0: float16
    d, the 5th bits as the little-endian uint32 qh (bit j: weight j), then the low 4 bits as q4_0's nibbles;
    block_q5_1: d, m, qh, nibbles."""
    t = TYPES[name]
    codes = (torch.arange(64) * 7 % (1 << t.code_bits)).reshape(1, 64)
    side = {"d": torch.tensor([[0.5, -3.0]], dtype=torch.float16)}
    if t.has_min:
        side["m"] = torch.tensor([[-1.25, 2.0]], dtype=torch.float16)
    raw = to_ggml_blocks(name, codes, side).reshape(2, -1)
    assert raw.shape == (2, t.type_size)
    assert raw[:, 0:2].tolist() == [[0x00, 0x38], [0x00, 0xC2]]  # 0.5 and -3.0 as little-endian float16
    at = 2
    if t.has_min:
        assert raw[:, 2:4].tolist() == [[0x00, 0xBD], [0x00, 0x40]]  # -1.25 and 2.0
        at = 4
    c = codes.reshape(2, 32).numpy()
    if t.code_bits == 5:
        qh = raw[:, at : at + 4].copy().view("<u4").reshape(2)
        assert [[(int(qh[b]) >> j) & 1 for j in range(32)] for b in range(2)] == ((c >> 4) & 1).tolist()
        at += 4
    assert np.array_equal(raw[:, at:], (c[:, :16] & 15) | ((c[:, 16:] & 15) << 4))
    q = (codes.reshape(2, 32) - t.offset).numpy()
    d = side["d"].float().numpy().reshape(2, 1)
    expected = decoded(d, side["m"].float().numpy().reshape(2, 1), q) if t.has_min else d * q.astype(np.float32)
    assert np.array_equal(bits_of(ggml_values(codes, side, name).numpy()), bits_of(expected.reshape(1, 64)))
    assert np.array_equal(bits_of(quants.dequantize(raw.reshape(-1), gguf_type(name))), bits_of(expected.reshape(-1)))
    codes_back, side_back = from_ggml_blocks(name, raw, (1, 64))
    assert torch.equal(codes_back, codes) and all(torch.equal(side_back[k], side[k]) for k in side)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["gaussian", "student_t2", "shifted", "edges"])
def test_llama_cpps_own_bytes_read_and_written_back_unchanged(name, kind):
    x = weights(kind, 8, 256)
    raw, values = reference(name, x.numpy())
    codes, side = from_ggml_blocks(name, raw, x.shape)
    assert np.array_equal(to_ggml_blocks(name, codes, side), raw)
    assert np.array_equal(bits_of(ggml_values(codes, side, name).numpy()), bits_of(values))
    assert int(codes.min()) >= 0 and int(codes.max()) < 1 << TYPES[name].code_bits
    # any bytes a file may hold (finite float16 d and m): read, written back and decoded as gguf decodes them
    t = TYPES[name]
    noise = np.random.default_rng(5).integers(0, 256, size=(6, t.type_size), dtype=np.uint8)
    for at in (0, 2) if t.has_min else (0,):
        noise[:, at : at + 2] = np.random.default_rng(at).normal(0, 0.01, size=(6, 1)).astype(np.float16).view(np.uint8)
    codes, side = from_ggml_blocks(name, noise, (6, 32))
    assert np.array_equal(to_ggml_blocks(name, codes, side), noise)
    assert np.array_equal(bits_of(ggml_values(codes, side, name).numpy()),
                          bits_of(quants.dequantize(noise, gguf_type(name))))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["gaussian", "laplace", "student_t2", "shifted", "edges"])
def test_our_bytes_dequantize_in_gguf_to_our_values_bit_for_bit(name, kind):
    x = weights(kind, 16, 512, seed=1) if kind != "edges" else EDGE_MATRIX
    values = quantize(x, name)
    stored = encode(x, name)
    assert stored is not None and stored.bits == TYPES[name].code_bits
    raw = to_ggml_blocks(name, stored)
    assert np.array_equal(bits_of(quants.dequantize(raw, gguf_type(name))), bits_of(values.numpy()))
    codes, side = from_ggml_blocks(name, raw, x.shape)
    assert np.array_equal(to_ggml_blocks(name, codes, side), raw)
    assert torch.equal(codes, stored.unpacked())
    assert all(torch.equal(side[k], stored.side[k]) for k in side)


def test_a_side_without_its_min_is_refused():
    codes, side = ggml_quantize(weights("gaussian", 2, 64), "q4_1")
    assert set(side) == {"d", "m"} and side["m"].dtype == torch.float16 and side["m"].shape == (2, 2)
    with pytest.raises(FormatError, match="lacks m"):
        to_ggml_blocks("q4_1", codes, {"d": side["d"]})
    with pytest.raises(FormatError, match="0..15"):
        to_ggml_blocks("q4_1", codes + 16, side)
    with pytest.raises(FormatError, match="0..31"):
        to_ggml_blocks("q5_0", codes + 32, {"d": side["d"]})


# Errors against the reference, nearest codes --------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["gaussian", "laplace", "student_t2", "shifted", "edges"])
def test_no_block_is_worse_than_llama_cpps_reference(name, kind):
    """The reference's d (and m), rounded to float16 as it stores them, are a candidate, with every weight at its
    nearest code under them: the kept block's error is at most the reference's (summed in float64).
    Measured (64 × 1024, seed 2), ours / the reference's MSE: q4_1 0.76 (Gaussian), 0.78 (Laplace), 0.64 (Student's
    t, 2 degrees of freedom), 0.76 (blocks off zero); q5_0 0.87, 0.91, 0.97, 0.81; q5_1 0.76, 0.77, 0.60, 0.77."""
    x = weights(kind, seed=2)
    _, ref = reference(name, x.numpy())
    ours = quantize(x, name).numpy()
    ours_error, ref_error = block_errors(x, ours), block_errors(x, ref)
    finite = np.isfinite(ref_error)
    expected = [list(EDGES).index("largest_q5_0")] if kind == "edges" and TYPES[name].has_min else []
    assert np.flatnonzero(~finite).tolist() == expected and bool(np.isfinite(ours).all())
    assert bool(np.all(ours_error[finite] <= ref_error[finite] * (1 + 1e-12)))
    if kind != "edges":
        assert ours_error.sum() < 0.98 * ref_error.sum()


@pytest.mark.parametrize("name", NAMES)
def test_no_block_is_worse_than_the_reference_under_an_importance(name):
    """With an importance, the weighted error of each block is at most that of the reference's values."""
    x = weights("laplace", 16, 512, seed=8)
    importance = torch.rand(512, generator=torch.Generator().manual_seed(9)) ** 2
    _, ref = reference(name, x.numpy())
    ours = ggml_values(*ggml_quantize(x, name, importance=importance), name).numpy()
    w = importance.double().numpy()
    weighted = lambda v: ((x.double().numpy() - v.astype(np.float64)) ** 2 * w).reshape(-1, 32).sum(-1)  # noqa: E731
    assert bool(np.all(weighted(ours) <= weighted(ref) * (1 + 1e-12)))


@pytest.mark.parametrize("name", NAMES)
def test_every_weight_is_at_its_nearest_code_under_the_stored_d_and_m(name):
    """Every weight's value is the nearest of the 16 or 32 float32 values its block's float16 d (and m) decode to."""
    t = TYPES[name]
    x = torch.cat([weights("student_t2", 8, 256, seed=3).reshape(-1, 32),
                   weights("shifted", 4, 256, seed=3).reshape(-1, 32), EDGE_MATRIX])
    codes, side = ggml_quantize(x, name)
    v = ggml_values(codes, side, name).double()
    q = np.arange(t.qmin, t.qmax + 1, dtype=np.float32)
    d = side["d"].float().numpy().reshape(-1, 1)
    grid = decoded(d, side["m"].float().numpy().reshape(-1, 1), q) if t.has_min else d * q  # [B, codes] float32
    gaps = np.abs(x.double().numpy()[:, :, None] - grid.astype(np.float64)[:, None, :]).min(-1)
    assert np.array_equal((x.double() - v).abs().numpy(), gaps)


@pytest.mark.parametrize("name,limit", [("q4_1", 0.8), ("q5_0", 0.9), ("q5_1", 0.8)])
def test_rmse_on_gaussian_weights_against_the_reference(name, limit):
    """Measured on N(0, 1), 1024 × 4096 (seed 4), ours / the reference's MSE: q4_1 0.769 (RMSE 0.0685 against
    0.0782), q5_0 0.876 (0.0399 against 0.0427), q5_1 0.759 (0.0330 against 0.0378)."""
    x = weights("gaussian", 128, 4096, seed=4)
    _, ref = reference(name, x.numpy())
    ours = quantize(x, name).numpy()
    assert block_errors(x, ours).sum() < limit * block_errors(x, ref).sum()


@pytest.mark.parametrize("name", NAMES)
def test_importance_lowers_the_weighted_error(name):
    x = weights("gaussian", 16, 512, seed=5)
    importance = torch.rand(512, generator=torch.Generator().manual_seed(6)) ** 4
    error = lambda v: float(((x - v).square() * importance).sum())  # noqa: E731
    plain = ggml_values(*ggml_quantize(x, name), name)
    weighted = ggml_values(*ggml_quantize(x, name, importance=importance), name)
    assert error(weighted) < 0.95 * error(plain)


# Edges ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_edge_blocks(name):
    t = TYPES[name]
    codes, side = ggml_quantize(EDGE_MATRIX, name)
    values = ggml_values(codes, side, name)
    row = {key: values[i] for i, key in enumerate(EDGES)}
    d = {key: float(side["d"][i, 0]) for i, key in enumerate(EDGES)}
    assert bool(torch.isfinite(values).all())
    # zeros: +0.0 each, d = 0 (and m = 0) and the code of q = 0, as llama.cpp writes them but for the sign of q5_0's d:
    # its reference stores max / -16 = -0.0, which decodes to -0.0 weights
    assert torch.equal(row["zeros"].view(torch.int32), torch.zeros(32, dtype=torch.int32)) and d["zeros"] == 0
    zero_raw = to_ggml_blocks(name, codes[:1], {k: v[:1] for k, v in side.items()})
    llama_raw = reference(name, np.zeros((1, 32)))[0]
    assert np.array_equal(zero_raw[:, 2:], llama_raw[:, 2:]) and zero_raw[:, :2].tolist() == [[0, 0]]
    assert llama_raw[:, :2].tolist() == [[0, 0x80 if name == "q5_0" else 0]]
    # an outlier is kept within half a step; the small weights around it within a few hundredths
    for key, sign in (("outlier", 1), ("negative_outlier", -1)):
        assert abs(float(row[key][5]) - sign * 40.0) <= abs(d[key]) / 2
        assert float((row[key] - EDGES[key]).abs().max()) < 0.03
    # saturation: q5_0's largest magnitude is 16·65504 (d = -65504, q = -16)
    largest = row["largest_q5_0"]
    assert bool((torch.sign(largest) == torch.sign(EDGES["largest_q5_0"])).all())
    if name == "q5_0":  # 16·65504 on q = -16; -16·65504 saturates at q = 15
        assert float(largest[0]) == 16 * F16_MAX and float(largest[1]) == -15 * F16_MAX
    else:  # a block spans at most 65504·qmax, from m (65504 at most in magnitude): one end saturates
        ends = sorted([abs(float(largest.max())), abs(float(largest.min()))])
        assert ends[0] == F16_MAX and ends[1] >= 14 * F16_MAX
    assert float((row["float16_max"] - EDGES["float16_max"]).abs().max()) <= F16_MAX * 2**-9
    for key in ("constant", "negative_constant"):
        assert float((row[key] - EDGES[key]).abs().max()) <= 0.37 * 2**-10
    # a subnormal float16 d still quantizes; below float16's smallest step: zeros (or the min's own float16 step)
    assert 0 < abs(d["subnormal_d"]) < 2**-14
    tiny = EDGES["subnormal_d"]
    assert float((row["subnormal_d"] - tiny).square().sum()) < 0.02 * float(tiny.square().sum())
    assert float(row["below_float16"].abs().max()) <= 2**-24 * 2
    # zeros stay zeros: q5_0's symmetric grid holds them; a non-negative block holding a zero keeps m = 0
    if name == "q5_0":
        assert bool((row["sparse"][EDGES["sparse"] == 0] == 0).all())
    else:
        assert float(side["m"][list(EDGES).index("non_negative_with_zeros"), 0]) == 0
    assert bool((row["non_negative_with_zeros"][EDGES["non_negative_with_zeros"] == 0] == 0).all())
    positive = EDGES["positive"]
    if t.has_min:  # a block off zero: its step is its range over qmax, not its largest magnitude's
        spread = float((positive - positive.mean()).square().sum())
        assert float((row["positive"] - positive).square().sum()) < 0.01 * spread
    assert torch.equal(row["one_weight"], EDGES["one_weight"])  # a block of one weight holds it exactly


@pytest.mark.parametrize("name", NAMES)
def test_infinities_nan_and_ragged_rows(name):
    t = TYPES[name]
    x = torch.tensor([[math.inf, -math.inf] + [0.5] * 30, [torch.finfo(torch.float32).max] * 32,
                      [-torch.finfo(torch.float32).max] * 32])
    y = quantize(x, name)
    assert bool(torch.isfinite(y).all())
    assert float(y[0, 0]) > 0 > float(y[0, 1])  # ±Inf saturate, the sign kept
    # a block of the largest float32: the type's largest value, 65504·16 (q5_0: d = -65504, q = -16), 65504·(qmax + 1)
    # (q4_1, q5_1: d = m = 65504, q = qmax; the negative one with d = m = -65504)
    largest = F16_MAX * (16 if name == "q5_0" else t.qmax + 1)
    assert torch.equal(y[1], torch.full((32,), largest)) and torch.equal(y[2], torch.full((32,), -largest))
    if name == "q5_0":
        assert float(y[0, 0]) == largest and float(y[0, 1]) == -F16_MAX * 15
    else:
        assert float(y[0, 0] - y[0, 1]) == F16_MAX * t.qmax
    x[0, 3] = math.nan
    with pytest.raises(FormatError, match="NaN"):
        quantize(x, name)
    with pytest.raises(FormatError, match="multiple of 32"):
        quantize(torch.randn(2, 48), name)
    with pytest.raises(FormatError, match="0-d"):
        quantize(torch.tensor(1.0), name)


@pytest.mark.parametrize("name", NAMES)
def test_dtypes_and_ranks(name):
    x = weights("shifted", 4, 96, seed=7)
    flat = quantize(x.reshape(-1, 32), name)
    for shape in ((384,), (4, 96), (2, 2, 96), (2, 1, 2, 96), (12, 32)):
        assert torch.equal(quantize(x.reshape(shape), name).reshape(-1, 32), flat)
    for dtype in (torch.float16, torch.bfloat16):
        low = x.to(dtype)
        y = quantize(low, name)
        assert y.dtype == dtype and torch.equal(y, quantize(low.float(), name).to(dtype))
        stored = encode(low, name)
        assert stored is not None and torch.equal(decode(stored), y)
    assert quantize(torch.zeros(0, 64), name).shape == (0, 64)


@pytest.mark.parametrize("name", NAMES)
def test_straight_through_gradient_and_bounds(name):
    x = weights("shifted", 2, 256, seed=4).requires_grad_(True)
    quantize(x, name).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    fmt = get_format(name)
    low, high = fmt.bounds(x.detach(), fmt.validate({}))
    y = quantize(x.detach(), name)
    assert bool(((y >= low) & (y <= high)).all()) and bool((low < high).all())


# GPTQ -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_sweeps_codes_on_the_blocks_stored_grid(name, act_order):
    """One float16 d (and m) per block of 32, fixed from the block before its first column; every result value is
    the value of an integer code of the block's grid under the d (and m) GPTQ kept, and the layer's output error is
    below rounding's."""
    t = TYPES[name]
    w, h, x = correlated(offset=0.05)
    result = gptq(w, h, {"name": name}, act_order=act_order)
    d = result.side["d"]
    assert d.dtype == torch.float16 and d.shape == (8, 256 // 32)
    blocks = result.weight.reshape(8, -1, 32)
    if t.has_min:
        m = result.side["m"]
        assert m.dtype == torch.float16 and m.shape == d.shape
        q = ((blocks.double() - m.double()[..., None]) / d.double()[..., None]).round()
        assert torch.equal(d.float()[..., None] * q.float() + m.float()[..., None], blocks)
    else:
        q = blocks / d.float()[..., None]
        assert torch.equal(q, q.round()) and torch.equal(d.float()[..., None] * q, blocks)
    assert float(q.min()) >= t.qmin and float(q.max()) <= t.qmax
    out_err = lambda v: float((x @ (w - v).t()).square().sum())  # noqa: E731
    assert out_err(result.weight) < 0.95 * out_err(quantize(w, name))
    encoded = encode(result.weight, {"name": name}, side=result.side, values=result.weight)
    assert encoded is not None and torch.equal(decode(encoded), result.weight)
    raw = to_ggml_blocks(name, encoded)
    assert np.array_equal(bits_of(quants.dequantize(raw, gguf_type(name))).reshape(8, -1), bits_of(result.weight.numpy()))


@pytest.mark.parametrize("name", NAMES)
def test_group_quantizer_grid_by_block_and_by_column(name):
    """The grid a block fixes rounds the block's own values to their fake-quantized values, as a block or column by
    column, and far values to its ends."""
    fmt = get_format(name)
    params = fmt.validate({})
    x = torch.cat([weights("shifted", 6, 64, seed=9), EDGE_MATRIX.repeat(1, 2)])
    expected = quantize(x, name)
    for start in (0, 32):
        block = x[:, start : start + 32].contiguous()
        side, grid = fmt.group_quantizer(params, block)
        assert set(side) == ({"d", "m"} if TYPES[name].has_min else {"d"})
        assert torch.equal(grid(block), expected[:, start : start + 32])
        columns = torch.stack([grid(block[:, j].double(), column=j) for j in range(32)], 1).float()
        assert torch.equal(columns, expected[:, start : start + 32])
        far = grid(block * 100)
        low, high = fmt.bounds(block, params)
        assert bool(((far >= low) & (far <= high)).all())
