"""MXINT8 on the CPU: the packed layer against float32 and bfloat16 ``F.linear`` and torchao's int8
weight-only Linear (where torchao is installed; never a dependency), its memory bandwidth against a
copy of the packed bytes, and a Llama built from a config, float against packed: forward time,
resident memory and packing time.

Every call is timed by ``torch.utils.benchmark`` (warm-up first, median of a blocked autorange), in
rounds that time each candidate in turn, so load that drifts hits all of them alike; a ratio is the ratio
of the two columns printed (their medians).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mase_lite.bench.section import Plot, Section
from mase_lite.bench.timing import column_ratio
from mase_lite.kernels.mxint8 import MXInt8Linear, mxint8_linear, pack_linears, quantize
from mase_lite.infra.heap import return_free_memory

MIB = 2**20
LLAMA_085B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=5632, vocab_size=32000)


def side_by_side(fns: dict[str, Callable[[], object]], threads: int, rounds: int,
                 min_run_time: float) -> dict[str, list[float]]:
    """Seconds per call of each function, one median per round, the functions timed in turn each round."""
    from torch.utils import benchmark

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for fn in fns.values():
            fn()  # warm-up: first-use builds, caches, page faults
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=threads)
                times[name].append(timer.blocked_autorange(min_run_time=min_run_time).median)
        return times
    finally:
        torch.set_num_threads(previous)


def torchao_linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Module | None:
    """torchao's int8 weight-only Linear of ``weight`` and ``bias``, or None where torchao is not installed."""
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    holder = nn.Sequential(nn.Linear(weight.shape[1], weight.shape[0]))
    with torch.no_grad():
        holder[0].weight.copy_(weight)
        holder[0].bias.copy_(bias)
    quantize_(holder, Int8WeightOnlyConfig())
    return holder[0]


def bench_cpu_linear(features: int, batches: list[int], threads: list[int], rounds: int,
                     min_run_time: float) -> Section:
    """A square layer: float32 and bfloat16 ``F.linear``, ``mxint8_linear`` on both, torchao int8 weight-only."""
    torch.manual_seed(0)
    weight = torch.randn(features, features) / features**0.5
    bias = torch.randn(features)
    codes, scales = quantize(weight)
    weight_bf16, bias_bf16 = weight.bfloat16(), bias.bfloat16()
    ao = torchao_linear(weight, bias)
    rows = []
    for count in threads:
        for batch in batches:
            x = torch.randn(batch, features)
            x_bf16 = x.bfloat16()
            fns = {"fp32": lambda: F.linear(x, weight, bias), "bf16": lambda: F.linear(x_bf16, weight_bf16, bias_bf16),
                   "mx": lambda: mxint8_linear(x, codes, scales, bias),
                   "mx bf16": lambda: mxint8_linear(x_bf16, codes, scales, bias_bf16)}
            if ao is not None:
                fns["torchao"] = lambda: ao(x)
            with torch.no_grad():
                t = side_by_side(fns, count, rounds, min_run_time)
            row = {"threads": count, "batch": batch, "F.linear fp32 ms": _ms(t["fp32"]), "F.linear bf16 ms": _ms(t["bf16"]),
                   "mxint8 fp32 ms": _ms(t["mx"]), "mxint8 bf16 ms": _ms(t["mx bf16"]),
                   "torchao int8 ms": _ms(t["torchao"]) if ao is not None else "-",
                   "fp32 / mxint8": column_ratio(t["fp32"], t["mx"]), "bf16 / mxint8 bf16": column_ratio(t["bf16"], t["mx bf16"]),
                   "torchao / mxint8": column_ratio(t["torchao"], t["mx"]) if ao is not None else "-"}
            rows.append(row)
    columns = list(rows[0])
    notes = [f"{features}x{features}, bias; ratios are speed-ups of the packed layer (above 1: packed is faster), "
             f"the ratio of the columns (medians of {rounds} rounds); torchao: {'int8 weight-only Linear' if ao else 'not installed'}."]
    return Section("cpu_linear", f"CPU: mxint8_linear vs F.linear and torchao, {features}x{features}", columns, rows,
                   notes, Plot(x="batch", ys=["F.linear fp32 ms", "mxint8 fp32 ms"], ylabel="ms per call", logx=True))


