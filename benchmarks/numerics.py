"""Quantizer speed: quantize-dequantize throughput and forward+backward of a quantized Linear vs float32.

For each format: (1) ``quantize`` of one ``--size`` x ``--size`` float32 tensor (elements per second,
and for MXFP the time over torchao's MX emulation ``to_mx`` + ``to_dtype`` where torchao is
installed — it is optional, never a dependency); (2) forward+backward of ``F.linear`` with a
``--size`` x ``--size`` weight at batch ``--batch``, weight and input both fake-quantized with a
straight-through gradient, over the same step in float32; the case ``copy`` copies the tensors into
new memory instead of quantizing them (what every result costs before any arithmetic). With
``--torch-too`` each format's quantize-dequantize is also timed through its torch implementation
(the native kernels bypassed, as where they do not apply), in the same rounds. Cases are measured in rounds, every case
once per round (interleaved, so load on the machine spreads over all of them); each figure is the
median over rounds of ``torch.utils.benchmark`` timings after a warm-up.

Usage (repository root)::

    python benchmarks/numerics.py                     # defaults: size 4096, batch 64, 5 rounds
    python benchmarks/numerics.py --rounds 3 --only mxint8 block_fp8
    python benchmarks/numerics.py --threads 2         # every timing with two torch threads
    python benchmarks/numerics.py --only nvfp4 scaled_int4_g128 --torch-too   # native and torch side by side
    MASE_LITE_NATIVE=0 python benchmarks/numerics.py  # MX through torch operations, not the native kernel
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from mase_lite.numerics import quantize, straight_through
from mase_lite.numerics.memory import empty_like_advised
from mase_lite.numerics.native import block_kernel, element_kernel, scaled_kernel
from record import add_record_flag, recording  # beside this script

FORMATS: dict[str, dict] = {
    "integer8": {"name": "integer", "width": 8, "frac_width": 4},
    "mxint8": {"name": "mxint", "element_width": 8},
    "mxfp8_e4m3": {"name": "mxfp", "element_format": "e4m3"},
    "mxfp8_e5m2": {"name": "mxfp", "element_format": "e5m2"},
    "mxfp6_e3m2": {"name": "mxfp", "element_format": "e3m2"},
    "mxfp6_e2m3": {"name": "mxfp", "element_format": "e2m3"},
    "mxfp4_e2m1": {"name": "mxfp", "element_format": "e2m1"},
    "block_fp8": {"name": "block_fp", "width": 8},
    "block_minifloat8": {"name": "block_minifloat", "width": 8, "exponent_width": 4},
    "block_log4": {"name": "block_log", "width": 4},
    "minifloat_ieee8": {"name": "minifloat_ieee", "width": 8, "exponent_width": 4},
    "minifloat_denorm8": {"name": "minifloat_denorm", "width": 8, "exponent_width": 4},
    "log4": {"name": "log", "width": 4},
    "scaled_int8_channel": {"name": "scaled_integer", "width": 8},
    "scaled_int8_tensor": {"name": "scaled_integer", "width": 8, "granularity": "tensor"},
    "scaled_int4_g128": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128},
    "scaled_uint4_g128_f16": {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group",
                              "group_size": 128, "scale_dtype": "float16"},
    "nvfp4": {"name": "nvfp4"},
}


@contextlib.contextmanager
def torch_implementation():
    """Every format through its torch implementation: the native kernels stand aside meanwhile."""
    modules = (block_kernel, element_kernel, scaled_kernel)
    saved = [m.applies for m in modules]
    for m in modules:
        m.applies = lambda x: False
    try:
        yield
    finally:
        for m, applies in zip(modules, saved):
            m.applies = applies


def through_torch(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with torch_implementation():
            return fn()

    return run


def torchao_mx() -> Callable[[str], Callable[[torch.Tensor], torch.Tensor]] | None:
    """A maker of torchao MX quantize-dequantize functions per element format, or None without torchao."""
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except Exception:  # torchao is optional: absent, or built for another torch
        return None
    elements = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e3m2": "fp6_e3m2",
                "e2m3": "fp6_e2m3", "e2m1": torch.float4_e2m1fn_x2}

    def make(element_format: str) -> Callable[[torch.Tensor], torch.Tensor]:
        dtype = elements[element_format]

        def qdq(x: torch.Tensor) -> torch.Tensor:
            scale, data = to_mx(x, dtype, 32)
            return to_dtype(data, scale, dtype, 32, x.dtype)

        return qdq

    return make


def ste(qdq: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``qdq`` with a straight-through gradient (how torchao's emulation is used in the same recipe)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            value = qdq(x.detach())
        return straight_through(x, value)

    return fn


def median_seconds(stmt: Callable[[], object], min_run_time: float, threads: int) -> float:
    timer = benchmark.Timer("stmt()", globals={"stmt": stmt}, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds per timing")
    parser.add_argument("--only", nargs="*", choices=sorted(FORMATS), help="formats to measure")
    parser.add_argument("--torch-too", action="store_true",
                        help="also time each quantize-dequantize through the torch implementation")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every timing (torch.utils.benchmark's default 1; the machine's cores: all)")
    add_record_flag(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.only or list(FORMATS)

    torch.manual_seed(0)
    tensor = torch.randn(args.size, args.size)
    weight = torch.randn(args.size, args.size, requires_grad=True)
    inputs = torch.randn(args.batch, args.size, requires_grad=True)

    def step(q: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            F.linear(q(inputs), q(weight)).sum().backward()

        return run

    def fresh_copy(t: torch.Tensor) -> torch.Tensor:
        """The weight copied into new memory, as a quantizer's result is: the floor of any quantizer."""
        with torch.no_grad():
            copy = empty_like_advised(t).copy_(t)
        return straight_through(t, copy) if t.requires_grad else copy

    qdq_cases: dict[str, Callable[[], object]] = {}
    step_cases: dict[str, Callable[[], None]] = {"float32": step(lambda t: t), "copy": step(fresh_copy)}
    for name in names:
        fmt = FORMATS[name]
        qdq_cases[name] = lambda fmt=fmt: quantize(tensor, fmt)
        if args.torch_too:
            qdq_cases[f"{name} (torch)"] = through_torch(qdq_cases[name])
        step_cases[name] = step(lambda t, fmt=fmt: quantize(t, fmt))
    make_torchao = torchao_mx()
    if make_torchao is None:
        print("torchao is not installed: its MX emulation is not measured")
    else:
        for name in names:
            if FORMATS[name]["name"] == "mxfp":
                element = FORMATS[name]["element_format"]
                qdq_cases[f"torchao {name}"] = lambda q=make_torchao(element): q(tensor)
                step_cases[f"torchao {name}"] = step(ste(make_torchao(element)))

    cases = [("qdq", k, v) for k, v in qdq_cases.items()] + [("step", k, v) for k, v in step_cases.items()]
    for _, _, fn in cases:  # warm-up
        fn()
    times: dict[tuple[str, str], list[float]] = {(kind, name): [] for kind, name, _ in cases}
    for _ in range(args.rounds):
        for kind, name, fn in cases:
            times[(kind, name)].append(median_seconds(fn, args.min_run_time, args.threads))
    med = {key: statistics.median(v) for key, v in times.items()}

    print(f"\nquantize-dequantize of one {args.size}x{args.size} float32 tensor "
          f"(median of {args.rounds} interleaved rounds, {args.threads} torch thread(s))")
    print("| format | ms | Melem/s | over torchao | over its torch implementation |\n|---|---|---|---|---|")
    for name in qdq_cases:
        if name.startswith("torchao"):
            continue
        ms = med[("qdq", name)] * 1e3
        theirs, torch_ms = med.get(("qdq", f"torchao {name}")), med.get(("qdq", f"{name} (torch)"))
        ratio = f"{med[('qdq', name)] / theirs:.2f}x" if theirs else "-"
        over_torch = f"{med[('qdq', name)] / torch_ms:.2f}x" if torch_ms else "-"
        print(f"| {name} | {ms:.1f} | {tensor.numel() / ms / 1e3:.0f} | {ratio} | {over_torch} |")
    for name in qdq_cases:
        if name.startswith("torchao"):
            print(f"| {name} | {med[('qdq', name)] * 1e3:.1f} | - | - | - |")

    base = med[("step", "float32")]
    print(f"\nforward+backward, Linear {args.size}x{args.size}, batch {args.batch}, weight and input "
          f"quantized / float32 ({base * 1e3:.1f} ms)")
    print("| format | ms | ratio | ratio per round |\n|---|---|---|---|")
    for name in step_cases:
        if name == "float32":
            continue
        per_round = [t / b for t, b in zip(times[("step", name)], times[("step", "float32")])]
        spread = f"{min(per_round):.2f}-{max(per_round):.2f}"
        print(f"| {name} | {med[('step', name)] * 1e3:.1f} | {med[('step', name)] / base:.2f}x | {spread} |")


if __name__ == "__main__":
    with recording("numerics"):
        main()
