"""GGML's K-quants Q2_K .. Q6_K held packed (``KQuantLinear``) and multiplied with int8 activations (``kquant_dot.h``):
the records hold GGUF's values at the format's bits, the kernel computes its documented integers and float32
operations exactly (checked against a transcription of them here), the same bits at every vector level, thread count
and batch, and the layer fits the quantize pass, the exports and the native decoding step."""

import copy
from fractions import Fraction

import numpy as np
import pytest
import torch
import transformers

import mase_lite as ml
from mase_lite.infra.errors import UserError
from mase_lite.kernels import cpu, kquants
from mase_lite.kernels.int8_activations.cpu_kernel import linear_kquants_many, quantize_activations
from mase_lite.kernels.kquants import KQuantLinear
from mase_lite.kernels.kquants.module import reference_int8
from mase_lite.kernels.kquants.records import from_records, to_records
from mase_lite.layers.presets import mixed_types
from mase_lite.layers.quantized import quantize_module
from mase_lite.numerics.ggml import ggml_quantize, ggml_values, to_ggml_blocks
from tests.kernels.levels import assert_same_bits_everywhere, bits32
from tests.kernels.native_decoding import assert_decodes_natively

native = pytest.mark.skipif(not cpu.available_levels(), reason="no C compiler: the kernels are not built")
KINDS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")


def packed(kind, rows=8, columns=512, seed=0, bias=True):
    torch.manual_seed(seed)
    return KQuantLinear.from_linear(torch.nn.Linear(columns, rows, bias=bias), {"name": kind}, activations="int8")


# ------------------------------------------------------------------ records


@pytest.mark.parametrize("kind,bits", [("q2_k", 2.625), ("q3_k", 3.5625), ("q4_k", 4.625), ("q5_k", 5.625),
                                       ("q6_k", 6.5625)])
def test_records_hold_the_codes_and_side_at_the_formats_bits(kind, bits):
    w = torch.randn(5, 768) * torch.logspace(-3, 2, 768)  # sub-blocks of very different ranges
    codes, side = ggml_quantize(w, kind)
    data = to_records(kind, codes, side)
    assert data.dtype == torch.uint8 and data.numel() * 8 / w.numel() == bits
    back, back_side = from_records(kind, data)
    assert torch.equal(back, codes) and back_side.keys() == side.keys()
    assert all(torch.equal(back_side[k], side[k]) for k in side)


def test_q4_k_record_layout_by_hand():
    codes, side = ggml_quantize(torch.randn(1, 256), "q4_k")
    codes[0, 32 + 5], codes[0, 64 + 20] = 9, 14  # block 1's code 5, block 2's code 20
    record, gguf = to_records("q4_k", codes, side)[0], torch.from_numpy(to_ggml_blocks("q4_k", codes, side)).flatten()
    assert record.shape == (148,) and gguf.shape == (144,)
    assert torch.equal(record[:4], gguf[:4])  # d, dmin as GGUF stores them
    assert record[4:12].tolist() == side["scales"][0].tolist() and record[12:20].tolist() == side["mins"][0].tolist()
    assert record[20 + 32 * 1 + 4 * 1 + 1] & 15 == 9  # byte-vector 1 (codes 4..7), lane 1, byte 1: low nibbles
    assert record[20 + 32 * 1 + 4 * 2 + 0] >> 4 == 14  # byte-vector 5 (codes 20..23), lane 2: vector 1's high nibbles


def test_q5_k_record_layout_by_hand():
    codes = torch.zeros(1, 256, dtype=torch.int64)
    codes[0, 0], codes[0, 1], codes[0, 4], codes[0, 32 + 20] = 16, 31, 17, 19  # fifth bits set; block 1's code 20
    side = {"d": torch.tensor([[1.0]], dtype=torch.float16), "dmin": torch.tensor([[2.0]], dtype=torch.float16),
            "scales": torch.arange(8, dtype=torch.uint8)[None], "mins": torch.arange(8, 16, dtype=torch.uint8)[None]}
    record, gguf = to_records("q5_k", codes, side)[0], torch.from_numpy(to_ggml_blocks("q5_k", codes, side)).flatten()
    assert record.shape == (180,) and gguf.shape == (176,) and torch.equal(record[:4], gguf[:4])
    assert record[:148].tolist() == to_records("q4_k", codes & 15, side)[0].tolist()  # Q4_K's record of the low bits
    assert record[148] == 0b11  # lane 0, byte 0: code 0 (byte-vector 0, bit 0) and code 4 (byte-vector 1, bit 1)
    assert record[149] == 0b01  # code 1: byte-vector 0, lane 0, byte 1
    assert record[148 + 4] == 1 << 5  # block 1's code 20: byte-vector 5, lane 1, byte 0
    assert int(record[148:].count_nonzero()) == 3


