"""Hostile GGUF files (issue 48): every one is refused in one line naming the file and the field or tensor at fault
(an ``ExportError``, exit 2 from the CLI, no traceback), at once: no count is looped over before it is checked
against the bytes left, no FIFO is opened, no model is built from sizes its tensors contradict or that do not fit
in memory. Valid variants (version 2, other alignments, unknown keys, a million-value array) import with the same
weights. Each file is forged from one small valid export (tests/deploy/gguf_forge.py)."""

import json
import os
import re
import struct
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.deploy import gguf as gguf_io
from mase_lite.deploy import gguf_file
from mase_lite.importers import hub
from mase_lite.deploy.layers import ExportError
from mase_lite.ir.module_model import ModuleModel
from mase_lite.workloads.tokenizer import train_wordpiece

gguf = pytest.importorskip("gguf")
from tests.deploy.gguf_forge import (  # noqa: E402
    ARRAY, BOOL, FLOAT32, INT32, STRING, UINT8, UINT32, UINT64, Array, Parts, Raw, parse,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, Parts, dict[str, torch.Tensor], torch.nn.Module]:
    """A valid Q8_0 Llama GGUF file with a WordPiece vocabulary, its parts, its import's state and the source model."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"head": None, "linear": {"weight": {"name": "mxint"}}}})
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    tokenizer = train_wordpiece(["the cat sat on the mat", "a dog ran"], vocab_size=90)
    gguf_io.write(ModuleModel(model), path, tokenizer=tokenizer)
    return path, parse(path), _state(hub.read_model(path, AutoModelForCausalLM)), model


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}



def refused(path: Path, pattern: str, read=lambda p: hub.read_model(p, AutoModelForCausalLM)) -> str:
    with pytest.raises(ExportError) as caught:
        read(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and re.search(pattern, message), message
    return message


def damaged(parts: Parts, change) -> Parts:
    """A copy of ``parts`` changed in place by ``change``, or the parts it returns."""
    parts = parts.copy()
    out = change(parts)
    return out if isinstance(out, Parts) else parts


def aligned(parts: Parts, alignment: int) -> Parts:
    """``parts`` laid out at ``alignment``, which general.alignment says."""
    parts = parts.relaid(alignment)
    parts.set("general.alignment", UINT32, alignment)
    return parts


def nested(depth: int) -> Raw:
    """``depth`` arrays, each holding the next (about 12 bytes each)."""
    return Raw(struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", UINT8, 0))


def tensor(which: str, **changes):
    """A change of tensor ``which``'s info."""
    def change(parts: Parts) -> None:
        for key, value in changes.items():
            setattr(parts.tensor(which), key, value)
    return change


