"""Post-training quantization at scale: GPTQ over a 0.85 B-parameter Llama built from a config.

In a fresh process: build the Llama (hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 5632, vocab 32000;
random weights) and the grammar corpus in windows of 128 tokens, capture it, quantize every Linear
but the head to 4-bit scaled integers (groups of 128), then run the ``gptq`` pass over the calibration
batches, block by block. Prints the seconds of each step, the peak resident memory (ru_maxrss) against
the bytes of the model's weights, and GPTQ's layer-output error against rounding's.

    python benchmarks/ptq.py                     # 8 batches of 4 windows
    python benchmarks/ptq.py --batches 4 --layers 4

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

BIG = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
       "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048}
W4 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "scale_dtype": "float16"}


def child(out: str, batches: int, layers: int) -> None:
    import mase_lite as ml

    spec = {"name": "big-gptq", "seed": 0, "device": "cpu",
            "model": {"task": "causal-lm", "hf_config": {**BIG, "num_hidden_layers": layers}},
            "data": {"dataset": "synthetic-grammar", "block_size": 128, "n_train": batches * 4, "n_test": 1},
            "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": W4}}}},
                      {"pass": "gptq", "params": {"num_batches": batches, "batch_size": 4, "act_order": True}}],
            "output_dir": out}
    result = ml.run_pipeline(spec)
    weights = sum(p.numel() * p.element_size() for p in result.mg.source_model.parameters())
    steps = {s["pass"]: s for s in result.report["steps"]}
    info = steps["gptq"]["info"]
    print(json.dumps({"weights": weights, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "capture": result.report["capture"]["seconds"], "quantize": steps["quantize"]["seconds"],
                      "gptq": steps["gptq"]["seconds"], "error": info["error"], "rtn_error": info["rtn_error"],
                      "layers": len(info["layers"]), "rows": info["calibration_rows"]}))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "_child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=8, help="calibration batches of 4 windows of 128 tokens")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers (16: 0.85 B parameters)")
    args = parser.parse_args()
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, __file__, "_child", str(Path(tmp) / "run"), str(args.batches), str(args.layers)],
                              capture_output=True, text=True, check=True)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"| Llama {r['weights'] / 4e9:.2f} B, {r['layers']} Linears, {r['rows']} windows of 128 tokens | capture {r['capture']:.0f} s, "
          f"quantize {r['quantize']:.1f} s, gptq {r['gptq']:.0f} s | peak RSS {r['peak'] / 1e9:.2f} GB = {r['peak'] / r['weights']:.2f}x "
          f"the weights ({r['weights'] / 1e9:.2f} GB) | layer-output error {r['error']:.4g} vs rounding {r['rtn_error']:.4g} "
          f"({r['error'] / r['rtn_error']:.3f}) | load {before} -> {load()} |")


if __name__ == "__main__":
    main()