def test_q3_k_and_q2_k_record_layouts_by_hand():
    codes = torch.zeros(1, 256, dtype=torch.int64)
    codes[0, 0], codes[0, 4], codes[0, 8], codes[0, 32 + 17] = 7, 5, 3, 6  # byte-vectors 0, 1, 2; block 1's code 17
    scales = torch.arange(-8, 8, dtype=torch.int8)[None]
    r = to_records("q3_k", codes, {"d": torch.tensor([[1.0]], dtype=torch.float16), "scales": scales})[0]
    assert r.shape == (114,) and r[:2].tolist() == [0x00, 0x3C]
    assert r[2:18].view(torch.int8).tolist() == list(range(-8, 8, 2)) + list(range(-7, 8, 2))  # as Q6_K's
    assert r[18] == (3 | 3 << 2) and r[18 + 32] == 1  # low 2 bits: byte-vectors 0 and 2 in vector 0, 1 in vector 1
    assert r[82] == 0b011  # third bits: codes 0 (7) and 4 (5), not 8 (3)
    assert r[18 + 4 * 1 + 1] == 2 << 4 and r[82 + 4 * 1 + 1] == 1 << 4  # code 17: byte-vector 4, lane 1, byte 1
    side = {"d": torch.tensor([[1.0]], dtype=torch.float16), "dmin": torch.tensor([[0.5]], dtype=torch.float16),
            "scales": torch.arange(16, dtype=torch.uint8)[None],
            "mins": torch.arange(15, -1, -1, dtype=torch.uint8)[None]}
    r = to_records("q2_k", codes & 3, side)[0]
    gguf = torch.from_numpy(to_ggml_blocks("q2_k", codes & 3, side)).flatten()
    assert r.shape == gguf.shape == (84,)  # GGUF's own size
    assert r[:4].tolist() == gguf[80:84].tolist()  # d, dmin (GGUF puts them last)
    assert r[4:8].tolist() == [0 | 15 << 4, 2 | 13 << 4, 4 | 11 << 4, 6 | 9 << 4]  # first halves: scale low, min high
    assert r[12] == 1 | 14 << 4  # block 0's second half
    assert r[20] == (3 | 3 << 2) and r[20 + 4 + 1] == 2 << 4  # codes 0, 8 (byte-vectors 0, 2); block 1's code 17


def test_q6_k_record_layout_by_hand():
    codes = torch.zeros(1, 256, dtype=torch.int64)
    codes[0, 0], codes[0, 16], codes[0, 8], codes[0, 24], codes[0, 32] = 0x3F, 0x21, 0x10, 0x20, 0x35
    side = {"d": torch.tensor([[1.0]], dtype=torch.float16), "scales": torch.arange(-8, 8, dtype=torch.int8)[None]}
    r = to_records("q6_k", codes, side)[0]
    assert r[:2].tolist() == [0x00, 0x3C]  # float16 1.0, little-endian
    assert r[2:18].view(torch.int8).tolist() == list(range(-8, 8, 2)) + list(range(-7, 8, 2))  # first halves, second
    assert r[18] == 0x1F  # block 0's code 0 (byte-vector 0) low nibble F; its code 16 (byte-vector 4) low nibble 1
    assert r[18 + 64] == 0x00  # codes 8 and 24: byte-vectors 2 and 6, low nibbles 0
    assert r[146] == (3 | 1 << 2 | 2 << 4 | 2 << 6)  # high crumbs of byte-vectors 0, 2, 4, 6 (codes 0, 8, 16, 24)
    assert r[18 + 4] == 0x05 and r[146 + 4] == 3  # block 1's code 0: lane 1


