"""A model streamed from a safetensors directory (``model.stream``): quantize, GPTQ and a compressed-tensors
export load one decoder block at a time and give the in-memory run's files bit for bit; memory holds one block."""

import glob
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import safetensors.torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.runtime.disk_weights import DiskWeights
from mase_lite.workloads.tokenizer import train_wordpiece
from tests.conftest import PATIENCE

W4 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "full_range": True}


def write_model(path, hidden=64, ffn=128, layers=3, vocab=120, dtype=torch.float32, kv_heads=2):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=64, tie_word_embeddings=True)
    LlamaForCausalLM(config).to(dtype).save_pretrained(path)
    train_wordpiece(["the cat sat on the mat", "a dog ran far away"], vocab_size=100).save_pretrained(path)
    return path


def spec(model_dir, out, stream, steps=None):
    return {"seed": 0, "capture": "modules",
            "model": {"task": "causal-lm", "pretrained": str(model_dir), "stream": stream},
            "data": {"block_size": 16, "n_train": 16, "n_test": 8},
            "steps": steps or [
                {"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": W4}}}},
                {"pass": "gptq", "params": {"num_batches": 2, "batch_size": 4}},
                {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}}],
            "output_dir": str(out)}


def copy_with(model_dir, target, tensors):
    """A copy of the model directory whose weights are ``tensors``."""
    target.mkdir()
    for file in model_dir.iterdir():
        if file.suffix != ".safetensors":
            (target / file.name).write_bytes(file.read_bytes())
    safetensors.torch.save_file(tensors, str(target / "model.safetensors"))
    return target


def tensors_in(directory):
    out = {}
    for file in sorted(glob.glob(f"{directory}/*.safetensors")):
        out.update(safetensors.torch.load_file(file))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("streamed")
    model_dir = write_model(root / "model")
    before = digests(model_dir)
    runs = model_dir, ml.run_pipeline(spec(model_dir, root / "memory", False)), ml.run_pipeline(spec(model_dir, root / "disk", True))
    assert digests(model_dir) == before  # GPTQ changed the blocks in memory, never the user's files
    return runs


def digests(directory):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir())}


