"""Hostile compressed-tensors directories (issue 48): each is refused in one line naming the file and the field or
tensor at fault (an ``ExportError``; exit 2 from the CLI, no traceback), at once: damaged safetensors, config values
of the wrong types, target regexes that do not parse or would backtrack for ever, FIFOs and links out of the
directory, a tensor in two files or not where the index says, NaN and infinities, another tool's ``quant_method``,
sizes the tensors contradict or the memory cannot hold. Valid variants (an index, shards, a link inside, a target
that matches nothing) import with the same weights. Every directory is made from one small valid export of the
tool's own, with seven config groups: one per scheme the reader reads."""

import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.deploy import export
from mase_lite.importers import hub
from mase_lite.deploy.layers import ExportError
from mase_lite.deploy.targets import Targets, TargetError
from mase_lite.workloads.tokenizer import train_wordpiece

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
Q, V, O, GATE, UP = (f"model.layers.0.{p}" for p in ("self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj",
                                                      "mlp.gate_proj", "mlp.up_proj"))
EMBED, NORM = "model.embed_tokens.weight", "model.norm.weight"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The valid directory (pack-quantized W4 symmetric and asymmetric, int-quantized W8A8 static, FP8, MXFP4, NVFP4,
    unsigned fixed point) and its import's state."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16))
    model, _ = ml.passes.quantize(model.eval(), {"by": "regex", "rules": RULES})
    path = tmp_path_factory.mktemp("ct") / "base"
    export(model, "compressed-tensors", path, tokenizer=train_wordpiece(["the cat sat on the mat", "a dog ran"], 90))
    return path, _state(read(path))


def read(path: Path) -> torch.nn.Module:
    return hub.read_model(path, AutoModelForCausalLM)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}



def made(base: tuple[Path, dict], tmp_path: Path, change) -> Path:
    path = tmp_path / "ct"
    shutil.copytree(base[0], path, symlinks=True)
    change(path)
    return path


def config(change):
    def apply(path: Path) -> None:
        data = json.loads((path / "config.json").read_text())
        change(data)
        (path / "config.json").write_text(json.dumps(data))

    return apply


def quantization(change):
    return config(lambda c: change(c["quantization_config"]))


def group(n: int, change):
    return quantization(lambda q: change(q["config_groups"][f"group_{n}"]))


def text(old: str, new: str):
    def apply(path: Path) -> None:
        before = (path / "config.json").read_text()
        assert old in before
        (path / "config.json").write_text(before.replace(old, new))

    return apply


def tensors(change):
    def apply(path: Path) -> None:
        file = path / "model.safetensors"
        held = load_file(file)
        change(held)
        save_file(held, file)

    return apply


def put(name: str, index: int, value: float):
    """One value of the tensor ``name`` changed (through its bytes, for the float8 and uint8 ones)."""
    def change(held: dict) -> None:
        flat = held[name].view(torch.uint8) if held[name].element_size() == 1 else held[name]
        flat.view(-1)[index] = value

    return tensors(change)


def header(change):
    """The safetensors header rewritten by ``change`` (the data left as it is)."""
    def apply(path: Path) -> None:
        file = path / "model.safetensors"
        data = file.read_bytes()
        size = struct.unpack("<Q", data[:8])[0]
        held = json.loads(data[8:8 + size])
        change(held)
        new = json.dumps(held).encode()
        file.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + size:])

    return apply


def fifo(name: str):
    def apply(path: Path) -> None:
        (path / name).unlink(missing_ok=True)
        os.mkfifo(path / name)

    return apply


def index(weight_map):
    """A model.safetensors.index.json mapping ``weight_map(tensor names)``."""
    def apply(path: Path) -> None:
        names = list(load_file(path / "model.safetensors"))
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map(names)}))

    return apply


def both(*changes):
    def apply(path: Path) -> None:
        for change in changes:
            change(path)

    return apply


def second_file(path: Path) -> None:
    save_file({NORM: torch.zeros(32)}, path / "model-2.safetensors")


