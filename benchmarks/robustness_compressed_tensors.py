"""The ``compressed-tensors`` cases of the reliability probe (benchmarks/robustness.py): compressed-tensors
directories someone else made, imported as ``"model": {"pretrained": "dir"}`` imports them (issue 48).

A small valid directory (a Llama with seven config groups, one per scheme the reader reads, and a WordPiece
tokenizer, written by the tool's exporter) is changed: ``config.json``'s fields (wrong types, absurd sizes,
non-finite numbers, deep nesting, duplicate keys); ``quantization_config``'s (``quant_method``, status, formats,
groups, ``targets`` and ``ignore`` regexes, quantization args, schemes it cannot apply); the tensors (NaN, infinite,
zero, negative, tiny and huge scales; shapes, dtypes, missing, extra, renamed and duplicated tensors; safetensors
headers that lie); shards and index files; links and FIFOs; valid variants; code the files name; and byte-level
damage (``robustness_data.BYTE_DAMAGE``) of every file, and of the safetensors header alone.

Each case reads the directory in a forked process as a run does (``build_model``, then its tokenizer; a few through
``mase-lite run``) and is verified: a directory only a refusal is right for must be refused; a valid variant must
import with the original weights; any other may import or be refused, but when it imports, every weight whose
tensors are byte for byte the original's (and of the original's dtype) must be the original's. Nothing a file names
may run.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import struct
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from robustness_data import BYTE_DAMAGE, pretrained_run

Verify = Callable[[int | None], str | None]
Make = Callable[[Path], None]
REFUSED, IMPORTS, EITHER = "refused", "imports", "either"  # what is right: only a refusal, only the original, any
STATE = "state.pt"
WEIGHTS, CONFIG, INDEX = "model.safetensors", "config.json", "model.safetensors.index.json"
LAYERS = {name: f"model.layers.0.{name}" for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
Q, K, V, O, GATE, UP, DOWN = LAYERS.values()
EMBED, NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
W8 = {"name": "scaled_integer", "width": 8, "granularity": "channel", "full_range": True}
RULES = {  # one config group each, in this order: group_0 ... group_6
    ".*q_proj": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16}},
    ".*k_proj": {"weight": {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group",
                            "group_size": 16}},
    ".*v_proj": {"weight": W8, "data_in": {**W8, "granularity": "tensor", "scale": 0.02}},
    ".*o_proj": {"weight": {"name": "scaled_float"}},
    ".*gate_proj": {"weight": {"name": "mxfp", "element_format": "e2m1"}},
    ".*up_proj": {"weight": {"name": "nvfp4", "per_tensor": "global_scale"}},
    ".*down_proj": {"weight": {"name": "integer", "width": 8, "frac_width": 6, "signed": False}},
}
THROUGH_CLI = {"as written", "a FIFO named model.safetensors", "quant_method = 'gptq'",
               "num_hidden_layers = 4294967295", f"{Q}.weight_scale[0] = nan"}  # these run as ``mase-lite run``


def _base(work: Path) -> Path:
    """The valid directory, written by the tool's exporter; its import checked against the source model's logits."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    import mase_lite as ml
    from mase_lite.deploy import export
    from mase_lite.importers import hub
    from mase_lite.workloads.tokenizer import train_wordpiece

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16))
    model, _ = ml.passes.quantize(model.eval(), {"by": "regex", "rules": RULES})
    path = work / "base"
    export(model, "compressed-tensors", path, tokenizer=train_wordpiece(["the cat sat on the mat", "a dog ran"], 90))
    ids = torch.randint(0, 90, (2, 7))
    with torch.no_grad():
        assert torch.equal(hub.read_model(path, AutoModelForCausalLM)(input_ids=ids).logits, model(input_ids=ids).logits)
    return path