HEADER = [
    ("magic", lambda p: setattr(p, "magic", b"GGML"), r"magic: the file starts with b'GGML', not b'GGUF'"),
    ("version 1", lambda p: setattr(p, "version", 1), r"GGUF.version: version 1; readable: 2, 3"),
    ("version 2**31", lambda p: setattr(p, "version", 2**31), r"GGUF.version: version 2147483648; readable"),
    ("kv_count 2**60", lambda p: setattr(p, "kv_count", 2**60),
     r"GGUF.kv_count: 1152921504606846976 key-value pairs cannot fit in the \d+ bytes left"),
    ("kv_count 2**64-1", lambda p: setattr(p, "kv_count", 2**64 - 1), r"GGUF.kv_count: 18446744073709551615 key-value"),
    ("tensor_count 2**40", lambda p: setattr(p, "tensor_count", 2**40),
     r"GGUF.tensor_count: 1099511627776 tensors; at most 65536 are read"),
    ("tensor_count 60000", lambda p: setattr(p, "tensor_count", 60000),
     r"GGUF.tensor_count: 60000 tensor infos cannot fit in the \d+ bytes left"),
]
KVS = [
    ("value type 13", lambda p: p.set("x", 13, Raw(b"")), r"'x': value type 13 is unknown"),
    ("array of type 99", lambda p: p.set("x", ARRAY, Array(99, [])), r"'x': an array of value type 99, which is unknown"),
    ("array of 2**60 UINT8", lambda p: p.set("x", ARRAY, Array(UINT8, [], count=2**60)),
     r"'x': an array of 1152921504606846976 UINT8 values cannot fit in the \d+ bytes left"),
    ("array of 2**60 strings", lambda p: p.set("x", ARRAY, Array(STRING, [], count=2**60)),
     r"'x': an array of 1152921504606846976 STRING values cannot fit"),
    ("arrays nested 200000 deep", lambda p: p.set("x", ARRAY, nested(200_000)),
     r"'x'\[0\]\[0\]\[0\]\[0\]: arrays nested more than 4 deep"),
    ("string past the end", lambda p: p.set("general.name", STRING, Raw(struct.pack("<Q", 2**40) + b"ab")),
     r"'general.name': a string of 1099511627776 bytes cannot fit"),
    ("key not UTF-8", lambda p: p.set(b"\xff\xfe", UINT32, 1), r"key 0: a string that is not UTF-8"),
    ("value not UTF-8", lambda p: p.set("general.name", STRING, b"\xc3\x28"), r"'general.name': a string that is not UTF-8"),
    ("token not UTF-8", lambda p: p.kv("tokenizer.ggml.tokens").value.items.__setitem__(5, b"\xc3\x28"),
     r"'tokenizer.ggml.tokens'\[5\]: a string that is not UTF-8"),
    ("BOOL 2", lambda p: p.set("x", BOOL, 2), r"'x': a BOOL of byte value 2; give 0 or 1"),
    ("BOOL array", lambda p: p.set("x", ARRAY, Array(BOOL, [0, 1, 7])), r"'x': a BOOL of byte value 7"),
    ("duplicate key", lambda p: p.kvs.append(p.kv("llama.block_count")), r"'llama.block_count': a duplicate key"),
    ("empty key", lambda p: p.set("", UINT32, 1), r"key 0: an empty key"),
    ("alignment 0", lambda p: p.set("general.alignment", UINT32, 0),
     r"general.alignment: UINT32 0; give a UINT32 power of two"),
    ("alignment 48", lambda p: p.set("general.alignment", UINT32, 48), r"general.alignment: UINT32 48"),
    ("alignment a string", lambda p: p.set("general.alignment", STRING, "32"), r"general.alignment: STRING '32'"),
]
TENSOR_INFOS = [
    ("name not UTF-8", tensor("output_norm.weight", name=b"\xff"), r"tensor info \d+: a string that is not UTF-8"),
    ("name of 65 bytes", tensor("output_norm.weight", name="x" * 65), r"tensor info \d+: a name of 65 bytes; give 1 to 64"),
    ("empty name", tensor("output_norm.weight", name=""), r"tensor info \d+: a name of 0 bytes"),
    ("0 dimensions", tensor("output_norm.weight", dims=[]), r"tensor 'output_norm.weight': 0 dimensions; give 1 to 4"),
    ("5 dimensions", tensor("output_norm.weight", dims=[64, 1, 1, 1, 1]), r"'output_norm.weight': 5 dimensions"),
    ("a dimension 0", tensor("token_embd.weight", dims=[64, 0]),
     r"tensor 'token_embd.weight': dimensions \[64, 0\]; give positive ones whose product fits in 63 bits"),
    ("negative dimension", tensor("token_embd.weight", dims=[64, 2**64 - 1]), r"dimensions \[64, 18446744073709551615\]"),
    ("dimensions overflow", tensor("token_embd.weight", dims=[2**32, 2**32]), r"whose product fits in 63 bits"),
    ("GGML type 99", tensor("output_norm.weight", type=99), r"'output_norm.weight': GGML type 99 is unknown; known: "),
    ("rows not whole blocks", tensor("blk.0.attn_q.weight", dims=[48, 64]),
     r"'blk.0.attn_q.weight': a row of 48 Q8_0 values is not a whole number of blocks of 32"),
    ("unaligned offset", lambda p: setattr(p.tensors[-1], "offset", p.tensors[-1].offset + 1),
     r"offset \d+ is not a multiple of the alignment 32"),
    ("offset past the end", lambda p: setattr(p.tensors[-1], "offset", 2**40),
     r"its \d+ bytes at offset 1099511627776 of the data section \(byte \d+\) end past the file's \d+ bytes"),
    ("offset 2**64-32", lambda p: setattr(p.tensors[-1], "offset", 2**64 - 32), r"end past the file's"),
    ("overlapping tensors", lambda p: setattr(p.tensor("output_norm.weight"), "offset",
                                              p.tensor("blk.0.ffn_norm.weight").offset),
     r"tensor '(output_norm|blk.0.ffn_norm).weight': its bytes overlap those of tensor"),
    ("duplicate tensor name", tensor("output_norm.weight", name="blk.0.ffn_norm.weight"),
     r"tensor 'blk.0.ffn_norm.weight': a duplicate tensor name"),
]
METADATA = [
    ("architecture an array", lambda p: p.set("general.architecture", ARRAY, Array(STRING, ["llama"])),
     r"general.architecture = \['llama'\] has no reader here; readable: llama, qwen2, qwen3"),
    ("architecture unknown", lambda p: p.set("general.architecture", STRING, "gpt99"), r"'gpt99' has no reader here"),
    ("head_count 0", lambda p: p.set("llama.attention.head_count", UINT32, 0),
     r": llama.attention.head_count = 0: give an integer from 1 to 64$"),
    ("embedding_length negative", lambda p: p.set("llama.embedding_length", INT32, -64),
     r"llama.embedding_length = -64: give an integer from 1 to 2147483647"),
    ("embedding_length a float", lambda p: p.set("llama.embedding_length", FLOAT32, 64.0), r"llama.embedding_length = 64.0"),
    ("embedding_length 65536", lambda p: p.set("llama.embedding_length", UINT32, 65536),
     r"llama.embedding_length makes tensor 'token_embd.weight' 65536 wide in dimension 0; the file's is \[64, 96\]"),
    ("head_count_kv 3", lambda p: p.set("llama.attention.head_count_kv", UINT32, 3),
     r"llama.attention.head_count_kv = 3 does not divide llama.attention.head_count = 4"),
    ("head_count 3", lambda p: (p.set("llama.attention.head_count", UINT32, 3),
                                p.set("llama.attention.head_count_kv", UINT32, 1), p.drop("llama.attention.key_length")),
     r"llama.attention.head_count = 3 does not divide llama.embedding_length = 64"),
    ("key_length odd", lambda p: p.set("llama.attention.key_length", UINT32, 15), r"key_length = 15: .* give an even head"),
    ("block_count 1e5", lambda p: p.set("llama.block_count", UINT32, 100_000),
     r"llama.block_count = 100000, but the file's tensors are of blocks \[0\]"),
    ("block_count 2**32-1", lambda p: p.set("llama.block_count", UINT32, 2**32 - 1),
     r"llama.block_count = 4294967295: give an integer from 1 to 2147483647"),
    ("vocab_size 1e9", lambda p: p.set("llama.vocab_size", UINT32, 10**9),
     r"llama.vocab_size = 1000000000, but tokenizer.ggml.tokens holds 96 tokens"),
    ("vocab_size 1e9 without tokens", lambda p: (p.set("llama.vocab_size", UINT32, 10**9), p.drop("tokenizer.ggml.tokens")),
     r"llama.vocab_size makes tensor 'token_embd.weight' 1000000000 wide in dimension 1"),
    ("feed_forward_length 1e6", lambda p: p.set("llama.feed_forward_length", UINT32, 10**6),
     r"llama.feed_forward_length makes tensor 'blk.0.ffn_up.weight' 1000000 wide in dimension 1"),
    ("context_length 2**40", lambda p: p.set("llama.context_length", UINT64, 2**40),
     r"llama.context_length = 1099511627776: give an integer from 1 to 16777216"),
    ("rms eps NaN", lambda p: p.set("llama.attention.layer_norm_rms_epsilon", FLOAT32, float("nan")),
     r"llama.attention.layer_norm_rms_epsilon = nan: give a number above 0 and below 1"),
    ("rope base inf", lambda p: p.set("llama.rope.freq_base", FLOAT32, float("inf")), r"llama.rope.freq_base = inf"),
    ("tokens not strings", lambda p: p.set("tokenizer.ggml.tokens", ARRAY, Array(UINT32, list(range(96)))),
     r"tokenizer.ggml.tokens = \[0, 1, 2, .*: give an array of strings"),
    ("a tensor missing", lambda p: p.tensors.remove(p.tensor("blk.0.ffn_down.weight")),
     r"tensor 'blk.0.ffn_down.weight' \(the model's model.layers.0.mlp.down_proj.weight\) is missing"),
    ("token_embd missing", lambda p: p.tensors.remove(p.tensor("token_embd.weight")),
     r"tensor 'token_embd.weight' is missing"),
    ("a shape not the model's", tensor("blk.0.ffn_down.weight", dims=[64, 128]),
     r"tensor 'blk.0.ffn_down.weight' is \[128, 64\], the model's model.layers.0.mlp.down_proj.weight \[64, 128\]"),
    ("an unknown tensor", tensor("output_norm.weight", name="blk.0.evil.weight"),
     r"tensor 'blk.0.evil.weight' has no place"),
    ("an I32 tensor", tensor("output_norm.weight", type=26),
     r"tensor 'output_norm.weight' is I32, which has no dequantizer"),
]
CASES = HEADER + KVS + TENSOR_INFOS + METADATA


