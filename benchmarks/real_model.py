"""A real pretrained model through one JSON pipeline, timed: a local GGUF -> lm-eval tasks -> GPTQ W4 -> the same
tasks -> a GGUF export; then the lm_eval step's float metrics against lm-eval's own HF model class on the same model.

No benchmark dataset can be downloaded here, so the tasks are written from a local text (``--text``), in lm-eval's
task YAML on local JSON files: ``text_cloze`` (multiple choice: a line's true ending among three endings of other
lines; acc, acc_norm) and ``text_rolling`` (rolling loglikelihood of each paragraph, as lm-eval's wikitext task;
word and byte perplexity, bits per byte).

    python benchmarks/real_model.py --gguf float.gguf --text held_out.txt --calibration calibration.txt --out runs/real

prints the pipeline spec, each step's seconds, the metrics before and after GPTQ, and the float model's metrics by
lm-eval's ``HFLM``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import mase_lite as ml
from mase_lite.importers import hub
from figures import cpu_model  # beside this script
from record import add_record_flag, recording  # beside this script

TASKS = ["text_cloze", "text_rolling"]
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "real-model.md"


def write_tasks(text: str, folder: Path, seed: int = 0) -> Path:
    """The two tasks of ``text`` in ``folder``: lines of at least 8 words (cloze) and blank-line paragraphs of at
    least 20 words (rolling)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [line.split() for line in text.splitlines() if len(line.split()) >= 8]
    rng = random.Random(seed)
    cloze = []
    for i, words in enumerate(lines):
        cut = len(words) // 2
        others = rng.sample([j for j in range(len(lines)) if j != i], 3)
        endings = [" ".join(words[cut:])] + [" ".join(lines[j][len(lines[j]) // 2:]) for j in others]
        order = list(range(4))
        rng.shuffle(order)
        cloze.append({"context": " ".join(words[:cut]), "endings": [endings[k] for k in order],
                      "answer": order.index(0)})
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) >= 20]
    rows = {"text_cloze": cloze, "text_rolling": [{"text": p} for p in paragraphs]}
    bodies = {
        "text_cloze": 'output_type: multiple_choice\ndoc_to_text: "{{context}}"\ndoc_to_choice: "{{endings}}"\n'
                      "doc_to_target: answer\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n",
        "text_rolling": 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
                        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
                        "  - metric: bits_per_byte\n",
    }
    for name, body in bodies.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows[name]))
        (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                             f"    test: {data}\ntest_split: test\n{body}")
    return folder


def pipeline(gguf: Path, calibration: Path, tasks: Path, out: Path) -> dict:
    """The guide's one JSON (``docs/guides/real-model.md``) on these files."""
    spec = json.loads(re.search(r"^```json\n(.*?)^```", GUIDE.read_text(), re.S | re.M).group(1))
    spec["model"]["pretrained"], spec["data"]["path"], spec["output_dir"] = str(gguf), str(calibration), str(out / "run")
    for step in spec["steps"]:
        if step["pass"] == "lm_eval":
            step["params"]["task_dir"] = str(tasks)
    return spec


def hf_float(model, tokenizer, tasks: Path, limit: int) -> dict:
    """lm-eval's own ``HFLM`` on ``model``, the same tasks."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from mase_lite.workloads.lm_harness import metric_name

    lm = HFLM(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=16)
    out = simple_evaluate(model=lm, tasks=TASKS, limit=limit, bootstrap_iters=1000, log_samples=False,
                          task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    return {t: {metric_name(k): v for k, v in r.items() if metric_name(k) and isinstance(v, float)}
            for t, r in out["results"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="a float GGUF of the model")
    parser.add_argument("--text", type=Path, required=True, help="held-out text the tasks are written from")
    parser.add_argument("--calibration", type=Path, required=True, help="GPTQ's calibration text")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=200, help="documents per task of the comparison with HFLM")
    add_record_flag(parser)
    args = parser.parse_args()
    tasks = write_tasks(args.text.read_text(), args.out / "tasks")
    spec = pipeline(args.gguf, args.calibration, tasks, args.out)
    (args.out / "pipeline.json").write_text(json.dumps(spec, indent=2))
    print(f"cpu: {cpu_model()}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")
    print(json.dumps(spec))
    start = time.perf_counter()
    result = ml.run_pipeline(spec)
    wall = time.perf_counter() - start
    print(f"pipeline wall: {wall:.1f} s")
    for step in result.report["steps"]:
        print(f"  {step['pass']}: {step.get('seconds', 0):.1f} s")
    metrics = result.report["metrics"]
    for label in ("float_ppl", "float", "gptq_ppl", "gptq"):
        print(f"{label}:", json.dumps(metrics[label]))
    model = hub.read_model(args.gguf, AutoModelForCausalLM).eval()  # the float model again, for both
    start = time.perf_counter()
    step = ml.passes.lm_eval(model, {"tasks": TASKS, "task_dir": str(tasks), "limit": args.limit, "batch_size": 16},
                             data=result.data)[1]["metrics"]
    print(f"the lm_eval step on the float model ({time.perf_counter() - start:.1f} s):", json.dumps(step))
    start = time.perf_counter()
    theirs = hf_float(model, result.data.tokenizer, tasks, args.limit)
    print(f"lm-eval's HFLM on it ({time.perf_counter() - start:.1f} s):", json.dumps(theirs))
    for task in TASKS:
        for name, value in theirs[task].items():
            ours = step[task][name]
            print(f"  {task}.{name}: step {ours!r}, HFLM {value!r}, relative difference "
                  f"{abs(ours - value) / abs(value) if value else abs(ours):.1e}")


if __name__ == "__main__":
    with recording("real_model"):
        main()
