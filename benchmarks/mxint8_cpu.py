"""MXINT8 on the CPU: packed Linear vs float32/bfloat16 F.linear and torchao int8 weight-only, bandwidth
against a copy of the packed bytes, and a Llama float vs packed (forward, resident memory, packing time).

Run: python benchmarks/mxint8_cpu.py [--parts linear bandwidth model] [--threads 1 2]
     [--batches 1 8 64 128] [--features 4096] [--llama 0.85b|small] [--rounds 3] [--min-run-time 0.3]
The load average is printed before and after (timings on shared cores are noisy: compare ratios).
The 0.85b Llama needs about 7 GB of memory. The logic lives in mase_lite/bench/mxint8_cpu.py.
"""

import argparse
import platform

import torch

from mase_lite.bench import mxint8_cpu
from mase_lite.kernels import cpu
from record import add_record_flag, recording  # beside this script

SMALL_LLAMA = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                   intermediate_size=1408, vocab_size=32000)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["linear", "bandwidth", "model"],
                        choices=["linear", "bandwidth", "model"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 128])
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--llama", choices=["0.85b", "small"], default="small")
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 128])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-run-time", type=float, default=0.3)
    add_record_flag(parser)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"MXINT8 CPU level {cpu.level()}; load average before: {load()}\n")
    sections = []
    if "linear" in args.parts:
        sections.append(mxint8_cpu.bench_cpu_linear(args.features, args.batches, args.threads, args.rounds,
                                                    args.min_run_time))
    if "bandwidth" in args.parts:
        sections.append(mxint8_cpu.bench_cpu_bandwidth(args.features, args.threads, args.rounds, args.min_run_time))
    if "model" in args.parts:
        config = mxint8_cpu.LLAMA_085B if args.llama == "0.85b" else SMALL_LLAMA
        sections.append(mxint8_cpu.bench_cpu_model(config, args.tokens, args.threads, args.rounds,
                                                   args.min_run_time))
    for section in sections:
        print(section.markdown(), "\n")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    with recording("mxint8_cpu"):
        main()
