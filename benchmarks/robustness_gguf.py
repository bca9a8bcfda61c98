"""The ``gguf`` cases of the reliability probe (benchmarks/robustness.py): GGUF files someone else made, imported
as ``"model": {"pretrained": "x.gguf"}`` imports them (issue 48).

A small valid file (a Q8_0 Llama with a WordPiece vocabulary, written by the tool's exporter) is forged anew
(tests/deploy/gguf_forge.py): each header field; each key-value's type and value, the sizes the importer reads
(zero, negative, huge, of another type), array lengths, nesting, strings; each tensor info's name, dimensions,
type and offset; the alignment; valid variants (version 2, other alignments, unknown keys, a million-value array,
metadata naming code); FIFOs and links to them; and byte-level damage (``robustness_data.BYTE_DAMAGE``, over the
whole file and over its header).

Each case reads the file in a forked process as a run does (the vocabulary, then ``build_model``; a few through
``mase-lite run``) and is verified: a file only a refusal is right for must be refused; a valid variant must import
with the original weights; any other file may import or be refused, but when it imports while its tensors and
``<arch>.*`` metadata are the original's, its weights must be the original's. Nothing a file names may run.

Like the rest of the probe, run it with one thread per case (robustness.py sets ``OMP_NUM_THREADS=1`` before torch is
imported): a child forked after the parent's OpenMP pool has run would block in its first parallel region.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import struct
import sys
from pathlib import Path
from typing import Any, Callable

from robustness_data import BYTE_DAMAGE, pretrained_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.deploy.gguf_forge import (  # noqa: E402  the hostile-file tests' forge
    ARRAY, BOOL, FLOAT32, INT32, STRING, UINT8, UINT32, UINT64, Array, Parts, Raw, parse,
)

Verify = Callable[[int | None], str | None]
Make = Callable[[Path], None]
REFUSED, IMPORTS, EITHER = "refused", "imports", "either"  # what is right: only a refusal, only the original, any
SIZES = {"llama.embedding_length": 64, "llama.block_count": 1, "llama.feed_forward_length": 128,
         "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.attention.key_length": 16,
         "llama.vocab_size": 96}
STATE = "state.pt"
THROUGH_CLI = {"as written", "a FIFO named x.gguf", "an extra 2**60 UINT8 array", "llama.attention.head_count = UINT32 0",
               "every tensor at offset 0"}  # these run as ``mase-lite run``


def _base(work: Path) -> tuple[Path, Parts]:
    """The valid file, written by the tool's exporter; its import checked against the source model's logits."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    import mase_lite as ml
    from mase_lite.deploy import gguf
    from mase_lite.importers import hub
    from mase_lite.ir.module_model import ModuleModel
    from mase_lite.workloads.tokenizer import train_wordpiece

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"head": None, "linear": {"weight": {"name": "mxint"}}}})
    path = work / "base.gguf"
    gguf.write(ModuleModel(model), path, tokenizer=train_wordpiece(["the cat sat on the mat", "a dog ran"], vocab_size=90))
    ids = torch.randint(0, 90, (2, 9))
    with torch.no_grad():
        assert torch.equal(hub.read_model(path, AutoModelForCausalLM)(input_ids=ids).logits, model(input_ids=ids).logits)
    return path, parse(path)


def _held(path: Path) -> Any:
    """What the import of ``path`` depends on: its ``<arch>.*`` metadata and each tensor's dimensions, type and bytes
    (None when the file is not readable)."""
    from mase_lite.deploy import gguf_file
    from mase_lite.infra.errors import UserError

    try:
        file = gguf_file.read_file(path)
    except UserError:
        return None
    arch = file.metadata.get("general.architecture")
    meta = {k: v for k, v in file.metadata.items() if isinstance(arch, str) and k.startswith(arch + ".")}
    tensors = {name: (t.dims, t.type, hashlib.sha256(file.buffer[t.offset:t.offset + t.n_bytes]).hexdigest())
               for name, t in file.tensors.items()}
    return json.dumps([arch, sorted(meta.items(), key=str), sorted(tensors.items())], default=str)


