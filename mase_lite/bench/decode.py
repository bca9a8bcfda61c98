"""Decoding on the CPU: a Llama from a config (random weights, the same in every column) generating greedily with
the tool's decoder (:mod:`mase_lite.runtime.decoder`, its key/value cache) after a prompt, float32 against every Linear
packed (``lm_head`` included): MXINT8 and the 4-bit kernels (Q4_0-style integers, MXFP4), and MXINT8 and Q4_0 with
int8 activations (``int8-act``). Where ``llama-cpp-python`` is installed, llama.cpp decodes the same weights exported
to GGUF (:mod:`mase_lite.deploy.gguf`: MXINT8 as Q8_0, 4-bit groups of 32 as Q4_0, every
Linear quantized) beside them, and the packed MXINT8 model in transformers' own ``generate``. A column's decode time
per token is the time from its first generated token to its last over the N - 1 tokens between (the prompt's prefill
is not in it), the median of ``rounds`` runs, the columns timed in turn each round so drifting load hits them alike;
speed-ups are computed from the columns of the same row.
"""

from __future__ import annotations

import copy
import importlib.util
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from mase_lite.bench.section import Section
from mase_lite.runtime.decoder import Decoder

PACKINGS = ("MXINT8", "Q4_0", "MXFP4", "MXINT8 int8-act", "Q4_0 int8-act")  # int8-act: int8 activations
HF_COLUMN = "MXINT8 in transformers' generate"
LLAMA_CPP = {  # llama.cpp's type: the tool's weight format that it holds exactly
    "Q8_0": {"name": "mxint", "element_width": 8},
    "Q4_0": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "scale_dtype": "float16",
             "full_range": True},
}


def decoders(config: dict) -> dict[str, nn.Module]:
    """The float32 Llama of ``config`` and its copies with every Linear packed, by column name."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mase_lite.kernels import mxint8, packed4

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    out = {"float32": model}
    for name in PACKINGS:
        packed = copy.deepcopy(model)
        weights, _, act = name.partition(" ")
        activations = "int8" if act else "float"
        if weights == "MXINT8":
            mxint8.pack_linears(packed, activations=activations)
        else:
            packed4.pack_linears(packed, weights.lower(), activations=activations)
        out[name] = packed
    return out


def _seconds(model: nn.Module, prompt: torch.Tensor, tokens: int) -> float:
    """transformers' ``generate``, greedy: seconds per token after the first (a streamer stamps each token)."""
    stamps: list[float] = []

    class Stamps:
        def put(self, value: torch.Tensor) -> None:
            stamps.append(time.perf_counter())  # the prompt first, then each new token

        def end(self) -> None:
            pass

    with torch.no_grad():
        model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                       streamer=Stamps())
    return (stamps[-1] - stamps[1]) / (tokens - 1)


def _decoder_seconds(decoder: Decoder, prompt: torch.Tensor, tokens: int) -> float:
    """The tool's decoder (what the ``generate`` step runs), greedy: seconds per token after the first."""
    with torch.no_grad():
        decoder.reset()
        logits = decoder(prompt)
        token = torch.argmax(logits).view(1, 1)
        start = time.perf_counter()
        for _ in range(tokens - 1):
            token = torch.argmax(decoder(token)).view(1, 1)
        return (time.perf_counter() - start) / (tokens - 1)


def _gguf_files(model: nn.Module, directory: Path) -> dict[str, Path]:
    """``model`` with every Linear quantized to each of llama.cpp's types, written as GGUF files."""
    import mase_lite as ml
    from mase_lite.deploy import export
    from mase_lite.workloads.grammar import default_grammar
    from mase_lite.workloads.tokenizer import train_wordpiece

    tokenizer = train_wordpiece(default_grammar().sample(500, random.Random(0)), vocab_size=1000)  # llama.cpp needs one
    files = {}
    for name, fmt in LLAMA_CPP.items():
        quantized, _ = ml.passes.quantize(copy.deepcopy(model), {"by": "type", "rules": {"linear": {"weight": fmt}}})
        files[name] = directory / f"{name}.gguf"
        export(quantized, "gguf", files[name], tokenizer=tokenizer)
    return files


