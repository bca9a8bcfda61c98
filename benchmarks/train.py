"""Seconds per epoch of the default fine-tune (``pipelines/finetune.json``'s model, data and train step).

The model and data are built and captured once; each timed run restores the initial weights and
runs the ``train`` pass for one epoch, so every run does the same work. The figure is the median
of ``--runs`` runs after a warm-up of ``--warmup-steps`` steps; each run's test accuracy is
printed as a check that the work is the real one.

    python benchmarks/train.py                    # torch's default thread count
    python benchmarks/train.py --threads 1 --runs 5

Prints a markdown table (the figures in benchmarks/RESULTS.md come from this script).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

import mase_lite as ml
from mase_lite.workloads import prepare
from record import add_record_flag, recording  # beside this script

PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "finetune.json"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="timed epochs")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed training steps first")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    add_record_flag(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = json.loads(PIPELINE.read_text())
    train_params = next(s["params"] for s in spec["steps"] if s["pass"] == "train")
    with tempfile.TemporaryDirectory() as run_dir:
        t0 = time.perf_counter()
        model, data = prepare(spec["model"], spec["data"], Path(run_dir), spec["seed"])
        prepared = time.perf_counter() - t0
        t0 = time.perf_counter()
        mg = ml.MaseGraph(model, hf_input_names=data.input_names)
        captured = time.perf_counter() - t0
        mg.data, mg.run_dir = data, Path(run_dir)
        initial = {k: v.clone() for k, v in mg.model.state_dict().items()}
        ml.passes.train(mg, {**train_params, "max_steps": args.warmup_steps, "progress": False})
        rows = []
        for _ in range(args.runs):
            mg.model.load_state_dict(initial)
            t0 = time.perf_counter()
            _, info = ml.passes.train(mg, {**train_params, "progress": False})
            seconds = time.perf_counter() - t0
            _, evaluated = ml.passes.evaluate(mg, {"progress": False})
            rows.append((seconds, info["steps"], info["samples"], evaluated["metrics"]["accuracy"]))
    epoch = statistics.median(r[0] for r in rows)
    steps, samples = rows[0][1], rows[0][2]
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}, "
          f"prepare {prepared:.2f} s, capture {captured:.2f} s")
    print("| run | epoch s | steps/s | rows/s | test accuracy |")
    print("|---:|---:|---:|---:|---:|")
    for i, (seconds, n_steps, n_rows, accuracy) in enumerate(rows, start=1):
        print(f"| {i} | {seconds:.2f} | {n_steps / seconds:.1f} | {n_rows / seconds:.0f} | {accuracy:.3f} |")
    print(f"\nmedian epoch: {epoch:.2f} s ({steps} steps of {train_params['batch_size']} rows, {samples} rows)")


if __name__ == "__main__":
    with recording("train"):
        main()
