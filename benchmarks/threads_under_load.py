"""The packed MXINT8 Linear (4096 x 4096 with bias) at 1 and 2 threads, quiet and beside two busy processes.

For each setting (adaptive thread choice on, the default; and off: every call on torch's thread count), in a fresh
process: batch 1, 8 and 64, the median of 40 calls after 10 warm-up calls (the adaptive choice probes during the
warm-up). Then the same with two busy processes (``while True: pass``) started by this script. Prints the
milliseconds and the ratio of 2 threads to 1.

    python benchmarks/threads_under_load.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from busy import busy_processes  # beside this script
from record import add_record_flag, recording  # beside this script

CHILD = """
import json, time, torch
from mase_lite.kernels.mxint8 import mxint8_linear, quantize
torch.manual_seed(0)
codes, scales = quantize(torch.randn(4096, 4096))
bias = torch.randn(4096)
out = {}
for threads in (1, 2):
    torch.set_num_threads(threads)
    for batch in (1, 8, 64):
        x = torch.randn(batch, 4096)
        for _ in range(10):
            mxint8_linear(x, codes, scales, bias, 32)
        times = []
        for _ in range(40):
            start = time.perf_counter()
            mxint8_linear(x, codes, scales, bias, 32)
            times.append(time.perf_counter() - start)
        out[f"{threads},{batch}"] = sorted(times)[len(times) // 2] * 1e3
print(json.dumps(out))
"""


def measure(adaptive: bool) -> dict[str, float]:
    env = {**os.environ, "MASE_LITE_ADAPTIVE_THREADS": "1" if adaptive else "0"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(label: str, results: dict[bool, dict[str, float]]) -> None:
    print(f"\n{label}")
    print("| adaptive | batch | 1 thread (ms) | 2 threads (ms) | 2 / 1 |")
    print("|---|---|---|---|---|")
    for adaptive, r in results.items():
        for batch in (1, 8, 64):
            one, two = r[f"1,{batch}"], r[f"2,{batch}"]
            print(f"| {'on' if adaptive else 'off'} | {batch} | {one:.3f} | {two:.3f} | {two / one:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_flag(parser)
    parser.parse_args()
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    print(f"load average before: {load()}")
    table("quiet", {adaptive: measure(adaptive) for adaptive in (True, False)})
    with busy_processes(2):
        table("beside two busy processes", {adaptive: measure(adaptive) for adaptive in (True, False)})
        print(f"\nload average with the busy processes: {load()}")


if __name__ == "__main__":
    with recording("threads_under_load"):
        main()
