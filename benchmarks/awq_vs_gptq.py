"""AWQ against GPTQ on a real model, the same weights format and calibration set: each pass's seconds and the
held-out perplexity after it (llama.cpp's chunks of 512 on the data's test split), each run in a fresh process, the
methods interleaved.

    python benchmarks/awq_vs_gptq.py --gguf float.gguf --calibration calibration.txt --out runs/awq [--rounds 2]

The format is 4-bit symmetric groups of 128 (``scaled_integer``, the field's W4 g128); calibration 4 batches of
4 windows of 512 tokens. AWQ needs the captured graph (it folds its scales into the producers); GPTQ runs on modules.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from figures import cpu_model, spread  # beside this script
from record import add_record_flag, recording  # beside this script

W4G128 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128}


def spec(method: str, gguf: Path, calibration: Path, out: Path) -> dict:
    steps = [{"pass": "quantize", "params": {"by": "type", "ignore": ["lm_head"], "rules": {"linear": {"weight": W4G128}}}},
             {"pass": method, "params": {"num_batches": 4, "batch_size": 4}},
             {"pass": "evaluate", "params": {"protocol": "chunks", "context": 512, "label": "held_out", "progress": False}}]
    if method == "float":
        steps = steps[-1:]
    return {"name": method, "seed": 0, "output_dir": str(out / method), "capture": "graph" if method == "awq" else "modules",
            "model": {"pretrained": str(gguf), "task": "causal-lm"},
            "data": {"dataset": "txt", "path": str(calibration), "block_size": 512}, "steps": steps}


def one(method: str, gguf: Path, calibration: Path, out: Path) -> None:
    """Run one method's pipeline here; print its pass seconds and held-out perplexity as JSON."""
    import mase_lite as ml

    report = ml.run_pipeline(spec(method, gguf, calibration, out)).report
    seconds = next((s["seconds"] for s in report["steps"] if s["pass"] == method), 0.0)
    print(json.dumps({"seconds": seconds, "perplexity": report["metrics"]["held_out"]["perplexity"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", choices=["float", "gptq", "awq"], help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args()
    if args.one:
        return one(args.one, args.gguf, args.calibration, args.out)
    print(f"cpu: {cpu_model()}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    runs: dict[str, list[dict]] = {"float": [], "gptq": [], "awq": []}
    for method in ["float"] + ["gptq", "awq"] * args.rounds:
        command = [sys.executable, __file__, "--gguf", str(args.gguf), "--calibration", str(args.calibration),
                   "--out", str(args.out), "--one", method]
        line = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        runs[method].append(json.loads(line))
        print(method, runs[method][-1], f"load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"float held-out perplexity {runs['float'][0]['perplexity']:.4f}")
    for method in ("gptq", "awq"):
        seconds = [r["seconds"] for r in runs[method]]
        perplexities = sorted({f"{r['perplexity']:.4f}" for r in runs[method]})
        print(f"{method}: {spread(seconds, 1)} s, held-out perplexity {' / '.join(perplexities)}")
    ratios = [a["seconds"] / g["seconds"] for a, g in zip(runs["awq"], runs["gptq"])]
    print(f"AWQ / GPTQ wall: {spread(ratios)}")


if __name__ == "__main__":
    with recording("awq_vs_gptq"):
        main()