@pytest.mark.parametrize("change, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_hostile_file_is_refused_naming_the_field(change, pattern, base, tmp_path, hang_guard):
    started = time.perf_counter()
    refused(damaged(base[1], change).write(tmp_path / "x.gguf"), pattern)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("cut, pattern", [(0, r"header: the file has 0 bytes, a GGUF header 24"),
                                          (10, r"header: the file has 10 bytes"),
                                          (300, r"is not a readable GGUF file: "),
                                          (-100, r"end past the file's \d+ bytes")])
def test_a_truncated_file_is_refused(cut, pattern, base, tmp_path):
    data = base[0].read_bytes()
    (tmp_path / "x.gguf").write_bytes(data[:cut] if cut >= 0 else data[:cut])
    refused(tmp_path / "x.gguf", pattern)


def test_a_fifo_or_a_link_to_one_is_never_opened(tmp_path, hang_guard):
    os.mkfifo(tmp_path / "x.gguf")
    (tmp_path / "link.gguf").symlink_to(tmp_path / "x.gguf")
    for path in (tmp_path / "x.gguf", tmp_path / "link.gguf"):
        assert hub.kind_of(path) == "gguf"
        refused(path, r"is a FIFO; a GGUF model is read from a regular file")
        refused(path, r"is a FIFO", hub.read_tokenizer)
    (tmp_path / "dir.gguf").mkdir()
    assert hub.kind_of(tmp_path / "dir.gguf") is None


def gpt2(parts: Parts) -> None:
    parts.set("tokenizer.ggml.model", STRING, "gpt2")


@pytest.mark.parametrize("change, pattern", [
    (lambda p: p.set("tokenizer.ggml.unknown_token_id", UINT32, 1000),
     r"tokenizer.ggml.unknown_token_id = 1000: give a token id below 96"),
    (lambda p: p.set("tokenizer.ggml.eos_token_id", STRING, "x"), r"tokenizer.ggml.eos_token_id = 'x': give a token id"),
    (lambda p: p.kv("tokenizer.ggml.token_type").value.items.pop(),
     r"tokenizer.ggml.token_type = .*one type per token \(96\)"),
    (lambda p: p.set("tokenizer.ggml.model", STRING, "spm"), r"tokenizer.ggml.model = 'spm' has no reader here"),
    (lambda p: (gpt2(p), p.set("tokenizer.ggml.merges", ARRAY, Array(STRING, ["zz qq"]))),
     r"tokenizer.ggml.merges\[0\] = 'zz qq': give two tokens of the vocabulary"),
    (lambda p: (gpt2(p), p.set("tokenizer.ggml.merges", ARRAY, Array(STRING, ["[CLS]"]))),
     r"tokenizer.ggml.merges\[0\] = '\[CLS\]'"),
], ids=["unknown id out of range", "eos id a string", "types short", "spm", "merges of unknown tokens", "merge of one"])
def test_a_hostile_vocabulary_is_refused(change, pattern, base, tmp_path):
    refused(damaged(base[1], change).write(tmp_path / "x.gguf"), pattern, hub.read_tokenizer)


def test_a_million_string_vocabulary_is_refused_in_seconds(base, tmp_path, hang_guard):
    started = time.perf_counter()
    tokens = Array(STRING, [f"t{i}" for i in range(1_000_000)])
    path = damaged(base[1], lambda p: p.set("tokenizer.ggml.tokens", ARRAY, tokens)).write(tmp_path / "x.gguf")
    refused(path, r"llama.vocab_size = 96, but tokenizer.ggml.tokens holds 1000000 tokens")
    assert time.perf_counter() - started < 8


def test_a_model_over_the_memory_is_refused_before_it_is_built(base, monkeypatch):
    monkeypatch.setattr("mase_lite.infra.limits.memory_bytes", lambda: 1000)
    refused(base[0], r"llama.block_count=1, llama.embedding_length=64, llama.feed_forward_length=128, "
                     r"llama.vocab_size=96: the llama model its metadata describes would need about .* GB, more than")


def same_weights(path: Path, expected: dict[str, torch.Tensor]) -> None:
    state = _state(hub.read_model(path, AutoModelForCausalLM))
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)


