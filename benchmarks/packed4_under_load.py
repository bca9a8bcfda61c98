"""A packed Linear (Q4_0 by default, 4096 x 4096 with bias) at 1 and 2 threads beside two busy processes this script
starts (``while True: pass``), float32 ``F.linear`` beside it: batch 1, 8 and 64. One and two threads alternate in
``--rounds`` rounds (the load drifts: two counts timed minutes apart are not comparable), each a blocked autorange
of at least 0.3 s after a warm-up call; prints the median milliseconds and the median and range of the per-round
ratio of 2 threads to 1.

    python benchmarks/packed4_under_load.py [--rounds 7]
    python benchmarks/packed4_under_load.py --format mxint8 --activations int8 --batches 1
"""

import argparse
import os
import statistics

import torch
from torch.utils import benchmark

from busy import busy_processes  # beside this script
from mase_lite.kernels import mxint8, packed4


def timed(call, threads: int) -> float:
    torch.set_num_threads(threads)
    with torch.no_grad():
        call()
        timer = benchmark.Timer("call()", globals={"call": call}, num_threads=threads)
        return timer.blocked_autorange(min_run_time=0.3).median * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--format", choices=["q4_0", "mxint4", "mxfp4", "mxint8"], default="q4_0")
    parser.add_argument("--activations", choices=["float", "int8"], default="float")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()
    with busy_processes(2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096))
        weight, bias = model[0].weight.detach().clone(), model[0].bias.detach().clone()
        if args.format == "mxint8":
            mxint8.pack_linears(model, activations=args.activations)
        else:
            packed4.pack_linears(model, args.format, activations=args.activations)
        layer = model[0]
        print(f"load average {os.getloadavg()[0]:.2f}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
        print("| batch | layer | 1 thread ms | 2 threads ms | 2 / 1 (median of rounds) | range |\n|---:|---|---:|---:|---:|---|")
        label = f"{args.format} packed" + (", int8 activations" if args.activations == "int8" else "")
        for batch in args.batches:
            x = torch.randn(batch, 4096)
            calls = {label: lambda: layer(x), "float32 F.linear": lambda: torch.nn.functional.linear(x, weight, bias)}
            for name, call in calls.items():
                ms = {1: [], 2: []}
                for _ in range(args.rounds):
                    for threads in (1, 2):
                        ms[threads].append(timed(call, threads))
                ratios = [b / a for a, b in zip(ms[1], ms[2])]
                print(f"| {batch} | {name} | {statistics.median(ms[1]):.3f} | {statistics.median(ms[2]):.3f} | "
                      f"{statistics.median(ratios):.2f} | {min(ratios):.2f}–{max(ratios):.2f} |")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
