"""The packed 4-bit Linear (Q4_0, 4096 x 4096 with bias) at 1 and 2 threads beside two busy processes this script
starts (``while True: pass``): batch 1, 8 and 64, the median of a blocked autorange of at least 1 s after a warm-up
call; prints the milliseconds and the ratio of 2 threads to 1.

    python benchmarks/packed4_under_load.py
"""

import os
import subprocess
import sys

import torch
from torch.utils import benchmark

from mase_lite.kernels import packed4


def main() -> None:
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096))
        packed4.pack_linears(model, "q4_0")
        layer = model[0]
        print(f"load average {os.getloadavg()[0]:.2f}\n| batch | 1 thread ms | 2 threads ms | 2 / 1 |\n|---:|---:|---:|---:|")
        for batch in (1, 8, 64):
            x, res = torch.randn(batch, 4096), {}
            for threads in (1, 2):
                torch.set_num_threads(threads)
                with torch.no_grad():
                    layer(x)
                    timer = benchmark.Timer("layer(x)", globals={"layer": layer, "x": x}, num_threads=threads)
                    res[threads] = timer.blocked_autorange(min_run_time=1.0).median * 1e3
            print(f"| {batch} | {res[1]:.3f} | {res[2]:.3f} | {res[2] / res[1]:.2f} |")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        for process in busy:
            process.kill()


if __name__ == "__main__":
    main()
