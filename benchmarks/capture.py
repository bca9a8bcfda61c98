"""Capture time (export + raise + eval check + metadata) against plain torch.export of the same models.

Run: python benchmarks/capture.py [--repeats 3] [--zoo-only | --recapture-only] [--threads N]
Each figure is the median of --repeats runs after one warm-up run; both paths use the same
dynamic shapes and non-strict export (with use_cache off, as capture does), measured in the same
process. First over the test zoo (tests/zoo/models.py: tiny configs, median ratio), then BERT
sizes with draw time, then re-capture: a BERT of an architecture captured before, with new
weights (the capture cache), against its first capture (cache emptied before each run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

from mase_lite import MaseGraph
from mase_lite.bench import timing
from mase_lite.ir.export import caches_off, default_dynamic_shapes
from mase_lite.ir.capture_cache import CACHE
from mase_lite.ir.inputs import hf_example_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the zoo lives in tests/
from tests.zoo.models import ZOO  # noqa: E402
from record import add_record_flag, recording  # noqa: E402  beside this script

NAMES = ["input_ids", "attention_mask", "labels"]
SHAPES = {
    "bert 2 layers, h128": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "bert 4 layers, h256": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "bert-base 12 layers, h768": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def median_seconds(fn, repeats: int, setup=lambda: None) -> float:
    """Median seconds of ``fn()`` after a warm-up; ``setup()`` (emptying the capture cache: microseconds) runs first each time."""
    return timing.median_seconds(lambda: (setup(), fn()), torch.device("cpu"), warmup=1, repeats=repeats)


def plain_export(model, inputs, dyn):
    with caches_off(model):
        return torch.export.export(model, (), inputs, strict=False, dynamic_shapes=dyn)


def zoo(repeats: int) -> None:
    print("| model | torch.export (s) | MaseGraph capture + metadata (s) | ratio | train mode |")
    print("|---|---|---|---|---|")
    ratios = []
    for entry in ZOO:
        model = entry.build()
        if entry.make is not None:
            inputs = entry.make(3, 13)
            capture = lambda: MaseGraph(model, example_inputs=inputs)  # noqa: E731
        else:
            inputs = hf_example_inputs(model, entry.inputs)
            capture = lambda: MaseGraph(model, hf_input_names=entry.inputs)  # noqa: E731
        dyn = default_dynamic_shapes(inputs)
        export = median_seconds(lambda: plain_export(model, inputs, dyn), repeats)
        graphs = []
        captured = median_seconds(lambda: graphs.append(capture()), repeats, setup=CACHE.clear)
        train = "eval only" if graphs[-1].model.train_limits else "kept"
        ratios.append(captured / export)
        print(f"| {entry.name} | {export:.3f} | {captured:.3f} | {captured / export:.2f}× | {train} |")
    print(f"\nmedian capture / export over {len(ratios)} models: {statistics.median(ratios):.2f}×")


# MASE (transformers 4.57, its own environment) on the same BERT shapes, fx trace plus metadata, as issue 24 records.
MASE_SECONDS = {"bert 2 layers, h128": "0.12", "bert-base 12 layers, h768": "1.3–1.6"}


def recapture(repeats: int) -> None:
    print("| model | first capture + metadata (s) | re-capture, new weights (s) | ratio | MASE fx trace + metadata (s) |")
    print("|---|---|---|---|---|")
    for label in MASE_SECONDS:
        def build(seed: int) -> BertForSequenceClassification:
            torch.manual_seed(seed)
            return BertForSequenceClassification(BertConfig(**SHAPES[label])).eval()

        first = build(0)
        cold = median_seconds(lambda: MaseGraph(first, hf_input_names=NAMES), repeats, setup=CACHE.clear)
        del first
        CACHE.clear()
        MaseGraph(build(1), hf_input_names=NAMES)  # a fresh model, as a search trial builds one
        other = build(2)
        hits, misses = CACHE.hits, CACHE.misses
        warm = median_seconds(lambda: MaseGraph(other, hf_input_names=NAMES), repeats)
        assert CACHE.misses == misses and CACHE.hits > hits, "every re-capture must be a cache hit"
        print(f"| {label} | {cold:.3f} | {warm:.3f} | {warm / cold:.3f}× | {MASE_SECONDS[label]} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--zoo-only", action="store_true")
    parser.add_argument("--recapture-only", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    add_record_flag(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} after warm-up")
    if args.recapture_only:
        recapture(args.repeats)
        return
    zoo(args.repeats)
    if args.zoo_only:
        return
    print("| model | torch.export (s) | MaseGraph capture + metadata (s) | ratio | draw svg (s) | nodes drawn |")
    print("|---|---|---|---|---|---|")
    for label, shape in SHAPES.items():
        model = BertForSequenceClassification(BertConfig(**shape)).eval()
        inputs = hf_example_inputs(model, NAMES)
        dyn = default_dynamic_shapes(inputs)
        export = median_seconds(
            lambda: torch.export.export(model, (), inputs, strict=False, dynamic_shapes=dyn), args.repeats
        )
        capture = median_seconds(lambda: MaseGraph(model, hf_input_names=NAMES), args.repeats, setup=CACHE.clear)
        mg = MaseGraph(model, hf_input_names=NAMES)
        with tempfile.TemporaryDirectory() as tmp:
            draw = median_seconds(lambda: mg.draw(Path(tmp) / "g.svg"), args.repeats)
            drawn = (Path(tmp) / "g.svg").read_text().count('class="node"')
        print(f"| {label} | {export:.2f} | {capture:.2f} | {capture / export:.2f}× | {draw:.2f} | {drawn} |")
    recapture(args.repeats)


if __name__ == "__main__":
    with recording("capture"):
        main()
