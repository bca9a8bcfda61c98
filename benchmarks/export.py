"""Deployment: a 4-bit GPTQ Llama of ~150 M parameters to compressed-tensors, and MXINT8 / MXFP4 to GGUF.

Builds the Llama of the PTQ issue (hidden 1024, 8 layers, 16 heads, 4 KV heads, FFN 2816, vocab 32000: 156 M
parameters; random weights, as no checkpoint can be downloaded) and the grammar corpus in windows of 128 tokens,
then, in one pipeline run: quantize every Linear but the head to 4-bit integers in groups of 128 (compressed-tensors'
grid: full range, float16 scales), GPTQ over 16 windows, evaluate, save a checkpoint, export compressed-tensors.
transformers (with compressed-tensors) then loads the directory and its perplexity on the same test windows is
computed by the same evaluate pass. Prints sizes on disk against the float32 checkpoint, both perplexities and the
seconds of each step. A second export keeps the float tensors (embeddings, head, norms) in bfloat16, as checkpoints
are usually shipped; transformers computes it in float32.

GGUF: the same model with MXINT8 (-> Q8_0) and with MXFP4 (-> MXFP4) weights, round to nearest; every weight is read
back with gguf's reader and dequantizer and compared with the tool's bit for bit. Where ``llama_cpp`` (the
llama-cpp-python package, built from source) is installed, llama.cpp loads each file and generates; otherwise
that is said.

    python benchmarks/export.py                  # the 156 M model
    python benchmarks/export.py --layers 2       # a quick run
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from record import add_record_flag, recording  # beside this script

SHAPE = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 2048}
W4 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "full_range": True,
      "scale_dtype": "float16"}


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def compressed_tensors_run(root: Path, layers: int) -> dict:
    import mase_lite as ml
    from transformers import AutoModelForCausalLM

    data = {"dataset": "synthetic-grammar", "block_size": 128, "n_train": 16, "n_test": 32}
    spec = {"name": "export-gptq", "seed": 0, "device": "cpu",
            "model": {"task": "causal-lm", "hf_config": {**SHAPE, "num_hidden_layers": layers}}, "data": data,
            "steps": [{"pass": "save", "params": {"path": "float", "weights": "float"}},
                      {"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": W4}}}},
                      {"pass": "gptq", "params": {"num_batches": 16, "batch_size": 1}},
                      {"pass": "evaluate", "params": {"label": "tool", "progress": False}},
                      {"pass": "save", "params": {"path": "codes"}},
                      {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}},
                      {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf_bf16",
                                                    "float_dtype": "bfloat16"}}],
            "output_dir": str(root / "run")}
    result = ml.run_pipeline(spec)
    steps = {s.get("label") or s["pass"]: s for s in result.report["steps"]}
    start = time.perf_counter()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    loaded = AutoModelForCausalLM.from_pretrained(root / "run" / "hf")
    load_seconds = time.perf_counter() - start
    _, info = ml.passes.evaluate(loaded, {"label": "transformers", "progress": False}, data=result.data)
    bf16 = AutoModelForCausalLM.from_pretrained(root / "run" / "hf_bf16", dtype=torch.float32)
    _, info_bf16 = ml.passes.evaluate(bf16, {"label": "transformers", "progress": False}, data=result.data)
    run = root / "run"
    return {"parameters": sum(p.numel() for p in result.mg.source_model.parameters()),
            "float_checkpoint": size(run / "float" / "model.safetensors"),
            "codes_checkpoint": size(run / "codes" / "model.safetensors"),
            "compressed_tensors": size(run / "hf" / "model.safetensors"),
            "compressed_tensors_bf16": size(run / "hf_bf16" / "model.safetensors"),
            "transformers_perplexity_bf16": info_bf16["metrics"]["perplexity"],
            "tool_perplexity": result.report["metrics"]["tool"]["perplexity"],
            "transformers_perplexity": info["metrics"]["perplexity"],
            "capture_s": result.report["capture"]["seconds"],
            "gptq_s": [s["seconds"] for s in result.report["steps"] if s["pass"] == "gptq"][0],
            "export_s": [s["seconds"] for s in result.report["steps"] if s["pass"] == "export"][0],
            "transformers_load_s": load_seconds}


def gguf_run(root: Path, layers: int) -> list[dict]:
    import gguf
    import mase_lite as ml
    from gguf.quants import dequantize
    from transformers import LlamaConfig, LlamaForCausalLM

    from mase_lite.deploy import export

    rows = []
    config = {k: v for k, v in {**SHAPE, "num_hidden_layers": layers}.items() if k != "model_type"}
    for label, fmt in (("MXINT8 -> Q8_0", {"name": "mxint", "element_width": 8}),
                       ("MXFP4 -> MXFP4", {"name": "mxfp", "element_format": "e2m1"})):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**config)).eval()
        model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"head": None, "linear": {"weight": fmt}}})
        path = root / f"{fmt['name']}.gguf"
        start = time.perf_counter()
        info = export(model, "gguf", path)
        seconds = time.perf_counter() - start
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
        exact = checked = 0
        for name, module in model.named_modules():
            if hasattr(module, "weight_quantizer") and module.weight_quantizer is not None:
                block, _, rest = name.removeprefix("model.layers.").partition(".")
                target = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                          "mlp.down_proj": "ffn_down"}[rest]
                tensor = tensors[f"blk.{block}.{target}.weight"]
                ours = module.weight_quantizer(module.weight).detach()
                if rest in ("self_attn.q_proj", "self_attn.k_proj"):  # llama.cpp's rotary row order
                    heads = config["num_attention_heads"] if rest.endswith("q_proj") else config["num_key_value_heads"]
                    ours = ours.reshape(heads, 2, ours.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(ours.shape)
                checked += 1
                exact += bool(np.array_equal(dequantize(tensor.data, tensor.tensor_type), ours.numpy()))
        rows.append({"mapping": label, "bytes": info["bytes"], "seconds": seconds, "exact": f"{exact}/{checked}",
                     "llama.cpp": _llama_cpp(path)})
    return rows


def _llama_cpp(path: Path) -> str:
    try:
        from llama_cpp import Llama
    except ImportError:
        return "llama-cpp-python not installed (it builds from source: pip install llama-cpp-python)"
    llm = Llama(model_path=str(path), n_ctx=256, verbose=False)
    start = time.perf_counter()
    out = llm("the", max_tokens=16)
    return f"generates: {out['usage']['completion_tokens'] / (time.perf_counter() - start):.1f} tokens/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8, help="decoder layers (8: 156 M parameters)")
    add_record_flag(parser)
    args = parser.parse_args()
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        ct = compressed_tensors_run(Path(tmp), args.layers)
        rows = gguf_run(Path(tmp), args.layers)
    print(f"load average before {before}, after {load()}")
    print(json.dumps(ct, indent=1))
    float32 = ct["float_checkpoint"]
    print(f"compressed-tensors / float32 checkpoint: {ct['compressed_tensors'] / float32:.3f} (bfloat16 float tensors: "
          f"{ct['compressed_tensors_bf16'] / float32:.3f}); codes checkpoint / float32: {ct['codes_checkpoint'] / float32:.3f}")
    print(f"perplexity: tool {ct['tool_perplexity']:.6g}, transformers {ct['transformers_perplexity']:.6g}, "
          f"transformers on the bfloat16 export {ct['transformers_perplexity_bf16']:.6g}")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    with recording("export"):
        main()