def test_streamed_gptq_and_export_equal_the_in_memory_run(runs):
    model_dir, memory, disk = runs
    assert memory.report["steps"][1]["info"]["layers"] == disk.report["steps"][1]["info"]["layers"]
    a, b = tensors_in(memory.output_dir / "hf"), tensors_in(disk.output_dir / "hf")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((memory.output_dir / "hf/config.json").read_text()) == json.loads((disk.output_dir / "hf/config.json").read_text())
    index = json.loads((disk.output_dir / "hf/model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert index["weight_map"]["model.layers.2.mlp.down_proj.weight_packed"] == "model-00004-of-00004.safetensors"
    # the sharded directory loads where the single file does (transformers with compressed-tensors)
    from transformers import AutoModelForCausalLM

    x = torch.randint(0, 100, (2, 12))
    logits = [AutoModelForCausalLM.from_pretrained(str(r.output_dir / "hf"))(x).logits for r in (memory, disk)]
    assert torch.equal(logits[0], logits[1])


def test_one_block_is_resident_at_a_time(runs):
    model_dir, memory, disk = runs
    model = memory.mg.source_model
    block = sum(t.numel() * t.element_size() for t in model.model.layers[0].state_dict().values())
    embedding = model.model.embed_tokens.weight.numel() * 4
    assert disk.report["steps"][1]["info"]["streamed_peak_bytes"] == max(block, embedding)
    assert all(p.is_meta for p in disk.mg.model.parameters())  # nothing left resident after the run


def test_streaming_refuses_what_needs_the_whole_model(runs, tmp_path):
    model_dir = runs[0]
    steps = [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": {"weight": W4}}}},
             {"pass": "gptq", "params": {"num_batches": 1, "batch_size": 2}},
             {"pass": "evaluate", "params": {}},
             {"pass": "export", "params": {"format": "gguf", "path": "m.gguf"}}]
    with pytest.raises(UserError) as err:
        ml.run_pipeline({**spec(model_dir, tmp_path / "a", True, steps), "capture": "graph"})
    text = str(err.value)
    assert "capture: model.stream runs in module mode" in text
    assert "steps.2 (evaluate): needs the whole model in memory; with model.stream a pipeline runs export, gptq, quantize" in text
    assert "steps.3 (export)" in text and "steps.1" not in text
    # the head quantized too: GPTQ of a layer outside the blocks needs whole-model runs
    with pytest.raises(UserError, match=r"layer 'lm_head' is outside the repeated blocks \(model.layers\)"):
        ml.run_pipeline(spec(model_dir, tmp_path / "b", True, steps[:2]))


def test_a_directory_without_the_models_tensors_is_refused(runs, tmp_path):
    model_dir = runs[0]
    tensors = safetensors.torch.load_file(str(model_dir / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    broken = copy_with(model_dir, tmp_path / "broken", tensors)
    with pytest.raises(UserError, match="has no tensor 'model.layers.1.mlp.up_proj.weight'"):
        ml.run_pipeline(spec(broken, tmp_path / "out", True))
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="model.safetensors is not a readable safetensors file"):
        ml.run_pipeline(spec(broken, tmp_path / "out2", True))
    assert not (tmp_path / "out2" / "hf").exists()


def test_a_written_block_reads_back_its_codes(runs, tmp_path):
    """A block GPTQ changed is written as codes and scales; made resident again, its layers compute with exactly
    the values GPTQ chose (the export read them back: the files equal the in-memory run's)."""
    model_dir, memory, disk = runs
    weights: DiskWeights = disk.mg.model.mase_disk_weights
    assert sorted(p.name for p in (disk.output_dir / "stream").iterdir()) == [f"model.layers.{i}.safetensors" for i in range(3)]
    weights.work_dir = tmp_path  # the run's directory was staged and moved: read its files where they are now
    weights.codes = {k: (disk.output_dir / "stream" / f.name, e) for k, (f, e) in weights.codes.items()}
    weights.location = {k: (disk.output_dir / "stream" / f.name if f.parent.name == "stream" else f, key)
                        for k, (f, key) in weights.location.items()}
    with weights.resident("model.layers.1") as block:
        for name, param in block.named_parameters():
            assert torch.equal(param, memory.mg.model.model.layers[1].get_parameter(name)), name
        layer = block.mlp.down_proj
        assert layer.weight_quantizer.held(layer.weight) is not None  # held: not quantized again


MEMORY_CHILD = textwrap.dedent("""
    import json, re, sys
    import mase_lite as ml

    def status(key):
        return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

    warm, spec = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    ml.run_pipeline(warm)  # imports, libraries (LAPACK), tokenizer, data: what both runs share, on a tiny model
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from the current one
    base = status("VmRSS")
    ml.run_pipeline(spec)
    print(json.dumps({"growth": status("VmHWM") - base}))
""")


def test_streaming_keeps_the_float_model_out_of_memory(tmp_path):
    """Measured in fresh processes (the peak resident size from a warmed-up start, Linux's ``clear_refs``): a run
    in memory grows the process by about the float weights (≥ 0.9×); streamed GPTQ, by less than half of them (one block of
    7 MB, its Hessians and the calibration activations). Large allocations are mapped and unmapped
    (``MALLOC_MMAP_THRESHOLD_``), so the resident size follows what is alive, not what the allocator keeps."""
    # many bytes per GPTQ column (its sweep's cost): square layers, no grouped heads
    model_dir = write_model(tmp_path / "model", hidden=512, ffn=512, layers=13, vocab=128, kv_heads=4)
    size = sum(t.numel() * 4 for t in tensors_in(model_dir).values())  # 96 MB of float32 weights
    steps = [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": W4}}}},
             {"pass": "gptq", "params": {"num_batches": 1, "batch_size": 4}}]
    warm = spec(write_model(tmp_path / "tiny"), tmp_path / "warm", True, steps)
    growth = {}
    for stream in (False, True):  # in memory, loading the model is enough to show it
        run = spec(model_dir, tmp_path / f"out-{stream}", stream, steps if stream else steps[:1])
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, json.dumps(warm), json.dumps(run)], capture_output=True,
                             text=True, timeout=PATIENCE, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr[-2000:]
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        growth[stream] = figures["growth"]
    assert growth[False] >= 0.9 * size, (growth, size)
    assert growth[True] < 0.5 * size, (growth, size)


def test_a_tied_tensor_stored_twice_with_other_values_is_untied_as_transformers_does(runs, tmp_path):
    model_dir = runs[0]
    tensors = safetensors.torch.load_file(str(model_dir / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
    untied = copy_with(model_dir, tmp_path / "untied", tensors)
    memory, disk = (ml.run_pipeline(spec(untied, tmp_path / str(s), s)) for s in (False, True))
    a, b = tensors_in(memory.output_dir / "hf"), tensors_in(disk.output_dir / "hf")
    assert torch.equal(b["lm_head.weight"], tensors["lm_head.weight"])
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_full_disk_while_writing_a_block_is_named(runs, tmp_path, monkeypatch):
    import errno

    import mase_lite.runtime.disk_weights as disk_weights

    def full(tensors, path, metadata=None):
        open(path, "wb").write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(disk_weights.safetensors.torch, "save_file", full)
    with pytest.raises(UserError, match=r"model.layers.0.safetensors.*: No space left on device \(.* MB free"):
        ml.run_pipeline(spec(runs[0], tmp_path / "out", True))
    assert sorted(p.name for p in (tmp_path / "out" / "stream").iterdir()) == []  # no half-written block
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "failed" and report["failed_step"] == "steps.1 (gptq)"
