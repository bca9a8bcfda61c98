"""GPTQ against gptqmodel and llm-compressor in one run: the 156 M Llama of benchmarks/ptq.py (random weights, seed 0),
W4 symmetric in groups of 128 with act-order and damping 0.01, every Linear of the decoder layers (not the head), on the
same 16 windows of 128 calibration tokens, each tool in a fresh process, the tools in turn each round, quiet and then
beside two busy processes. Prints each tool's quantization wall time (the tool: its gptq step; gptqmodel: its
``quantize()``, its packing extension built before the clock starts; llm-compressor: its ``oneshot()``) and each
process's CPU seconds (user + system, imports and model loading included), medians and ranges, and the tool's
held-out layer error.

Each peer lives in its own environment, made with torch pinned to the one installed (``-c`` a constraints file
holding ``torch==2.13.0``: pip must not resolve a torch of its own); pass its interpreter:

- gptqmodel (it pins its own numpy): 7.6.0 from its sdist, ``python -m venv --system-site-packages gq &&
  gq/bin/pip install --no-deps gptqmodel-7.6.0.tar.gz`` plus its runtime requirements;
- llm-compressor (optional; without it its columns are left out): ``python -m venv --system-site-packages lc &&
  lc/bin/pip install -c constraints.txt llmcompressor`` (0.14.0.1, which brings transformers 5.17.0 and
  compressed-tensors 0.19.0 into its environment). Its GPTQ takes only ``actorder: "static"`` (groups of the
  weight's own columns, their scales from the weight before GPTQ; ``"group"`` is refused); the tool's groups are the
  weight's columns too, a group's scale fixed at its first column in act-order; gptqmodel's (``desc_act``) follow
  the act-order.

    python benchmarks/gptq_vs_gptqmodel.py --gptqmodel-python /path/to/gq/bin/python \\
        --llmcompressor-python /path/to/lc/bin/python
    python benchmarks/gptq_vs_gptqmodel.py --gptqmodel-python ... --rounds 1 --busy 0    # quiet only, once
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PEER_ENV = dict(os.environ)  # the peers run in the environment as given: the tool's import sets GOMP_SPINCOUNT

from busy import busy_processes  # beside this script
from figures import cpu_model, spread  # beside this script
from ptq import MODELS, gptq_steps, held_out_error, spec  # beside this script
from record import add_record_flag, command_line, recording  # beside this script

GPTQMODEL = """
import json, os, sys, time
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # its pool needs two workers on a machine of two cores
import torch
from gptqmodel import GPTQModel, QuantizeConfig
from gptqmodel.utils.cpp import load_pack_block_extension
model_dir, calibration = sys.argv[1], json.load(open(sys.argv[2]))
load_pack_block_extension()
config = QuantizeConfig(bits=4, group_size=128, desc_act=True, act_group_aware=False, sym=True, damp_percent=0.01,
                        device="cpu", offload_to_disk=False)
model = GPTQModel.load(model_dir, config, dtype=torch.float32)
began = time.perf_counter()
model.quantize(calibration, batch_size=1)
print(json.dumps({"seconds": time.perf_counter() - began}))
"""

LLMCOMPRESSOR = """
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
model_dir, calibration = sys.argv[1], json.load(open(sys.argv[2]))
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
dataset = Dataset.from_dict({"input_ids": calibration, "attention_mask": [[1] * len(w) for w in calibration]})
weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
           "actorder": "static"}  # the only act-order its GPTQ takes
recipe = GPTQModifier(config_groups={"w4": {"targets": ["Linear"], "weights": weights}}, ignore=["lm_head"],
                      dampening_frac=0.01, block_size=128)
began = time.perf_counter()
oneshot(model=model, dataset=dataset, recipe=recipe, num_calibration_samples=len(calibration),
        max_seq_length=len(calibration[0]), shuffle_calibration_samples=False)
print(json.dumps({"seconds": time.perf_counter() - began}))
"""


def prepare(config: dict, batches: int, directory: Path) -> None:
    """The float model and its tokenizer saved for gptqmodel, and the calibration windows the tool's gptq step takes."""
    import mase_lite as ml

    result = ml.run_pipeline(spec(config, batches, [], "float", str(directory / "float")))
    result.mg.model.save_pretrained(directory / "hf")
    result.data.tokenizer.save_pretrained(directory / "hf")
    windows = [row.tolist() for batch in result.data.loader("train", 4) for row in batch["input_ids"]][: batches * 4]
    (directory / "calibration.json").write_text(json.dumps(windows))


