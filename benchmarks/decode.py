"""Decode speed on CPU: a Llama of 156 M parameters (hidden 1024, 8 layers, 16/4 heads, FFN 2816, vocabulary
32000) generating greedily with its key/value cache after a 32-token prompt, float32 against every Linear packed
(lm_head included) in MXINT8, Q4_0-style 4-bit integers and MXFP4 (mase_lite.bench.decode: the columns timed in
turn each round, ratios from the same row). The same section runs in `mase-lite bench --parts decode`.

    python benchmarks/decode.py                          # 1 and 2 threads, 3 rounds
    python benchmarks/decode.py --layers 2 --rounds 1    # a quick look
    python benchmarks/decode.py --busy 2                 # beside two busy processes this script starts
"""

from __future__ import annotations

import argparse
import contextlib
import os

from busy import busy_processes  # beside this script
from mase_lite.bench.decode import bench_decode
from record import add_record_flag, recording  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--busy", type=int, default=0, help="busy processes (while True: pass) during the run")
    add_record_flag(parser)
    args = parser.parse_args()
    config = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=args.layers, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512)
    load = os.getloadavg()[0]
    with busy_processes(args.busy) if args.busy else contextlib.nullcontext():
        section = bench_decode(config, args.threads, args.prompt, args.tokens, args.rounds)
    print(f"load average before: {load:.2f}, after: {os.getloadavg()[0]:.2f}\n")
    print(section.markdown())


if __name__ == "__main__":
    with recording("decode"):
        main()
