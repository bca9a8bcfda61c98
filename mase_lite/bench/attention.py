"""Naive attention versus the same graph after ``fuse_sdpa`` (``F.scaled_dot_product_attention``).

A naive block (``matmul(q, kᵀ) · scale + mask → softmax → dropout → matmul(·, v)``) is captured once per
shape; one copy stays naive, the other goes through ``fuse_sdpa``. Both run in eval mode under
``torch.inference_mode`` on the same inputs, their calls interleaved.
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.nn as nn

from mase_lite.bench.section import Plot, Section
from mase_lite.bench.timing import column_ratio, paired_seconds


class NaiveAttention(nn.Module):
    """Attention core written with plain ops, as eager HF models do."""

    def __init__(self, head_dim: int, dropout: float = 0.1):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale + mask
        return torch.matmul(self.dropout(torch.softmax(scores, dim=-1)), v)


def make_inputs(batch: int, heads: int, seq: int, head_dim: int, device: torch.device,
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """q, k, v and an additive mask hiding the last quarter of every other sequence."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.zeros(batch, 1, 1, seq, dtype=dtype)
    mask[::2, ..., seq * 3 // 4:] = torch.finfo(dtype).min
    return {name: t.to(device) for name, t in {"q": q, "k": k, "v": v, "mask": mask}.items()}


def graphs(inputs: dict[str, torch.Tensor], head_dim: int, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """(naive, fused) GraphModules captured on CPU with these input shapes, moved to ``device``."""
    import mase_lite.passes as passes
    from mase_lite.ir.graph import MaseGraph

    cpu_inputs = {name: t.cpu() for name, t in inputs.items()}
    naive = MaseGraph(NaiveAttention(head_dim).eval(), example_inputs=cpu_inputs)
    fused = MaseGraph(NaiveAttention(head_dim).eval(), example_inputs=cpu_inputs)
    fused, info = passes.fuse_sdpa(fused)
    if len(info["fused"]) != 1:
        raise RuntimeError(f"fuse_sdpa did not fuse the naive block: {info}")
    return naive.to(device).model.eval(), fused.to(device).model.eval()


def bench_attention(device: torch.device, seqs: list[int], batch: int, heads: int, head_dim: int,
                    warmup: int, repeats: int, dtype: torch.dtype = torch.float32) -> Section:
    rows = []
    for seq in seqs:
        inputs = make_inputs(batch, heads, seq, head_dim, device, dtype)
        naive, fused = graphs(inputs, head_dim, device)
        with torch.inference_mode():
            diff = (naive(**inputs).float() - fused(**inputs).float()).abs().max().item()
            naive_s, fused_s = paired_seconds([lambda: naive(**inputs), lambda: fused(**inputs)], device,
                                              warmup, repeats)
        rows.append({"device": device.type, "seq": seq, "naive ms": 1e3 * statistics.median(naive_s),
                     "fused ms": 1e3 * statistics.median(fused_s), "speed-up": column_ratio(naive_s, fused_s),
                     "max abs diff": f"{diff:.1e}"})
    notes = [f"Batch {batch}, {heads} heads, head dim {head_dim}, {str(dtype).removeprefix('torch.')}; "
             f"median of {repeats} interleaved calls after {warmup} warm-up calls; speed-up is naive ms / fused ms "
             "(the columns' medians)."]
    return Section("attention", "Naive attention vs fuse_sdpa",
                   ["device", "seq", "naive ms", "fused ms", "speed-up", "max abs diff"], rows, notes,
                   Plot(x="seq", ys=["naive ms", "fused ms"], ylabel="ms per call"))