def test_a_packed_layer_is_its_fake_quantized_weight_bit_for_bit():
    linear = torch.nn.Linear(512, 24)
    for kind in KINDS:
        fake = quantize_module(linear, {"weight": {"name": kind}})
        layer = KQuantLinear.from_quantized(fake)
        assert torch.equal(bits32(layer.dequantized_weight()), bits32(fake._operand("weight", fake.weight)))
        x = torch.randn(3, 512)
        with torch.no_grad():  # float activations: the fake layer's own product
            assert torch.equal(layer(x), fake(x))
        encoded = layer.encoded()
        assert np.array_equal(to_ggml_blocks(kind, encoded.unpacked(), encoded.side),
                              to_ggml_blocks(kind, *ggml_quantize(linear.weight.detach(), kind)))


def test_bad_layers_are_refused_naming_the_limit():
    with pytest.raises(UserError, match="multiple of 256"):
        KQuantLinear.from_linear(torch.nn.Linear(288, 4), {"name": "q4_k"})
    with pytest.raises(UserError, match="takes q2_k, q3_k, q4_k, q5_k or q6_k over .* \\{'name': 'q4_0'\\}"):
        KQuantLinear.from_linear(torch.nn.Linear(256, 4), {"name": "q4_0"})
    with pytest.raises(UserError, match="activations must be one of float, int8"):
        KQuantLinear(256, 4, {"name": "q4_k"}, activations="int4")
    with pytest.raises(UserError, match="'Q4_K_M' is not a K-quant that packs; allowed: q2_k, q3_k, q4_k, q5_k, q6_k"):
        kquants.pack_linears(torch.nn.Sequential(torch.nn.Linear(256, 4)), "Q4_K_M")
    with pytest.raises(UserError, match=r"\{'0': 'q4_0'\} are not K-quants that pack"):
        kquants.pack_linears(torch.nn.Sequential(torch.nn.Linear(256, 4)), {"0": "q4_0"})


# ------------------------------------------------------------------ the kernel's arithmetic, transcribed


def _f32(value: Fraction) -> Fraction:
    """``value`` rounded to float32, ties to even (exactly: no double rounding)."""
    guess = np.float32(float(value))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(np.int32)) & 1))
    return Fraction(float(best))


def _fma(a, b, c):
    return _f32(Fraction(a) * Fraction(b) + Fraction(c))


def _mul(a, b):
    return _f32(Fraction(a) * Fraction(b))