def norm_moved(path: Path) -> None:
    """The norm's weight moved to a second file."""
    held = load_file(path / "model.safetensors")
    save_file({NORM: held.pop(NORM)}, path / "model-2.safetensors")
    save_file(held, path / "model.safetensors")


def link_outside(path: Path) -> None:
    shutil.copy(path / "model.safetensors", path.parent / "elsewhere.safetensors")
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").symlink_to(path.parent / "elsewhere.safetensors")


def sharded(path: Path) -> None:
    """The tensors in two files, as a large export writes them, with their index."""
    held = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(held)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in parts.items():
        save_file({n: held[n] for n in part}, path / file)
    weight_map = {n: file for file, part in parts.items() for n in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def link_inside(path: Path) -> None:
    (path / "model.safetensors").rename(path / "weights.bin")
    (path / "model.safetensors").symlink_to("weights.bin")


def set_key(key: str, value):
    return config(lambda c: c.update({key: value}))


MISMATCH = r"is \w+ of shape \[.*\]; .* needs .* of shape \[.*\]"
UNREADABLE = r"is not a readable safetensors file: Error while deserializing header"
CONFIG, WEIGHTS, DIRECTORY = "config.json", "model.safetensors", ""
REFUSED = {  # id: (change, the file the message names, what it says)
    # damaged safetensors
    "truncated": (lambda p: (p / WEIGHTS).write_bytes((p / WEIGHTS).read_bytes()[:3000]), WEIGHTS, UNREADABLE),
    "emptied": (lambda p: (p / WEIGHTS).write_bytes(b""), WEIGHTS, UNREADABLE),
    "garbage": (lambda p: (p / WEIGHTS).write_bytes(os.urandom(512)), WEIGHTS, UNREADABLE),
    "a tensor larger than the file": (header(lambda h: h[EMBED].update(shape=[96, 3200])), WEIGHTS, UNREADABLE),
    "overlapping tensors": (header(lambda h: h[NORM].update(data_offsets=h[EMBED]["data_offsets"])), WEIGHTS,
                            UNREADABLE),
    "an unknown dtype": (header(lambda h: h[NORM].update(dtype="Q4")), WEIGHTS, UNREADABLE),
    # values of the wrong types
    "hidden_size a string": (set_key("hidden_size", "32"), CONFIG, r"not a valid llama config: .*hidden_size"),
    "quantization_config a list": (set_key("quantization_config", []), CONFIG,
                                   r"quantization_config = \[\]: expected an object"),
    "config_groups a list": (quantization(lambda q: q.update(config_groups=[1])), CONFIG,
                             r"quantization_config.config_groups = \[1\]: expected an object"),
    "a group a string": (quantization(lambda q: q["config_groups"].update(group_0="x")), CONFIG,
                         r"config_groups.group_0 = 'x': expected an object"),
    "targets a string": (group(0, lambda g: g.update(targets="Linear")), CONFIG,
                         r"group_0.targets = 'Linear': expected a list"),
    "a target a number": (group(0, lambda g: g.update(targets=[7])), CONFIG, r"group_0.targets.0 = 7: not a string"),
    "ignore an object": (quantization(lambda q: q.update(ignore={"a": 1})), CONFIG, r"ignore = \{'a': 1\}: expected a list"),
    "num_bits a string": (group(0, lambda g: g["weights"].update(num_bits="4")), CONFIG,
                          r"group_0.weights.num_bits = '4': expected a positive integer"),
    "symmetric a string": (group(1, lambda g: g["weights"].update(symmetric="false")), CONFIG,
                           r"group_1.weights.symmetric = 'false': expected true or false"),
    "group_size 0": (group(0, lambda g: g["weights"].update(group_size=0)), CONFIG,
                     r"group_0.weights.group_size = 0: expected a positive integer"),
    "group_size 24": (group(0, lambda g: g["weights"].update(group_size=24)), CONFIG,
                      r"group_0.weights.group_size = 24: layer '.*q_proj' has 32 columns"),
    "a strategy of a list": (group(2, lambda g: g["input_activations"].update(strategy=["tensor"])), CONFIG,
                             r"group_2.input_activations.strategy = \['tensor'\]: expected a string"),
    "format a number": (group(3, lambda g: g.update(format=8)), CONFIG, r"group_3.format = 8: expected a string"),
    "model_type a list": (set_key("model_type", ["llama"]), CONFIG, r"model_type \['llama'\] is not a model type"),
    "dtype float64": (set_key("dtype", "float64"), CONFIG, r"dtype = 'float64': expected one of float32"),
    "a key twice": (text('"model_type": "llama"', '"model_type": "llama", "model_type": "gpt2"'), CONFIG,
                    r"the key 'model_type' appears twice"),
    # target regexes
    "a regex that does not parse": (group(0, lambda g: g.update(targets=["re:("])), CONFIG,
                                    r"group_0.targets.0 = 're:\(': not a regex: missing \)"),
    "a regex with a flag": (quantization(lambda q: q.update(ignore=["re:(?i)LM_HEAD"])), CONFIG,
                            r"ignore.0 = 're:\(\?i\)LM_HEAD': inline flags .* are not supported"),
    "a back reference": (group(0, lambda g: g.update(targets=[r"re:(q)\1"])), CONFIG, r"a back reference is not supported"),
    "a counted repeat of a million states": (group(0, lambda g: g.update(targets=["re:(a{1000}){1000}"])), CONFIG,
                                             r"needs more than 20000 states"),
    "regexes of more states than a config may take": (group(0, lambda g: g["targets"].extend(["re:(a{100}){60}"] * 6)),
                                                       CONFIG, r"group_0.targets.6 = .*: a regex whose automaton needs "
                                                       r"more than \d+ states"),
    "a backtracking regex as the only target": (group(0, lambda g: g.update(targets=["re:(.|.)*Z"])), DIRECTORY,
                                                r"does not fit a LlamaForCausalLM of its config: it lacks .*q_proj"),
    # sizes that do not match or fit
    "scale transposed": (tensors(lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"].t().contiguous()})),
                         WEIGHTS, r"'.*q_proj.weight_scale' " + MISMATCH),
    "packed codes of another width": (tensors(lambda t: t.update({f"{Q}.weight_packed": t[f"{Q}.weight_packed"][:, :2].contiguous()})),
                                      WEIGHTS, r"'.*q_proj.weight_packed' " + MISMATCH),
    "an embedding transposed": (tensors(lambda t: t.update({EMBED: t[EMBED].t().contiguous()})), WEIGHTS,
                                rf"'{EMBED}' is F32 of shape \[32, 96\]; a LlamaForCausalLM .* needs .* of shape \[96, 32\]"),
    "MXFP4 scales of float32": (tensors(lambda t: t.update({f"{GATE}.weight_scale": t[f"{GATE}.weight_scale"].float()})),
                                WEIGHTS, r"gate_proj.weight_scale' is F32 .* needs U8"),
    "a global scale of two values": (tensors(lambda t: t.update({f"{UP}.weight_global_scale": torch.ones(2)})), WEIGHTS,
                                     r"up_proj.weight_global_scale' " + MISMATCH),
    "weight_shape lies": (tensors(lambda t: t.update({f"{Q}.weight_shape": torch.tensor([16, 64])})), WEIGHTS,
                          r"q_proj.weight_shape': \[16, 64\], but the layer is \[32, 32\]"),
    "a tensor missing": (tensors(lambda t: t.pop(f"{V}.input_scale")), DIRECTORY, r"lacks tensor .*v_proj.input_scale"),
    "a tensor of no layer": (tensors(lambda t: t.update({"model.extra": torch.ones(2)})), WEIGHTS,
                             r"tensor 'model.extra' is none of its tensors"),
    "a bias the layer does not have": (tensors(lambda t: t.update({f"{Q}.bias": torch.ones(32)})), WEIGHTS,
                                       r"q_proj.bias' is none of its tensors"),
    "num_hidden_layers 1e5": (set_key("num_hidden_layers", 100_000), CONFIG,
                              r"num_hidden_layers = 100000, but the checkpoint holds \d+ tensors"),
    "num_hidden_layers 2**32-1": (set_key("num_hidden_layers", 2**32 - 1), CONFIG, r"num_hidden_layers = 4294967295"),
    "a text_config of 2**32-1 layers": (set_key("text_config", {"num_hidden_layers": 2**32 - 1}), CONFIG,
                                        r"text_config.num_hidden_layers = 4294967295, but the checkpoint holds"),
    "hidden_size 65536": (set_key("hidden_size", 65536), WEIGHTS, r"q_proj.weight_scale' " + MISMATCH),
    "vocab_size 1e12": (set_key("vocab_size", 10**12), CONFIG,
                        r"a llama model of this config \(vocab_size = 1000000000000, .*\) and its tensors would need "
                        r"about .* GB, more than"),
    # files that are not regular, or outside
    "a FIFO named model.safetensors": (fifo(WEIGHTS), WEIGHTS, r"not a regular file"),
    "a link to a FIFO": (both(fifo("pipe"), lambda p: ((p / WEIGHTS).unlink(), (p / WEIGHTS).symlink_to("pipe"))),
                         WEIGHTS, r"not a regular file"),
    "a link outside": (link_outside, WEIGHTS, r"resolves to .*elsewhere.safetensors, outside"),
    "an index naming a file outside": (index(lambda names: {n: "../base/model.safetensors" for n in names}),
                                       "model.safetensors.index.json",
                                       r"weight_map names '../base/model.safetensors', which resolves to .*, outside"),
    "config.json a link outside": (lambda p: (shutil.copy(p / CONFIG, p.parent / "c.json"), (p / CONFIG).unlink(),
                                              (p / CONFIG).symlink_to(p.parent / "c.json")), CONFIG,
                                   r"resolves to .*c.json, outside"),
    # silently different models
    "a second file holding a tensor again": (second_file, WEIGHTS, rf"tensor '{NORM}' is also in .*/model-2.safetensors"),
    "an index putting a tensor elsewhere": (both(norm_moved, index(lambda names: {
        **{n: WEIGHTS for n in names}, NORM: WEIGHTS, EMBED: "model-2.safetensors"})), "model.safetensors.index.json",
        rf"tensor '{NORM}' is in model-2.safetensors, but the index puts it in 'model.safetensors'"),
    "an index not listing a tensor": (index(lambda names: {n: WEIGHTS for n in names if n != NORM}),
                                      "model.safetensors.index.json", rf"tensor '{NORM}' .* the index does not list it"),
    "an index listing a missing tensor": (index(lambda names: {**{n: WEIGHTS for n in names}, "x.weight": WEIGHTS}),
                                          "model.safetensors.index.json", r"maps tensor 'x.weight' to 'model.safetensors', "
                                          r"which does not hold it"),
    "a NaN scale": (put(f"{Q}.weight_scale", 3, float("nan")), WEIGHTS, r"q_proj.weight_scale' holds NaN or infinite"),
    "an infinite embedding": (put(EMBED, 5, float("inf")), WEIGHTS, rf"'{EMBED}' holds NaN or infinite"),
    "a NaN norm": (put(NORM, 0, float("nan")), WEIGHTS, rf"'{NORM}' holds NaN or infinite"),
    "a NaN global scale": (put(f"{UP}.weight_global_scale", 0, float("nan")), WEIGHTS, r"weight_global_scale' holds NaN"),
    "a NaN FP8 weight": (put(f"{O}.weight", 7, 0x7F), WEIGHTS, r"o_proj.weight' holds NaN"),
    "a NaN E8M0 scale": (put(f"{GATE}.weight_scale", 1, 0xFF), WEIGHTS, r"gate_proj.weight_scale': holds the E8M0 NaN"),
    "a scale that overflows": (put(f"{Q}.weight_scale", 0, 3e38), WEIGHTS, r"q_proj.weight_scale': the codes and scales "
                               r"decode to NaN or infinite weights"),
    "an input scale of 0": (put(f"{V}.input_scale", 0, 0.0), WEIGHTS, r"v_proj.input_scale': 0.0: a static input scale"),
    "a symmetric zero point": (tensors(lambda t: t.update({f"{Q}.weight_zero_point": torch.ones(32, 2, dtype=torch.int8)})),
                               WEIGHTS, r"q_proj.weight_zero_point': not zero in a symmetric scheme"),
    "eps NaN": (text('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'), CONFIG, r"NaN is not a JSON number"),
    "output activations": (group(0, lambda g: g.update(output_activations={"num_bits": 8})), CONFIG,
                           r"group_0.output_activations = .*: output quantization has no equivalent"),
    "a KV-cache scheme": (quantization(lambda q: q.update(kv_cache_scheme={"num_bits": 8})), CONFIG,
                          r"kv_cache_scheme = .*: KV-cache quantization has no equivalent"),
    "sparse compression": (quantization(lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"})), CONFIG,
                           r"sparsity_config.format = 'sparse-24-bitmask'"),
    "GPTQ's group index": (group(0, lambda g: g["weights"].update(actorder="group")), CONFIG,
                           r"group_0.weights: layer '.*q_proj': weights .* have no equivalent format"),
    "quantization_status frozen": (quantization(lambda q: q.update(quantization_status="frozen")), CONFIG,
                                   r"quantization_status = 'frozen': only compressed checkpoints store codes"),
}


@pytest.mark.parametrize("change, file, pattern", REFUSED.values(), ids=REFUSED.keys())
def test_a_hostile_directory_is_refused_in_one_line(change, file, pattern, base, tmp_path, hang_guard):
    path = made(base, tmp_path, change)
    with pytest.raises(ExportError) as caught:
        read(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path / file)) and re.search(pattern, message), message


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes", "fp8", "compressed_tensors"])
def test_a_quant_method_this_reader_does_not_know_is_refused_not_loaded_at_random(method, base, tmp_path):
    """Before: any quant_method but compressed-tensors went to transformers, which left the layers at random."""
    path = made(base, tmp_path, quantization(lambda q: q.update(quant_method=method)))
    assert hub.kind_of(path) == "compressed-tensors"
    with pytest.raises(ExportError, match=rf"config.json: quantization_config.quant_method = '{method}': not readable "
                                          r"here .* readable: 'compressed-tensors' directories"):
        read(path)


VALID = {
    "an index of the one file": index(lambda names: {n: WEIGHTS for n in names}),
    "two shards and their index": sharded,
    "a link to a file inside": link_inside,
    "an index and a FIFO it does not map": both(index(lambda names: {n: WEIGHTS for n in names}), fifo("x.safetensors")),
    "a backtracking regex beside the targets": group(0, lambda g: g["targets"].append("re:(.|.)*Z")),
    "an unknown config key": set_key("my_note", [1, {"a": None}]),
    "an ignore list of 200000 names": quantization(lambda q: q["ignore"].extend(f"x.{i}" for i in range(200_000))),
}


@pytest.mark.parametrize("change", VALID.values(), ids=VALID.keys())
def test_a_valid_variant_imports_the_same_weights(change, base, tmp_path, hang_guard):
    state = _state(read(made(base, tmp_path, change)))
    assert state.keys() == base[1].keys() and all(torch.equal(state[k], base[1][k]) for k in state)


@pytest.mark.parametrize("pattern, matches", [
    (r"(.|.)*Z", [False, False]), (r"(a+)+$", [True, False]), (r"(\w+\s?)*$", [True, False]),
    (r"(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)Z", [False, False]), (r"((((.*)*)*)*)*!", [False, False]),
    (r"(x+x+)+y", [False, False])])
def test_a_backtracking_regex_is_matched_in_linear_time(pattern, matches):
    """Python's re backtracks for ever on these (on 30 characters already, but where one matches); here a name of
    5000 characters takes milliseconds."""
    start = time.perf_counter()
    target = Targets([f"re:{pattern}"])
    assert [target.matches(name, None) for name in ("a" * 5000, "model.layers.0.self_attn.q_proj" * 100)] == matches
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("pattern", [r".*q_proj", r"model\.layers\.\d+\.mlp\..*", r".*self_attn\.(q|k|v)_proj$",
                                     r"^model.*(gate|up)_proj\Z", r"(?:model\.)?layers\.[0-9]{1,2}\.", r"[^.]+\.embed",
                                     r"lm_head", r".*\s", r".*_pr", r"model.layers.0.mlp.up_proj.", r"$",
                                     r"(?P<m>model)\.layers\.\d+\.(self_attn|mlp)\.[a-z]+_proj$"])
def test_a_target_regex_matches_as_python_re_does(pattern):
    names = ["model.layers.0.self_attn.q_proj", "model.layers.12.mlp.up_proj", "lm_head", "model.embed_tokens",
             "layers.3.x", "model.layers.0.mlp.up_proj\n", "", "model.layers.0.mlp.up_proj"]
    target = Targets([f"re:{pattern}"])
    assert [target.matches(n, None) for n in names] == [re.match(pattern, n) is not None for n in names]


@pytest.mark.parametrize("pattern", [r"(?=q)", r"\bq", "(?i)q", "a++", "(?>a)", "x" * 1001])
def test_what_an_automaton_cannot_run_is_refused(pattern):
    with pytest.raises(TargetError):
        Targets([f"re:{pattern}"])


def test_a_fifo_named_config_json_is_not_opened(base, tmp_path, hang_guard):
    assert hub.kind_of(made(base, tmp_path, fifo(CONFIG))) is None


def spec(tmp_path: Path, path: Path) -> str:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": {"task": "causal-lm", "pretrained": str(path)},
                                "data": {"block_size": 8, "n_train": 8, "n_test": 8},
                                "steps": [{"pass": "evaluate", "params": {"progress": False}}],
                                "output_dir": str(tmp_path / "run")}))
    return str(spec)


