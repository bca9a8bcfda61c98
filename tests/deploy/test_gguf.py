"""GGUF export, read back with llama.cpp's own Python library (gguf): every quantized weight dequantizes to the
tool's values bit for bit (Llama's query and key rows permuted as llama.cpp's converter permutes them), float
tensors are the model's, the metadata and vocabulary are llama.cpp's keys, and refusals name the layer."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config,
                          Qwen3ForCausalLM)

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export
from mase_lite.importers import hub
from mase_lite.workloads.tokenizer import train_wordpiece

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

FORMATS = {
    "Q8_0": [{"name": "mxint", "element_width": 8},
             {"name": "scaled_integer", "width": 8, "granularity": "group", "group_size": 32, "scale_dtype": "float16",
              "full_range": True}],
    "Q4_0": [{"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "scale_dtype": "float16"},
             {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "scale_dtype": "float16",
              "full_range": True},
             {"name": "mxint", "element_width": 4}],
    "MXFP4": [{"name": "mxfp", "element_format": "e2m1"}],
}
CASES = [(qtype, fmt) for qtype, fmts in FORMATS.items() for fmt in fmts]


def decoder(kind: str, tied: bool = False):
    torch.manual_seed(0)
    if kind == "llama":
        config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                             tie_word_embeddings=tied)
        return LlamaForCausalLM(config).eval()
    config = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=32, tie_word_embeddings=tied)
    return Qwen3ForCausalLM(config).eval()


class Quantized:
    """A decoder quantized in module mode (export reads modules only: no capture needed), as ``mg.model``."""

    def __init__(self, kind: str, rules: dict, tied: bool = False):
        self.model, _ = ml.passes.quantize(decoder(kind, tied), {"by": "type", "rules": rules})


def quantized(kind: str, rules: dict, tied: bool = False):
    return Quantized(kind, rules, tied)


def llama_cpp_rows(name: str, weight: torch.Tensor, kind: str, heads: int) -> np.ndarray:
    """llama.cpp's converter's rotary permutation of Llama's query and key rows, written out by hand."""
    w = weight.numpy()
    if kind != "llama" or not name.endswith(("q_proj", "k_proj")):
        return w
    heads = 2 if name.endswith("k_proj") else heads
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("qtype, fmt", CASES, ids=[f"{q}-{f['name']}-{i}" for i, (q, f) in enumerate(CASES)])
def test_every_weight_dequantizes_to_the_tools_values(kind, qtype, fmt, tmp_path):
    mg = quantized(kind, {"head": None, "linear": {"weight": fmt}})
    info = export(mg.model, "gguf", tmp_path / "m.gguf")
    assert info["types"] == {"F32": 2, qtype: 14} and info["architecture"] == kind
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    tensors = {t.name: t for t in reader.tensors}
    for block in range(2):
        for hf_name, gguf_name in GGUF_NAMES.items():
            tensor = tensors[f"blk.{block}.{gguf_name}.weight"]
            assert tensor.tensor_type.name == qtype
            layer = mg.model.get_submodule(f"model.layers.{block}.{hf_name}")
            ours = llama_cpp_rows(hf_name, layer.weight_quantizer(layer.weight).detach(), kind, 4)
            assert np.array_equal(dequantize(tensor.data, tensor.tensor_type), ours)
    assert np.array_equal(tensors["token_embd.weight"].data, mg.model.get_submodule("model.embed_tokens").weight.detach().numpy())
    assert np.array_equal(tensors["output.weight"].data, mg.model.get_submodule("lm_head").weight.detach().numpy())
    blocks = {"Q8_0": 34, "Q4_0": 18, "MXFP4": 17}[qtype]
    assert tensors["blk.0.ffn_down.weight"].n_bytes == 64 * (128 // 32) * blocks


def field(reader, key):
    return reader.fields[key].contents()


def test_metadata_and_the_runs_wordpiece_vocabulary(tmp_path):
    tokenizer = train_wordpiece(["the cat sat on the mat", "a dog ran far"], vocab_size=90)
    mg = quantized("llama", {"head": None, "linear": {"weight": {"name": "mxint", "element_width": 8}}})
    export(mg.model, "gguf", tmp_path / "m.gguf", tokenizer=tokenizer)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "llama.block_count") == 2 and field(reader, "llama.attention.head_count_kv") == 2
    assert field(reader, "llama.rope.dimension_count") == 16 and field(reader, "general.file_type") == 7
    assert field(reader, "tokenizer.ggml.model") == "bert"
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab = tokenizer.get_vocab()
    assert len(tokens) == 96 and tokens[vocab["[CLS]"]] == "[CLS]" and tokens[vocab["cat"]] == "\u2581cat"
    assert tokens[vocab["##t"]] == "t" and tokens[95] == "[PAD95]"
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[vocab["[SEP]"]] == gguf.TokenType.CONTROL and types[95] == gguf.TokenType.UNUSED
    assert field(reader, "tokenizer.ggml.eos_token_id") == vocab["[SEP]"]