def transcribed(kind, layer, x_row):
    """One output as kquant_dot.h documents it: exact integer sums per super-block, then its float32 operations in its
    order."""
    codes, side = layer.codes()
    xq, xs = quantize_activations(x_row[None], 256)
    xq, xs = xq[0].long(), [float(v) for v in xs[0]]
    off = {"q2_k": 0, "q3_k": 4, "q4_k": 0, "q5_k": 0, "q6_k": 32}[kind]
    out = []
    for j in range(codes.shape[0]):
        acc = Fraction(0)
        for s in range(codes.shape[1] // 256):
            total = pairs = 0
            for h in range(16):  # halves of 16: each one's scale, and its pair weight (a min, or the scale)
                u, xh = codes[j, 256 * s + 16 * h:256 * s + 16 * h + 16], xq[256 * s + 16 * h:256 * s + 16 * h + 16]
                if kind in ("q4_k", "q5_k"):  # a scale and a min per block of 32
                    sc = int(side["scales"][j, 8 * s + h // 2])
                    m = int(side["mins"][j, 8 * s + h // 2])
                else:
                    sc = int(side["scales"][j, 16 * s + h])
                    m = int(side["mins"][j, 16 * s + h]) if kind == "q2_k" else sc
                total += sc * int((u * xh).sum())
                pairs += m * int(xh.sum())
            total -= off * pairs
            acc = _fma(total, _mul(xs[s], float(side["d"][j, s])), acc)
            if kind in ("q2_k", "q4_k", "q5_k"):
                acc = _fma(-pairs, _mul(xs[s], float(side["dmin"][j, s])), acc)
        out.append(_f32(acc + Fraction(float(layer.bias.detach()[j]))))
    return torch.tensor([float(v) for v in out], dtype=torch.float32)


@native
@pytest.mark.parametrize("kind", KINDS)
def test_every_output_is_the_documented_arithmetic_exactly(kind, monkeypatch):
    """Every tile of the kernels: 7 rows of W (a prompt's by 4, 2 and 1; a decoding step's by pairs and the one left
    over) against batches of 43, 40, 24, 7 and 1 rows of x: bands of 8 rows, the last of 3 or 7, and AVX-512's pairs
    of bands, two at a time and one, the last with one band or none past m."""
    layer = packed(kind, rows=7, columns=512)
    x = torch.randn(43, 512) * torch.linspace(0.01, 30, 512) * torch.arange(1, 44)[:, None] / 6
    x[:, 40:64] = 0  # an all-zero block of x: scale 0
    expected = torch.stack([transcribed(kind, layer, row) for row in x])
    for level in cpu.available_levels():
        monkeypatch.setenv(cpu.LEVEL_ENV, level)
        with torch.no_grad():
            for rows in (43, 40, 24, 7):
                assert torch.equal(bits32(layer(x[:rows])), bits32(expected[:rows])), (level, rows)
            for i in range(7):
                assert torch.equal(bits32(layer(x[i:i + 1])), bits32(expected[i:i + 1])), (level, i)


@native
def test_hand_derived_q4_k_output():
    """x all ones (codes 127, scale 1/127), d = 1, dmin = 0.5, scales 1..8, mins 0..7, codes e % 16: each sub-block
    gives sc * (sum of 0..15 twice = 240) - 0.5 * m * 32, in all 240 * 36 - 16 * 28 = 8192."""
    codes = (torch.arange(256) % 16)[None]
    side = {"d": torch.tensor([[1.0]], dtype=torch.float16), "dmin": torch.tensor([[0.5]], dtype=torch.float16),
            "scales": torch.arange(1, 9, dtype=torch.uint8)[None], "mins": torch.arange(8, dtype=torch.uint8)[None]}
    layer = KQuantLinear(256, 1, {"name": "q4_k"}, bias=False, activations="int8")
    layer.blocks = to_records("q4_k", codes, side)
    assert float(ggml_values(codes, side, "q4_k").sum()) == 8192.0
    with torch.no_grad():
        assert abs(float(layer(torch.ones(1, 256))) - 8192.0) <= 8192 * 2**-20  # xs * 127 = 1 within float32


@native
@pytest.mark.parametrize("kind", KINDS)
def test_same_bits_at_every_level_thread_count_and_batch(kind, monkeypatch):
    assert_same_bits_everywhere(packed(kind, rows=37, columns=768), 768, monkeypatch)  # rows that split unevenly


@native
@pytest.mark.parametrize("kind", ("q4_k", "q5_k", "q6_k"))
def test_a_prompt_past_a_run_of_bands_has_each_rows_bits_alone(kind):
    layer = packed(kind, rows=6, columns=4096)  # 4096 inputs: a run of bands is 128 rows of x (BAND_X_BYTES)
    x = torch.randn(137, 4096)  # two runs, the last band of one row; rows of W by 4, then 2
    with torch.no_grad():
        together = layer(x)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(137)])
    assert torch.equal(bits32(together), bits32(alone))


@native
@pytest.mark.parametrize("kind", KINDS)
def test_follows_the_reference_for_dtypes_and_ranks(kind):
    layer = packed(kind, rows=11, columns=256)
    for shape in ((256,), (3, 256), (2, 3, 256), (2, 1, 2, 256)):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn(shape).to(dtype)
            with torch.no_grad():
                y = layer(x)
            ref = reference_int8(x, layer.dequantized_weight(), layer.bias)
            assert y.shape == (*shape[:-1], 11) and y.dtype == dtype
            tolerance = 1e-5 if dtype == torch.float32 else 1e-2
            assert torch.allclose(y.float(), ref.float(), rtol=tolerance, atol=tolerance)
    with torch.no_grad():
        assert torch.equal(layer(torch.zeros(2, 256)), layer.bias.detach().expand(2, 11))


@native
def test_k_quant_layers_fused_in_one_call_give_their_own_bits():
    layers = [packed("q4_k", rows=16, seed=1), packed("q6_k", rows=8, seed=2), packed("q5_k", rows=24, seed=3)]
    x = torch.randn(2, 512)
    together = KQuantLinear.fused(layers)
    assert together is not None
    with torch.no_grad():
        outs = together(x)
        assert all(torch.equal(bits32(o), bits32(m(x))) for o, m in zip(outs, layers))
    assert linear_kquants_many(x, [(layers[0].blocks, "q4_k", None)] * 9) is None  # more than 8 layers: the caller's


@native
def test_records_are_paired_in_place_by_the_first_call():
    layers = {kind: packed(kind, rows=4, columns=512) for kind in ("q4_k", "q6_k")}
    rows = {kind: layer.blocks.clone() for kind, layer in layers.items()}
    with torch.no_grad():
        for layer in layers.values():
            layer(torch.randn(1, 512))
    for kind, size in (("q4_k", 148), ("q6_k", 210)):
        r = rows[kind].view(4, 2, size)  # row, super-block, record
        expected = torch.stack([r[0, 0], r[1, 0], r[0, 1], r[1, 1], r[2, 0], r[3, 0], r[2, 1], r[3, 1]])
        assert torch.equal(layers[kind].blocks, expected.view(4, 2 * size))  # pair p: its super-blocks in turn
        assert torch.equal(layers[kind].state_dict()["blocks"], rows[kind])


def test_state_dict_round_trip():
    layer = packed("q6_k", rows=4, columns=256)
    fresh = KQuantLinear(256, 4, {"name": "q6_k"}, activations="int8")
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(2, 256)
    with torch.no_grad():
        assert torch.equal(fresh(x), layer(x))


# ------------------------------------------------------------------ the pass, the exports, the decoding step


def llama(**extra):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_quantize_pass_packs_k_quants():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    packed_model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"linear": {
        "weight": {"name": "q6_k"}, "storage": "packed", "activations": "int8"}}})
    layers = [m for m in packed_model.modules() if isinstance(m, KQuantLinear)]
    assert len(layers) == 2 and {m.fmt["name"] for m in layers} == {"q6_k"}
    with pytest.raises(UserError, match="rules.linear: node '0': a packed K-quant weight takes q2_k, q3_k, q4_k, "
                                        "q5_k or q6_k over inputs a multiple of 256"):
        ml.passes.quantize(torch.nn.Sequential(torch.nn.Linear(288, 4)), {"by": "type", "rules": {"linear": {
            "weight": {"name": "q4_k"}, "storage": "packed"}}})


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q5_K_M"])
def test_gguf_export_of_a_packed_mixture_equals_the_presets(preset, tmp_path):
    from mase_lite.deploy import export

    model = llama()
    fake, _ = ml.passes.quantize(copy.deepcopy(model), {"preset": preset})
    assert kquants.pack_linears(model, mixed_types(model, preset)) == 15
    export(fake, "gguf", tmp_path / "fake.gguf")
    export(model, "gguf", tmp_path / "packed.gguf")
    assert (tmp_path / "fake.gguf").read_bytes() == (tmp_path / "packed.gguf").read_bytes()