def _importer(path: Path, out: Path) -> Callable[[], int]:
    """The import as a run does it (``build_model``; then the tokenizer a run reads from the directory: a run reads it
    first, which would keep many a directory from the model's reader), answering like the CLI; the imported state is
    saved beside the directory for the verifier."""
    def call() -> int:
        from mase_lite.importers.hub import read_tokenizer
        from mase_lite.infra.errors import UserError, describe
        from mase_lite.workloads.models import build_model
        from mase_lite.workloads.tokenizer import load_tokenizer

        try:
            model = build_model({"task": "causal-lm", "pretrained": str(path)}, seed=0)
            read_tokenizer(path) or load_tokenizer(path, None, field="model.pretrained")
        except UserError as err:
            print(f"mase-lite: error: {describe(err)}", file=sys.stderr)
            return 2
        torch.save({k: v.detach() for k, v in model.state_dict().items()}, out / STATE)
        return 0

    return call


# ---------------------------------------------------------------------------------------------- what a case reads

def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _tensor_hashes(path: Path) -> dict[str, str | None]:
    """Each tensor of the directory's regular safetensors files: a hash of its dtype, shape and bytes (None for a
    name in two files); unreadable files are left out."""
    from safetensors import safe_open

    found: dict[str, str | None] = {}
    for file in sorted(path.glob("*.safetensors")):
        if not _regular(file):
            continue
        try:
            with safe_open(str(file), "pt") as handle:
                for name in handle.keys():
                    tensor = handle.get_tensor(name)
                    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                    digest = hashlib.sha256(f"{tensor.dtype}{list(tensor.shape)}".encode() + data).hexdigest()
                    found[name] = None if name in found else digest
        except Exception:  # what the reader must refuse; the verifier compares only what it can read
            continue
    return found