@pytest.mark.parametrize("change, file, pattern", [
    (fifo(WEIGHTS), WEIGHTS, r"not a regular file"),
    (quantization(lambda q: q.update(quant_method="gptq")), CONFIG, r"quant_method = 'gptq': not readable here"),
    (put(f"{Q}.weight_scale", 0, float("inf")), WEIGHTS, r"weight_scale' holds NaN or infinite values"),
    (set_key("num_hidden_layers", 2**32 - 1), CONFIG, r"num_hidden_layers = 4294967295"),
], ids=["FIFO", "gptq", "infinite scale", "2**32-1 layers"])
def test_the_cli_refuses_in_one_line_with_exit_2(change, file, pattern, base, tmp_path, capsys, hang_guard):
    path = made(base, tmp_path, change)
    assert main(["run", spec(tmp_path, path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[transformers]")]
    assert len(lines) == 1 and lines[0].startswith("mase-lite: error: ") and "Traceback" not in err, err
    assert str(path / file) in lines[0] and re.search(pattern, lines[0])


def test_a_snapshot_of_the_hugging_face_cache_imports(base, tmp_path):
    """The hub cache's layout: <repo>/snapshots/<revision>/<file> links to <repo>/blobs/<hash>. Its links leave the
    snapshot, but stay in its repository's blobs: they are the checkpoint's own files."""
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(p for p in base[0].iterdir() if p.is_file())):
        shutil.copy(file, blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{i}")
    state = _state(read(snapshot))
    assert state.keys() == base[1].keys() and all(torch.equal(state[k], base[1][k]) for k in state)
    (snapshot / "model.safetensors").unlink()  # a link out of the repository is still refused
    (snapshot / "model.safetensors").symlink_to(base[0] / "model.safetensors")
    with pytest.raises(ExportError, match=r"model.safetensors: resolves to .*, outside "):
        read(snapshot)
