"""Post-training quantization at scale: GPTQ against its compute floor, memory and held-out layer error.

In a fresh process: build a Llama from a config (random weights: nothing can be downloaded) and the grammar
corpus in windows of 128 tokens; in module mode (no capture), quantize every Linear but the head to 4-bit
``scaled_integer`` in groups of 128 (float16 scales; ``--grid full``: compressed-tensors' -8..7 grid, the
default; ``symmetric``: ±7), then run ``gptq`` (act-order, damp 0.01) block by block over the calibration
windows. Prints:

- the GPTQ seconds against the compute floor: the FLOPs of one Hessian per distinct layer input (``2 T n²``
  for ``T`` tokens), its factorisation and inverse (``2/3 n³``), the column updates (``rows · n²`` per layer)
  and two forwards of each block (``4 T`` times its parameters), at the float32 GEMM rate (``torch.mm`` of
  2048² matrices, median of a blocked autorange) measured just before, in the parent process;
- the peak resident memory (ru_maxrss) of the whole process and above the process after its imports,
  against the float32 weights;
- the held-out layer error: over test windows the float model has not been calibrated on, each quantized
  Linear's ``||X (W - Q)ᵀ||² / ||X Wᵀ||²`` summed over layers (``X``: its input in the float model), for GPTQ
  and for rounding.

    python benchmarks/ptq.py                       # the 156 M Llama (hidden 1024, 8 layers, FFN 2816)
    python benchmarks/ptq.py --model 0.85b --batches 4
    python benchmarks/ptq.py --layers 2 --grid symmetric

The smaller PTQ figures (the trained Llama: RTN vs GPTQ, W8A8 with and without SmoothQuant; BERT's
calibrated width sweep) come from the shipped searches ``pipelines/tasks/llm_gptq_sweep.json``,
``llm_smoothquant.json`` and ``pipelines/labs/lab1_quantize_calibrated.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from record import add_record_flag, recording  # beside this script

MODELS = {
    "156m": {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
             "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 2048},
    "0.85b": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048},
}
WINDOW = 128


def weight_format(grid: str) -> dict:
    return {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "scale_dtype": "float16",
            "full_range": grid == "full"}


def spec(config: dict, batches: int, steps: list, name: str, out_dir: str) -> dict:
    """A pipeline of ``steps`` on the Llama of ``config`` (random weights, seed 0) and the grammar corpus, with
    ``batches`` batches of 4 calibration windows of ``WINDOW`` tokens and 8 test windows."""
    return {"name": name, "seed": 0, "device": "cpu", "capture": "modules",
            "model": {"task": "causal-lm", "hf_config": config},
            "data": {"dataset": "synthetic-grammar", "block_size": WINDOW, "n_train": batches * 4, "n_test": 8},
            "steps": steps, "output_dir": out_dir}


def gptq_steps(grid: str, batches: int) -> tuple[dict, dict]:
    """Every Linear but the head quantized to W4 in groups of 128 on ``grid``, then GPTQ (act-order) over the
    calibration batches."""
    quantize = {"pass": "quantize", "params": {"by": "type", "rules": {"head": None,
                                                                        "linear": {"weight": weight_format(grid)}}}}
    return quantize, {"pass": "gptq", "params": {"num_batches": batches, "batch_size": 4, "act_order": True}}


def gemm_rate() -> float:
    import torch
    from torch.utils import benchmark

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    timer = benchmark.Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b})
    return 2 * 2048**3 / timer.blocked_autorange(min_run_time=1.0).median


def floor_flops(config: dict, tokens: int) -> float:
    """The floor's FLOPs for every decoder layer's Linears (see the module docstring)."""
    h, f = config["hidden_size"], config["intermediate_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    inputs = {"attention": (h, h + 2 * kv), "o": (h, h), "mlp": (h, 2 * f), "down": (f, h)}  # n, rows sharing it
    per_layer = sum(2 * tokens * n * n + 2 / 3 * n**3 + rows * n * n for n, rows in inputs.values())
    params = sum(n * rows for n, rows in inputs.values())
    return config["num_hidden_layers"] * (per_layer + 2 * 2 * tokens * params)


def held_out_error(float_model, model, batches) -> float:
    """Σ ||X (W - Q)ᵀ||² / Σ ||X Wᵀ||² over the quantized Linears, X their inputs in the float model."""
    import torch

    quantized = {name: m for name, m in model.named_modules() if getattr(m, "weight_quantizer", None) is not None}
    sums = [0.0, 0.0]
    hooks = []
    for name, module in float_model.named_modules():
        if name in quantized:
            q = quantized[name]._operand("weight", quantized[name].weight).detach()

            def hook(m, args, q=q):
                x = args[0].reshape(-1, args[0].shape[-1])
                sums[0] += float((x @ (m.weight - q).t()).square().sum())
                sums[1] += float((x @ m.weight.t()).square().sum())
            hooks.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        for batch in batches:
            float_model(input_ids=batch)
    for handle in hooks:
        handle.remove()
    return sums[0] / sums[1]


def child(out: str, model_name: str, batches: int, layers: int, grid: str, rate: float) -> None:
    import torch  # noqa: F401  (the imports' memory is the baseline: torch, transformers' Llama, the passes)
    from transformers import LlamaForCausalLM  # noqa: F401

    import mase_lite as ml
    import mase_lite.passes  # noqa: F401

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    config = {**MODELS[model_name], "num_hidden_layers": layers}

    def run(steps, name):
        return ml.run_pipeline(spec(config, batches, steps, name, f"{out}/{name}"))

    quantize, gptq = gptq_steps(grid, batches)
    result = run([quantize, gptq], "gptq")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    steps = {s["pass"]: s for s in result.report["steps"]}
    info = steps["gptq"]["info"]
    weights = sum(p.numel() * p.element_size() for p in result.mg.model.parameters())
    test = [batch["input_ids"] for batch in result.data.loader("test", 4)]
    float_model = run([], "float").mg.model.eval()
    rtn = run([quantize], "rtn").mg.model.eval()
    tokens = batches * 4 * WINDOW
    print(json.dumps({"weights": weights, "peak": peak, "base": base_rss, "gptq": steps["gptq"]["seconds"],
                      "floor": floor_flops(config, tokens) / rate, "rate": rate / 1e9, "layers": len(info["layers"]),
                      "together": len(info["together"]), "tokens": tokens,
                      "held_out": held_out_error(float_model, result.mg.model, test),
                      "held_out_rtn": held_out_error(float_model, rtn, test)}))


def main() -> None:
    if len(sys.argv) == 8 and sys.argv[1] == "_child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], float(sys.argv[7]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="156m")
    parser.add_argument("--batches", type=int, default=4, help="calibration batches of 4 windows of 128 tokens")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    parser.add_argument("--grid", choices=["full", "symmetric"], default="full")
    add_record_flag(parser)
    args = parser.parse_args()
    layers = args.layers or MODELS[args.model]["num_hidden_layers"]
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    before = load()
    rate = gemm_rate()  # here: its buffers and timer would count in the run's peak memory
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, __file__, "_child", str(Path(tmp) / "run"), args.model, str(args.batches),
                               str(layers), args.grid, str(rate)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"| Llama {args.model}, {layers} layers, {r['layers']} Linears ({r['together']} shared sweeps), {r['tokens']} "
          f"tokens, {args.grid} grid | gptq {r['gptq']:.1f} s = {r['gptq'] / r['floor']:.2f}x the floor ({r['floor']:.1f} s "
          f"at {r['rate']:.0f} GFLOP/s) | peak RSS {r['peak'] / 1e9:.2f} GB = {r['peak'] / r['weights']:.2f}x the float32 "
          f"weights ({r['weights'] / 1e9:.2f} GB); above the imports {(r['peak'] - r['base']) / r['weights']:.2f}x | "
          f"held-out layer error {r['held_out']:.4f} (rounding {r['held_out_rtn']:.4f}) | load {before} -> {load()} |")


if __name__ == "__main__":
    with recording("ptq"):
        main()
