"""Capture time (export + raise + metadata) against plain torch.export of the same models, and draw time.

Run: python benchmarks/capture.py [--repeats 3]
Each figure is the median of --repeats runs after one warm-up run; both paths use the same
dynamic shapes and non-strict export, measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

from mase_lite import MaseGraph
from mase_lite.ir.capture import default_dynamic_shapes
from mase_lite.ir.inputs import TOKEN_INPUTS, hf_example_inputs

NAMES = ["input_ids", "attention_mask", "labels"]
SHAPES = {
    "bert 2 layers, h128": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "bert 4 layers, h256": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "bert-base 12 layers, h768": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} after warm-up")
    print("| model | torch.export (s) | MaseGraph capture + metadata (s) | ratio | draw svg (s) | nodes drawn |")
    print("|---|---|---|---|---|---|")
    for label, shape in SHAPES.items():
        model = BertForSequenceClassification(BertConfig(**shape)).eval()
        inputs = hf_example_inputs(model, NAMES)
        dyn = default_dynamic_shapes(inputs, TOKEN_INPUTS)
        export = median_seconds(
            lambda: torch.export.export(model, (), inputs, strict=False, dynamic_shapes=dyn), args.repeats
        )
        capture = median_seconds(lambda: MaseGraph(model, hf_input_names=NAMES), args.repeats)
        mg = MaseGraph(model, hf_input_names=NAMES)
        with tempfile.TemporaryDirectory() as tmp:
            draw = median_seconds(lambda: mg.draw(Path(tmp) / "g.svg"), args.repeats)
            drawn = (Path(tmp) / "g.svg").read_text().count('class="node"')
        print(f"| {label} | {export:.2f} | {capture:.2f} | {capture / export:.2f}× | {draw:.2f} | {drawn} |")


if __name__ == "__main__":
    main()
