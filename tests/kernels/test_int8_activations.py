"""Linears with int8 activations (llama.cpp's way), packed 4-bit and MXINT8: the activation codes and scales by hand
(ties to even, saturation at 127, zero and non-finite blocks), every vector level bit for bit the plain C one at any
thread count, the affine (Q4_0) and looked-up (MXINT4, MXFP4) tables and MXINT8 codes alike, results within float32
accumulation error of the exact integer reference, and the layers' inference-only contract."""

import pytest
import torch

from mase_lite import UserError
from mase_lite.kernels import mxint8
from mase_lite.kernels import cpu
from mase_lite.kernels.int8_activations import cpu_kernel
from mase_lite.kernels.packed4 import Packed4Linear, pack_linears
from mase_lite.layers.quantized import quantize_module

FORMATS = {
    "q4_0": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "full_range": True,
             "scale_dtype": "float16"},
    "mxint4": {"name": "mxint", "element_width": 4},
    "mxfp4": {"name": "mxfp", "element_format": "e2m1"},
    "iq4_nl": {"name": "iq4_nl"},  # GGML's non-uniform table (int8 values: a looked-up kind)
}
LEVELS = cpu.available_levels()


def layer(name: str, out_features: int, in_features: int, seed: int = 0) -> Packed4Linear:
    torch.manual_seed(seed)
    fake = quantize_module(torch.nn.Linear(in_features, out_features), {"weight": FORMATS[name]})
    return Packed4Linear.from_quantized(fake, activations="int8")


