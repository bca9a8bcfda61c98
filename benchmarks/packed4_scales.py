"""Q4_0 with its scales in float16 (as packed) against the same layers with their scales cast to float32: 60
2816 x 1024 layers streamed at batch 1 (more than the last-level cache holds), one thread, float or int8 activations,
the two alternating over ``--rounds`` rounds (each a blocked autorange); prints the medians and the median
per-round ratio.

    python benchmarks/packed4_scales.py [--activations int8] [--rounds 15]
"""

import argparse
import copy
import statistics

import torch
from torch.utils import benchmark

from mase_lite.kernels import packed4
from record import add_record_flag, recording  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activations", choices=["float", "int8"], default="int8")
    parser.add_argument("--rounds", type=int, default=15)
    add_record_flag(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    half = []
    for _ in range(60):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 2816, bias=False))
        packed4.pack_linears(model, "q4_0", activations=args.activations)
        half.append(model[0])
    single = [copy.deepcopy(layer) for layer in half]
    for layer in single:
        layer.scales = layer.scales.float()
    x = torch.randn(1, 1024)

    def run(layers):
        for layer in layers:
            layer(x)

    ms = {"float16 scales": [], "float32 scales": []}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, layers in (("float16 scales", half), ("float32 scales", single)):
                timer = benchmark.Timer("run(layers)", globals={"run": run, "layers": layers})
                ms[name].append(timer.blocked_autorange(min_run_time=0.2).median * 1e3 / len(layers))
    ratios = [a / b for a, b in zip(ms["float16 scales"], ms["float32 scales"])]
    print(f"activations {args.activations}: " + ", ".join(f"{k} {statistics.median(v):.4f} ms a layer" for k, v in ms.items())
          + f"; float16 / float32 per round: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f}")


if __name__ == "__main__":
    with recording("packed4_scales"):
        main()
