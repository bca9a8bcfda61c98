"""Packed Linears at batch 1 with float and with int8 activations, the weights streamed from memory as in decoding.

Builds ``--layers`` packed layers of ``--out`` x ``--in`` (random weights; together beyond the CPU's caches), then
times one input row through all of them, in turn for Q4_0 (4-bit integers in blocks of 32, float32 scale) and
MXINT8, each with its float kernel and with int8 activations (``mase_lite.kernels.int8_activations``), by
``torch.utils.benchmark`` (median of a blocked autorange), and prints ms per layer, the bytes of weights and scales
read per second and the int8 path's speed-up over the float path in the same run.

    python benchmarks/int8_activations.py                      # 80 layers of 2816 x 1024, 1 thread
    python benchmarks/int8_activations.py --threads 2
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils import benchmark

from mase_lite.kernels.mxint8 import MXInt8Linear
from mase_lite.kernels.packed4 import pack_linears
from record import add_record_flag, recording  # beside this script


def layers(kind: str, activations: str, count: int, out_features: int, in_features: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    made = []
    for _ in range(count):
        linear = torch.nn.Linear(in_features, out_features, bias=False)
        if kind == "MXINT8":
            made.append(MXInt8Linear.from_linear(linear, activations=activations))
        else:
            holder = torch.nn.Sequential(linear)
            pack_linears(holder, "q4_0", activations=activations)
            made.append(holder[0])
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--out", type=int, default=2816)
    parser.add_argument("--in", dest="in_features", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    add_record_flag(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(1, args.in_features)
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.layers} layers of {args.out} x {args.in_features}, "
          f"{args.threads} thread(s)\n")
    print("| weights | activations | ms per layer | GB/s read | int8 / float speed-up |\n|---|---|---:|---:|---:|")
    for kind in ("Q4_0", "MXINT8"):
        seconds = {}
        for activations in ("float", "int8"):
            stack = layers(kind, activations, args.layers, args.out, args.in_features)
            nbytes = sum(b.numel() * b.element_size() for layer in stack for b in layer.buffers() if b.numel() > 16)

            def run(stack=stack):
                with torch.no_grad():
                    for layer in stack:
                        layer(x)
            seconds[activations] = benchmark.Timer("run()", globals={"run": run}).blocked_autorange(min_run_time=2).median
            speed = f"{seconds['float'] / seconds['int8']:.2f}" if activations == "int8" else ""
            print(f"| {kind} | {activations} | {seconds[activations] / args.layers * 1e3:.3f} | "
                  f"{nbytes / seconds[activations] / 1e9:.2f} | {speed} |")
            del stack
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    with recording("int8_activations"):
        main()