def test_each_formats_table_as_integers():
    assert cpu_kernel.integer_table(layer("q4_0", 1, 32).table) == (pytest.approx(torch.arange(-8, 8)), 1.0)
    itable, unit = cpu_kernel.integer_table(layer("mxfp4", 1, 32).table)
    assert unit == 0.5 and itable.tolist() == [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    itable, unit = cpu_kernel.integer_table(layer("mxint4", 1, 32).table)
    assert torch.equal(itable.double() * unit, layer("mxint4", 1, 32).table.double())
    assert cpu_kernel.integer_table(torch.full((16,), 0.3)) is None
    assert cpu_kernel.integer_table(torch.full((16,), 200.0)) is None


def test_activation_codes_by_hand():
    x = torch.zeros(1, 96)
    x[0, :6] = torch.tensor([127.0, 63.5, -0.5, 1.5, 2.5, -126.5])  # amax 127: the scale is 1, ties go to even
    x[0, 64:66] = torch.tensor([254.0, 1.0])  # scale 2: 1 / 2 -> 0 (a tie, to even)
    codes, scales = cpu_kernel.quantize_activations(x)
    assert codes[0, :6].tolist() == [127, 64, 0, 2, 2, -126]
    assert scales.tolist() == [[1.0, 0.0, 2.0]] and codes[0, 32:64].eq(0).all()  # a zero block: codes 0, scale 0
    assert codes[0, 64:66].tolist() == [127, 0]


@pytest.mark.parametrize("level", LEVELS)
def test_the_kernel_rounds_ties_as_the_reference_exactly(level, monkeypatch):
    """Unit scales and integer weights make every float step exact: the output is the integer dot product."""
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    packed = layer("q4_0", 3, 64)
    packed.scales.fill_(1.0)
    packed.bias = None
    x = torch.zeros(1, 64)
    x[0, :8] = torch.tensor([127.0, 63.5, -0.5, 1.5, 2.5, -126.5, 0.5, -1.5])
    x[0, 32:36] = torch.tensor([-254.0, 1.0, 3.0, -5.0])  # scale 2: codes -127, 0, 2, -2
    codes, _ = cpu_kernel.quantize_activations(x)
    weights = cpu_kernel.unpacked(packed.nibbles, packed.integer_table()[0])
    expected = (weights.long() * codes.long()).reshape(3, 2, 32).sum(-1) @ torch.tensor([1, 2])
    with torch.no_grad():
        assert packed(x)[0].tolist() == expected.tolist()


def integers_and_scales(packed):
    """The layer's integer weights, its blocks' scales (float64) and the kernel's order of a block's elements."""
    if isinstance(packed, Packed4Linear):
        itable, unit = packed.integer_table()
        order = torch.cat([torch.arange(0, 32, 2), torch.arange(1, 32, 2)])  # evens, then odds
        return cpu_kernel.unpacked(packed.nibbles, itable), packed.scales.double() * unit, order
    scales = torch.ldexp(torch.ones_like(packed.scales, dtype=torch.float64), packed.scales.long() - 127 - 6)
    return packed.codes, scales, torch.arange(32)


def reference(x, packed):
    if isinstance(packed, Packed4Linear):
        return cpu_kernel.reference_nibbles(x, packed.nibbles, packed.scales, *packed.integer_table(), packed.bias.detach())
    return cpu_kernel.reference_codes(x, packed.codes, packed.scales, packed.bias.detach())


def lane_bound(x, packed):
    """(blocks + 8) 2**-24 times the sum of |lane sum x scales| over the kernel's eight int32 lanes of each block
    (lane l: the block's elements 8l, 8l+2, 8l+4, 8l+6 for l < 4, then the odd ones): float32 accumulation of
    exact integer lane sums."""
    codes, xs = cpu_kernel.quantize_activations(x.reshape(-1, x.shape[-1]).float())
    weights, block_scales, order = integers_and_scales(packed)
    products = codes.reshape(codes.shape[0], 1, -1, 32).long() * weights.reshape(1, weights.shape[0], -1, 32).long()
    lanes = products[..., order].reshape(*products.shape[:3], 8, 4).sum(-1).abs().sum(-1).double()
    terms = (lanes * xs.double()[:, None] * block_scales[None].abs()).sum(-1)  # IQ4_NL's d may be negative
    return (x.shape[-1] // 32 + 8) * 2.0**-24 * terms.reshape(*x.shape[:-1], -1)


def mxint8_layer(out_features: int, in_features: int, seed: int = 0):
    torch.manual_seed(seed)
    return mxint8.MXInt8Linear.from_linear(torch.nn.Linear(in_features, out_features), activations="int8")


@pytest.mark.parametrize("name", [*FORMATS, "mxint8"])
def test_every_level_and_thread_count_gives_the_c_bits_within_the_references_error(name, monkeypatch):
    previous = torch.get_num_threads()
    try:
        for out_features, in_features, rows in ((1, 32, 1), (7, 96, 3), (33, 224, 5), (600, 512, 2)):
            packed = mxint8_layer(out_features, in_features, rows) if name == "mxint8" else layer(name, out_features, in_features, seed=rows)
            x = torch.randn(rows, in_features) * torch.logspace(-3, 3, in_features)
            expected = reference(x.double(), packed)  # in float64
            bound = lane_bound(x, packed) + 2.0**-24 * (packed.bias.abs().double() + expected.abs())
            outputs = []
            for level in LEVELS:
                monkeypatch.setenv(cpu.LEVEL_ENV, level)
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    with torch.no_grad():
                        outputs.append(packed(x))
            assert all(torch.equal(o.view(torch.int32), outputs[0].view(torch.int32)) for o in outputs)
            assert bool(((outputs[0].double() - expected).abs() <= bound).all())
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("name", [*FORMATS, "mxint8"])
def test_each_row_of_a_batch_has_the_bits_of_that_row_alone(name, monkeypatch):
    """A prompt's rows run as tiles of rows of W by rows of x; each output keeps the bits of a one-row call (a
    decoding step): 37 rows of 4096 inputs cross the kernel's runs of rows of x, 7 outputs its tiles of rows of W."""
    packed = mxint8_layer(7, 4096, 3) if name == "mxint8" else layer(name, 7, 4096, seed=3)
    x = torch.randn(37, 4096)
    for level in LEVELS:
        monkeypatch.setenv(cpu.LEVEL_ENV, level)
        with torch.no_grad():
            batch, rows = packed(x), torch.cat([packed(x[i : i + 1]) for i in range(37)])
        assert torch.equal(batch.view(torch.int32), rows.view(torch.int32)), level


@pytest.mark.parametrize("kind", ["mxfp4", "mxint8"])
@pytest.mark.parametrize("level", LEVELS)
def test_saturation_zero_and_non_finite_blocks(level, kind, monkeypatch):
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    packed = layer("mxfp4", 4, 128) if kind == "mxfp4" else mxint8_layer(4, 128)
    x = torch.zeros(3, 128)
    x[0, 0], x[0, 1] = 1e30, 1e-30  # the tiny value's code is 0 beside the huge one
    x[1, 40] = float("inf")
    x[2, 100] = float("nan")
    with torch.no_grad():
        y = packed(x)
    expected = reference(x, packed)
    assert torch.isfinite(y[0]).all() and torch.allclose(y[0], expected[0], rtol=1e-6)
    assert y[1:].isnan().all() and expected[1:].isnan().all()
    with torch.no_grad():
        zero = packed(torch.zeros(1, 128))
    assert torch.equal(zero[0], packed.bias.detach())  # a zero block adds nothing


def test_blocks_too_small_for_127_over_their_amax_quantize_to_zero_at_every_level(monkeypatch):
    """127 / amax overflows float32 below amax = 127 / FLT_MAX (about 3.7e-37): such a block's codes are 0 at every
    level, as the reference states (not the -128 a vector conversion of an infinity gives), subnormals too. Q8_0's
    weights of d = 1024 keep the products of any nonzero code in float32's range."""
    x = torch.zeros(2, 96)
    x[0, :4] = torch.tensor([1e-40, -5e-41, 0.0, 3e-41])  # subnormal
    x[0, 32:35] = torch.tensor([1e-38, -1e-38, 2e-39])  # normal, still below 127 / FLT_MAX
    x[1, 64:66] = torch.tensor([4e-37, -1e-37])  # just above: 127 / amax is finite
    codes, _ = cpu_kernel.quantize_activations(x)
    assert not codes[0].any() and codes[1, 64:66].tolist() == [127, -32]
    weights = torch.full((8, 96), 127, dtype=torch.int8)
    d = torch.full((8, 3), 1024.0, dtype=torch.float16)
    for level in LEVELS:
        monkeypatch.setenv(cpu.LEVEL_ENV, level)
        y = cpu_kernel.linear_codes(x, weights, d, None)
        assert torch.equal(y[0], torch.zeros(8)), level  # the tiny blocks add nothing
        assert torch.equal(y[1], cpu_kernel.linear_codes(x[1:], weights, d, None)[0]) and bool((y[1] > 0).all())


def test_half_precision_inputs_and_shapes():
    packed = layer("q4_0", 5, 64)
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        y32, y16 = packed(x), packed(x.to(torch.bfloat16))
    assert y32.shape == (2, 3, 5) and y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), reference(x.to(torch.bfloat16).float(), packed).to(torch.bfloat16).float())