def test_a_byte_level_bpe_vocabulary_keeps_its_merges(tmp_path):
    vocab = {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("Ġ", "ab")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="ab")
    mg = quantized("qwen3", {"head": None, "linear": {"weight": {"name": "mxint", "element_width": 8}}})
    export(mg.model, "gguf", tmp_path / "m.gguf", tokenizer=tokenizer)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.merges") == ["a b", "Ġ ab"]
    assert field(reader, "tokenizer.ggml.tokens")[:5] == ["a", "b", "ab", "Ġ", "Ġab"]


def test_a_quantized_tied_head_gets_its_own_output_tensor(tmp_path):
    mg = quantized("qwen3", {"linear": {"weight": {"name": "mxint", "element_width": 8}}}, tied=True)
    export(mg.model, "gguf", tmp_path / "m.gguf")
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    head = mg.model.get_submodule("lm_head")
    assert tensors["output.weight"].tensor_type.name == "Q8_0"
    assert np.array_equal(dequantize(tensors["output.weight"].data, tensors["output.weight"].tensor_type),
                          head.weight_quantizer(head.weight).detach().numpy())
    assert tensors["token_embd.weight"].tensor_type.name == "F32"


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_float_tied_head_is_written_once_and_imports_tied(tmp_path, kind):
    rules = {"head": None, "linear": {"weight": {"name": "mxint", "element_width": 8}}}
    tied, untied = quantized(kind, rules, tied=True), quantized(kind, rules, tied=False)
    export(tied.model, "gguf", tmp_path / "tied.gguf")
    export(untied.model, "gguf", tmp_path / "untied.gguf")
    names = {t.name for t in gguf.GGUFReader(tmp_path / "tied.gguf").tensors}
    assert "output.weight" not in names and "token_embd.weight" in names
    saved = (tmp_path / "untied.gguf").stat().st_size - (tmp_path / "tied.gguf").stat().st_size
    assert 96 * 64 * 4 <= saved < 96 * 64 * 4 + 128  # the float32 head (vocabulary x hidden) and its entry, once less
    model = hub.read_model(tmp_path / "tied.gguf", AutoModelForCausalLM)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.get_input_embeddings().weight
    ids = torch.randint(0, 96, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tied.model(ids).logits)


@pytest.mark.parametrize("rules, message", [
    ({"linear": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}}},
     r"gguf cannot hold layer 'model.layers.0.self_attn.q_proj': the scale [\d.e-]+ of block \d+ of row \d+ is not a "
     r"float16 value; nearest gguf scheme: scale_dtype float16"),
    ({"linear": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 64,
                            "scale_dtype": "float16"}}},
     r"weight format scaled_integer \(.*group_size=64.*\); nearest gguf scheme: Q8_0"),
    ({"linear": {"weight": {"name": "mxint", "element_width": 8}, "data_in": {"name": "mxint", "element_width": 8}}},
     r"quantized activations \(llama.cpp quantizes them its own way\)"),
])
def test_refusals_name_the_layer_and_write_nothing(rules, message, tmp_path):
    mg = quantized("llama", {"head": None, **rules})
    with pytest.raises(UserError, match=message):
        export(mg.model, "gguf", tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_a_model_llama_cpp_has_no_architecture_for_is_refused(tiny_bert, tmp_path):
    with pytest.raises(UserError, match="gguf writes decoder LMs of model type llama, mistral, qwen2, qwen3; this model is bert"):
        export(tiny_bert, "gguf", tmp_path / "m.gguf")


GGML_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "IQ4_NL": 18}


