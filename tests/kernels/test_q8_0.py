"""GGUF's Q8_0 held packed (``Q8_0Linear``: int8 codes, a float16 ``d`` per block of 32) and multiplied with int8
activations by the codes' kernel of ``int8_linear.c``: GGUF's values at its 8.5 bits, the kernel's documented float32
chain exactly (a transcription here), the same bits at every level, thread count, batch and layout (tiled or in rows),
and the layer fits the quantize pass, the GGUF export and the native decoding step."""

import copy
from fractions import Fraction

import numpy as np
import pytest
import torch
import transformers

import mase_lite as ml
from mase_lite.infra.errors import UserError
from mase_lite.kernels import cpu
from mase_lite.kernels.int8_activations.cpu_kernel import quantize_activations
from mase_lite.kernels.q8_0 import Q8_0Linear, pack_linears
from mase_lite.layers.quantized import quantize_module
from mase_lite.numerics.ggml import ggml_quantize, to_ggml_blocks
from tests.kernels.levels import assert_same_bits_everywhere, bits32
from tests.kernels.native_decoding import assert_decodes_natively

native = pytest.mark.skipif(not cpu.available_levels(), reason="no C compiler: the kernels are not built")


def packed(rows, columns=256, seed=0):
    torch.manual_seed(seed)
    return Q8_0Linear.from_linear(torch.nn.Linear(columns, rows), activations="int8")


def test_holds_ggufs_codes_and_scales_at_its_bits():
    linear = torch.nn.Linear(96, 5)
    layer = Q8_0Linear.from_linear(linear)
    codes, side = ggml_quantize(linear.weight.detach(), "q8_0")
    assert torch.equal(layer.codes.long() + 128, codes) and torch.equal(layer.scales, side["d"])
    stored = sum(b.numel() * b.element_size() for b in (layer.codes, layer.scales))
    assert stored * 8 / linear.weight.numel() == 8.5
    assert np.array_equal(to_ggml_blocks("q8_0", *ggml_quantize(linear.weight.detach(), "q8_0")),
                          to_ggml_blocks("q8_0", layer.encoded().unpacked(), layer.encoded().side))


def test_a_packed_layer_is_its_fake_quantized_weight_bit_for_bit():
    linear = torch.nn.Linear(64, 24)
    fake = quantize_module(linear, {"weight": {"name": "q8_0"}})
    layer = Q8_0Linear.from_quantized(fake)
    assert torch.equal(bits32(layer.dequantized_weight()), bits32(fake._operand("weight", fake.weight)))
    x = torch.randn(3, 64)
    with torch.no_grad():  # float activations: the fake layer's own product
        assert torch.equal(layer(x), fake(x))


def test_bad_layers_are_refused_naming_the_limit():
    with pytest.raises(UserError, match="q8_0 over inputs a multiple of 32.*over 40 inputs"):
        Q8_0Linear.from_linear(torch.nn.Linear(40, 4))
    with pytest.raises(UserError, match="q8_0 over inputs a multiple of 32.*'q4_0'"):
        Q8_0Linear.from_quantized(quantize_module(torch.nn.Linear(64, 4), {"weight": {"name": "q4_0"}}))
    with pytest.raises(UserError, match="activations must be one of float, int8"):
        Q8_0Linear(64, 4, activations="int4")
    with pytest.raises(UserError, match="runs inference only"):
        packed(8)(torch.randn(2, 256, requires_grad=True))


def _f32(value: Fraction) -> Fraction:
    guess = np.float32(float(value))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(np.int32)) & 1))
    return Fraction(float(best))