@pytest.mark.parametrize("change", [
    lambda p: None,
    lambda p: setattr(p, "version", 2),
    lambda p: aligned(p, 64),
    lambda p: aligned(p, 1),
    lambda p: setattr(p, "tail", b"\x00garbage after the data"),
    lambda p: p.set("x.big", ARRAY, Array(UINT32, list(range(1_000_000)))),
    lambda p: p.set("x.nested", ARRAY, Array(ARRAY, [Array(ARRAY, [Array(STRING, ["a", "b"])])])),
], ids=["as written", "version 2", "alignment 64", "alignment 1", "bytes appended", "a million UINT32", "nested 3 deep"])
def test_a_valid_file_imports_with_the_same_weights(change, base, tmp_path, hang_guard):
    forged = damaged(base[1], change).write(tmp_path / "x.gguf")
    same_weights(forged, base[2])


def test_the_valid_file_gives_the_models_logits_and_forges_back_byte_for_byte(base, tmp_path):
    path, parts, _, source = base
    assert parts.to_bytes() == path.read_bytes()
    ids = torch.randint(0, 90, (2, 9))
    with torch.no_grad():
        assert torch.equal(hub.read_model(path, AutoModelForCausalLM)(input_ids=ids).logits, source(input_ids=ids).logits)


def test_metadata_alone_reads_no_tensor_info_and_either_byte_order(base, tmp_path):
    path, parts, _, _ = base
    meta = gguf_file.metadata(path)
    assert meta["general.architecture"] == "llama" and len(meta["tokenizer.ggml.tokens"]) == 96
    broken = damaged(parts, tensor("output_norm.weight", type=99)).write(tmp_path / "broken.gguf")
    assert gguf_file.metadata(broken) == meta  # tensor infos are not read
    swapped = damaged(parts, lambda p: setattr(p, "order", ">")).write(tmp_path / "big.gguf")
    assert gguf_file.metadata(swapped) == meta