@pytest.mark.parametrize("qtype", list(GGML_BYTES))
def test_ggml_block_formats_export_as_their_type_and_import_as_themselves(qtype, tmp_path):
    """A K-quant or IQ4_NL layer is written as its own GGML type, gguf's dequantizer gives the tool's values bit for
    bit (Llama's query and key rows in llama.cpp's order), and the import holds the same format and bytes."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    fmt = {"name": qtype.lower()}
    model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"head": None, "linear": {"weight": fmt}}})
    info = export(model, "gguf", tmp_path / "m.gguf")
    assert info["types"] == {"F32": 2, qtype: 7}
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    for hf_name, gguf_name in GGUF_NAMES.items():
        tensor = tensors[f"blk.0.{gguf_name}.weight"]
        layer = model.get_submodule(f"model.layers.0.{hf_name}")
        assert tensor.tensor_type.name == qtype and tensor.n_bytes == layer.out_features * layer.in_features // (
            32 if qtype == "IQ4_NL" else 256) * GGML_BYTES[qtype]
        ours = llama_cpp_rows(hf_name, layer.weight_quantizer(layer.weight).detach(), "llama", 4)
        assert np.array_equal(dequantize(tensor.data, tensor.tensor_type), ours)
    back = hub.read_model(tmp_path / "m.gguf", AutoModelForCausalLM)
    layer = back.get_submodule("model.layers.0.mlp.down_proj")
    assert layer.weight_quantizer.spec.as_dict()["name"] == fmt["name"]
    export(back, "gguf", tmp_path / "again.gguf")
    again = {t.name: t for t in gguf.GGUFReader(tmp_path / "again.gguf").tensors}
    for name, tensor in tensors.items():
        assert np.array_equal(np.asarray(again[name].data), np.asarray(tensor.data)), name


@pytest.mark.parametrize("fmt", [
    {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "scale_dtype": "float16",
     "full_range": True},
    {"name": "mxint", "element_width": 4}, {"name": "mxfp", "element_format": "e2m1"}])
def test_a_packed_model_exports_as_its_fake_quantized_twin(fmt, tmp_path):
    fake = quantized("llama", {"head": None, "linear": {"weight": fmt}}).model
    packed = quantized("llama", {"head": None, "linear": {"weight": fmt, "storage": "packed"}}).model
    assert type(packed.get_submodule("model.layers.0.mlp.down_proj")).__name__ == "Packed4Linear"
    export(fake, "gguf", tmp_path / "fake.gguf")
    export(packed, "gguf", tmp_path / "packed.gguf")
    ours = {t.name: (t.tensor_type.name, np.asarray(t.data)) for t in gguf.GGUFReader(tmp_path / "packed.gguf").tensors}
    twin = {t.name: (t.tensor_type.name, np.asarray(t.data)) for t in gguf.GGUFReader(tmp_path / "fake.gguf").tensors}
    assert ours.keys() == twin.keys()
    assert all(ours[k][0] == twin[k][0] and np.array_equal(ours[k][1], twin[k][1]) for k in ours)


def test_the_source_tokenizer_metadata_survives_an_import_and_an_export(tmp_path):
    """llama.cpp picks its pre-tokenizer by tokenizer.ggml.pre: an import -> export round trip (through a saved
    tokenizer too) writes it, the BOS/EOS settings and the chat template back unchanged."""
    from transformers import AutoTokenizer

    from tests.deploy.gguf_forge import BOOL, STRING, parse

    vocab = {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("Ġ", "ab")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    mg = quantized("qwen3", {"head": None, "linear": {"weight": {"name": "mxint", "element_width": 8}}})
    export(mg.model, "gguf", tmp_path / "made.gguf", tokenizer=PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="ab"))
    parts = parse(tmp_path / "made.gguf")
    parts.set("tokenizer.ggml.pre", STRING, "smollm")
    parts.set("tokenizer.ggml.add_bos_token", BOOL, True)
    parts.set("tokenizer.chat_template", STRING, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    source = parts.write(tmp_path / "source.gguf")
    tokenizer = hub.read_tokenizer(source)
    tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    export(hub.read_model(source, AutoModelForCausalLM), "gguf", tmp_path / "again.gguf", tokenizer=tokenizer)
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(tmp_path / "again.gguf")
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                "tokenizer.chat_template", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"):
        assert field(after, key) == field(before, key), key
    assert field(after, "tokenizer.ggml.pre") == "smollm"


def test_a_row_that_blocks_of_32_do_not_tile_is_refused_saying_so(tmp_path):
    """A 344-wide down_proj in Q4_0's groups of 32 ends in a short block, which GGUF cannot hold: the refusal says
    so, where it named only the format."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=344, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    fmt = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "full_range": True,
           "scale_dtype": "float16"}
    model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"head": None, "linear": {"weight": fmt}}})
    with pytest.raises(UserError, match=r"gguf cannot hold layer 'model.layers.0.mlp.down_proj': groups of 32 over 344 "
                       r"columns \(a short last group\); nearest gguf scheme: leave this layer float \(a null rule for it\)"):
        export(model, "gguf", tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("name", "file_type"), [("q4_1", gguf.LlamaFileType.MOSTLY_Q4_1),
                                                 ("q5_0", gguf.LlamaFileType.MOSTLY_Q5_0),
                                                 ("q4_k", gguf.LlamaFileType.MOSTLY_Q4_K_M),
                                                 ("q8_0", gguf.LlamaFileType.MOSTLY_Q8_0)])
def test_the_file_type_is_llama_cpps_name_of_the_most_common_type(name, file_type, tmp_path):
    """Every GGML type the tool writes names llama.cpp's file type (MOSTLY_<type>, a K-quant's _M mix)."""
    wide = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    model, _ = ml.passes.quantize(wide, {"by": "type", "rules": {"head": None, "linear": {"weight": {"name": name}}}})
    export(model, "gguf", tmp_path / "m.gguf")
    assert field(gguf.GGUFReader(tmp_path / "m.gguf"), "general.file_type") == file_type
