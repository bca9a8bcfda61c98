"""How readable the codegen'd model.py is: lines, aten calls, fx ``= None`` trailers, longest line;
with ``--zoo``, which zoo models go through codegen bit-exactly.

Usage (repository root): ``python benchmarks/codegen_readability.py [--zoo]``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mase_lite as ml  # noqa: E402
from mase_lite.codegen import emit  # noqa: E402
from record import add_record_flag, recording  # noqa: E402  beside this script

BERTS = {"BertConfig() default (12 layers, h768)": {},
         "bert-tiny shape (2 layers, h128)": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                                  intermediate_size=512)}


def measure(source: str) -> dict:
    lines = source.splitlines()
    return {"lines": len(lines), "aten calls": source.count("torch.ops.aten"),
            "= None trailers": len(re.findall(r";\s*[\w, ]+ = None$", source, flags=re.M)),
            "longest line": max(map(len, lines))}


def bert_rows() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    for label, config in BERTS.items():
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(**config)).eval()
        mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask"])
        print(label, measure(emit(mg)[0]))


def zoo_rows() -> None:
    from mase_lite.codegen import CodegenError
    from tests.zoo.models import ZOO

    passed = []
    for entry in ZOO:
        model = entry.build()
        mg = ml.MaseGraph(model, example_inputs=entry.make(3, 13)) if entry.make else \
            ml.MaseGraph(model, hf_input_names=entry.inputs)
        try:
            source = emit(mg)[0]
        except CodegenError as err:
            print(f"{entry.name}: {str(err).splitlines()[0]}")
            continue
        passed.append(entry.name)
        print(entry.name, measure(source))
    print(f"codegen succeeds on {len(passed)}/{len(ZOO)} zoo models")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="store_true", help="also run every zoo model through codegen")
    add_record_flag(parser)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with recording("codegen_readability"):
        bert_rows()
        if args.zoo:
            zoo_rows()