def _llama_cpp_timer(path: Path, threads: int, context: int) -> tuple[Callable[[torch.Tensor, int], float], Callable[[], None]]:
    """Seconds for llama.cpp to prefill a prompt and decode greedily, and the closer of its model."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)

    def seconds(prompt: torch.Tensor, tokens: int) -> float:
        llm.reset()
        stamps = []
        for _ in llm.generate(prompt[0].tolist(), top_k=1, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == tokens:
                break
        return (stamps[-1] - stamps[0]) / (tokens - 1)

    return seconds, llm.close


def _has_llama_cpp() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def bench_decode(config: dict, threads: list[int], prompt_tokens: int, new_tokens: int, rounds: int) -> Section:
    """ms per decoded token and tokens per second of each column, per thread count."""
    models = decoders(config)
    prompt = torch.randint(1, config["vocab_size"], (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    previous = torch.get_num_threads()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = _gguf_files(models["float32"], Path(tmp)) if _has_llama_cpp() else {}
        try:
            for count in threads:
                torch.set_num_threads(count)
                timers = {name: (lambda p, n, d=Decoder.of(model, prompt_tokens + new_tokens): _decoder_seconds(d, p, n))
                          for name, model in models.items()}
                timers[HF_COLUMN] = lambda p, n: _seconds(models["MXINT8"], p, n)
                closers = []
                for name, path in files.items():
                    timers[f"llama.cpp {name}"], close = _llama_cpp_timer(path, count, prompt_tokens + new_tokens + 8)
                    closers.append(close)
                for timer in timers.values():
                    timer(prompt, 3)  # warm-up: kernels built, caches filled
                seconds = {name: [] for name in timers}
                for _ in range(rounds):
                    for name, timer in timers.items():
                        seconds[name].append(timer(prompt, new_tokens))
                for close in closers:
                    close()
                ms = {name: statistics.median(seconds[name]) * 1e3 for name in timers}
                row = {"threads": count, **{f"{name} ms/token": ms[name] for name in timers}}
                row.update({f"{name} / float32 speed-up": ms["float32"] / ms[name] for name in PACKINGS})
                row[f"MXINT8 / {HF_COLUMN} speed-up"] = ms[HF_COLUMN] / ms["MXINT8"]
                for name in files:
                    for ours in (("MXINT8", "MXINT8 int8-act") if name == "Q8_0" else (name, f"{name} int8-act")):
                        row[f"{ours} / llama.cpp {name} speed-up"] = ms[f"llama.cpp {name}"] / ms[ours]
                row["MXINT8 tokens/s"], row["Q4_0 tokens/s"] = 1e3 / ms["MXINT8"], 1e3 / ms["Q4_0"]
                rows.append(row)
        finally:
            torch.set_num_threads(previous)
    llama = ("llama.cpp decodes the same weights from GGUF (MXINT8 as Q8_0, 4-bit groups of 32 with float16 scales "
             "as Q4_0, every Linear quantized); a speed-up above 1 is the tool faster" if files else
             "llama.cpp is not timed here (llama-cpp-python is not installed: it builds from source, in its own "
             "environment)")
    notes = [f"LlamaForCausalLM({config}), greedy decoding with the key/value cache after {prompt_tokens} prompt "
             f"tokens, {new_tokens} tokens (ms per token from the first to the last), median of {rounds} rounds, by "
             f"the tool's decoder (mase_lite.runtime.decoder, what the generate step runs; the same packed model in "
             f"transformers' generate beside it); int8-act: "
             f"the packed Linears with int8 activations (llama.cpp's way: the input quantized per block of 32, integer "
             f"dot products); {llama}."]
    return Section("decode", "CPU: decoding with the KV cache, float32 vs packed MXINT8 and 4-bit", list(rows[0]), rows,
                   notes)
