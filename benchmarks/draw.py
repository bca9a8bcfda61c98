"""Drawing bert-base: full, collapsed to its encoder layers, folded; and ``to_networkx``.

Run: python benchmarks/draw.py [--repeats 7] [--layers 12] [--out DIR]
bert-base (BertForSequenceClassification from a default BertConfig, 12 layers, no download) is
captured once. Each view is built with the graphviz package and rendered to SVG by ``dot``
(``mg.draw``), the wall time is the median of --repeats calls after one warm-up call, and the
ratio is against the full drawing measured in the same run. ``to_networkx`` is timed the same way.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

from mase_lite import MaseGraph
from mase_lite.bench import timing
from mase_lite.viz.draw import DrawOptions, build
from record import add_record_flag, recording  # beside this script

VIEWS = {
    "full": {},
    "full, folded": {"fold_repeats": True},
    "encoder layers (depth 3)": {"depth": 3},
    "encoder layers, folded": {"depth": 3, "fold_repeats": True},
}


def median_s(fn, repeats: int) -> float:
    return timing.median_seconds(fn, torch.device("cpu"), warmup=1, repeats=repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None, help="keep the SVGs here (default: a temporary directory)")
    add_record_flag(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_hidden_layers=args.layers)).eval()
    mg = MaseGraph(model, hf_input_names=["input_ids", "attention_mask"])
    out = args.out or Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    print(f"bert-base, {args.layers} layers, {len(mg.nodes)} fx nodes; median of {args.repeats} runs")
    nx_s = median_s(mg.to_networkx, args.repeats)
    print(f"| view | boxes | build (s) | build + dot SVG (s) | × full |")
    print("|---|---|---|---|---|")
    base = None
    for name, opts in VIEWS.items():
        boxes = build(mg, DrawOptions(**opts)).boxes
        build_s = median_s(lambda: build(mg, DrawOptions(**opts)), args.repeats)
        path = out / f"bert_base_{'_'.join(f'{k}{v}' for k, v in opts.items()) or 'full'}.svg"
        total_s = median_s(lambda: mg.draw(path, **opts), args.repeats)
        base = base or total_s
        print(f"| {name} | {boxes} | {build_s:.3f} | {total_s:.3f} | {total_s / base:.2f} |")
    print(f"to_networkx: {nx_s * 1e3:.1f} ms")


if __name__ == "__main__":
    with recording("draw"):
        main()