def _importer(path: Path, out: Path) -> Callable[[], int]:
    """The import as a run does it (the vocabulary, then the model: ``build_model``), answering like the CLI; the
    imported weights are saved beside the file for the verifier."""
    def call() -> int:
        import torch

        from mase_lite.importers.hub import read_tokenizer
        from mase_lite.infra.errors import UserError, describe
        from mase_lite.workloads.models import build_model

        try:
            read_tokenizer(path)
            model = build_model({"task": "causal-lm", "pretrained": str(path)}, seed=0)
        except UserError as err:
            print(f"mase-lite: error: {describe(err)}", file=sys.stderr)
            return 2
        torch.save({k: v.detach() for k, v in model.state_dict().items()}, out / STATE)
        return 0

    return call


# ---------------------------------------------------------------------------------------------- forging

def _forged(base: Parts, change: Callable[[Parts], Any]) -> Make:
    """Write ``base`` changed by ``change`` (in place, or the parts it returns)."""
    def make(path: Path) -> None:
        parts = base.copy()
        out = change(parts)
        (out if isinstance(out, Parts) else parts).write(path)

    return make


def _set(key: str | bytes, kind: int, value: Any) -> Callable[[Parts], None]:
    return lambda parts: parts.set(key, kind, value)


def _drop(key: str) -> Callable[[Parts], None]:
    return lambda parts: parts.drop(key)


def _retyped(key: str, kind: int) -> Callable[[Parts], None]:
    """``key``'s value bytes kept, its type code changed."""
    def change(parts: Parts) -> None:
        kv = parts.kv(key)
        kv.value, kv.type = Raw(parts.value_bytes(kv.type, kv.value)), kind

    return change


def _tensor(index: int, **changes: Any) -> Callable[[Parts], None]:
    def change(parts: Parts) -> None:
        info = parts.tensors[index]
        for name, value in changes.items():
            setattr(info, name, value(parts, info) if callable(value) else value)

    return change


def _nested(depth: int) -> Raw:
    return Raw(struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", UINT8, 0))


def _aligned(alignment: int, kind: int = UINT32) -> Callable[[Parts], Parts]:
    def change(parts: Parts) -> Parts:
        parts = parts.relaid(alignment)
        _set("general.alignment", kind, alignment)(parts)
        return parts

    return change


def _both(*changes: Callable[[Parts], Any]) -> Callable[[Parts], None]:
    def change(parts: Parts) -> None:
        for each in changes:
            each(parts)

    return change


def _header_cases(base: Parts) -> list[tuple[str, str, Callable, str]]:
    n_tensors, n_kvs = len(base.tensors), len(base.kvs)
    cases = [("header", f"magic {m!r}", lambda p, m=m: setattr(p, "magic", m), REFUSED)
             for m in (b"GGML", b"gguf", b"\x00GGU", b"GGUF"[::-1])]
    cases += [("header", f"version {v}", lambda p, v=v: setattr(p, "version", v), REFUSED)
              for v in (0, 1, 4, 2**31, 2**32 - 1, 3 << 16)]
    cases += [("header", f"tensor_count {c}", lambda p, c=c: setattr(p, "tensor_count", c), REFUSED)
              for c in (0, n_tensors - 1, n_tensors + 1, 2**16 + 1, 2**63, 2**64 - 1)]
    cases += [("header", f"kv_count {c}", lambda p, c=c: setattr(p, "kv_count", c), REFUSED)
              for c in (0, n_kvs - 1, n_kvs + 1, 2**60, 2**64 - 1)]
    return cases


def _value_cases(base: Parts, rng: random.Random) -> list[tuple[str, str, Callable, str]]:
    cases = []
    for kv in base.kvs:  # each key's value bytes read as another type
        for kind in rng.sample([k for k in range(13) if k != kv.type], 2) + [rng.choice([13, 255, 2**32 - 1])]:
            cases.append(("key-value type", f"{kv.key} read as type {kind}", _retyped(kv.key, kind), EITHER))
    for key, size in SIZES.items():  # every size the importer reads: anything but the file's own is refused
        values = [(UINT32, 0), (INT32, -1), (UINT32, size + 1), (UINT32, size * 2), (UINT32, 2**31), (UINT32, 2**32 - 1),
                  (UINT64, 2**63), (FLOAT32, float("nan")), (FLOAT32, float(size)), (STRING, str(size)),
                  (ARRAY, Array(UINT32, [size])), (BOOL, 1)]
        cases += [("metadata size", f"{key} = {_type_name(k)} {v}", _set(key, k, v), REFUSED) for k, v in values]
    others = {"llama.context_length": ([(UINT32, 0), (INT32, -1), (UINT32, 2**24 + 1), (UINT64, 2**63),
                                        (FLOAT32, float("nan")), (STRING, "32")], [(UINT32, 1), (UINT32, 2**20)]),
              "llama.attention.layer_norm_rms_epsilon": ([(FLOAT32, 0.0), (FLOAT32, -1e-6), (FLOAT32, float("nan")),
                                                          (FLOAT32, float("inf")), (FLOAT32, 1.5), (STRING, "x")],
                                                         [(FLOAT32, 1e-3)]),
              "llama.rope.freq_base": ([(FLOAT32, 0.0), (FLOAT32, -1.0), (FLOAT32, float("nan")), (FLOAT32, float("inf")),
                                        (UINT64, 10**13)], [(FLOAT32, 1.0), (UINT32, 500_000)]),
              "general.architecture": ([(STRING, "gpt99"), (STRING, ""), (STRING, "LLAMA"), (STRING, "qwen2"),
                                        (STRING, "qwen3"), (STRING, "mistral"), (UINT32, 5),
                                        (ARRAY, Array(STRING, ["llama"]))], [])}
    for key, (hostile, valid) in others.items():
        cases += [("metadata value", f"{key} = {_type_name(k)} {v}", _set(key, k, v), REFUSED) for k, v in hostile]
        cases += [("metadata value", f"{key} = {_type_name(k)} {v}", _set(key, k, v), IMPORTS) for k, v in valid]
    return cases


def _type_name(kind: int) -> str:
    return ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY", "UINT64",
            "INT64", "FLOAT64"][kind]