def tool_child(config: dict, batches: int, out: str) -> None:
    import mase_lite as ml

    result = ml.run_pipeline(spec(config, batches, list(gptq_steps("full", batches)), "gptq", out))
    seconds = next(s["seconds"] for s in result.report["steps"] if s["pass"] == "gptq")
    test = [batch["input_ids"] for batch in result.data.loader("test", 4)]
    float_model = ml.run_pipeline(spec(config, batches, [], "float", out + "_float")).mg.model.eval()
    print(json.dumps({"seconds": seconds, "held_out": held_out_error(float_model, result.mg.model, test)}))


def timed(command: list[str], cwd: Path, env: dict | None = None) -> tuple[dict, float]:
    """The command's last line as JSON, and its CPU seconds (user + system); run in ``cwd`` (gptqmodel writes logs
    into its working directory), in ``env`` (default: this process's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"{command[0]} failed:\n{run.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(run.stdout.strip().splitlines()[-1]), cpu


def version(python: str, package: str) -> str:
    """``package``'s installed version in the environment of ``python``."""
    run = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                         capture_output=True, text=True)
    return run.stdout.strip() or "(version unknown)"


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "_tool":
        tool_child(json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gptqmodel-python", required=True, help="the interpreter of gptqmodel's environment")
    parser.add_argument("--llmcompressor-python", help="the interpreter of llm-compressor's environment "
                                                       "(default: llm-compressor not run, its columns left out)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batches", type=int, default=4, help="calibration batches of 4 windows of 128 tokens")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="busy processes beside, per setting")
    add_record_flag(parser)
    args = parser.parse_args()
    config = {**MODELS["156m"], "num_hidden_layers": args.layers}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        prepare(config, args.batches, directory)
        tools = {"tool": [sys.executable, str(Path(__file__).resolve()), "_tool", json.dumps(config), str(args.batches),
                          str(directory / "tool")]}
        peers = {"gptqmodel": (args.gptqmodel_python, GPTQMODEL),
                 "llm-compressor": (args.llmcompressor_python, LLMCOMPRESSOR)}
        for name, (python, source) in peers.items():
            if python:
                script = directory / f"{name.replace('-', '_')}_run.py"
                script.write_text(source)
                tools[name] = [python, str(script), str(directory / "hf"), str(directory / "calibration.json")]
        for busy in args.busy:
            load = os.getloadavg()[0]
            runs: dict[str, list] = {name: [] for name in tools}
            with busy_processes(busy) if busy else contextlib.nullcontext():
                for _ in range(args.rounds):
                    for name, command in tools.items():
                        runs[name].append(timed(command, directory, None if name == "tool" else PEER_ENV))
            rows.append((busy, load, os.getloadavg()[0], runs))
    versions = [f"{name} {version(python, name.replace('-', ''))}" for name, (python, _) in peers.items() if python]
    print(f"command: {command_line()}")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; {args.rounds} rounds each setting, the tools in turn; "
          f"{', '.join(versions)}\n")
    others = [name for name in tools if name != "tool"]
    columns = (["busy processes", "load before → after", "tool GPTQ s"]
               + [f"{name} {'quantize' if name == 'gptqmodel' else 'oneshot'} s" for name in others]
               + [f"wall ratio tool / {name}" for name in others]
               + [f"{name} process CPU s" for name in tools] + ["tool held-out layer error"])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for busy, before, after, runs in rows:
        seconds = {name: [r[0]["seconds"] for r in runs[name]] for name in tools}
        cells = ([str(busy), f"{before:.2f} → {after:.2f}"] + [spread(seconds[name], 1) for name in tools]
                 + [spread([t / p for t, p in zip(seconds["tool"], seconds[name])]) for name in others]
                 + [spread([r[1] for r in runs[name]], 1) for name in tools]
                 + [f"{statistics.median(r[0]['held_out'] for r in runs['tool']):.4f}"])
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    with recording("gptq_vs_gptqmodel"):
        main()
