"""The tool's GGUF against llama.cpp's own quantizer, judged by llama.cpp itself: held-out perplexity in
``llama-perplexity`` of the same float model quantized by ``llama-quantize`` (plain, and with an importance matrix
from ``llama-imatrix`` on the calibration text) and by the tool (rounding, and GPTQ on the same calibration text),
each file's size beside it. Every figure comes from one run of this script.

    python benchmarks/gguf_vs_llama_cpp.py --model SmolLM2-135M-Instruct.Q4_1.gguf --llama-bin llama.cpp/build/bin

The model: a GGUF file, every tensor dequantized to F32 (the float model both tools start from); the text: Python's own documentation (``pydoc_data.topics``, real English prose with code), the first part to
calibrate, a later part held out. The embedding (the head, where tied) is F16 in both tools' files
(``--token-embedding-type f16 --output-tensor-type f16``), so the sizes compare the quantized layers. llama.cpp's binaries are
built from its source (not part of the project).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path

import mase_lite as ml
from record import add_record_flag, recording  # beside this script


def corpus(work: Path, calibration_chars: int, held_out_chars: int) -> tuple[Path, Path]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    calibration, held_out = work / "calibration.txt", work / "held_out.txt"
    calibration.write_text(text[:calibration_chars])
    held_out.write_text(text[-held_out_chars:])
    return calibration, held_out


def float_source(model: Path, out: Path) -> None:
    """``model`` with every quantized tensor dequantized to F32 by gguf's own dequantizer (metadata and tokenizer as
    they are): the float model both tools start from."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(model)
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in ("general.architecture", "general.file_type"):
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tool_gguf(model: Path, calibration: Path, out: Path, preset: str, gptq: bool, samples: int) -> float:
    """The tool's pipeline: the model quantized with ``preset`` (its head, tied to the embedding, left float), with or
    without GPTQ (act order, block scales by the Hessian's diagonal), exported with F16 embeddings; seconds."""
    steps = [{"pass": "quantize", "params": {"preset": preset, "ignore": ["lm_head"]}}]
    if gptq:
        steps.append({"pass": "gptq", "params": {"num_batches": samples // 4, "batch_size": 4, "act_order": True}})
    steps.append({"pass": "export", "params": {"format": "gguf", "path": str(out), "overwrite": True,
                                                "float_dtype": "float16"}})
    t0 = time.perf_counter()
    ml.run_pipeline({"name": out.stem, "model": {"task": "causal-lm", "pretrained": str(model)}, "capture": "modules",
                     "data": {"dataset": "txt", "path": str(calibration), "block_size": 512, "test_fraction": 0.1},
                     "steps": steps, "output_dir": str(out.parent / f"run_{out.stem}")})
    return time.perf_counter() - t0


def llama(binary: Path, *args: str) -> str:
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def perplexity(bin_dir: Path, model: Path, text: Path, context: int, threads: int) -> tuple[float, float]:
    out = llama(bin_dir / "llama-perplexity", "-m", str(model), "-f", str(text), "-c", str(context), "-t", str(threads),
                "-b", str(context))
    found = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
    if found is None:
        raise RuntimeError(f"llama-perplexity printed no estimate:\n{out[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--presets", nargs="+", default=["Q4_0", "Q4_K_M"],
                        help="llama-quantize's types, the tool's presets of the same name")
    parser.add_argument("--samples", type=int, default=64, help="calibration windows of 512 tokens (GPTQ and imatrix)")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    add_record_flag(parser)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gguf_vs_llama_"))
    work.mkdir(parents=True, exist_ok=True)
    calibration, held_out = corpus(work, 400_000, 120_000)
    float_file = work / "float.gguf"
    float_source(args.model, float_file)
    imatrix = work / "imatrix.gguf"
    llama(args.llama_bin / "llama-imatrix", "-m", str(float_file), "-f", str(calibration), "-o", str(imatrix),
          "-c", str(args.context), "--chunks", str(args.samples), "-t", str(args.threads))
    rows = [("float (F32)", float_file, None)]
    for preset in args.presets:
        plain, weighted = work / f"llama_{preset}.gguf", work / f"llama_{preset}_imatrix.gguf"
        for out, extra in ((plain, []), (weighted, ["--imatrix", str(imatrix)])):
            llama(args.llama_bin / "llama-quantize", *extra, "--token-embedding-type", "f16", "--output-tensor-type",
                  "f16", str(float_file), str(out), preset, str(args.threads))
        rtn, gptq = work / f"tool_{preset}_rtn.gguf", work / f"tool_{preset}_gptq.gguf"
        seconds_rtn = tool_gguf(float_file, calibration, rtn, preset, False, args.samples)
        seconds_gptq = tool_gguf(float_file, calibration, gptq, preset, True, args.samples)
        rows += [(f"llama.cpp {preset}", plain, None), (f"llama.cpp {preset} + imatrix", weighted, None),
                 (f"tool {preset} rounding", rtn, seconds_rtn), (f"tool {preset} GPTQ", gptq, seconds_gptq)]
    print(f"model {args.model.name}; text: pydoc_data.topics (calibration 400,000 chars, held out the last 120,000); "
          f"llama-perplexity -c {args.context}; {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"| file | bytes | perplexity (llama.cpp) | tool seconds |\n|---|---:|---:|---:|")
    for label, path, seconds in rows:
        ppl, err = perplexity(args.llama_bin, path, held_out, args.context, args.threads)
        print(f"| {label} | {path.stat().st_size:,} | {ppl:.4f} ± {err:.4f} | {'' if seconds is None else f'{seconds:.0f}'} |",
              flush=True)


if __name__ == "__main__":
    with recording("gguf_vs_llama_cpp"):
        main()
