"""Throughput of a mixed-precision PTQ search on the default tiny BERT, and the engine's share of it.

The pipeline trains the model (2 epochs on 1,000 synthetic samples), then per trial every Linear
gets a sampled format/width (a per-layer choice among integer 8/4, integer 4/2 and minifloat IEEE
e4m3) and the model is evaluated on 1,000 synthetic test samples. With the prefix cache (default)
the training, data, model build and capture run once and later trials start from a copy of the
trained graph; without it every trial is a whole pipeline run. The engine's overhead is the time of
a trial spent outside the pipeline run (storage, sampling, bookkeeping), measured by the engine
itself, as a share of the whole trial.

    python benchmarks/search.py --trials 40                 # one worker
    python benchmarks/search.py --trials 8 --no-cache       # every trial trains and captures
    python benchmarks/search.py --trials 40 --workers 2     # two `mase-lite search` processes
    python benchmarks/search.py --trials 40 --threads 1     # one torch thread per worker

"trials/min (wall)" counts everything from the start (imports, the first trial's training);
"trials/min (steady)" is 60 / the median complete trial's seconds (times the workers), the rate once
the prefix is cached; "median trial CPU s" is the process CPU time of a trial (both cores count), a
figure the machine's load changes less than wall time.

Prints a markdown table row (the figures in benchmarks/RESULTS.md come from this script).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import add_record_flag, recording  # beside this script

FORMATS = [
    {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4},
    {"name": "integer", "data_in_width": 4, "data_in_frac_width": 2, "weight_width": 4, "weight_frac_width": 2},
    {"name": "minifloat_ieee", "data_in_width": 8, "data_in_exponent_width": 4, "weight_width": 8, "weight_exponent_width": 4},
]


def search_spec(out: Path, trials: int, cache: bool = True) -> dict:
    pipeline = {
        "name": "mixed_precision_ptq",
        "seed": 0,
        "data": {"dataset": "synthetic-sentiment", "n_train": 1000, "n_test": 1000, "max_length": 32},
        "steps": [
            {"pass": "train", "params": {"epochs": 2, "batch_size": 32, "lr": 2e-3, "progress": False}},
            {"pass": "quantize", "params": {"by": "name", "rules": {}, "default": None}},
            {"pass": "avg_bits", "params": {"dims": {"batch": 1, "seq": 32}}},
            {"pass": "evaluate", "params": {"label": "ptq", "batch_size": 250, "progress": False}},
        ],
    }
    return {
        "pipeline": pipeline,
        "space": [
            {"path": "steps.quantize.params.rules.{node}", "nodes": {"op": "linear"}, "type": "choice", "values": FORMATS}
        ],
        "objectives": [{"metric": "ptq.accuracy"}, {"metric": "avg_bits.weights", "direction": "minimize"}],
        "sampler": {"name": "nsga2", "seed": 0},
        "n_trials": trials,
        "output_dir": str(out),
        "cache": cache,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--no-cache", action="store_true", help="turn the prefix cache off")
    parser.add_argument("--threads", type=int, help="torch CPU threads per worker (OMP_NUM_THREADS; default: torch's)")
    add_record_flag(parser)
    args = parser.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch is imported, here and in the workers
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "search"
        spec_path = Path(tmp) / "search.json"
        spec_path.write_text(json.dumps(search_spec(out, args.trials, cache=not args.no_cache)))
        t0 = time.perf_counter()
        cpu: list[float] = []  # process CPU seconds per trial (both cores count), one worker only
        if args.workers == 1:
            import mase_lite as ml
            from mase_lite.search import engine

            run_trial = engine.run_trial

            def timed(study, trial):
                c0 = time.process_time()
                try:
                    return run_trial(study, trial)
                finally:
                    cpu.append(time.process_time() - c0)

            engine.run_trial = timed
            result = ml.run_search(spec_path)
            overhead = result.studies[0].overhead
            loops = result.studies[0].loop_seconds
        else:
            cmd = [sys.executable, "-m", "mase_lite.cli", "search", str(spec_path)]
            workers = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(args.workers)]
            for w in workers:
                w.wait()
            overhead, loops = [], []
        wall = time.perf_counter() - t0
        report = json.loads((out / "search_report.json").read_text())
        trials = [t for t in report["studies"][0]["trials"] if t["state"] == "COMPLETE"]
        seconds = [t["metrics"]["trial.seconds"] for t in trials]
        # wall time includes the one-off import and space check; per-trial figures exclude it
        per_trial = statistics.median(seconds)
        share = statistics.median(o / s for o, s in zip(overhead, loops)) if overhead else float("nan")
        accuracy = [t["metrics"]["ptq.accuracy"] for t in trials]
        print(
            "| workers | threads | cache | complete trials | wall s | trials/min (wall) | median trial s | trials/min (steady) "
            "| median trial CPU s | engine overhead | accuracy range |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print(
            f"| {args.workers} | {args.threads or 'default'} | {'off' if args.no_cache else 'on'} | {len(trials)} | {wall:.1f} | "
            f"{60 * len(trials) / wall:.1f} | {per_trial:.2f} | {args.workers * 60 / per_trial:.1f} | "
            f"{statistics.median(cpu) if cpu else float('nan'):.2f} | {100 * share:.1f} % | {min(accuracy):.3f}–{max(accuracy):.3f} |"
        )


if __name__ == "__main__":
    with recording("search"):
        main()
