"""Prefill and decode on the CPU, the tool against llama.cpp in the same run: a Llama of 156 M parameters (hidden 1024,
8 layers, 16/4 heads, FFN 2816, vocabulary 32000; random weights, seed 0) quantized by the tool, exported to GGUF, and
run both by the tool's decoder (every Linear packed with int8 activations; mase_lite.runtime.decoder) and by llama.cpp's
``llama-bench`` on that very file. The types: Q4_0 (the tool's 4-bit groups of 32 with float16 scales, which GGUF's Q4_0
holds exactly), Q8_0 (GGUF's own, int8 codes with a float16 d per block, packed as such), Q4_K_M and Q5_K_M (the tool's
presets of those names: Q4_K or Q5_K, with Q6_K for the head and some value and down projections, as llama-quantize
chooses; the decoder holds them as K-quant records, mase_lite.kernels.kquants); on request (``--types``), IQ4_NL (the
tool's ``iq4_nl``, packed as 4-bit codes with its 16-value table).

Each round times every (type, threads) pair once per tool, the tools in turn, so drifting load hits them alike:
prefill is tokens per second over a 512-token prompt (llama-bench's pp512; its n_batch 512), decode is tokens per second
over N tokens after a short prompt (llama-bench's tgN from an empty cache; the tool's decoder after 8 prompt tokens).
Each tool warms up in each round before its timed runs, as llama-bench does: the whole prompt once, one token (the
first prompt after the other tool's run took the tool 5-10 % longer than the next on an Intel Xeon).
Ratios (tool / llama.cpp, above 1: the tool faster) are per round, given as the median and the range.

    python benchmarks/vs_llama_cpp.py --llama-bench /path/to/llama-bench          # 1 and 2 threads, 5 rounds
    python benchmarks/vs_llama_cpp.py --llama-bench ... --busy 2                  # beside two busy processes
    python benchmarks/vs_llama_cpp.py --llama-bench ... --layers 2 --rounds 1     # a quick look

llama-bench comes with llama.cpp (``cmake --build build --target llama-bench``); ``$LLAMA_BENCH`` names it too. Where
the CPU has AMX but the kernel does not grant a process its tiles (a VM: llama-bench dies of a general protection fault
at ``ldtilecfg``), build it without AMX: ``-DGGML_NATIVE=OFF`` with ``-DGGML_AVX2=ON -DGGML_AVX512=ON
-DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER_ENV = dict(os.environ)  # llama-bench runs in the environment as given
import mase_lite  # noqa: E402,F401  before torch, as the tool's command line does (it sets GOMP_SPINCOUNT)
import torch  # noqa: E402

from busy import busy_processes  # noqa: E402  beside this script
from figures import cpu_model, spread  # noqa: E402  beside this script
from record import add_record_flag, recording  # noqa: E402  beside this script

TYPES = {  # GGUF's type: the tool's format that it holds exactly, and how the tool packs it
    "Q4_0": ({"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "scale_dtype": "float16",
              "full_range": True}, "q4_0"),
    "Q8_0": ({"name": "q8_0"}, "q8_0"),  # GGUF's own: int8 codes, a float16 d per block of 32
    "Q4_K_M": ("Q4_K_M", "Q4_K_M"),  # llama-quantize's mixtures, Q4_K or Q5_K and Q6_K: the same preset for both
    "Q5_K_M": ("Q5_K_M", "Q5_K_M"),
    "IQ4_NL": ({"name": "iq4_nl"}, {"name": "iq4_nl"}),  # a 16-value table: the 4-bit layers' kernel of looked-up values
}
DEFAULT_TYPES = ("Q4_0", "Q8_0", "Q4_K_M", "Q5_K_M")  # the issue's; IQ4_NL on request (--types)


def build_model(layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval()


def gguf_file(model: torch.nn.Module, fmt: dict | str, path: Path) -> None:
    """``model`` with every Linear quantized to ``fmt``, written as GGUF (with a tokenizer: llama.cpp needs one)."""
    import mase_lite as ml
    from mase_lite.deploy import export
    from mase_lite.workloads.grammar import default_grammar
    from mase_lite.workloads.tokenizer import train_wordpiece

    tokenizer = train_wordpiece(default_grammar().sample(500, random.Random(0)), vocab_size=1000)
    params = {"preset": fmt} if isinstance(fmt, str) else {"by": "type", "rules": {"linear": {"weight": fmt}}}
    quantized, _ = ml.passes.quantize(copy.deepcopy(model), params)
    export(quantized, "gguf", path, tokenizer=tokenizer)


def packed_decoder(model: torch.nn.Module, packing: str, max_length: int):
    from mase_lite.kernels import kquants, packed4, q8_0
    from mase_lite.layers.presets import mixed_types
    from mase_lite.runtime.decoder import Decoder

    packed = copy.deepcopy(model)
    if packing == "q8_0":
        q8_0.pack_linears(packed, activations="int8")
    elif packing in ("Q4_K_M", "Q5_K_M"):
        kquants.pack_linears(packed, mixed_types(packed, packing), activations="int8")
    else:
        packed4.pack_linears(packed, packing, activations="int8")
    decoder = Decoder.of(packed, max_length)
    assert decoder is not None and decoder.step is not None, "the tool's native decoding step does not apply"
    return decoder


def tool_rates(decoder, prompt: torch.Tensor, start: torch.Tensor, tokens: int) -> tuple[float, float]:
    """The tool's prefill and decode tokens per second, each after a warm-up as llama-bench's (in the same process,
    before its timed runs: the whole prompt once, one generated token)."""
    with torch.no_grad():
        for _ in range(2):  # the first run is the warm-up
            decoder.reset()
            began = time.perf_counter()
            decoder(prompt)
            prefill = prompt.shape[1] / (time.perf_counter() - began)
        decoder.reset()
        token = torch.argmax(decoder(start)).view(1, 1)
        token = torch.argmax(decoder(token)).view(1, 1)  # the warm-up token
        began = time.perf_counter()
        for _ in range(tokens):
            token = torch.argmax(decoder(token)).view(1, 1)
        return prefill, tokens / (time.perf_counter() - began)


def llama_rates(binary: str, path: Path, threads: int, prompt: int, tokens: int) -> tuple[float, float]:
    """llama-bench's pp<prompt> and tg<tokens> tokens per second (one repetition each, after its warm-up)."""
    result = subprocess.run([binary, "-m", str(path), "-p", str(prompt), "-n", str(tokens), "-t", str(threads),
                             "-r", "1", "-o", "json"], capture_output=True, text=True, check=True, env=PEER_ENV)
    tests = json.loads(result.stdout)
    rate = {(t["n_prompt"], t["n_gen"]): t["avg_ts"] for t in tests}
    return rate[(prompt, 0)], rate[(0, tokens)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench"))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--types", nargs="+", default=list(DEFAULT_TYPES), choices=list(TYPES))
    parser.add_argument("--busy", type=int, default=0, help="busy processes (while True: pass) during the run")
    add_record_flag(parser)
    args = parser.parse_args()
    if not args.llama_bench:
        parser.error("--llama-bench: no llama-bench found (build llama.cpp's llama-bench target, or set LLAMA_BENCH)")
    model = build_model(args.layers)
    prompt = torch.randint(1, 32000, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    start = prompt[:, :8]
    load_before = os.getloadavg()[0]
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, (busy_processes(args.busy) if args.busy else contextlib.nullcontext()):
        files, decoders = {}, {}
        for name in args.types:
            fmt, packing = TYPES[name]
            files[name] = Path(tmp) / f"{name}.gguf"
            gguf_file(model, fmt, files[name])
            decoders[name] = packed_decoder(model, packing, args.prompt + args.tokens + 16)
        previous = torch.get_num_threads()
        try:
            for threads in args.threads:  # warm-up: kernels built, caches filled, llama.cpp's file read once
                torch.set_num_threads(threads)
                for name in args.types:
                    tool_rates(decoders[name], prompt, start, 4)
                    llama_rates(args.llama_bench, files[name], threads, args.prompt, 4)
            for _ in range(args.rounds):
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    for name in args.types:
                        row = results.setdefault((name, threads), {k: [] for k in ("tp", "td", "lp", "ld")})
                        tp, td = tool_rates(decoders[name], prompt, start, args.tokens)
                        lp, ld = llama_rates(args.llama_bench, files[name], threads, args.prompt, args.tokens)
                        for key, value in zip(("tp", "td", "lp", "ld"), (tp, td, lp, ld)):
                            row[key].append(value)
        finally:
            torch.set_num_threads(previous)
    load_after = os.getloadavg()[0]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; busy processes beside: {args.busy}; "
          f"load average before {load_before:.2f}, after {load_after:.2f}; {args.rounds} rounds, interleaved\n")
    print(f"llama-bench on the tool's GGUF exports of the {args.layers}-layer Llama, the tool's decoder on the same "
          "weights (int8 activations; Q4_0, Q8_0 tiled, K-quants as records, paired); tool / llama.cpp per "
          f"round, median (range); decode {args.tokens} tokens.\n")
    print(f"| type | threads | tool prefill t/s | llama.cpp pp{args.prompt} t/s | prefill ratio | tool decode t/s | "
          f"llama.cpp tg{args.tokens} t/s | decode ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, threads), row in results.items():
        prefill = [t / l for t, l in zip(row["tp"], row["lp"])]
        decode = [t / l for t, l in zip(row["td"], row["ld"])]
        print(f"| {name} | {threads} | {statistics.median(row['tp']):.0f} | {statistics.median(row['lp']):.0f} | "
              f"{spread(prefill)} | {statistics.median(row['td']):.0f} | {statistics.median(row['ld']):.0f} | "
              f"{spread(decode)} |")


if __name__ == "__main__":
    with recording("vs_llama_cpp"):
        main()