def transcribed(layer, x_row):
    """Each output as int8_linear.c documents it: per block the exact integer sum, fmaf(sum, xs * d, acc) in order,
    then times the unit (1) and plus the bias, in float32."""
    xq, xs = quantize_activations(x_row[None])
    xq, xs = xq[0].long(), [Fraction(float(v)) for v in xs[0]]
    codes, scales = layer.rows()
    out = []
    for j in range(codes.shape[0]):
        acc = Fraction(0)
        for b in range(codes.shape[1] // 32):
            total = int((codes[j, 32 * b:32 * b + 32].long() * xq[32 * b:32 * b + 32]).sum())
            acc = _f32(total * _f32(xs[b] * Fraction(float(scales[j, b]))) + acc)
        out.append(float(_f32(acc + Fraction(float(layer.bias.detach()[j])))))
    return torch.tensor(out, dtype=torch.float32)


@native
@pytest.mark.parametrize("rows", [16, 13])  # tiled (whole tiles of 8) and in rows
def test_every_output_is_the_documented_arithmetic_exactly(rows, monkeypatch):
    layer = packed(rows)
    x = torch.randn(6, 256) * torch.linspace(0.01, 30, 256)
    x[:, 64:96] = 0  # an all-zero block of x: scale 0
    with torch.no_grad():
        layer.scales[0, 1] = 0.0  # an all-zero block of W
    expected = torch.stack([transcribed(layer, row) for row in x])
    for level in cpu.available_levels():
        monkeypatch.setenv(cpu.LEVEL_ENV, level)
        with torch.no_grad():
            assert torch.equal(bits32(layer(x)), bits32(expected)), level
            assert torch.equal(bits32(layer(x[2:3])), bits32(expected[2:3])), level  # a decoding step


@native
def test_same_bits_at_every_level_thread_count_and_batch(monkeypatch):
    assert_same_bits_everywhere(packed(40, 512), 512, monkeypatch)


@native
def test_follows_the_reference_for_dtypes_and_ranks():
    layer = packed(11, 64)
    for shape in ((64,), (3, 64), (2, 3, 64), (2, 1, 2, 64)):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn(shape).to(dtype)
            with torch.no_grad():
                y = layer(x)
            weight = layer.dequantized_weight().double()
            codes, xs = quantize_activations(x.reshape(-1, 64).float())
            exact = (codes.double().reshape(-1, 2, 32) * xs.double()[..., None]).reshape(-1, 64) @ weight.T
            exact = (exact + layer.bias.double()).reshape(*shape[:-1], 11)
            assert y.shape == (*shape[:-1], 11) and y.dtype == dtype
            tolerance = 1e-5 if dtype == torch.float32 else 1e-2
            assert torch.allclose(y.double(), exact.to(dtype).double(), rtol=tolerance, atol=tolerance)


def test_state_dict_round_trip_of_tiled_weights():
    layer = packed(16)
    x = torch.randn(2, 256)
    with torch.no_grad():
        before = layer(x)  # tiles the codes in place where the kernel runs
    state = layer.state_dict()
    fresh = Q8_0Linear(256, 16, activations="int8")
    fresh.load_state_dict(state)
    assert torch.equal(state["codes"], Q8_0Linear.from_linear(_linear(16), activations="int8").codes)
    with torch.no_grad():
        assert torch.equal(fresh(x), before)


def _linear(rows, columns=256, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(columns, rows)


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_quantize_pass_packs_q8_0_and_its_gguf_export_is_the_fake_layers(tmp_path):
    from mase_lite.deploy import export

    model = llama()
    rule = {"weight": {"name": "q8_0"}}
    fake, _ = ml.passes.quantize(copy.deepcopy(model), {"by": "type", "rules": {"linear": rule}})
    packed_model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"linear": {**rule, "storage": "packed",
                                                                                    "activations": "int8"}}})
    assert sum(isinstance(m, Q8_0Linear) for m in packed_model.modules()) == 15
    export(fake, "gguf", tmp_path / "fake.gguf")
    export(packed_model, "gguf", tmp_path / "packed.gguf")
    assert (tmp_path / "fake.gguf").read_bytes() == (tmp_path / "packed.gguf").read_bytes()


@native
def test_decodes_natively_with_the_same_bits_everywhere(monkeypatch):
    model = llama()
    assert pack_linears(model, activations="int8") == 15
    assert_decodes_natively(model, monkeypatch)