def spec(tmp_path: Path, pretrained: Path) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"model": {"task": "causal-lm", "pretrained": str(pretrained)},
                                "data": {"block_size": 8, "n_train": 8, "n_test": 8},
                                "steps": [{"pass": "evaluate", "params": {"progress": False}}],
                                "output_dir": str(tmp_path / "run")}))
    return str(path)


@pytest.mark.parametrize("make, pattern", [
    (lambda b, d: damaged(b[1], KVS[2][1]).write(d / "x.gguf"), r"an array of 1152921504606846976 UINT8 values"),
    (lambda b, d: damaged(b[1], METADATA[2][1]).write(d / "x.gguf"), r"llama.attention.head_count = 0"),
    (lambda b, d: damaged(b[1], TENSOR_INFOS[13][1]).write(d / "x.gguf"), r"its bytes overlap those of tensor"),
    (lambda b, d: (os.mkfifo(d / "x.gguf"), d / "x.gguf")[1], r"is a FIFO"),
], ids=["2**60 array", "head_count 0", "overlapping tensors", "FIFO"])
def test_the_cli_refuses_in_one_line_with_exit_2(make, pattern, base, tmp_path, capsys, hang_guard):
    path = make(base, tmp_path)
    assert main(["run", spec(tmp_path, path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mase-lite: error: ") and "Traceback" not in err, err
    assert str(path) in lines[0] and re.search(pattern, lines[0])


def _with_bytes(parts: Parts, name: str, at: int, raw: bytes) -> Parts:
    """``parts`` whose tensor ``name`` has ``raw`` written ``at`` bytes into its data."""
    parts = parts.copy()
    start = parts.tensor(name).offset + at
    parts.data = parts.data[:start] + raw + parts.data[start + len(raw):]
    return parts


@pytest.mark.parametrize("tensor, at, raw, named", [
    ("blk.0.attn_q.weight", 0, struct.pack("<e", float("nan")), "model.layers.0.self_attn.q_proj"),  # a Q8_0 scale
    ("blk.0.ffn_down.weight", 34, struct.pack("<e", float("inf")), "model.layers.0.mlp.down_proj"),  # the 2nd block's
    ("token_embd.weight", 8, struct.pack("<f", float("nan")), "token_embd.weight"),  # a float weight
    ("output_norm.weight", 0, struct.pack("<f", float("-inf")), "output_norm.weight"),
])
def test_nan_or_infinite_weights_are_refused_naming_the_tensor(base, tmp_path, tensor, at, raw, named):
    path = _with_bytes(base[1], tensor, at, raw).write(tmp_path / "x.gguf")
    refused(path, rf"tensor '{re.escape(named)}' holds NaN or infinite values \(a damaged scale or weight\)$")
