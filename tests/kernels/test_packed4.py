"""The packed 4-bit Linear (Q4_0-style integers, MXINT4, MXFP4, GGML's IQ4_NL and Q4_0): weights bit for bit the formats' decoders at every
vector level, outputs within float32 accumulation error of the float64 reference and the same bits at any thread
count, the edges of each format, and the layer through the quantize pass and capture."""

import pytest
import torch

import mase_lite as ml
from mase_lite import UserError
from mase_lite.kernels import cpu
from mase_lite.kernels.packed4 import Packed4Linear, cpu_kernel
from mase_lite.kernels.packed4.module import decode
from mase_lite.layers.quantized import quantize_module
from tests.kernels.mxint8_cases import UNIT_ROUNDOFF, SMALLEST_STEP, assert_bitwise_equal

FORMATS = {
    "q4_0": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "full_range": True,
             "scale_dtype": "float16"},
    "w4_float32_scale": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32},
    "mxint4": {"name": "mxint", "element_width": 4},
    "mxfp4": {"name": "mxfp", "element_format": "e2m1"},
    "iq4_nl": {"name": "iq4_nl"},  # GGML's: its 16 non-uniform int8 values times a float16 d per 32
    "ggml_q4_0": {"name": "q4_0"},
}
LEVELS = [*cpu.available_levels(), "torch"]


def packed(fmt: dict, out_features: int, in_features: int, seed: int = 0, weight: torch.Tensor | None = None):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features)
    if weight is not None:
        with torch.no_grad():
            linear.weight.copy_(weight)
    fake = quantize_module(linear, {"weight": fmt})
    return fake, Packed4Linear.from_quantized(fake)


def assert_within_accumulation_error(actual, x, weight, bias):
    """|y - y_ref| <= (K + 2) 2**-24 sum|x w| + u |y_ref| + step (+ underflow), y_ref in float64."""
    x64, w64, b64 = x.double(), weight.double(), None if bias is None else bias.double()
    expected = torch.nn.functional.linear(x64, w64, b64)
    magnitude = torch.nn.functional.linear(x64.abs(), w64.abs(), None if b64 is None else b64.abs())
    k = weight.shape[1]
    bound = ((k + 2) * 2.0**-24 * magnitude + UNIT_ROUNDOFF[actual.dtype] * expected.abs() + SMALLEST_STEP[actual.dtype]
             + 2.0**-133 * x64.abs().sum(-1, keepdim=True) + (k + 1) * 2.0**-149)
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert bool(((actual.double() - expected).abs()[~nan] <= bound[~nan]).all())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_weights_exact_and_outputs_within_accumulation_error(name, level, monkeypatch):
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    for out_features, in_features, rows in ((1, 32, 1), (7, 96, 3), (33, 64, 5), (9, 160, 40)):  # 40: the panels
        fake, layer = packed(FORMATS[name], out_features, in_features, seed=rows)
        weight = fake._operand("weight", fake.weight).detach()
        assert_bitwise_equal(layer.dequantized_weight(), weight)
        x = torch.randn(2, rows, in_features)
        with torch.no_grad():
            y = layer(x)
        assert y.shape == (2, rows, out_features)
        assert_within_accumulation_error(y, x, weight, layer.bias.detach())


@pytest.mark.parametrize("level", cpu.available_levels())
def test_thread_counts_give_the_same_bits(level, monkeypatch):
    """Rows of W are split over threads, never a dot product."""
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    _, layer = packed(FORMATS["q4_0"], 300, 256)
    previous = torch.get_num_threads()
    try:
        for rows in (1, 4, 7):
            x = torch.randn(rows, 256)
            outputs = []
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                with torch.no_grad():
                    outputs.append(layer(x))
            assert all(torch.equal(o.view(torch.int32), outputs[0].view(torch.int32)) for o in outputs)
    finally:
        torch.set_num_threads(previous)


def edge_weight(name: str) -> torch.Tensor:
    """Rows: zeros, one saturating outlier per block, ties between codes, tiny and huge magnitudes."""
    w = torch.zeros(8, 64)
    w[1, :] = torch.linspace(-1, 1, 64)
    w[1, 5] = 1e4  # the block's scale from its outlier: the rest rounds to 0
    w[2, :] = torch.arange(64) % 16 - 8.0  # every integer code
    w[3, :] = 0.5 + torch.arange(64) % 8  # halfway between codes (ties)
    w[4, :] = torch.randn(64) * 1e-30  # scales near the bottom of float32 (MX: E8M0 down to 2**-127)
    w[5, :] = torch.randn(64) * 1e30
    w[6, :] = -65504.0 * (name == "q4_0") + (name != "q4_0") * -3e38  # the float16 scale's top; MX's largest
    w[7, :32] = torch.tensor([6.0, -6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5] * 4)  # the E2M1 grid
    return w


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_edges_of_each_format(name, level, monkeypatch):
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    fake, layer = packed(FORMATS[name], 8, 64, weight=edge_weight(name))
    weight = fake._operand("weight", fake.weight).detach()
    assert_bitwise_equal(layer.dequantized_weight(), weight)
    assert_bitwise_equal(decode(layer.nibbles, layer.scales, layer.table), weight)
    assert (layer.dequantized_weight()[0] == 0).all()
    x = torch.randn(3, 64) * 1e-3
    with torch.no_grad():
        assert_within_accumulation_error(layer(x), x, weight, layer.bias.detach())


