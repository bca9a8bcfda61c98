"""The task targets: train the shipped task pipelines on their default data, and evaluate a large Llama.

* ``llm``: ``pipelines/tasks/llm.json`` (Llama 4 x 256, the grammar corpus): train seconds, test
  perplexity against the corpus's bound, and the change MXINT8 PTQ of every Linear makes;
* ``cnn`` / ``vit``: ``pipelines/tasks/cnn.json`` / ``vit.json`` on the drawn shapes: train seconds and
  test accuracy (float, and integer-8 PTQ as the pipelines ship);
* ``big-eval``: perplexity of a Llama built from a config (random weights; hidden 2048, 16 layers,
  32 heads, 8 KV heads, FFN 5632, vocab 32000: 0.85 B parameters incl. embeddings) on 32 windows of 128
  tokens, through the pipeline (capture, then the ``evaluate`` pass), in a fresh process whose peak
  resident memory is read from the kernel, against the bytes of the model's weights.

    python benchmarks/tasks.py llm cnn vit      # each a full run of the shipped spec
    python benchmarks/tasks.py big-eval

Prints a markdown table (the figures in benchmarks/RESULTS.md and pipelines/TASKS.md come from it),
with the machine's load average before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import add_record_flag, recording  # beside this script

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "pipelines" / "tasks"
BIG = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
       "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_spec(name: str, out: Path) -> dict:
    import mase_lite as ml

    before = load()
    t0 = time.perf_counter()
    report = ml.run_pipeline(TASKS / f"{name}.json", output_dir=out).report
    wall = time.perf_counter() - t0
    train = next(s for s in report["steps"] if s["pass"] == "train")
    return {"report": report, "wall": wall, "train": train["info"]["seconds"], "load": f"{before} -> {load()}"}


def bench_llm(out: Path) -> list[str]:
    r = run_spec("llm", out / "llm")
    m = r["report"]["metrics"]
    fp, q = m["fp32"], m["ptq"]
    return [
        f"| llm (Llama 4x256) | {r['train']:.1f} | perplexity {fp['perplexity']:.3f}, bound {fp['perplexity_bound']:.3f} "
        f"(x{fp['perplexity'] / fp['perplexity_bound']:.3f}), entropy rate {fp['perplexity_entropy_rate']:.3f}; "
        f"MXINT8 PTQ {q['perplexity']:.3f} ({100 * (q['perplexity'] / fp['perplexity'] - 1):+.3f} %) | {r['wall']:.0f} | {r['load']} |"
    ]


def bench_vision(name: str, out: Path) -> list[str]:
    r = run_spec(name, out / name)
    m = r["report"]["metrics"]
    return [
        f"| {name} | {r['train']:.1f} | accuracy {m['fp32']['accuracy']:.3f} (top-5 {m['fp32']['top5']:.3f}); "
        f"integer-8 PTQ {m['quantized']['accuracy']:.3f} | {r['wall']:.0f} | {r['load']} |"
    ]


def big_eval_child(out: str) -> None:
    """In its own process: the pipeline, then the peak resident memory (ru_maxrss) and the weights' bytes."""
    import mase_lite as ml

    spec = {"name": "big-eval", "seed": 0, "device": "cpu",
            "model": {"task": "causal-lm", "hf_config": BIG},
            "data": {"dataset": "synthetic-grammar", "block_size": 128, "n_train": 1, "n_test": 32},
            "steps": [{"pass": "evaluate", "params": {"batch_size": 4, "progress": False}}],
            "output_dir": out}
    t0 = time.perf_counter()
    result = ml.run_pipeline(spec)
    wall = time.perf_counter() - t0
    params = sum(p.numel() * p.element_size() for p in result.mg.source_model.parameters())
    report = result.report
    print(json.dumps({"weights": params, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "wall": wall,
                      "capture": report["capture"]["seconds"],
                      "evaluate": next(s for s in report["steps"] if s["pass"] == "evaluate")["seconds"],
                      "tokens": report["metrics"]["evaluate"]["tokens"], "perplexity": report["metrics"]["evaluate"]["perplexity"]}))


def bench_big_eval(out: Path) -> list[str]:
    before = load()
    proc = subprocess.run([sys.executable, __file__, "_big-eval-child", str(out / "big")], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return [
        f"| big-eval (Llama 0.85 B, 32 x 128 tokens, batch 4) | capture {r['capture']:.1f}, evaluate {r['evaluate']:.1f} | "
        f"peak RSS {r['peak'] / 1e9:.2f} GB = {r['peak'] / r['weights']:.2f}x the weights ({r['weights'] / 1e9:.2f} GB); "
        f"{r['tokens']} tokens, perplexity {r['perplexity']:.0f} | {r['wall']:.0f} | {before} -> {load()} |"
    ]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "_big-eval-child":
        big_eval_child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", choices=["llm", "cnn", "vit", "big-eval"])
    add_record_flag(parser)
    args = parser.parse_args()
    rows = ["| run | train s | figures | wall s | load (1/5/15 min) before -> after |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for what in args.what:
            if what == "llm":
                rows += bench_llm(out)
            elif what == "big-eval":
                rows += bench_big_eval(out)
            else:
                rows += bench_vision(what, out)
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    with recording("tasks"):
        main()
