"""``mase-lite bench``: the performance lab in one command, writing results.md, results.json and plots.

Example::

    run_bench(["attention"], device="cpu", quick=True, output_dir="bench_out")
"""

from __future__ import annotations

import json
import logging
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mase_lite.bench.section import Section
from mase_lite.infra.errors import UserError, ensure_dir
from mase_lite.infra.files import staged_file

logger = logging.getLogger(__name__)

PARTS = ("compile", "attention", "mxint8", "codegen", "decode")
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_BERT = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
BIG_BERT = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048)
QUICK_BERT = dict(DEFAULT_BERT, vocab_size=1000)
QUICK_LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128, vocab_size=1000)
CPU_LLAMA = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=2816, vocab_size=32000)


@dataclass(frozen=True)
class Sizes:
    """How big and how often: one set for --quick, one for CPU, one for CUDA."""

    warmup: int
    repeats: int
    batch: int
    seq: int
    compile_models: dict
    attention_seqs: tuple[int, ...]
    attention_shape: tuple[int, int, int]  # batch, heads, head dim
    dequantize_mi: tuple[int, ...]
    memory_bert: dict
    linear_features: int
    linear_batches: tuple[int, ...] = (1, 16, 256)
    cpu_batches: tuple[int, ...] = (1, 8, 64, 128)  # the CPU section (mase_lite/bench/mxint8_cpu.py)
    cpu_threads: tuple[int, ...] = (1, 2)
    cpu_llama: dict = field(default_factory=lambda: dict(CPU_LLAMA))
    cpu_tokens: tuple[int, ...] = (1, 128)
    cpu_min_run_time: float = 0.2


QUICK = Sizes(1, 3, 2, 16, {"bert-tiny shape": QUICK_BERT}, (32, 64), (2, 2, 16), (1,), QUICK_BERT, 256,
              cpu_batches=(1, 8, 64), cpu_threads=(1,), cpu_llama=QUICK_LLAMA, cpu_tokens=(1, 16), cpu_min_run_time=0.01)
CPU = Sizes(3, 20, 8, 128, {"bert-tiny shape": DEFAULT_BERT, "bert h512 x4": BIG_BERT}, (128, 256, 512),
            (8, 12, 64), (1, 4, 16), {}, 4096)
CUDA = Sizes(10, 50, 8, 128, {"bert-tiny shape": DEFAULT_BERT, "bert h512 x4": BIG_BERT}, (128, 256, 512, 1024),
             (8, 12, 64), (1, 4, 16, 64, 256), {}, 4096)


def resolve_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise UserError(f"--device: unknown device {device!r}; allowed: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device: cuda was asked for but no CUDA device is visible; use cpu or auto")
    return torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")


def run_part(part: str, device: torch.device, sizes: Sizes) -> list[Section]:
    w, r = sizes.warmup, sizes.repeats
    if part == "compile":
        from mase_lite.bench.compile import bench_compile

        return [bench_compile(device, sizes.compile_models, sizes.batch, sizes.seq, w, r)]
    if part == "attention":
        from mase_lite.bench.attention import bench_attention

        sections = [bench_attention(d, list(sizes.attention_seqs), *sizes.attention_shape, w, r)
                    for d in dict.fromkeys([torch.device("cpu"), device])]
        for extra in sections[1:]:
            sections[0].rows += extra.rows
        return sections[:1]
    if part == "mxint8":
        from mase_lite.bench.mxint8 import bench_dequantize, bench_linear, bench_memory

        sections = [bench_memory(device, sizes.memory_bert, sizes.batch, sizes.seq),
                    bench_linear(device, sizes.linear_features, list(sizes.linear_batches), w, r)]
        if device.type == "cpu":
            from mase_lite.bench import mxint8_cpu

            rounds, features, threads = max(1, min(r, 3)), sizes.linear_features, list(sizes.cpu_threads)
            sections += [
                mxint8_cpu.bench_cpu_linear(features, list(sizes.cpu_batches), threads, rounds, sizes.cpu_min_run_time),
                mxint8_cpu.bench_cpu_bandwidth(features, threads, rounds, sizes.cpu_min_run_time),
                mxint8_cpu.bench_cpu_model(sizes.cpu_llama, list(sizes.cpu_tokens), threads, rounds,
                                           sizes.cpu_min_run_time)]
        return [*sections, bench_dequantize(device, list(sizes.dequantize_mi), w, r)]
    if part == "codegen":
        from mase_lite.bench.codegen import bench_codegen

        config = sizes.compile_models["bert-tiny shape"]
        return [bench_codegen(device, config, sizes.batch, sizes.seq, w, r)]
    if part == "decode":
        if device.type != "cpu":
            return []  # the packed kernels this part times are CPU kernels
        from mase_lite.bench.decode import bench_decode

        return [bench_decode(sizes.cpu_llama, list(sizes.cpu_threads), 8 if sizes is QUICK else 32,
                             4 if sizes is QUICK else 16, max(1, min(sizes.repeats, 3)))]
    raise UserError(f"--parts: unknown part {part!r}; allowed: {', '.join(PARTS)}")


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        from mase_lite.kernels.mxint8 import cuda_extension

        kernels = "MXINT8 CUDA kernels" if cuda_extension() is not None else "MXINT8 torch fallback (kernels not built)"
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, {kernels}"
    return (f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads, "
            f"torch {torch.__version__}")


