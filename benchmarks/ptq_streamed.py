"""GPTQ of a model larger than it should take in memory: a Qwen2.5-1.5B-shaped model streamed from disk.

Writes a Qwen2.5-1.5B-shaped model (hidden 1536, 28 layers, 12/2 heads, FFN 8960, vocabulary 151936, tied
embeddings, q/k/v biases) with random bfloat16 weights as a safetensors directory, one shard per block
(nothing can be downloaded; the writer never holds more than one tensor), with a tokenizer trained on the
grammar corpus. Then, in fresh processes, ``mase-lite run`` of ``"model": {"pretrained": dir, "stream":
true}``: 4-bit ``scaled_integer`` weights in groups of 128 (compressed-tensors' grid, float16 scales) on every
Linear but the head, ``gptq`` (act-order, 4 batches of 4 windows of 128 tokens) and an export to
compressed-tensors. Prints the peak resident memory (VmHWM) of the run against the model's float32 size,
and of the same run's first step alone (imports, tokenizer, data: no weights), the GPTQ and export seconds
and what was written.

    python benchmarks/ptq_streamed.py                  # 28 layers
    python benchmarks/ptq_streamed.py --layers 2 --compare   # also the in-memory run: its files must be equal
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import add_record_flag, recording  # beside this script

QWEN_1_5B = {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "dtype": "bfloat16"}


def write_model(directory: Path, layers: int) -> int:
    """The model's config, random bfloat16 tensors (one shard per block) and a tokenizer; returns its parameters."""
    import safetensors.torch
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mase_lite.runtime.disk_weights import repeated_blocks
    import random

    from mase_lite.workloads.grammar import default_grammar
    from mase_lite.workloads.tokenizer import train_wordpiece

    fields = {k: v for k, v in QWEN_1_5B.items() if k != "model_type"}
    config = AutoConfig.for_model("qwen2", **{**fields, "num_hidden_layers": layers})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    prefix, blocks = repeated_blocks(model)
    tensors = dict(model.named_parameters())  # a tied tensor once, under its first name (the embedding's)
    parts = [[(n, t) for n, t in tensors.items() if not n.startswith(f"{prefix}.")]]
    parts += [[(n, t) for n, t in tensors.items() if n.startswith(f"{prefix}.{i}.")] for i in range(len(blocks))]
    generator = torch.Generator().manual_seed(0)
    index, count = {}, 0
    for i, part in enumerate(parts):
        tensors = {}
        for name, meta in part:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(meta.shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(meta.shape, generator=generator) * 0.02).to(torch.bfloat16)
            count += meta.numel()
        file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        safetensors.torch.save_file(tensors, str(directory / file), metadata={"format": "pt"})
        index.update({name: file for name in tensors})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    config.save_pretrained(str(directory))
    train_wordpiece(default_grammar().sample(2000, random.Random(0)), vocab_size=2000).save_pretrained(str(directory))
    return count


def spec(model_dir: Path, out: Path, stream: bool, steps: int | None = None) -> dict:
    weight = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "scale_dtype": "float16",
              "full_range": True}
    all_steps = [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": weight}}}},
                 {"pass": "gptq", "params": {"num_batches": 4, "batch_size": 4, "act_order": True}},
                 {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}}]
    return {"name": "streamed", "seed": 0, "device": "cpu", "capture": "modules",
            "model": {"task": "causal-lm", "pretrained": str(model_dir), "stream": stream},
            "data": {"dataset": "synthetic-grammar", "block_size": 128, "n_train": 16, "n_test": 8},
            "steps": all_steps[:steps], "output_dir": str(out)}


def run(run_spec: dict, tmp: Path, name: str, threads: int) -> tuple[float, dict]:
    """``mase-lite run --threads`` of ``run_spec`` in a fresh process: its peak RSS (bytes) and report."""
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(run_spec))
    # VmHWM, not ru_maxrss: Linux counts a forked child's copy of its parent's pages in the child's ru_maxrss
    code = ("import re, sys; from mase_lite.cli import main; code = main(['--quiet', '--threads', sys.argv[2], 'run', sys.argv[1]]); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1); "
            "print('PEAK', int(hwm) * 1024); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(threads)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    peak = int(next(line for line in proc.stdout.splitlines() if line.startswith("PEAK")).split()[1])
    return peak, json.loads((Path(run_spec["output_dir"]) / "report.json").read_text())


def equal_files(a: Path, b: Path) -> bool:
    import safetensors.torch
    import torch

    def tensors(d: Path) -> dict:
        out = {}
        for file in sorted(d.glob("*.safetensors")):
            out.update(safetensors.torch.load_file(str(file)))
        return out

    x, y = tensors(a), tensors(b)
    return sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=QWEN_1_5B["num_hidden_layers"])
    parser.add_argument("--compare", action="store_true", help="also run in memory and compare the exported files")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads of the runs")
    add_record_flag(parser)
    args = parser.parse_args()
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        model_dir = tmp / "model"
        model_dir.mkdir()
        t0 = time.perf_counter()
        params = write_model(model_dir, args.layers)
        written = time.perf_counter() - t0
        before = load()
        base, _ = run(spec(model_dir, tmp / "base", True, steps=1), tmp, "base", args.threads)
        peak, report = run(spec(model_dir, tmp / "disk", True), tmp, "disk", args.threads)
        steps = {s["pass"]: s for s in report["steps"]}
        f32 = params * 4
        out = tmp / "disk" / "hf"
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"| Qwen2.5-1.5B shape, {args.layers} layers, {args.threads} threads, {params / 1e9:.2f} B parameters (bf16 on disk "
              f"{params * 2 / 1e9:.2f} GB, written in {written:.0f} s) | streamed: gptq {steps['gptq']['seconds']:.0f} s, "
              f"export {steps['export']['seconds']:.0f} s ({len(list(out.glob('*.safetensors')))} shards, {size / 1e9:.2f} GB) | "
              f"peak RSS {peak / 1e9:.2f} GB = {peak / f32:.3f}x the float32 model ({f32 / 1e9:.2f} GB); the first step "
              f"alone {base / 1e9:.2f} GB | resident tensors at most {steps['gptq']['info']['streamed_peak_bytes'] / 1e6:.0f} MB "
              f"| load {before} -> {load()} |", flush=True)
        if args.compare:
            memory_peak, _ = run(spec(model_dir, tmp / "memory", False), tmp, "memory", args.threads)
            print(f"| in memory | peak RSS {memory_peak / 1e9:.2f} GB = {memory_peak / f32:.3f}x | exported files equal "
                  f"the streamed run's: {equal_files(tmp / 'memory' / 'hf', out)} |")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with recording("ptq_streamed"):
        main()
