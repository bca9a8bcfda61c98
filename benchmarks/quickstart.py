"""Wall time of the quickstart pipeline, process start to exit, as a user runs it.

Run: python benchmarks/quickstart.py [--repeats 5]
Rounds of three commands timed in turn (`mase_lite.bench.timing.paired_seconds`), after one warm-up
round that fills the OS file cache and the on-disk export cache: the baseline `python -c "import torch,
transformers"`, `python -m mase_lite.cli run pipelines/quickstart.json` as users run it (the export
loaded from the cache), and the same with the export cache off (`MASE_LITE_EXPORT_CACHE=0`: a first
run's export). Medians of the seconds and of the per-round ratios to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from mase_lite.bench import timing
from record import add_record_flag, recording  # beside this script

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    add_record_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = [sys.executable, "-m", "mase_lite.cli", "run", "pipelines/quickstart.json", "--output-dir", tmp]
        cold_env = {**os.environ, "MASE_LITE_EXPORT_CACHE": "0"}
        commands = {"baseline": ([sys.executable, "-c", "import torch, transformers"], None),
                    "run": (run, None), "cold": (run, cold_env)}
        fns = [lambda cmd=cmd, env=env: subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, env=env)
               for cmd, env in commands.values()]
        base, warm, cold = timing.paired_seconds(fns, torch.device("cpu"), warmup=1, repeats=args.repeats)
        report = json.loads((Path(tmp) / "report.json").read_text())  # the last run: the export cache off
    print(f"median of {args.repeats} rounds (the three commands in turn each round) after one warm-up round")
    print("| what | seconds | / baseline |")
    print("|---|---|---|")
    print(f"| import torch, transformers (baseline) | {statistics.median(base):.2f} | 1 |")
    print(f"| mase-lite run pipelines/quickstart.json | {statistics.median(warm):.2f} | "
          f"{timing.median_ratio(warm, base):.2f} |")
    print(f"| the same, export cache off (a first run's export) | {statistics.median(cold):.2f} | "
          f"{timing.median_ratio(cold, base):.2f} |")
    print(f"| of which, last run (cache off): data + model + capture | {report['capture']['seconds']:.2f} | |")
    print(f"| of which, last run: the {len(report['steps'])} steps | {sum(s['seconds'] for s in report['steps']):.2f} | |")


if __name__ == "__main__":
    with recording("quickstart"):
        main()