def _sources(key: str, tensors: dict[str, Any]) -> list[str]:
    """The stored tensors a state entry is read from: those under its longest module path that has any."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end]) + "."
        names = [n for n in tensors if n.startswith(prefix)]
        if names:
            return names
    return []


def _verifier(directory: Path, expect: str, hashes: dict[str, str | None], original: dict[str, str | None],
              weights: dict, canary: Path) -> Verify:
    def verify(code: int | None) -> str | None:
        if canary.exists():
            return "code named by a file ran"
        if code == 2:
            return "a valid directory was refused" if expect == IMPORTS else None
        if code != 0:
            return None  # the probe's classification names it
        if expect == REFUSED:
            return "a hostile directory was imported"
        if not (directory / STATE).exists():  # through the CLI: its exit code is the check
            return None
        state = torch.load(directory / STATE, weights_only=True)
        if expect == IMPORTS:
            same = state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in state)
            return None if same else "the imported weights differ from the original's"
        for key in state.keys() & weights.keys():
            sources = _sources(key, original)
            unchanged = sources and all(original[n] is not None and hashes.get(n) == original[n] for n in sources)
            if unchanged and state[key].dtype == weights[key].dtype and not torch.equal(state[key], weights[key]):
                return f"{key} differs from the original's, though the tensors it is read from are the original's"
        return None

    return verify


# ---------------------------------------------------------------------------------------------- changes

def _config(change: Callable[[dict], Any]) -> Make:
    def make(path: Path) -> None:
        data = json.loads((path / CONFIG).read_text())
        change(data)
        (path / CONFIG).write_text(json.dumps(data))

    return make


def _quantization(change: Callable[[dict], Any]) -> Make:
    return _config(lambda c: change(c["quantization_config"]))


def _group(n: int, change: Callable[[dict], Any]) -> Make:
    return _quantization(lambda q: change(q["config_groups"][f"group_{n}"]))


def _text(old: str, new: str) -> Make:
    def make(path: Path) -> None:
        text = (path / CONFIG).read_text()
        assert old in text, old
        (path / CONFIG).write_text(text.replace(old, new, 1))

    return make


def _tensors(change: Callable[[dict], Any]) -> Make:
    def make(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        held = load_file(path / WEIGHTS)
        change(held)
        save_file({k: v.contiguous().clone() for k, v in held.items()}, path / WEIGHTS)

    return make


def _put(name: str, index: int, value: float) -> Make:
    """One value of the tensor ``name`` changed (its bytes, for the one-byte dtypes)."""
    def change(held: dict) -> None:
        flat = held[name].view(torch.uint8) if held[name].element_size() == 1 else held[name]
        flat.view(-1)[index % flat.numel()] = value

    return _tensors(change)


def _header(change: Callable[[dict], Any]) -> Make:
    """The safetensors header rewritten (the data left as it is)."""
    def make(path: Path) -> None:
        data = (path / WEIGHTS).read_bytes()
        size = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + size])
        change(header)
        new = json.dumps(header).encode()
        (path / WEIGHTS).write_bytes(struct.pack("<Q", len(new)) + new + data[8 + size:])

    return make


def _index(weight_map: Callable[[list[str]], Any]) -> Make:
    def make(path: Path) -> None:
        from safetensors import safe_open

        with safe_open(str(path / WEIGHTS), "pt") as handle:
            names = list(handle.keys())
        (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map(names)}))

    return make


def _both(*makes: Make) -> Make:
    def make(path: Path) -> None:
        for one in makes:
            one(path)

    return make


def _fifo(name: str) -> Make:
    def make(path: Path) -> None:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        target.unlink(missing_ok=True)
        os.mkfifo(target)

    return make


def _link(name: str, to: str | Path) -> Make:
    def make(path: Path) -> None:
        (path / name).unlink(missing_ok=True)
        (path / name).symlink_to(to)

    return make


def _moved(name: str, to: str) -> Make:
    """The tensor ``name`` moved to the new file ``to``."""
    def make(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        held = load_file(path / WEIGHTS)
        save_file({name: held.pop(name)}, path / to)
        save_file(held, path / WEIGHTS)

    return make


def _sharded(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    held = load_file(path / WEIGHTS)
    (path / WEIGHTS).unlink()
    names = sorted(held)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in parts.items():
        save_file({n: held[n] for n in part}, path / file)
    (path / INDEX).write_text(json.dumps({"weight_map": {n: f for f, part in parts.items() for n in part}}))


def _extra_file(name: str, tensors: Callable[[dict], dict]) -> Make:
    def make(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        save_file(tensors(load_file(path / WEIGHTS)), path / name)

    return make


def _nested(depth: int) -> Make:
    return _text('"hidden_act": "silu"', '"hidden_act": "silu", "deep": ' + "[" * depth + "]" * depth)


# ---------------------------------------------------------------------------------------------- cases

def _valid_cases(canary: Path) -> list[tuple[str, str, Make, str]]:
    code = f"open({str(canary)!r}, 'w').write('ran')\n"

    def code_named(path: Path) -> None:
        (path / "evil.py").write_text(code)
        _config(lambda c: c.update(auto_map={"AutoModelForCausalLM": "evil.Model"}, architectures=["Evil"]))(path)

    return [("valid", what, make, IMPORTS) for what, make in [
        ("as written", lambda p: None),
        ("an index of the one file", _index(lambda names: {n: WEIGHTS for n in names})),
        ("two shards and their index", _sharded),
        ("a link to a file inside", _both(lambda p: (p / WEIGHTS).rename(p / "w.bin"), _link(WEIGHTS, "w.bin"))),
        ("an unrelated file", lambda p: (p / "README.md").write_text("# notes\n")),
        ("an empty second safetensors file", _extra_file("extra.safetensors", lambda t: {})),
        ("an index and a FIFO it does not map", _both(_index(lambda names: {n: WEIGHTS for n in names}),
                                                      _fifo("other.safetensors"))),
        ("an index and a duplicate file it does not map", _both(_index(lambda names: {n: WEIGHTS for n in names}),
                                                                _extra_file("copy.safetensors", lambda t: t))),
        ("no generation_config.json", lambda p: (p / "generation_config.json").unlink()),
        ("an unknown config key", _config(lambda c: c.update(my_note=[1, {"a": None}]))),
        ("quantization_config's version and ratio", _quantization(lambda q: q.update(version="0.20.1",
                                                                                   global_compression_ratio=1.5))),
        ("a backtracking regex beside a target", _group(0, lambda g: g["targets"].append("re:(.|.)*Z"))),
        ("targets as equivalent regexes", _quantization(lambda q: [
            g.update(targets=[f"re:{t.replace('.', chr(92) + '.')}$" for t in g["targets"]])
            for g in q["config_groups"].values()])),
        ("ignore naming nothing", _quantization(lambda q: q["ignore"].append("re:^nothing$"))),
        ("ignore emptied (lm_head is in no group)", _quantization(lambda q: q.update(ignore=[]))),
        ("a dense sparsity_config", _quantization(lambda q: q.update(sparsity_config={"format": "dense"}))),
        ("top-level format unread", _quantization(lambda q: q.update(format="pack-quantized"))),
        ("actorder weight (no group index)", _group(0, lambda g: g["weights"].update(actorder="weight"))),
        ("a zero input_zero_point", _tensors(lambda t: t.update({f"{V}.input_zero_point": torch.zeros(1, dtype=torch.int8)}))),
        ("auto_map naming code", code_named),
        ("an ignore list of 200000 names", _quantization(lambda q: q["ignore"].extend(f"x.{i}" for i in range(200_000)))),
        ("100000 config groups targeting nothing", _quantization(lambda q: q["config_groups"].update(
            {f"extra_{i}": {"format": "pack-quantized", "targets": [f"x.{i}"]} for i in range(100_000)}))),
    ]]


def _config_cases(rng: random.Random) -> list[tuple[str, str, Make, str]]:
    cases = []
    weird = [None, "x", "64", -1, 0, 1.5, 2**40, [], {}, True, [32]]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "intermediate_size", "max_position_embeddings", "head_dim", "rms_norm_eps", "model_type", "dtype",
                "tie_word_embeddings", "rope_parameters", "hidden_act", "pad_token_id", "architectures"):
        for value in rng.sample(weird, 5):
            cases.append(("config", f"{key} = {json.dumps(value)}", _config(lambda c, k=key, v=value: c.update({k: v})),
                          EITHER))
        cases.append(("config", f"no {key}", _config(lambda c, k=key: c.pop(k, None)), EITHER))
    for key, value in [("num_hidden_layers", 100_000), ("num_hidden_layers", 2**32 - 1), ("vocab_size", 10**9),
                       ("vocab_size", 10**12), ("hidden_size", 65536), ("intermediate_size", 2**40),
                       ("num_attention_heads", 2**31), ("dtype", "float64"), ("dtype", "int8")]:
        cases.append(("config", f"{key} = {value}", _config(lambda c, k=key, v=value: c.update({k: v})), REFUSED))
    for raw in ("NaN", "Infinity", "-Infinity", "1e999"):
        cases.append(("config", f"rms_norm_eps = {raw}", _text('"rms_norm_eps": 1e-06', f'"rms_norm_eps": {raw}'),
                      REFUSED))
    cases += [
        ("config", "vocab_size of 5000 digits", _text('"vocab_size": 96', '"vocab_size": 1' + "0" * 5000), EITHER),
        ("config", "nested 100 deep", _nested(100), REFUSED),
        ("config", "nested 100000 deep", _nested(100_000), EITHER),
        ("config", "a key twice", _text('"model_type": "llama"', '"model_type": "llama", "model_type": "gpt2"'), REFUSED),
        ("config", "a lone surrogate", _text('"hidden_act": "silu"', '"hidden_act": "\\ud800"'), REFUSED),
        ("config", "not an object", lambda p: (p / CONFIG).write_text("[1, 2]"), EITHER),
        ("config", "an empty object", lambda p: (p / CONFIG).write_text("{}"), EITHER),
        ("config", "16 MiB of padding", lambda p: (p / CONFIG).write_text(" " * (16 << 20) + (p / CONFIG).read_text()),
         EITHER),
    ]
    return cases


def _quantization_cases(rng: random.Random) -> list[tuple[str, str, Make, str]]:
    cases = []
    for value in ["gptq", "awq", "bitsandbytes", "fp8", "compressed_tensors", "Compressed-Tensors", "", None, 5,
                  ["compressed-tensors"]]:
        cases.append(("quantization_config", f"quant_method = {value!r}",
                      _quantization(lambda q, v=value: q.update(quant_method=v)), REFUSED))
    for value in [[], "x", 1, True, {}]:
        cases.append(("quantization_config", f"quantization_config = {json.dumps(value)}",
                      _config(lambda c, v=value: c.update(quantization_config=v)), REFUSED))
    cases.append(("quantization_config", "quantization_config = null",
                  _config(lambda c: c.update(quantization_config=None)), REFUSED))
    cases.append(("quantization_config", "no quantization_config", _config(lambda c: c.pop("quantization_config")),
                  REFUSED))
    for key, value, expect in [
        ("quantization_status", "frozen", REFUSED), ("quantization_status", None, REFUSED),
        ("quantization_status", 5, REFUSED), ("config_groups", [], REFUSED), ("config_groups", {}, REFUSED),
        ("config_groups", None, REFUSED), ("config_groups", "x", REFUSED), ("ignore", "lm_head", REFUSED),
        ("ignore", [5], REFUSED), ("ignore", ["re:.*"], REFUSED), ("ignore", ["re:("], REFUSED),
        ("ignore", ["re:(?i)LM_HEAD"], REFUSED), ("format", 5, REFUSED), ("format", "marlin-24", IMPORTS),
        ("kv_cache_scheme", {"num_bits": 8, "type": "float"}, REFUSED), ("transform_config", {"r1": {}}, REFUSED),
        ("sparsity_config", {"format": "sparse-24-bitmask"}, REFUSED), ("sparsity_config", [1], REFUSED),
    ]:
        cases.append(("quantization_config", f"{key} = {json.dumps(value)}",
                      _quantization(lambda q, k=key, v=value: q.update({k: v})), expect))
    group_changes: list[tuple[str, Callable[[dict], Any], str]] = [
        ("format = 5", lambda g: g.update(format=5), REFUSED),
        ("format = 'marlin-24'", lambda g: g.update(format="marlin-24"), REFUSED),
        ("format = null", lambda g: g.update(format=None), REFUSED),
        ("format = 'float-quantized'", lambda g: g.update(format="float-quantized"), EITHER),
        ("format = 'pack-quantized'", lambda g: g.update(format="pack-quantized"), EITHER),
        ("targets = 'x'", lambda g: g.update(targets="x"), REFUSED),
        ("targets = []", lambda g: g.update(targets=[]), REFUSED),
        ("targets = [5]", lambda g: g.update(targets=[5]), REFUSED),
        ("targets = ['re:(']", lambda g: g.update(targets=["re:("]), REFUSED),
        ("targets = ['re:(.|.)*Z']", lambda g: g.update(targets=["re:(.|.)*Z"]), REFUSED),
        ("targets = ['re:(a{1000}){1000}']", lambda g: g.update(targets=["re:(a{1000}){1000}"]), REFUSED),
        ("targets += 6 regexes of 18000 states", lambda g: g["targets"].extend(["re:(a{100}){60}"] * 6), REFUSED),
        ("targets = ['Linear']", lambda g: g.update(targets=["Linear"]), EITHER),
        ("weights = 'x'", lambda g: g.update(weights="x"), REFUSED),
        ("weights = null", lambda g: g.update(weights=None), REFUSED),
        ("input_activations = 'x'", lambda g: g.update(input_activations="x"), REFUSED),
        ("input_activations = {}", lambda g: g.update(input_activations={}), EITHER),
        ("output_activations = {num_bits 8}", lambda g: g.update(output_activations={"num_bits": 8}), REFUSED),
        ("a group a list", None, REFUSED),
    ]
    for key, values in {"num_bits": ["4", 3, 0, -1, 9, 2**40, 4.0, True, None], "type": ["float", "int", 5, None],
                        "strategy": ["tensor", "channel", "group", "block", 5, None],
                        "group_size": [0, -16, 24, 32, 8, "16", 2**40, None], "symmetric": [True, False, "false", None],
                        "dynamic": [True, "local", 1], "actorder": ["group", 5]}.items():
        for value in rng.sample(values, min(4, len(values))):
            group_changes.append((f"weights.{key} = {json.dumps(value)}",
                                  lambda g, k=key, v=value: (g.get("weights") or {}).update({k: v}), EITHER))
    for what, change, expect in group_changes:
        n = rng.randrange(7)
        make = (_quantization(lambda q, n=n: q["config_groups"].update({f"group_{n}": [1]})) if change is None
                else _group(n, change))
        cases.append(("config group", f"group_{n}.{what}", make, expect))
    for key, value in [("strategy", "channel"), ("strategy", ["tensor"]), ("dynamic", True), ("num_bits", 4),
                       ("type", "float"), ("symmetric", False)]:
        cases.append(("config group", f"group_2.input_activations.{key} = {json.dumps(value)}",
                      _group(2, lambda g, k=key, v=value: g["input_activations"].update({k: v})), EITHER))
    return cases


def _tensor_cases(rng: random.Random) -> list[tuple[str, str, Make, str]]:
    floats = [f"{Q}.weight_scale", f"{K}.weight_scale", f"{V}.weight_scale", f"{V}.input_scale", f"{O}.weight_scale",
              f"{UP}.weight_global_scale", f"{DOWN}.weight_scale", EMBED, NORM, HEAD,
              "model.layers.0.input_layernorm.weight"]
    cases = []
    for name in floats:
        for value in (float("nan"), float("inf"), float("-inf")):
            cases.append(("tensors", f"{name}[0] = {value}", _put(name, 0, value), REFUSED))
    for name in rng.sample(floats[:7], 5):
        for value in rng.sample([0.0, -0.01, 1e-45, 3e38, 1e4], 3):
            at = rng.randrange(64)
            cases.append(("tensors", f"{name}[{at}] = {value}", _put(name, at, value), EITHER))
    cases += [
        ("tensors", "an FP8 weight NaN", _put(f"{O}.weight", 5, 0x7F), REFUSED),
        ("tensors", "an NVFP4 block scale NaN", _put(f"{UP}.weight_scale", 3, 0xFF), REFUSED),
        ("tensors", "an E8M0 scale 255", _put(f"{GATE}.weight_scale", 2, 0xFF), REFUSED),
        ("tensors", "an E8M0 scale 0", _put(f"{GATE}.weight_scale", 2, 0), EITHER),
        ("tensors", "an int8 code -128", _put(f"{V}.weight", 9, 0x80), EITHER),
        ("tensors", "a packed zero point of random words", _tensors(lambda t: t[f"{K}.weight_zero_point"].copy_(
            torch.randint(-2**31, 2**31 - 1, t[f"{K}.weight_zero_point"].shape, generator=torch.Generator().manual_seed(0)))),
         EITHER),
        ("tensors", "a zero point 127", _put(f"{DOWN}.weight_zero_point", 0, 127), EITHER),
        ("tensors", "a symmetric zero point of ones",
         _tensors(lambda t: t.update({f"{Q}.weight_zero_point": t[f"{Q}.weight_scale"].to(torch.int8) + 1})),
         REFUSED),
        ("tensors", "a symmetric zero point of zeros",
         _tensors(lambda t: t.update({f"{Q}.weight_zero_point": t[f"{Q}.weight_scale"].to(torch.int8) * 0})),
         IMPORTS),
        ("tensors", "an input_zero_point of ones",
         _tensors(lambda t: t.update({f"{V}.input_zero_point": torch.ones(1, dtype=torch.int8)})), REFUSED),
        ("tensors", "weight_shape lies", _tensors(lambda t: t[f"{Q}.weight_shape"].mul_(2)), REFUSED),
        ("tensors", "a scale transposed", _tensors(lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"].t()})),
         REFUSED),
        ("tensors", "a scale of float64", _tensors(lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"].double()})),
         REFUSED),
        ("tensors", "a scale of float16", _tensors(lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"].half()})),
         EITHER),
        ("tensors", "packed codes of int64", _tensors(lambda t: t.update({f"{Q}.weight_packed": t[f"{Q}.weight_packed"].long()})),
         REFUSED),
        ("tensors", "packed codes cut", _tensors(lambda t: t.update({f"{Q}.weight_packed": t[f"{Q}.weight_packed"][:, :2]})),
         REFUSED),
        ("tensors", "FP8 weights as uint8",
         _tensors(lambda t: t.update({f"{O}.weight": t[f"{O}.weight"].view(torch.uint8)})), REFUSED),
        ("tensors", "an embedding transposed", _tensors(lambda t: t.update({EMBED: t[EMBED].t()})), REFUSED),
        ("tensors", "an embedding of int32", _tensors(lambda t: t.update({EMBED: t[EMBED].int()})), REFUSED),
        ("tensors", "an embedding of bfloat16", _tensors(lambda t: t.update({EMBED: t[EMBED].bfloat16()})), EITHER),
        ("tensors", "an extra tensor", _tensors(lambda t: t.update({"model.extra": t[NORM]})), REFUSED),
        ("tensors", "a bias the layer has not", _tensors(lambda t: t.update({f"{Q}.bias": t[NORM]})), REFUSED),
        ("tensors", "a renamed tensor", _tensors(lambda t: t.update({NORM + "_": t.pop(NORM)})), REFUSED),
        ("tensors", "a float weight beside the codes", _tensors(lambda t: t.update({f"{Q}.weight": t[f"{Q}.weight_scale"]})),
         REFUSED),
        ("tensors", "GPTQ's group index", _tensors(lambda t: t.update({f"{Q}.weight_g_idx": t[f"{Q}.weight_shape"]})),
         REFUSED),
        ("tensors", "no tensors", _tensors(lambda t: t.clear()), REFUSED),
    ]
    for name in rng.sample([f"{Q}.weight_packed", f"{K}.weight_zero_point", f"{V}.input_scale", f"{O}.weight",
                            f"{GATE}.weight_scale", f"{UP}.weight_global_scale", EMBED, NORM, HEAD], 5):
        cases.append(("tensors", f"no {name}", _tensors(lambda t, n=name: t.pop(n)), REFUSED))
    return cases


def _header_cases() -> list[tuple[str, str, Make, str]]:
    def entry(name: str, **change: Any) -> Callable[[dict], None]:
        return lambda h: h[name].update(change)

    return [("safetensors header", what, _header(change), expect) for what, change, expect in [
        ("a tensor larger than the file", entry(EMBED, shape=[96, 3200]), REFUSED),
        ("overlapping tensors", lambda h: h[NORM].update(data_offsets=h[EMBED]["data_offsets"]), REFUSED),
        ("an unknown dtype", entry(NORM, dtype="Q4"), REFUSED),
        ("a negative dimension", entry(NORM, shape=[-32]), REFUSED),
        ("a shape of 2**62 squared", entry(NORM, shape=[2**62, 2**62]), REFUSED),
        ("float32 read as int32", entry(NORM, dtype="I32"), REFUSED),
        ("float32 read as complex64", entry(EMBED, dtype="C64", shape=[96, 16]), REFUSED),
        ("a shape of the same size", entry(EMBED, shape=[32, 96]), REFUSED),
        ("metadata of a number", lambda h: h.update(__metadata__={"format": 5}), REFUSED),
        ("metadata naming code", lambda h: h.update(__metadata__={"format": "pt", "auto_map": "evil.Model"}), IMPORTS),
        ("an empty tensor entry", lambda h: h.update({"x": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}),
         EITHER),
    ]]


def _file_cases(work: Path) -> list[tuple[str, str, Make, str]]:
    outside = work / "outside.safetensors"
    return [("files", what, make, expect) for what, make, expect in [
        ("a FIFO named model.safetensors", _fifo(WEIGHTS), REFUSED),
        ("a link to a FIFO", _both(_fifo("pipe"), _link(WEIGHTS, "pipe")), REFUSED),
        ("a link to /dev/zero", _link(WEIGHTS, "/dev/zero"), REFUSED),
        ("a link to a copy outside", _both(lambda p: shutil.copy(p / WEIGHTS, outside), _link(WEIGHTS, outside)),
         REFUSED),
        ("a dangling link", _link(WEIGHTS, "missing.bin"), REFUSED),
        ("a directory named model.safetensors", _both(lambda p: (p / WEIGHTS).unlink(), lambda p: (p / WEIGHTS).mkdir()),
         REFUSED),
        ("config.json a FIFO", _fifo(CONFIG), EITHER),
        ("config.json a link to a copy outside", _both(lambda p: shutil.copy(p / CONFIG, work / "config-copy.json"),
                                                       _link(CONFIG, work / "config-copy.json")), REFUSED),
        ("config.json a directory", _both(lambda p: (p / CONFIG).unlink(), lambda p: (p / CONFIG).mkdir()), EITHER),
        ("tokenizer.json a FIFO", _fifo("tokenizer.json"), EITHER),
        ("the index a FIFO", _fifo(INDEX), REFUSED),
        ("the index a directory", lambda p: (p / INDEX).mkdir(), REFUSED),
        ("a second file holding a tensor again", _extra_file("model-2.safetensors", lambda t: {NORM: t[NORM] * 0}),
         REFUSED),
        ("a second file with a new tensor", _extra_file("model-2.safetensors", lambda t: {"x.weight": t[NORM]}),
         REFUSED),
        ("an index naming a file outside", _index(lambda names: {n: f"../{WEIGHTS}" for n in names}), REFUSED),
        ("an index naming an absolute path", _index(lambda names: {n: "/etc/passwd" for n in names}), REFUSED),
        ("an index naming a missing file", _index(lambda names: {**{n: WEIGHTS for n in names}, NORM: "x.safetensors"}),
         REFUSED),
        ("an index not listing a tensor", _index(lambda names: {n: WEIGHTS for n in names if n != NORM}), REFUSED),
        ("an index listing a missing tensor", _index(lambda names: {**{n: WEIGHTS for n in names}, "x": WEIGHTS}),
         REFUSED),
        ("an index putting a tensor elsewhere", _both(_moved(NORM, "model-2.safetensors"), _index(
            lambda names: {**{n: WEIGHTS for n in names}, NORM: WEIGHTS, EMBED: "model-2.safetensors"})), REFUSED),
        ("an index of a list", lambda p: (p / INDEX).write_text('{"weight_map": [1]}'), REFUSED),
        ("an index of nothing", lambda p: (p / INDEX).write_text("{}"), REFUSED),
        ("an index not JSON", lambda p: (p / INDEX).write_text("{"), REFUSED),
        ("an index and a second file holding a tensor again", _both(
            _index(lambda names: {**{n: WEIGHTS for n in names}, NORM: "model-2.safetensors"}),
            _extra_file("model-2.safetensors", lambda t: {NORM: t[NORM] * 0})), REFUSED),
        ("no safetensors file", lambda p: (p / WEIGHTS).unlink(), REFUSED),
    ]]


def _byte_cases(base: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Make, str]]:
    cases = []
    for name in sorted(p.name for p in base.iterdir()):
        data = (base / name).read_bytes()
        for damage, change in BYTE_DAMAGE.items():
            for _ in range(per_damage):
                damaged = change(data, rng)
                cases.append(("bytes", f"{name}: {damage}", lambda p, n=name, d=damaged: (p / n).write_bytes(d), EITHER))
    data = (base / WEIGHTS).read_bytes()
    header = 8 + struct.unpack("<Q", data[:8])[0]
    for damage, change in BYTE_DAMAGE.items():
        for _ in range(per_damage):
            damaged = change(data[:header], rng) + data[header:]
            cases.append(("bytes", f"{WEIGHTS} header: {damage}", lambda p, d=damaged: (p / WEIGHTS).write_bytes(d),
                          EITHER))
    return cases


def compressed_tensors_cases(seed: int, work: Path, canary: Path, per_damage: int = 2
                             ) -> list[tuple[str, str, Path, Callable[[], int], Verify]]:
    """Every case of the part: ``(source, damage, directory, call, verify)``."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    base = _base(work)
    assert _importer(base, work)() == 0
    weights = torch.load(work / STATE, weights_only=True)
    original = _tensor_hashes(base)
    made = (_valid_cases(canary) + _config_cases(rng) + _quantization_cases(rng) + _tensor_cases(rng)
            + _header_cases() + _file_cases(work) + _byte_cases(base, rng, per_damage))
    cases = []
    for k, (source, what, make, expect) in enumerate(made):
        directory = work / f"ct-{k}"
        directory.mkdir()
        path = directory / "ct"
        shutil.copytree(base, path, symlinks=True)
        make(path)
        call = (pretrained_run if what in THROUGH_CLI else _importer)(path, directory)
        cases.append((f"compressed-tensors {source}", what, directory, call,
                      _verifier(directory, expect, _tensor_hashes(path), original, weights, canary)))
    return cases
