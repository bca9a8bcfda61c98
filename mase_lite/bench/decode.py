"""Decoding on the CPU: a Llama from a config (random weights, the same in every column) generating greedily with
its key/value cache after a prompt, float32 against every Linear packed (``lm_head`` included): MXINT8 and the
4-bit kernels (Q4_0-style integers, MXFP4). A column's decode time per token is (time for N tokens - time for 1)
/ (N - 1), the median of ``rounds`` runs, the columns timed in turn each round so drifting load hits them alike;
speed-ups are computed from the columns of the same row.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
from torch import nn

from mase_lite.bench.section import Section

PACKINGS = ("MXINT8", "Q4_0", "MXFP4")


def decoders(config: dict) -> dict[str, nn.Module]:
    """The float32 Llama of ``config`` and its copies with every Linear packed, by column name."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mase_lite.kernels import mxint8, packed4

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    out = {"float32": model}
    for name in PACKINGS:
        packed = copy.deepcopy(model)
        if name == "MXINT8":
            mxint8.pack_linears(packed)
        else:
            packed4.pack_linears(packed, name.lower())
        out[name] = packed
    return out


def _seconds(model: nn.Module, prompt: torch.Tensor, tokens: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def bench_decode(config: dict, threads: list[int], prompt_tokens: int, new_tokens: int, rounds: int) -> Section:
    """ms per decoded token and tokens per second of each column, per thread count."""
    models = decoders(config)
    prompt = torch.randint(1, config["vocab_size"], (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    previous = torch.get_num_threads()
    rows = []
    try:
        for count in threads:
            torch.set_num_threads(count)
            for model in models.values():
                _seconds(model, prompt, 2)  # warm-up: kernels built, caches filled
            first = {name: [] for name in models}
            whole = {name: [] for name in models}
            for _ in range(rounds):
                for name, model in models.items():
                    first[name].append(_seconds(model, prompt, 1))
                    whole[name].append(_seconds(model, prompt, new_tokens))
            ms = {name: (statistics.median(whole[name]) - statistics.median(first[name])) / (new_tokens - 1) * 1e3
                  for name in models}
            row = {"threads": count, **{f"{name} ms/token": ms[name] for name in models}}
            row.update({f"{name} / float32 speed-up": ms["float32"] / ms[name] for name in PACKINGS})
            row["MXINT8 tokens/s"], row["Q4_0 tokens/s"] = 1e3 / ms["MXINT8"], 1e3 / ms["Q4_0"]
            rows.append(row)
    finally:
        torch.set_num_threads(previous)
    notes = [f"LlamaForCausalLM({config}), greedy decoding with the key/value cache after {prompt_tokens} prompt "
             f"tokens, {new_tokens} tokens, median of {rounds} rounds; llama.cpp is not timed here (its "
             "llama-cpp-python builds from source in its own environment)."]
    return Section("decode", "CPU: decoding with the KV cache, float32 vs packed MXINT8 and 4-bit", list(rows[0]), rows,
                   notes)
