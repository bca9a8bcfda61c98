"""Naive attention vs the same graph after ``fuse_sdpa`` (F.scaled_dot_product_attention), CPU and CUDA.

Run: python benchmarks/attention.py [--seq 128 512] [--batch 8] [--heads 12] [--repeats 20] [--threads N]
A naive attention block (matmul(q, kᵀ) · scale + mask → softmax → dropout → matmul(·, v)) is
captured with MaseGraph once per shape; one copy is left naive, the other goes through
``fuse_sdpa``. Both run in eval mode under ``torch.inference_mode`` on the same inputs, in the same
process, their calls interleaved; each time is the median of --repeats calls after --warmup calls,
and the speed-up is the median of the per-pair ratios naive / fused (robust to load drifting on a
shared machine). CUDA rows are added when a GPU is present (timed with synchronisation).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn

import mase_lite.passes as passes
from mase_lite import MaseGraph


class NaiveAttention(nn.Module):
    """Attention core written with plain ops, as eager HF models do."""

    def __init__(self, head_dim: int, dropout: float = 0.1):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale + mask
        return torch.matmul(self.dropout(torch.softmax(scores, dim=-1)), v)


def make_inputs(batch: int, heads: int, seq: int, head_dim: int, device: str, dtype: torch.dtype) -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.zeros(batch, 1, 1, seq, dtype=dtype)
    mask[::2, ..., seq * 3 // 4 :] = torch.finfo(dtype).min
    return {name: t.to(device) for name, t in {"q": q, "k": k, "v": v, "mask": mask}.items()}


def graphs(inputs: dict, head_dim: int, device: str) -> tuple[nn.Module, nn.Module]:
    """(naive, fused) GraphModules captured on CPU with these input shapes, moved to ``device``."""
    cpu_inputs = {name: t.cpu() for name, t in inputs.items()}
    naive = MaseGraph(NaiveAttention(head_dim).eval(), example_inputs=cpu_inputs)
    fused = MaseGraph(NaiveAttention(head_dim).eval(), example_inputs=cpu_inputs)
    fused, info = passes.fuse_sdpa(fused)
    if len(info["fused"]) != 1:
        raise RuntimeError(f"fuse_sdpa did not fuse the naive block: {info}")
    return naive.to(device).model.eval(), fused.to(device).model.eval()


def paired_ms(fns: list, device: str, warmup: int, repeats: int) -> list[list[float]]:
    """Per-call milliseconds of each function, calls interleaved so that all see the same machine load."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        for fn in fns:
            fn()
    sync()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(1e3 * (time.perf_counter() - t0))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, batch {args.batch}, {args.heads} heads, "
        f"head dim {args.head_dim}, {args.dtype}, median of {args.repeats} after {args.warmup} warm-up calls"
    )
    print("| device | seq | naive ms | fused ms | speed-up (median of naive / fused) | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for device in devices:
        for seq in args.seq:
            inputs = make_inputs(args.batch, args.heads, seq, args.head_dim, device, dtype)
            naive, fused = graphs(inputs, args.head_dim, device)
            with torch.inference_mode():
                diff = (naive(**inputs).float() - fused(**inputs).float()).abs().max().item()
                naive_ms, fused_ms = paired_ms(
                    [lambda: naive(**inputs), lambda: fused(**inputs)], device, args.warmup, args.repeats
                )
            ratio = statistics.median(n / f for n, f in zip(naive_ms, fused_ms))
            print(
                f"| {device} | {seq} | {statistics.median(naive_ms):.2f} | {statistics.median(fused_ms):.2f} "
                f"| {ratio:.2f}× | {diff:.1e} |"
            )


if __name__ == "__main__":
    main()
