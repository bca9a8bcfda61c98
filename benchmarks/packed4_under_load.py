"""A packed Linear (Q4_0 by default, 4096 x 4096 with bias) at 1 and 2 threads beside two busy processes this script
starts (``while True: pass``), float32 ``F.linear`` beside it: batch 1, 8 and 64.

Each of ``--rounds`` rounds times the call on 1 thread, on 2, and on 1 again (the control: what the load's drift
alone makes of two timings of the same thing), in an order that turns round by round; each a blocked autorange of at
least ``--seconds`` after a warm-up call, its mean (a stall counts: throughput pays for it). Prints the median
milliseconds, the median per-round ratio of 2 threads to 1 with the interval that holds the true median with 95 %
confidence (order statistics), and the same for the control.

    python benchmarks/packed4_under_load.py [--rounds 21]
    python benchmarks/packed4_under_load.py --format mxint8 --activations int8 --batches 1
"""

import argparse
import math
import os
import statistics

import torch
from torch.utils import benchmark

from busy import busy_processes  # beside this script
from mase_lite.kernels import mxint8, packed4
from record import add_record_flag, recording  # beside this script


def timed(call, threads: int, seconds: float) -> float:
    torch.set_num_threads(threads)
    with torch.no_grad():
        call()
        timer = benchmark.Timer("call()", globals={"call": call}, num_threads=threads)
        return timer.blocked_autorange(min_run_time=seconds).mean * 1e3


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The order statistics that hold the median of the values' distribution with ``confidence``.

    >>> median_interval([float(v) for v in range(1, 22)])
    (6.0, 16.0)
    """
    ordered, n = sorted(values), len(values)
    below = 0.0  # P(fewer than j of n values fall below the median)
    for j in range(n // 2 + 1):
        step = math.comb(n, j) / 2**n
        if below + step > (1 - confidence) / 2:
            return ordered[max(j - 1, 0)], ordered[min(n - j, n - 1)]
        below += step
    return ordered[0], ordered[-1]


def ratio_cell(ratios: list[float]) -> str:
    low, high = median_interval(ratios)
    return f"{statistics.median(ratios):.2f} ({low:.2f}–{high:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--seconds", type=float, default=0.2, help="least time of each timing")
    parser.add_argument("--format", choices=["q4_0", "mxint4", "mxfp4", "mxint8"], default="q4_0")
    parser.add_argument("--activations", choices=["float", "int8"], default="float")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    add_record_flag(parser)
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
        print(f"load average {os.getloadavg()[0]:.2f}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
              f"{args.rounds} rounds of at least {args.seconds} s a timing")
        print("| batch | layer | 1 thread ms | 2 threads ms | 2 / 1: median of rounds (95 % interval) | control: 1 again / 1 |\n"
              "|---:|---|---:|---:|---:|---:|")
        label = f"{args.format} packed" + (", int8 activations" if args.activations == "int8" else "")
        for batch in args.batches:
            x = torch.randn(batch, 4096)
            calls = {label: lambda: layer(x), "float32 F.linear": lambda: torch.nn.functional.linear(x, weight, bias)}
            for name, call in calls.items():
                ms = {"1": [], "2": [], "1 again": []}
                for round_ in range(args.rounds):
                    order = ["1", "2", "1 again"]
                    for which in order[round_ % 3:] + order[:round_ % 3]:
                        ms[which].append(timed(call, 2 if which == "2" else 1, args.seconds))
                two = [b / a for a, b in zip(ms["1"], ms["2"])]
                again = [b / a for a, b in zip(ms["1"], ms["1 again"])]
                print(f"| {batch} | {name} | {statistics.median(ms['1']):.3f} | {statistics.median(ms['2']):.3f} | "
                      f"{ratio_cell(two)} | {ratio_cell(again)} |")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    with recording("packed4_under_load"):
        main()
