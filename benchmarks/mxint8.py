"""MXINT8 benchmarks: dequantize throughput, packed BERT-base memory, packed-linear latency.

Every figure is a median over ``--repeats`` runs after ``--warmup`` runs, and every ratio is
against a baseline measured in the same run on the same device.

    python benchmarks/mxint8.py                      # CUDA if available, else CPU
    python benchmarks/mxint8.py --device cpu --sizes 1 4 16 --repeats 5

Prints markdown tables (the figures in benchmarks/RESULTS.md come from this script).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mase_lite.kernels.mxint8 import MXInt8Linear, cuda_extension, dequantize, mxint8_linear, quantize

MIB = 2 ** 20
THEORETICAL_SAVING = 1 - (8 + 8 / 32) / 32  # 74.2 %: one int8 element + 1/32 of a uint8 scale vs float32


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="dequantize sizes in Mi elements (default: 1 4 16 64 256 on CUDA, 1 4 16 on CPU)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--features", type=int, default=4096, help="square linear layer size")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (default: 50 CUDA, 7 CPU)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], choices=["dequantize", "memory", "linear"])
    return parser.parse_args()


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn`` (CUDA: event timing on the current stream)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start_time = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start_time)
    return statistics.median(times)


def bench_dequantize(device: torch.device, sizes: list[int], repeats: int, warmup: int) -> str:
    rows = ["| elements | dequantize GB/s | copy GB/s | ratio | dequantize ms |", "|---:|---:|---:|---:|---:|"]
    for size in sizes:
        elements = size * MIB
        codes = torch.randint(-127, 128, (elements // 4096, 4096), dtype=torch.int8, device=device)
        scales = torch.randint(100, 150, (elements // 4096, 128), dtype=torch.uint8, device=device)
        source = torch.empty(elements, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        copy_s = median_seconds(lambda: target.copy_(source), device, repeats, warmup)
        dequant_s = median_seconds(lambda: dequantize(codes, scales), device, repeats, warmup)
        dequant_bytes = elements * (1 + 1 / 32 + 4)  # codes + scales read, float32 written
        copy_bytes = elements * 8
        dequant_gbs, copy_gbs = dequant_bytes / dequant_s / 1e9, copy_bytes / copy_s / 1e9
        rows.append(f"| {size} Mi | {dequant_gbs:.1f} | {copy_gbs:.1f} | {dequant_gbs / copy_gbs:.2f} | "
                    f"{dequant_s * 1e3:.3f} |")
        del codes, scales, source, target
    return "\n".join(rows)


def pack_linears(model: torch.nn.Module, skip: str = "classifier") -> None:
    """Replace every nn.Linear except ``skip`` by MXInt8Linear."""
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and not name.startswith(skip):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, MXInt8Linear.from_linear(module))


def tensor_bytes(model: torch.nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_memory(device: torch.device) -> str:
    from transformers import BertConfig, BertForSequenceClassification

    def fp32_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return BertForSequenceClassification(BertConfig()).eval()

    def packed_model() -> torch.nn.Module:
        model = fp32_model()
        pack_linears(model)
        return model

    inputs = {"input_ids": torch.randint(0, 30522, (8, 128))}
    reference, packed = fp32_model(), packed_model()
    with torch.no_grad():
        logit_gap = (reference(**inputs).logits - packed(**inputs).logits).abs().max().item()
    layers = [m for m in packed.modules() if isinstance(m, MXInt8Linear)]
    weights = sum(m.codes.numel() for m in layers)
    weight_bytes_fp32, weight_bytes_packed = 4 * weights, sum(m.codes.numel() + m.scales.numel() for m in layers)
    fp32_total, packed_total = tensor_bytes(reference), tensor_bytes(packed)
    rows = ["| measure | fp32 | packed | saved |", "|---|---:|---:|---:|",
            f"| parameters + buffers, whole model (MiB) | {fp32_total / MIB:.1f} | {packed_total / MIB:.1f} | "
            f"{1 - packed_total / fp32_total:.1%} |",
            f"| packed Linear weights only (MiB) | {weight_bytes_fp32 / MIB:.1f} | {weight_bytes_packed / MIB:.1f} | "
            f"{1 - weight_bytes_packed / weight_bytes_fp32:.1%} (theory {THEORETICAL_SAVING:.1%}) |"]
    del reference, packed
    if device.type == "cuda":
        (fp32_resident, fp32_peak), (packed_resident, packed_peak) = (
            cuda_memory(build, inputs, device) for build in (fp32_model, packed_model))
        rows += [f"| CUDA memory_allocated after .to(cuda) (MiB) | {fp32_resident / MIB:.1f} | "
                 f"{packed_resident / MIB:.1f} | {1 - packed_resident / fp32_resident:.1%} |",
                 f"| CUDA max_memory_allocated, forward 8x128 (MiB) | {fp32_peak / MIB:.1f} | "
                 f"{packed_peak / MIB:.1f} | {1 - packed_peak / fp32_peak:.1%} |",
                 f"| CUDA: resident bytes saved / fp32 bytes of the packed weights | | | "
                 f"{(fp32_resident - packed_resident) / weight_bytes_fp32:.1%} (theory {THEORETICAL_SAVING:.1%}) |"]
    rows.append(f"\n{len(layers)} Linear layers packed ({weights / 1e6:.1f} M weights); max |logit difference| "
                f"fp32 vs packed (random init, batch 8x128): {logit_gap:.2e}")
    return "\n".join(rows)


def cuda_memory(build: Callable[[], torch.nn.Module], inputs: dict[str, torch.Tensor],
                device: torch.device) -> tuple[int, int]:
    """Bytes the CUDA allocator holds for the model once moved, and its peak during one forward."""
    model = build()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model = model.to(device)
    resident = torch.cuda.memory_allocated(device) - base
    with torch.no_grad():
        model(**{name: value.to(device) for name, value in inputs.items()})
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del model
    return resident, peak


def bench_linear(device: torch.device, features: int, batches: list[int], repeats: int, warmup: int) -> str:
    torch.manual_seed(0)
    weight = torch.randn(features, features, device=device) / features ** 0.5
    bias = torch.randn(features, device=device)
    codes, scales = quantize(weight)
    weight_bf16, bias_bf16 = weight.bfloat16(), bias.bfloat16()
    rows = ["| batch | fp32 F.linear ms | bf16 F.linear ms | mxint8_linear fp32 ms | mxint8_linear bf16 ms | "
            "mxint8 fp32 / F.linear fp32 | mxint8 bf16 / F.linear bf16 |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for batch in batches:
        x = torch.randn(batch, features, device=device)
        x_bf16 = x.bfloat16()
        fp32 = median_seconds(lambda: F.linear(x, weight, bias), device, repeats, warmup)
        bf16 = median_seconds(lambda: F.linear(x_bf16, weight_bf16, bias_bf16), device, repeats, warmup)
        packed = median_seconds(lambda: mxint8_linear(x, codes, scales, bias), device, repeats, warmup)
        packed_bf16 = median_seconds(lambda: mxint8_linear(x_bf16, codes, scales, bias_bf16), device, repeats, warmup)
        rows.append(f"| {batch} | {fp32 * 1e3:.3f} | {bf16 * 1e3:.3f} | {packed * 1e3:.3f} | "
                    f"{packed_bf16 * 1e3:.3f} | {packed / fp32:.2f} | {packed_bf16 / bf16:.2f} |")
    return "\n".join(rows)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        kernels = "CUDA kernels" if cuda_extension() is not None else "torch fallback (kernels not built)"
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, {kernels}"
    return f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__} (torch reference path)"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    sizes = args.sizes or ([1, 4, 16, 64, 256] if use_cuda else [1, 4, 16])
    repeats = args.repeats or (50 if use_cuda else 7)
    print(f"## MXINT8 on {describe(device)}; median of {repeats} runs after {args.warmup} warm-up runs\n")
    if "dequantize" not in args.skip:
        print(f"### Dequantize to float32 vs a same-device float32 copy\n\n"
              f"{bench_dequantize(device, sizes, repeats, args.warmup)}\n")
    if "memory" not in args.skip:
        print(f"### BERT-base classifier, every Linear but the classifier packed\n\n{bench_memory(device)}\n")
    if "linear" not in args.skip:
        print(f"### Linear {args.features}x{args.features} latency\n\n"
              f"{bench_linear(device, args.features, args.batches, repeats, args.warmup)}\n")


if __name__ == "__main__":
    main()
