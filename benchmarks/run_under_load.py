"""A whole run beside busy processes: ``mase-lite run SPEC`` with the CLI's default threads and with each
``--threads`` count, one after the other, while ``--busy`` processes (``while True: pass``) started by this script
hold the cores; prints each run's wall seconds, the threads its report records, and its ratio to the fastest.

    python benchmarks/run_under_load.py pipelines/tasks/llm.json --busy 2 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from busy import busy_processes  # beside this script
from record import add_record_flag, recording  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="explicit --threads settings to compare")
    add_record_flag(parser)
    args = parser.parse_args()
    settings = [None, *args.threads]
    rows = []
    with busy_processes(args.busy):
        for threads in settings:
            out = Path(tempfile.mkdtemp(prefix="run_under_load_"))
            spec = json.loads(Path(args.spec).read_text())
            spec["output_dir"] = str(out / "run")
            (out / "spec.json").write_text(json.dumps(spec))
            argv = ["mase-lite", *(["--threads", str(threads)] if threads else []), "run", str(out / "spec.json")]
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MASE_LITE_THREADS")}
            load = os.getloadavg()[0]
            start = time.perf_counter()
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            report = out / "run" / "report.json"
            recorded = json.loads(report.read_text()).get("threads") if report.is_file() else None
            rows.append((threads, seconds, recorded, done.returncode, load))
    best = min(r[1] for r in rows if r[3] == 0)
    print(f"{args.spec} beside {args.busy} busy processes on {os.cpu_count()} cores")
    print("| threads asked | threads recorded | exit | load at start | wall s | / fastest |\n|---|---|---:|---:|---:|---:|")
    for threads, seconds, recorded, code, load in rows:
        print(f"| {threads or 'default'} | {json.dumps(recorded)} | {code} | {load:.1f} | {seconds:.1f} | {seconds / best:.2f} |")


if __name__ == "__main__":
    with recording("run_under_load"):
        main()
