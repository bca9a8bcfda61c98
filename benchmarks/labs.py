"""Run the shipped lab searches at their shipped size and copy their plots into docs/labs/ (the figures
pipelines/README.md shows, so the docs show what the specs produce).

    OMP_NUM_THREADS=1 python benchmarks/labs.py                        # all seven labs
    OMP_NUM_THREADS=1 python benchmarks/labs.py lab3_formats           # some of them

Each lab runs as ``mase-lite search pipelines/labs/<lab>.json`` from the repository root, into its
``output_dir`` (``runs/<lab>``), which is removed first so every trial runs. Prints per lab the wall
time, the load average before and after, and each study's best value.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "pipelines" / "labs"
DOCS = ROOT / "docs" / "labs"
# the plot each lab writes -> its name in docs/labs
PLOTS = {
    "lab1_quantize": {"accuracy_vs_width.png": "lab1_accuracy_vs_width.png"},
    "lab1_prune_sweep": {"accuracy_vs_sparsity.png": "lab1_accuracy_vs_sparsity.png"},
    "lab2_nas": {"best_search.accuracy.png": "lab2_nas_best.png"},
    "lab2_compression_aware": {"best_search.accuracy.png": "lab2_compression_aware_best.png"},
    "lab3_mixed_integer": {"accuracy_vs_bits.png": "lab3_mixed_integer_accuracy_vs_bits.png"},
    "lab3_formats": {"best_quantized.accuracy.png": "lab3_formats_best.png",
                     "accuracy_vs_bits.png": "lab3_formats_accuracy_vs_bits.png"},
    "lab3_pareto": {"pareto.png": "lab3_pareto.png"},
}


def run(lab: str) -> None:
    spec = json.loads((LABS / f"{lab}.json").read_text())
    out = ROOT / spec["output_dir"]
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mase_lite.cli", "search", str(LABS / f"{lab}.json")], cwd=ROOT, check=True,
                   env={**os.environ, "TQDM_DISABLE": "1"})
    minutes = (time.perf_counter() - start) / 60
    report = json.loads((out / "search_report.json").read_text())
    for source, target in PLOTS[lab].items():
        shutil.copyfile(out / source, DOCS / target)
    print(f"{lab}: {minutes:.1f} min, load {load:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    for study in report["studies"]:
        best = study.get("best") or {}
        front = [t["values"] for t in study.get("pareto_front") or []]
        shown = f"best {best.get('values')} (trial {best.get('number')})" if best else f"front {front}"
        print(f"  {study['name']}: {study['states']} {shown}")


def main() -> None:
    from record import add_record_flag  # beside this script; here, as tests load this file by its path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labs", nargs="*", metavar="LAB", help=f"labs to run (default: all): {', '.join(PLOTS)}")
    add_record_flag(parser)
    labs = parser.parse_args().labs or list(PLOTS)
    unknown = [lab for lab in labs if lab not in PLOTS]
    if unknown:
        parser.error(f"unknown lab(s) {', '.join(unknown)}; labs: {', '.join(PLOTS)}")
    for lab in labs:
        run(lab)


if __name__ == "__main__":
    from record import recording  # beside this script

    with recording("labs"):
        main()
