"""Quantizing every Linear of bert-base: metadata refreshed once per pass (now) against once per
replaced module (before the pass manager), measured side by side in one process.

Run: python benchmarks/quantize.py [--repeats 3] [--layers 12]
Each figure is the median of --repeats runs; every run quantizes a freshly captured graph
(capture is not timed). The "per module" baseline replays the old behaviour by refreshing the
whole graph's metadata after every module swap.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

import mase_lite as ml
from mase_lite.ir import meta
from record import add_record_flag, recording  # beside this script

INT8 = {"name": "integer", "width": 8, "frac_width": 4}
PARAMS = {"by": "type", "rules": {"linear": {"data_in": INT8, "weight": INT8, "bias": INT8}}}


def fresh_graph(layers: int):
    config = BertConfig(hidden_size=768, num_hidden_layers=layers, num_attention_heads=12, intermediate_size=3072)
    return ml.MaseGraph(BertForSequenceClassification(config), hf_input_names=["input_ids", "attention_mask"])


def quantize_seconds(layers: int, per_module_refresh: bool) -> tuple[float, int]:
    mg = fresh_graph(layers)
    if per_module_refresh:
        swap = mg.replace_module

        def swap_and_refresh(target, module):
            swap(target, module)
            meta.refresh(mg)

        mg.replace_module = swap_and_refresh
    t0 = time.perf_counter()
    _, info = ml.passes.quantize(mg, PARAMS)
    return time.perf_counter() - t0, info["count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    add_record_flag(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    now, before = [], []
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        seconds, count = quantize_seconds(args.layers, per_module_refresh=False)
        now.append(seconds)
        before.append(quantize_seconds(args.layers, per_module_refresh=True)[0])
    a, b = statistics.median(now), statistics.median(before)
    print(f"bert-base ({args.layers} layers), {count} Linear modules quantized to integer 8/4")
    print(f"| metadata refresh | median seconds |\n|---|---|\n| once per pass (now) | {a:.3f} |\n| once per module (before) | {b:.3f} |")
    print(f"speed-up: {b / a:.1f}x")


if __name__ == "__main__":
    with recording("quantize"):
        main()