def _vocabulary_cases(base: Parts, canary: Path) -> list[tuple[str, str, Callable, str]]:
    tokens = base.kv("tokenizer.ggml.tokens").value.items
    gpt2 = _set("tokenizer.ggml.model", STRING, "gpt2")
    cases = [
        ("vocabulary", "tokens as UINT32", _set("tokenizer.ggml.tokens", ARRAY, Array(UINT32, list(range(96)))), REFUSED),
        ("vocabulary", "one token more", _set("tokenizer.ggml.tokens", ARRAY, Array(STRING, [*tokens, "x"])), REFUSED),
        ("vocabulary", "a token not UTF-8", _set("tokenizer.ggml.tokens", ARRAY, Array(STRING, [*tokens[:-1], b"\xff"])),
         REFUSED),
        ("vocabulary", "a lone surrogate",
         _set("tokenizer.ggml.tokens", ARRAY, Array(STRING, [*tokens[:-1], b"\xed\xa0\x80"])), REFUSED),
        ("vocabulary", "types one short", lambda p: p.kv("tokenizer.ggml.token_type").value.items.pop(), REFUSED),
        ("vocabulary", "unknown id 1000", _set("tokenizer.ggml.unknown_token_id", UINT32, 1000), REFUSED),
        ("vocabulary", "eos id a string", _set("tokenizer.ggml.eos_token_id", STRING, "[SEP]"), REFUSED),
        ("vocabulary", "model 'spm'", _set("tokenizer.ggml.model", STRING, "spm"), REFUSED),
        ("vocabulary", "model an array", _set("tokenizer.ggml.model", ARRAY, Array(STRING, ["bert"])), REFUSED),
        ("vocabulary", "gpt2, merges of unknown tokens",
         _both(gpt2, _set("tokenizer.ggml.merges", ARRAY, Array(STRING, ["zz qq"]))), REFUSED),
        ("vocabulary", "gpt2, a merge of one token", _both(gpt2, _set("tokenizer.ggml.merges", ARRAY, Array(STRING, ["a"]))),
         REFUSED),
        ("vocabulary", "gpt2, merges as UINT8", _both(gpt2, _set("tokenizer.ggml.merges", ARRAY, Array(UINT8, [1]))),
         REFUSED),
        ("vocabulary", "gpt2 without merges", gpt2, IMPORTS),
        ("vocabulary", "padding id past the vocabulary", _set("tokenizer.ggml.padding_token_id", UINT32, 10**6), IMPORTS),
        ("vocabulary", "no vocabulary", _both(_drop("tokenizer.ggml.model"), _drop("tokenizer.ggml.tokens")), IMPORTS),
        ("metadata naming code", "a chat template running a shell",
         _set("tokenizer.chat_template", STRING, "{{ cycler.__init__.__globals__.os.popen('touch %s').read() }}" % canary),
         IMPORTS),
        ("metadata naming code", "general.name as Python",
         _set("general.name", STRING, f"__import__('os').system('touch {canary}')"), IMPORTS),
    ]
    return cases


