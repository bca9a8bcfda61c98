"""torch.compile against eager on BERT: compile time apart, then medians of interleaved calls."""

from __future__ import annotations

import statistics
import time

import torch

from mase_lite.bench.section import Plot, Section
from mase_lite.bench.timing import column_ratio, paired_seconds, synchronize


def bert(config: dict) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(**config)).eval()


def bench_compile(device: torch.device, models: dict[str, dict], batch: int, seq: int, warmup: int,
                  repeats: int) -> Section:
    """One row per BERT config: eager ms, compiled ms (inductor), speed-up, first-call compile seconds."""
    rows = []
    for name, config in models.items():
        model = bert(config).to(device)
        inputs = {"input_ids": torch.randint(0, 1000, (batch, seq), device=device),
                  "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device)}
        compiled = torch.compile(model)
        with torch.inference_mode():
            synchronize(device)
            start = time.perf_counter()
            compiled(**inputs)
            synchronize(device)
            compile_s = time.perf_counter() - start
            gap = (compiled(**inputs).logits - model(**inputs).logits).abs().max().item()
            eager_s, compiled_s = paired_seconds([lambda: model(**inputs), lambda: compiled(**inputs)], device,
                                                 warmup, repeats)
        rows.append({"model": name, "params M": sum(p.numel() for p in model.parameters()) / 1e6,
                     "eager ms": 1e3 * statistics.median(eager_s), "compiled ms": 1e3 * statistics.median(compiled_s),
                     "speed-up": column_ratio(eager_s, compiled_s), "compile s": compile_s,
                     "max abs diff": f"{gap:.1e}"})
    notes = [f"Batch {batch}x{seq}, eval mode, inference_mode; compile s is the first compiled call (inductor); "
             f"then median of {repeats} interleaved calls after {warmup} warm-up calls. A speed-up below 1 means "
             "eager is faster."]
    return Section("compile", "torch.compile vs eager (BERT)",
                   ["model", "params M", "eager ms", "compiled ms", "speed-up", "compile s", "max abs diff"], rows,
                   notes, Plot(x="model", ys=["eager ms", "compiled ms"], ylabel="ms per forward", kind="bar"))