def test_q4_0_codes_and_scales_are_ggufs():
    """Q4_0: value = d * (q - 8) with q the nibble (low nibble the even element) and d the float16 scale."""
    w = torch.zeros(1, 32)
    w[0, :4] = torch.tensor([-8.0, 7.0, 1.0, -1.0]) * 0.25
    fake, layer = packed(FORMATS["q4_0"], 1, 32, weight=w)
    scale = torch.tensor(2.0 / 7.5).half().float()  # amax 2 over 7.5 (full range), stored as float16
    assert layer.scales.tolist() == [[scale.item()]]
    assert layer.table.tolist() == [float(q - 8) for q in range(16)]
    expected_codes = torch.round(w[0] / scale).clamp(-8, 7).long() + 8
    assert layer.nibbles[0, 0].item() == expected_codes[0].item() | expected_codes[1].item() << 4


def test_half_precision_inputs_and_gradients():
    fake, layer = packed(FORMATS["mxfp4"], 16, 64)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(2, 64, dtype=dtype)
        with torch.no_grad():
            y = layer(x)
        assert y.dtype == dtype
        assert torch.allclose(y.float(), fake(x.float()), rtol=2e-2, atol=2e-2)
    x = torch.randn(3, 64, requires_grad=True)
    layer(x).sum().backward()
    assert torch.allclose(x.grad, layer.dequantized_weight().sum(0).expand(3, 64))


def test_the_quantize_pass_packs_4_bit_weights_and_the_graph_captures():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8))
    x = torch.randn(4, 64)
    mg = ml.MaseGraph(model, example_inputs={"input": x})
    fake, _ = ml.passes.quantize(ml.MaseGraph(model, example_inputs={"input": x}),
                                 {"by": "type", "rules": {"linear": {"weight": FORMATS["mxint4"]}}})
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": FORMATS["mxint4"], "storage": "packed"}}})
    assert [type(m).__name__ for m in mg.model.modules() if "Linear" in type(m).__name__] == ["Packed4Linear"] * 2
    with torch.no_grad():
        got, expected = mg.model(x), fake.model(x)
    assert (got - expected).abs().max() < 1e-4
    again = ml.MaseGraph(mg.model, example_inputs={"input": x})  # the op is one node under torch.export
    with torch.no_grad():
        assert torch.equal(again.model(x), got)


def test_formats_that_do_not_pack_are_refused_in_one_line():
    with pytest.raises(UserError, match=r"'packed' needs a layer weight in format mxint with element_width 8, or 4-bit"):
        quantize_module(torch.nn.Linear(64, 8), {"weight": {"name": "scaled_integer", "width": 4, "symmetric": False,
                                                            "granularity": "group", "group_size": 32},
                                                 "storage": "packed"})
    fake = quantize_module(torch.nn.Linear(48, 8), {"weight": FORMATS["mxfp4"]})
    with pytest.raises(UserError, match=r"over 48 inputs"):
        Packed4Linear.from_quantized(fake)


def test_q4_0_holds_its_scales_in_float16_as_gguf_does():
    _, q4_0 = packed(FORMATS["q4_0"], 64, 256)
    _, float32_scales = packed(FORMATS["w4_float32_scale"], 64, 256)
    assert q4_0.scales.dtype == torch.float16 and float32_scales.scales.dtype == torch.float32
    stored = sum(t.numel() * t.element_size() for t in (q4_0.nibbles, q4_0.scales))
    assert stored / (64 * 256) == 0.5 + 2 / 32  # bytes per weight: GGUF's Q4_0


@pytest.mark.parametrize("level", cpu.available_levels())
def test_every_float16_scale_converts_exactly(level, monkeypatch):
    """Every float16 bit pattern as a block's scale (subnormals, infinities, NaNs included), each kernel converting
    it: the weights are the float32 value of that float16, and a float16 scale computes the bits of its float32 value."""
    monkeypatch.setenv(cpu.LEVEL_ENV, level)
    scales = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(256, 256)
    nibbles = torch.full((256, 256 * 16), 0x99, dtype=torch.uint8)  # every nibble 9: the value 1 of Q4_0's table
    table = torch.arange(16, dtype=torch.float32) - 8
    weights = cpu_kernel.dequantize(nibbles, scales, table)
    expected = scales.to(torch.float32).repeat_interleave(32, 1)
    assert torch.equal(weights.isnan(), expected.isnan()) and torch.equal(weights.nan_to_num(), expected.nan_to_num())
    x = torch.randn(2, 256 * 32)
    finite = scales.isfinite().all(1)  # rows without an infinity or a NaN
    half = cpu_kernel.linear(x, nibbles[finite], scales[finite], table, None)
    assert torch.equal(half, cpu_kernel.linear(x, nibbles[finite], scales[finite].float(), table, None))


def test_a_saved_q4_0_graph_loads_with_its_float16_scales(tmp_path):
    from mase_lite.passes.replay import load_graph

    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    model, x = make(), torch.randn(3, 64)
    mg = ml.MaseGraph(model, example_inputs={"input": x})
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": FORMATS["q4_0"], "storage": "packed",
                                                                       "activations": "int8"}}})
    mg.save(tmp_path / "q4_0")
    loaded = load_graph(tmp_path / "q4_0", model=make())
    layers = [m for m in loaded.model.modules() if isinstance(m, Packed4Linear)]
    assert [(m.scales.dtype, m.activations) for m in layers] == [(torch.float16, "int8")] * 2
    with torch.no_grad():
        assert torch.equal(loaded.model(x), mg.model(x))
