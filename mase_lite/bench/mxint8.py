"""MXINT8: packed weight and model memory against the 74.2 % theory, GPU memory of a forward pass,
``mxint8_linear`` against ``F.linear`` (fp32, bf16), dequantize throughput against a device copy.

Every ratio is against a baseline measured in the same run on the same device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from mase_lite.bench.section import Plot, Section
from mase_lite.bench.timing import median_seconds, synchronize
from mase_lite.kernels.mxint8 import MXInt8Linear, dequantize, mxint8_linear, pack_linears, quantize

MIB = 2 ** 20
THEORETICAL_SAVING = 1 - (8 + 8 / 32) / 32  # 74.2 %: one int8 element + 1/32 of a uint8 scale vs float32


def bench_dequantize(device: torch.device, sizes: list[int], warmup: int, repeats: int) -> Section:
    """Dequantize GB/s (codes and scales read, float32 written) vs a float32 copy of the same elements."""
    rows = []
    for size in sizes:
        elements = size * MIB
        codes = torch.randint(-127, 128, (elements // 4096, 4096), dtype=torch.int8, device=device)
        scales = torch.randint(100, 150, (elements // 4096, 128), dtype=torch.uint8, device=device)
        source = torch.empty(elements, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        copy_s = median_seconds(lambda: target.copy_(source), device, warmup, repeats)
        dequant_s = median_seconds(lambda: dequantize(codes, scales), device, warmup, repeats)
        dequant_gbs = elements * (1 + 1 / 32 + 4) / dequant_s / 1e9
        copy_gbs = elements * 8 / copy_s / 1e9
        rows.append({"Mi elements": size, "dequantize GB/s": dequant_gbs, "copy GB/s": copy_gbs,
                     "ratio": dequant_gbs / copy_gbs, "dequantize ms": dequant_s * 1e3})
        del codes, scales, source, target
    return Section("dequantize", "MXINT8 dequantize throughput vs device copy",
                   ["Mi elements", "dequantize GB/s", "copy GB/s", "ratio", "dequantize ms"], rows,
                   [f"Median of {repeats} runs after {warmup}; bytes moved: dequantize 5.03 B/element, copy 8."],
                   Plot(x="Mi elements", ys=["dequantize GB/s", "copy GB/s"], ylabel="GB/s", logx=True))


def tensor_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def bench_memory(device: torch.device, bert_config: dict, batch: int, seq: int) -> Section:
    """Bytes of the packed Linear weights and of the whole model, fp32 vs packed; on CUDA also allocated
    bytes after ``.to(cuda)`` and the peak of one forward pass."""
    from transformers import BertConfig, BertForSequenceClassification

    def fp32_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return BertForSequenceClassification(BertConfig(**bert_config)).eval()

    def packed_model() -> torch.nn.Module:
        model = fp32_model()
        pack_linears(model, skip=("classifier",))
        return model

    inputs = {"input_ids": torch.randint(0, 1000, (batch, seq))}
    reference, packed = fp32_model(), packed_model()
    with torch.no_grad():
        logit_gap = (reference(**inputs).logits - packed(**inputs).logits).abs().max().item()
    layers = [m for m in packed.modules() if isinstance(m, MXInt8Linear)]
    weights = sum(m.codes.numel() for m in layers)
    fp32_weights, packed_weights = 4 * weights, sum(m.codes.numel() + m.scales.numel() for m in layers)
    fp32_total, packed_total = tensor_bytes(reference), tensor_bytes(packed)
    weight_saving = 1 - packed_weights / fp32_weights
    rows = [{"measure": "packed Linear weights (MiB)", "fp32": fp32_weights / MIB, "packed": packed_weights / MIB,
             "saved": f"{1 - packed_weights / fp32_weights:.1%}", "of theory": f"{weight_saving / THEORETICAL_SAVING:.1%}"},
            {"measure": "parameters + buffers, whole model (MiB)", "fp32": fp32_total / MIB,
             "packed": packed_total / MIB, "saved": f"{1 - packed_total / fp32_total:.1%}", "of theory": ""}]
    del reference, packed
    if device.type == "cuda":
        (fp32_resident, fp32_peak), (packed_resident, packed_peak) = (
            cuda_memory(build, inputs, device) for build in (fp32_model, packed_model))
        rows += [{"measure": "CUDA memory_allocated after .to(cuda) (MiB)", "fp32": fp32_resident / MIB,
                  "packed": packed_resident / MIB, "saved": f"{1 - packed_resident / fp32_resident:.1%}",
                  "of theory": f"{(fp32_resident - packed_resident) / fp32_weights / THEORETICAL_SAVING:.1%}"},
                 {"measure": f"CUDA max_memory_allocated, forward {batch}x{seq} (MiB)", "fp32": fp32_peak / MIB,
                  "packed": packed_peak / MIB, "saved": f"{1 - packed_peak / fp32_peak:.1%}", "of theory": ""}]
    notes = [f"BERT {bert_config or 'bert-base (BertConfig defaults)'}; {len(layers)} Linear layers packed (all but the classifier, "
             f"{weights / 1e6:.2f} M weights); theory {THEORETICAL_SAVING:.1%}; max |logit difference| fp32 vs "
             f"packed (random init, batch {batch}x{seq}): {logit_gap:.2e}."]
    return Section("memory", "MXINT8 memory", ["measure", "fp32", "packed", "saved", "of theory"], rows, notes)


def cuda_memory(build: Callable[[], torch.nn.Module], inputs: dict[str, torch.Tensor],
                device: torch.device) -> tuple[int, int]:
    """Bytes the CUDA allocator holds for the model once moved, and its peak during one forward."""
    model = build()
    synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model = model.to(device)
    resident = torch.cuda.memory_allocated(device) - base
    with torch.no_grad():
        model(**{name: value.to(device) for name, value in inputs.items()})
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del model
    return resident, peak


def bench_linear(device: torch.device, features: int, batches: list[int], warmup: int, repeats: int) -> Section:
    """``mxint8_linear`` against ``F.linear`` on a square layer, in fp32 and bf16."""
    torch.manual_seed(0)
    weight = torch.randn(features, features, device=device) / features ** 0.5
    bias = torch.randn(features, device=device)
    codes, scales = quantize(weight)
    weight_bf16, bias_bf16 = weight.bfloat16(), bias.bfloat16()
    rows = []
    for batch in batches:
        x = torch.randn(batch, features, device=device)
        x_bf16 = x.bfloat16()
        fp32 = median_seconds(lambda: F.linear(x, weight, bias), device, warmup, repeats)
        bf16 = median_seconds(lambda: F.linear(x_bf16, weight_bf16, bias_bf16), device, warmup, repeats)
        packed = median_seconds(lambda: mxint8_linear(x, codes, scales, bias), device, warmup, repeats)
        packed_bf16 = median_seconds(lambda: mxint8_linear(x_bf16, codes, scales, bias_bf16), device, warmup, repeats)
        rows.append({"batch": batch, "F.linear fp32 ms": fp32 * 1e3, "F.linear bf16 ms": bf16 * 1e3,
                     "mxint8 fp32 ms": packed * 1e3, "mxint8 bf16 ms": packed_bf16 * 1e3,
                     "mxint8 / F.linear fp32": packed / fp32, "mxint8 / F.linear bf16": packed_bf16 / bf16})
    return Section("linear", f"mxint8_linear vs F.linear, {features}x{features}",
                   ["batch", "F.linear fp32 ms", "F.linear bf16 ms", "mxint8 fp32 ms", "mxint8 bf16 ms",
                    "mxint8 / F.linear fp32", "mxint8 / F.linear bf16"], rows,
                   [f"Median of {repeats} runs after {warmup}; below 1 the packed layer is faster."],
                   Plot(x="batch", ys=["F.linear fp32 ms", "F.linear bf16 ms", "mxint8 fp32 ms", "mxint8 bf16 ms"],
                        ylabel="ms per call", logx=True))