@native
@pytest.mark.parametrize("preset,base", [("Q4_K_M", "q4_k"), ("Q5_K_M", "q5_k")])
def test_mixtures_pack_as_llama_quantize_chooses_and_decode_natively(preset, base, monkeypatch):
    model = llama()
    assert kquants.pack_linears(model, mixed_types(model, preset), activations="int8") == 15
    chosen = {n: m.fmt["name"] for n, m in model.named_modules() if isinstance(m, KQuantLinear)}
    assert {n for n, k in chosen.items() if k == "q6_k"} == {"lm_head", "model.layers.1.self_attn.v_proj",
                                                             "model.layers.1.mlp.down_proj"}
    assert set(chosen.values()) == {base, "q6_k"}
    assert_decodes_natively(model, monkeypatch)


def test_a_saved_graph_of_packed_k_quants_loads_as_it_was(tmp_path):
    from mase_lite.passes.replay import load_graph

    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(256, 16), torch.nn.ReLU())
    model, x = make(), torch.randn(3, 256)
    mg = ml.MaseGraph(model, example_inputs={"input": x})
    rule = {"weight": {"name": "q4_k"}, "storage": "packed", "activations": "int8"}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": rule}})
    mg.save(tmp_path / "q4_k")
    loaded = load_graph(tmp_path / "q4_k", model=make())
    layers = [m for m in loaded.model.modules() if isinstance(m, KQuantLinear)]
    assert [(m.fmt["name"], m.activations) for m in layers] == [("q4_k", "int8")]
    with torch.no_grad():
        assert torch.equal(loaded.model(x), mg.model(x))
