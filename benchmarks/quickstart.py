"""Wall time of the quickstart pipeline, process start to exit, as a user runs it.

Run: python benchmarks/quickstart.py [--repeats 5]
Median of --repeats runs of `python -m mase_lite.cli run pipelines/quickstart.json` after one
warm-up run (which fills the OS file cache and the on-disk export cache); each run writes to a fresh
temporary directory. Timed twice: as users run it (the export loaded from the cache the warm-up
filled) and with the export cache off (`MASE_LITE_EXPORT_CACHE=0`: a first run's export).
The baseline is `python -c "import torch, transformers"` measured the same way in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from mase_lite.bench import timing

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], repeats: int, env: dict[str, str] | None = None) -> float:
    run = lambda: subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, env=env)  # noqa: E731
    return timing.median_seconds(run, torch.device("cpu"), warmup=1, repeats=repeats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = [sys.executable, "-m", "mase_lite.cli", "run", "pipelines/quickstart.json", "--output-dir", tmp]
        pipeline = timed(run, args.repeats)
        report = json.loads((Path(tmp) / "report.json").read_text())
        cold = timed(run, args.repeats, env={**os.environ, "MASE_LITE_EXPORT_CACHE": "0"})
    imports = timed([sys.executable, "-c", "import torch, transformers"], args.repeats)
    print(f"median of {args.repeats} after warm-up")
    print("| what | seconds |")
    print("|---|---|")
    print(f"| import torch, transformers (baseline) | {imports:.2f} |")
    print(f"| mase-lite run pipelines/quickstart.json | {pipeline:.2f} |")
    print(f"| the same, export cache off (a first run's export) | {cold:.2f} |")
    print(f"| of which, last run: data + model + capture | {report['capture']['seconds']:.2f} |")
    print(f"| of which, last run: the {len(report['steps'])} steps | {sum(s['seconds'] for s in report['steps']):.2f} |")


if __name__ == "__main__":
    main()