def test_inference_only_and_wrong_settings_are_named():
    packed = layer("q4_0", 2, 32)
    with pytest.raises(UserError, match="int8 activations runs inference only"):
        packed(torch.randn(1, 32, requires_grad=True))
    with pytest.raises(UserError, match=r"activations must be one of float, int8, got 'int4'"):
        Packed4Linear(32, 2, FORMATS["q4_0"], activations="int4")
    packed.table.fill_(0.3)
    with pytest.raises(UserError, match="this scaled_integer table has no int8 form"):
        packed(torch.randn(1, 32))


def test_pack_linears_takes_the_activations():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    assert pack_linears(model, "q4_0", activations="int8") == 2
    assert model[0].activations == "int8" and "activations=int8" in repr(model[0])
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    assert mxint8.pack_linears(model, activations="int8") == 2
    assert model[2].activations == "int8" and "activations=int8" in repr(model[2])


def test_mxint8_int8_activations_need_blocks_of_32_and_inference():
    with pytest.raises(UserError, match=r"blocks of 32 over inputs a multiple of 32, got block_size=16, in_features=64"):
        mxint8.MXInt8Linear(64, 8, block_size=16, activations="int8")
    with pytest.raises(UserError, match=r"activations must be one of float, int8, got 'int4'"):
        mxint8.MXInt8Linear(64, 8, activations="int4")
    with pytest.raises(UserError, match="int8 activations runs inference only"):
        mxint8_layer(8, 64)(torch.randn(1, 64, requires_grad=True))


@pytest.mark.parametrize("kind", ["q4_0", "mxint8"])
def test_layers_sharing_an_input_run_in_one_call_with_each_layers_own_bits(kind, monkeypatch):
    make = (lambda n, k, seed: mxint8_layer(n, k, seed)) if kind == "mxint8" else (lambda n, k, seed: layer("q4_0", n, k, seed))
    layers = [make(64, 256, 1), make(16, 256, 2), make(300, 256, 3)]
    fused = type(layers[0]).fused(layers)
    x = torch.randn(3, 256)
    previous = torch.get_num_threads()
    try:
        for level in LEVELS:
            monkeypatch.setenv(cpu.LEVEL_ENV, level)
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                with torch.no_grad():
                    together, alone = fused(x), [m(x) for m in layers]
                assert all(torch.equal(a, b) for a, b in zip(together, alone))
    finally:
        torch.set_num_threads(previous)
    other = make(8, 128, 4)
    assert type(layers[0]).fused([*layers, other]) is None  # other inputs
    assert type(layers[0]).fused([layers[0]] * 9) is None  # more than 8
    float_layer = Packed4Linear.from_quantized(quantize_module(torch.nn.Linear(256, 8), {"weight": FORMATS["q4_0"]}))
    assert Packed4Linear.fused([float_layer]) is None and mxint8.MXInt8Linear.fused([float_layer]) is None
    if kind == "q4_0":
        assert Packed4Linear.fused([layers[0], layer("mxfp4", 8, 256)]) is None  # another table


@pytest.mark.parametrize("level", LEVELS)
def test_float16_scales_compute_the_bits_of_their_float32_values(level, monkeypatch):
    """Q4_0 holds its scales in float16: every finite float16 (subnormals, the largest, negative ones) as a block's
    scale gives the bits the same scale in float32 gives."""
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    scales = bits[bits.isfinite()][: 240 * 128].reshape(240, 128)
    torch.manual_seed(0)
    nibbles = torch.randint(0, 256, (240, 128 * 16), dtype=torch.uint8)
    itable, unit = cpu_kernel.integer_table(torch.arange(16, dtype=torch.float32) - 8)
    x = torch.randn(3, 128 * 32)
    half = cpu_kernel.linear_nibbles(x, nibbles, scales, itable, unit, None)
    assert torch.equal(half.view(torch.int32), cpu_kernel.linear_nibbles(x, nibbles, scales.float(), itable, unit, None).view(torch.int32))