def _array_cases(base: Parts) -> list[tuple[str, str, Callable, str]]:
    cases = []
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        n = len(base.kv(key).value.items)
        for count, expect in ((0, EITHER), (n - 1, EITHER), (n + 1, EITHER), (2**32, REFUSED), (2**60, REFUSED),
                              (2**64 - 1, REFUSED)):
            cases.append(("array length", f"{key} declares {count}",
                          lambda p, key=key, count=count: setattr(p.kv(key).value, "count", count), expect))
    cases += [("array length", "an extra 2**60 UINT8 array", _set("x", ARRAY, Array(UINT8, [], count=2**60)), REFUSED),
              ("array length", "an extra 2**61 STRING array", _set("x", ARRAY, Array(STRING, [], count=2**61)), REFUSED),
              ("array length", "an extra array of 4M+1 UINT8", _set("x", ARRAY, Array(UINT8, [0] * (2**22 + 1))), REFUSED),
              ("array length", "an extra array of a million UINT32", _set("x", ARRAY, Array(UINT32, list(range(10**6)))),
               IMPORTS),
              ("array length", "an extra array of a million strings",
               _set("x", ARRAY, Array(STRING, [str(i) for i in range(10**6)])), IMPORTS)]
    cases += [("nesting", f"arrays nested {d} deep", _set("x", ARRAY, _nested(d)), REFUSED) for d in (5, 100, 200_000)]
    cases += [("nesting", f"arrays nested {d} deep", _set("x", ARRAY, _nested(d)), IMPORTS) for d in (2, 4)]
    return cases


def _string_cases(base: Parts) -> list[tuple[str, str, Callable, str]]:
    return [
        ("string", "a value not UTF-8", _set("general.name", STRING, b"\xc3\x28"), REFUSED),
        ("string", "a value of 2**63 bytes", _set("general.name", STRING, Raw(struct.pack("<Q", 2**63) + b"ab")), REFUSED),
        ("string", "a value longer than the file", _set("general.name", STRING, Raw(struct.pack("<Q", 10**6) + b"ab")),
         REFUSED),
        ("string", "a key not UTF-8", _set(b"\xff\xfe", UINT32, 1), REFUSED),
        ("string", "an empty key", _set("", UINT32, 1), REFUSED),
        ("string", "a key of 2**63 bytes", _set(Raw(struct.pack("<Q", 2**63) + b"k"), UINT32, 0),
         REFUSED),
        *[("string", f"{key} twice", lambda p, key=key: p.kvs.append(p.kv(key)), REFUSED)
          for key in ("general.architecture", "llama.block_count", "tokenizer.ggml.tokens")],
        ("scalar", "a BOOL of value 2", _set("x", BOOL, 2), REFUSED),
        ("scalar", "a BOOL array holding 9", _set("x", ARRAY, Array(BOOL, [1, 0, 9])), REFUSED),
        ("scalar", "value type 13", _set("x", 13, Raw(b"\x00" * 8)), REFUSED),
        ("scalar", "an unknown key of each type",
         _both(*[_set(f"x.{k}", k, v) for k, v in ((UINT8, 1), (INT32, -5), (FLOAT32, 0.5), (BOOL, 0), (STRING, "y"),
                                                   (UINT64, 2**64 - 1))]), IMPORTS),
    ]


