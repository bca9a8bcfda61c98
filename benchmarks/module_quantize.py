"""Module-level quantize of a 0.5 B Llama: ``ml.passes.quantize(model, ...)`` on the plain module (no capture).

Run: python benchmarks/module_quantize.py [--repeats 5]
The model is a randomly initialised Llama of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 4864
intermediate, 151 936 tokens: 494 M parameters, float32). Every Linear but ``lm_head`` is quantized
to integer 8/4 (input and weight); after each timed run the original Linears are put back (not
timed). The baseline, timed in the same process, is the bare swap: ``setattr`` of an already-built
module for each Linear — what any module-level quantizer must do at least. Median of --repeats runs
after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from record import add_record_flag, recording  # beside this script

INT8 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4}
PARAMS = {"by": "type", "rules": {"head": None}, "default": INT8}
SHAPE = dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864, num_attention_heads=14,
             num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True)


def linears(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"}


def put_back(model: nn.Module, originals: dict[str, nn.Module]) -> None:
    for name, module in originals.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, module)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_record_flag(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model = model.to_empty(device="cpu").eval()  # weights left uninitialised: quantize does not read them
    model.tie_weights()
    originals = linears(model)
    size = sum(p.numel() for p in model.parameters())
    quantized, swapped = [], []
    for i in range(args.repeats + 1):  # the first run of each is the warm-up
        seconds = timed(lambda: ml.passes.quantize(model, PARAMS))
        assert type(model.model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
        put_back(model, originals)
        doubles = {name: nn.Identity() for name in originals}
        bare = timed(lambda: put_back(model, doubles))
        put_back(model, originals)
        if i:
            quantized.append(seconds)
            swapped.append(bare)
    q, s = statistics.median(quantized), statistics.median(swapped)
    print(f"Llama {size / 1e6:.0f} M parameters, {len(originals)} Linear modules quantized (lm_head left alone)")
    print(f"| | median seconds |\n|---|---|\n| ml.passes.quantize(model, ...) | {q:.3f} |\n| bare setattr swap (baseline) | {s:.4f} |")
    print(f"quantize / bare swap: {q / s:.0f}x; runs: {', '.join(f'{x:.3f}' for x in quantized)}")


if __name__ == "__main__":
    with recording("module_quantize"):
        main()