def bench_cpu_bandwidth(features: int, threads: list[int], rounds: int, min_run_time: float) -> Section:
    """Batch-1 ``mxint8_linear``: bytes of codes and scales read per second against a copy of those bytes."""
    torch.manual_seed(0)
    codes, scales = quantize(torch.randn(features, features))
    codes_copy, scales_copy = torch.empty_like(codes), torch.empty_like(scales)
    x = torch.randn(1, features)
    packed = codes.numel() + scales.numel()
    fns = {"mx": lambda: mxint8_linear(x, codes, scales),
           "copy": lambda: (codes_copy.copy_(codes), scales_copy.copy_(scales))}

    def row(threads: int | str, t: dict[str, list[float]]) -> dict:
        return {"threads": threads, "packed MiB": packed / MIB, "mxint8 GB/s": packed / statistics.median(t["mx"]) / 1e9,
                "copy GB/s": packed / statistics.median(t["copy"]) / 1e9, "mxint8 / copy": column_ratio(t["copy"], t["mx"])}

    rows = [row(count, side_by_side(fns, count, rounds, min_run_time)) for count in threads]
    rows.append(row("1, CPU time", thread_seconds(fns, rounds)))
    return Section("cpu_bandwidth", "CPU: batch-1 mxint8_linear bandwidth vs a copy of the packed bytes",
                   list(rows[0]), rows, ["GB/s = packed bytes (codes + scales) / seconds per call; the copy reads "
                                         "and writes them once (into buffers allocated before timing). The last row "
                                         "counts this thread's CPU time (one thread), which other processes' "
                                         "scheduling does not stretch."])


def thread_seconds(fns: dict[str, Callable[[], object]], rounds: int, calls: int = 20) -> dict[str, list[float]]:
    """CPU seconds per call of each function on one thread (``time.thread_time``), in turn each round."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                start = time.thread_time()
                for _ in range(calls):
                    fn()
                times[name].append((time.thread_time() - start) / calls)
        return times
    finally:
        torch.set_num_threads(previous)


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def bench_cpu_model(config: dict, tokens: list[int], threads: list[int], rounds: int, min_run_time: float) -> Section:
    """A Llama from ``config`` (random weights): resident memory before and after packing every Linear,
    packing seconds (on the most threads), and forward ms float vs packed at 1 x ``tokens`` (no KV cache)
    on each thread count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def build() -> nn.Module:
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**config)).eval()

    previous = torch.get_num_threads()
    torch.set_num_threads(max(threads))
    try:
        gc.collect()
        return_free_memory()  # the heap trimmed at both ends, so the growth is the model's (never below zero)
        base = resident_bytes()
        packed = build()
        with_float = resident_bytes()
        start, start_cpu = time.perf_counter(), time.process_time()
        layers = pack_linears(packed)
        pack_seconds, pack_cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
        gc.collect()
        after = resident_bytes()
        reference = build()
    finally:
        torch.set_num_threads(previous)
    weights = sum(m.codes.numel() for m in packed.modules() if isinstance(m, MXInt8Linear))
    rows = [{"measure": "process RSS (MiB)", "float": with_float / MIB, "packed": after / MIB,
             "packed / float": after / with_float if with_float else "-", "speed-up": "-"},
            {"measure": "RSS grown by the model (MiB)", "float": (with_float - base) / MIB,
             "packed": (after - base) / MIB,
             "packed / float": (after - base) / (with_float - base) if with_float > base else "-", "speed-up": "-"}]
    for count, length in ((c, n) for c in threads for n in tokens):
        ids = torch.randint(0, config["vocab_size"], (1, length))
        with torch.no_grad():
            t = side_by_side({"float": lambda: reference(input_ids=ids, use_cache=False),
                              "packed": lambda: packed(input_ids=ids, use_cache=False)}, count, rounds, min_run_time)
        rows.append({"measure": f"forward 1x{length} tokens, {count} thread{'s' * (count > 1)} (ms)",
                     "float": _ms(t["float"]), "packed": _ms(t["packed"]),
                     "packed / float": "-", "speed-up": column_ratio(t["float"], t["packed"])})
    notes = [f"LlamaForCausalLM({config}), random weights, float32; {layers} Linear layers packed "
             f"({weights / 1e6:.1f} M weights) by pack_linears on {max(threads)} threads in {pack_seconds:.2f} s "
             f"({pack_cpu_seconds:.2f} s of CPU time); "
             f"memory: packed / float of the columns; forward: speed-up = float ms / packed ms of the columns (above 1: "
             f"packed is faster, as in every table), medians of {rounds} rounds."]
    return Section("cpu_model", "CPU: Llama forward, float vs packed MXINT8", list(rows[0]), rows, notes)


def _ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3