def plot_section(section: Section, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = section.plot
    fig, ax = plt.subplots(figsize=(6, 4))
    groups = sorted({row.get("device", "") for row in section.rows})
    for group in groups:
        rows = [row for row in section.rows if row.get("device", "") == group]
        xs = [row[spec.x] for row in rows]
        for i, y in enumerate(spec.ys):
            label = f"{y} ({group})" if group else y
            if spec.kind == "bar":
                width = 0.8 / len(spec.ys)
                ax.bar([j + i * width for j in range(len(xs))], [row[y] for row in rows], width, label=label)
                ax.set_xticks([j + 0.4 - width / 2 for j in range(len(xs))], [str(x) for x in xs])
            else:
                ax.plot(xs, [row[y] for row in rows], marker="o", label=label)
    if spec.logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(spec.x)
    ax.set_ylabel(spec.ylabel)
    ax.set_title(section.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with staged_file(path) as staging:
        fig.savefig(staging, format="png", dpi=100)
    plt.close(fig)


def run_bench(parts: list[str] | tuple[str, ...] = PARTS, device: str = "auto", quick: bool = False,
              output_dir: str | Path = "bench", repeats: int | None = None) -> dict[str, Any]:
    """Run the chosen parts; write ``results.md``, ``results.json`` and one PNG per plotted table."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise UserError(f"--parts: unknown part {unknown[0]!r}; allowed: {', '.join(PARTS)}")
    if repeats is not None and repeats < 1:
        raise UserError(f"--repeats: must be at least 1, got {repeats}")
    torch_device = resolve_device(device)
    sizes = QUICK if quick else (CUDA if torch_device.type == "cuda" else CPU)
    if repeats is not None:
        sizes = Sizes(**{**sizes.__dict__, "repeats": repeats})
    output = ensure_dir(output_dir, "--output-dir")
    sections: list[Section] = []
    for part in parts:
        logger.info("bench: %s on %s", part, torch_device)
        sections += run_part(part, torch_device, sizes)
    machine = describe(torch_device)
    header = f"# mase-lite bench\n\n{machine}; {'quick sizes' if quick else 'full sizes'}.\n"
    markdown = "\n\n".join([header, *(s.markdown() for s in sections)]) + "\n"
    plots = []
    for section in sections:
        if section.plot is not None and section.rows:
            plot_section(section, output / f"{section.name}.png")
            plots.append(f"{section.name}.png")
    result = {"machine": machine, "device": torch_device.type, "quick": quick, "parts": list(parts),
              "sections": [s.as_dict() for s in sections], "plots": plots}
    for name, text in (("results.md", markdown), ("results.json", json.dumps(result, indent=2))):
        with staged_file(output / name) as staging:
            staging.write_text(text)
    return result