def _tensor_cases(base: Parts, rng: random.Random) -> list[tuple[str, str, Callable, str]]:
    n = len(base.tensors)
    picks = lambda: rng.sample(range(n), 3)  # noqa: E731
    names: list[tuple[str, Any, str]] = [("empty name", "", REFUSED), ("name of 65 bytes", "x" * 65, REFUSED),
                                         ("name not UTF-8", b"\xff\xfe", REFUSED),
                                         ("an unknown name", "blk.0.evil.weight", REFUSED),
                                         ("a block past block_count", "blk.7.attn_norm.weight", REFUSED)]
    cases = [("tensor info", f"tensor {i}: {what}", _tensor(i, name=value), expect)
             for what, value, expect in names for i in picks()]
    cases += [("tensor info", f"tensor {i}: the name of tensor {(i + 1) % n}",
               _tensor(i, name=lambda p, t, i=i: p.tensors[(i + 1) % n].name), REFUSED) for i in picks()]
    dims: list[tuple[str, Callable, str]] = [
        ("no dimensions", lambda p, t: [], REFUSED), ("5 dimensions", lambda p, t: [*t.dims, 1, 1, 1, 1][:5], REFUSED),
        ("a dimension more", lambda p, t: [*t.dims, 1] if len(t.dims) < 4 else t.dims[:3], REFUSED),
        ("a zero", lambda p, t: [0, *t.dims[1:]], REFUSED),
        ("2**64-1", lambda p, t: [2**64 - 1, *t.dims[1:]], REFUSED),
        ("a product past 2**63", lambda p, t: [2**32, 2**32], REFUSED),
        ("rows of one more block", lambda p, t: [t.dims[0] + 32, *t.dims[1:]], REFUSED),
        ("reversed", lambda p, t: t.dims[::-1] if len(t.dims) > 1 else [t.dims[0] // 2, 2], REFUSED),
    ]
    cases += [("tensor info", f"tensor {i}: dimensions {what}", _tensor(i, dims=fn), expect)
              for what, fn, expect in dims for i in picks()]
    types = [("type 99", 99, REFUSED), ("type 2**32-1", 2**32 - 1, REFUSED), ("F16", 1, EITHER), ("Q4_0", 2, EITHER),
             ("Q5_0", 6, EITHER), ("I8", 24, EITHER), ("BF16", 30, EITHER), ("Q2_K", 10, EITHER)]
    cases += [("tensor info", f"tensor {i}: type {what}", _tensor(i, type=code), expect)
              for what, code, expect in types for i in picks()]
    offsets: list[tuple[str, Callable, str]] = [
        ("+1", lambda p, t: t.offset + 1, REFUSED), ("+alignment", lambda p, t: t.offset + 32, REFUSED),
        ("2**40", lambda p, t: 2**40, REFUSED), ("2**64-32", lambda p, t: 2**64 - 32, REFUSED),
        ("the previous tensor's", lambda p, t: p.tensors[p.tensors.index(t) - 1].offset, REFUSED),
        ("half into the previous tensor", lambda p, t: _inside(p, p.tensors.index(t) - 1), REFUSED),
    ]
    cases += [("tensor offset", f"tensor {i}: offset {what}", _tensor(i, offset=fn), expect)
              for what, fn, expect in offsets for i in picks()]
    cases += [("tensor offset", "two tensors' offsets swapped", _swap("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"),
               EITHER),
              ("tensor offset", "every tensor at offset 0", _tensors_at_zero, REFUSED)]
    return cases


def _inside(parts: Parts, index: int) -> int:
    """An aligned offset inside tensor ``index``'s bytes (its own offset when it is one alignment long)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    info = parts.tensors[index]
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type)]
    n_bytes = math.prod(info.dims) // block * size
    return info.offset + (n_bytes // 2) // 32 * 32


def _tensors_at_zero(parts: Parts) -> None:
    for info in parts.tensors:
        info.offset = 0


def _swap(a: str, b: str) -> Callable[[Parts], None]:
    def change(parts: Parts) -> None:
        x, y = parts.tensor(a), parts.tensor(b)
        x.offset, y.offset = y.offset, x.offset

    return change


def _alignment_cases() -> list[tuple[str, str, Callable, str]]:
    cases = [("alignment", f"general.alignment = {_type_name(k)} {v}", _set("general.alignment", k, v), REFUSED)
             for k, v in ((UINT32, 0), (UINT32, 3), (UINT32, 48), (UINT32, 2**31), (UINT32, 4096), (STRING, "32"),
                          (UINT64, 32), (INT32, 32), (ARRAY, Array(UINT32, [32])))]
    cases += [("alignment", f"general.alignment = {a}, tensors as they were", _set("general.alignment", UINT32, a), EITHER)
              for a in (16, 64)]
    cases += [("alignment", f"laid out at {a}", _aligned(a), IMPORTS) for a in (1, 8, 64, 4096)]
    return cases


def _valid_cases() -> list[tuple[str, str, Callable, str]]:
    return [("valid", "as written", lambda p: None, IMPORTS),
            ("valid", "version 2", lambda p: setattr(p, "version", 2), IMPORTS),
            ("valid", "bytes after the data", lambda p: setattr(p, "tail", b"\x00" * 100 + b"trailing"), IMPORTS),
            ("valid", "tensor infos in another order", lambda p: p.tensors.reverse(), IMPORTS),
            ("valid", "key-values in another order", lambda p: p.kvs.reverse(), IMPORTS)]


def _byte_damages(data: bytes, header: int, rng: random.Random, per_damage: int) -> list[tuple[str, bytes]]:
    """(what, damaged bytes): each of BYTE_DAMAGE over the whole file, and flips and cuts within its header."""
    out = [(name, change(data, rng)) for name, change in BYTE_DAMAGE.items() for _ in range(per_damage)]
    for _ in range(per_damage):
        for n in (1, 4, 16):
            flipped = bytearray(data)
            for _ in range(n):
                flipped[rng.randrange(4, header)] = rng.randrange(256)
            out.append((f"{n} header bytes flipped", bytes(flipped)))
        out.append(("cut in the header", data[: rng.randrange(header)]))
        out.append(("cut in the data", data[: rng.randrange(header, len(data))]))
    return out


def _special_files(work: Path, base_path: Path) -> list[tuple[str, str, Make, str]]:
    def fifo(path: Path) -> None:
        os.mkfifo(path)

    def link_to_fifo(path: Path) -> None:
        os.mkfifo(path.with_name("fifo"))
        path.symlink_to(path.with_name("fifo"))

    def link_to_file(path: Path) -> None:
        path.symlink_to(base_path)

    def directory(path: Path) -> None:
        path.mkdir()
        (path / "x.gguf").write_bytes(base_path.read_bytes())

    return [("special file", "a FIFO named x.gguf", fifo, REFUSED),
            ("special file", "a link to a FIFO", link_to_fifo, REFUSED),
            ("special file", "a link to the valid file", link_to_file, IMPORTS),
            ("special file", "a directory named x.gguf", directory, REFUSED)]


# ---------------------------------------------------------------------------------------------- cases

def gguf_cases(seed: int, work: Path, canary: Path, per_damage: int = 6
               ) -> list[tuple[str, str, Path, Callable[[], int], Verify]]:
    """Every case of the part: ``(source, damage, directory, call, verify)``."""
    import torch

    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    base_path, base = _base(work)
    original = _importer(base_path, work)
    assert original() == 0
    weights = torch.load(work / STATE, weights_only=True)
    held = _held(base_path)
    made: list[tuple[str, str, Make, str]] = [
        (source, what, _forged(base, change), expect)
        for source, what, change, expect in (_valid_cases() + _header_cases(base) + _value_cases(base, rng)
                                             + _vocabulary_cases(base, canary) + _array_cases(base)
                                             + _string_cases(base) + _tensor_cases(base, rng) + _alignment_cases())]
    data = base_path.read_bytes()
    made += [("bytes", what, lambda p, d=damaged: p.write_bytes(d), EITHER)
             for what, damaged in _byte_damages(data, base.header_bytes(), rng, per_damage)]
    made += _special_files(work, base_path)
    cases = []
    for k, (source, what, make, expect) in enumerate(made):
        directory = work / f"gguf-{k}"
        directory.mkdir()
        path = directory / "x.gguf"
        make(path)
        call = (pretrained_run if what in THROUGH_CLI else _importer)(path, directory)
        cases.append((f"gguf {source}", what, directory, call,
                      _verifier(directory, expect, _held(path) if expect == EITHER else None, held, weights, canary)))
    return cases


def _verifier(directory: Path, expect: str, case_held: Any, held: Any, weights: dict, canary: Path) -> Verify:
    def verify(code: int | None) -> str | None:
        import torch

        if canary.exists():
            return "code named by the file ran"
        if code == 2:
            return "a valid file was refused" if expect == IMPORTS else None
        if code != 0:
            return None  # the probe's classification names it
        if expect == REFUSED:
            return "a hostile file was imported"
        if not (directory / STATE).exists():  # through the CLI: its exit code is the check
            return None
        state = torch.load(directory / STATE, weights_only=True)
        same = state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in state)
        if not same and (expect == IMPORTS or case_held == held):
            return "the imported weights differ from the original's"
        return None

    return verify
