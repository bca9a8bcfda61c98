"""Reliability probe: mutated specs, corrupted checkpoints, damaged data files and killed runs.

Nine parts, all seeded (the same seed gives the same cases):

* ``pipelines`` and ``searches``: every shipped spec in pipelines/, pipelines/labs and pipelines/tasks is
  shrunk (16 training samples, one narrow layer, one training step, one trial of one study) so that a
  valid one runs in seconds, then mutated (unknown and misspelt keys, wrong types, out-of-range, huge and
  non-finite numbers, deep nesting, lone surrogates, duplicate keys, missing fields, bad
  pass/format/dataset/sampler names, typos in objectives, constraints and plot axes, huge sizes) and run
  with ``mase_lite.cli.main`` in a forked process (a fresh interpreter state per case, the parent's
  imports shared; the parent first runs a few shrunk specs itself, as a long-running process would have).
* ``checkpoints``: a saved tiny BERT checkpoint corrupted each way (bytes flipped, truncated, files
  deleted, recipes of the wrong JSON types or naming ``os:system`` and other code, symlinks, FIFOs, custom
  tokenizer code), loaded by ``mase-lite draw``, a pipeline's ``load`` step (and, when the recipe names
  code, a report recording that step with ``trust_code``) and ``ml.load``. A canary file that any code
  named by a file would create must never appear.
* ``subprocess``: a seeded sample of this process's spec cases again as ``python -m mase_lite.cli``: the
  real exit code, which must be the in-process one.
* ``data``: every local data source (CSV, JSON, JSON Lines, text, ``.npz``, image folders, ``pretrained``
  directories) damaged at the byte level and structurally, read as a run reads it
  (``benchmarks/robustness_data.py``).
* ``caches``: a run's tokenized-data cache and a search's prefix-cache entry and journal damaged or rewritten to
  lie consistently, and foreign reports naming the user's folder or code (``benchmarks/robustness_caches.py``):
  the outcome must also be right (the undamaged metrics, no finished trial lost, nothing written where a report
  points).
* ``imports``: files someone else made, imported as a run imports them: hostile GGUF files
  (``benchmarks/robustness_gguf.py``), compressed-tensors directories (``benchmarks/robustness_compressed_tensors.py``)
  and ``.pt2`` archives (``benchmarks/robustness_pt2.py``); a refusal or the right weights, no code run.
* ``exports``: ``mase-lite export`` and the export step aimed at every kind of destination for each format
  (``benchmarks/robustness_exports.py``): nothing but the export itself written, nothing removed.
* ``kills``: SIGKILL of runs (the previous run must stay whole, or the new one be complete, and its
  checkpoint load) and of search workers on the journal storage (resuming keeps every finished trial,
  runs no grid point twice and completes the study), and of workers killed at each point of a trial's life
  (before ask, between ask and heartbeat, mid-trial, at and after tell) on the journal and on PostgreSQL
  (``benchmarks/robustness_studies.py``).

Outcomes: ``ran`` (exit 0), ``refused`` (exit 2, one ``mase-lite: error:`` message, no traceback) or a
defect: any other exit code, a traceback, a case over the time limit or the memory cap, a canary, a
typo in an objective, constraint, plot or sampler that is not refused before the first trial. Peak
memory is the case's process's peak RSS, the ~0.4 GB of the interpreter with torch imported included.

    python benchmarks/robustness.py                       # everything, seed 0, one process
    python benchmarks/robustness.py --parts searches --slice 0/2 --json s0.jsonl   # half the search cases
    python benchmarks/robustness.py --parts pipelines --pipeline-cases 20 --no-shipped
    python benchmarks/robustness.py --summarize s0.jsonl s1.jsonl                  # one table of several runs

Prints the outcome table (the figures in benchmarks/RESULTS.md come from this script) and every defect.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIRS = [ROOT / "pipelines", ROOT / "pipelines" / "labs", ROOT / "pipelines" / "tasks"]
TIME_LIMIT = 60.0  # seconds a case may run before it counts as a hang
MEMORY_CAP = 6 * 2**30  # bytes of resident memory a case may reach before it is stopped
SLOW = 10.0  # a refusal slower than this is reported

# ---------------------------------------------------------------------------------------------- running


@dataclass
class Case:
    part: str  # pipeline, search, checkpoint, subprocess
    name: str  # base spec or corruption
    mutation: str  # what was done
    code: int | None = None
    seconds: float = 0.0
    cpu_seconds: float | None = None  # the case's own CPU time: what the machine's load changes least
    peak_mb: float = 0.0
    traceback: bool = False
    message: str = ""
    outcome: str = ""
    why: str = ""
    before_trials: bool | None = None  # searches: no trial directory when it ended
    names_field: bool | None = None  # refusals of a mutated field: the message names it
    expect: str = ""  # "refused" when only a refusal is right (typos a search can see before its first trial)
    field_hint: str = ""
    directory: str = ""


def _status_kb(pid: int | str, key: str) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) if found else 0


def forked(fn: Callable[[], int], cwd: Path, limit: float = TIME_LIMIT) -> tuple[int | None, float, float, str, str, float | None]:
    """Run ``fn`` in a forked child in ``cwd``: (exit code or None if stopped, seconds, peak RSS MB, stderr, why stopped,
    CPU seconds)."""
    cwd.mkdir(parents=True, exist_ok=True)
    err_path, result_path = cwd / ".probe_stderr", cwd / ".probe_result"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.chdir(cwd)
            os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # not a test runner's capture
            sys.stdout = open(1, "w", closefd=False)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # peak RSS from here on
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                code = fn()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
            except BaseException:  # what the interpreter would print for the real command
                traceback.print_exc()
                code = 1
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            result_path.write_text(json.dumps({"seconds": seconds, "cpu": cpu, "peak_kb": _status_kb("self", "VmHWM")}))
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 1)
    t0, why, peak = time.monotonic(), "", 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        rss = _status_kb(pid, "VmRSS")
        peak = max(peak, rss)
        if time.monotonic() - t0 > limit or rss * 1024 > MEMORY_CAP:
            why = f"over {limit:.0f} s" if time.monotonic() - t0 > limit else f"over {MEMORY_CAP >> 30} GiB"
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
            break
        time.sleep(0.02)
    stderr = err_path.read_text(errors="replace") if err_path.exists() else ""
    if status is None:
        return None, time.monotonic() - t0, peak / 1024, stderr, why, None
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    code = os.waitstatus_to_exitcode(status)
    if not result:
        why = f"died: exit status {code}"
    return (code, result.get("seconds", time.monotonic() - t0), max(peak, result.get("peak_kb", 0)) / 1024, stderr, why,
            result.get("cpu"))


def cli(argv: list[str]) -> Callable[[], int]:
    def call() -> int:
        from mase_lite.cli import main

        return main(argv)

    return call


def classify(case: Case, code: int | None, seconds: float, peak: float, stderr: str, why: str, cpu: float | None = None) -> Case:
    case.code, case.seconds, case.peak_mb = code, round(seconds, 3), round(peak, 1)
    case.cpu_seconds = None if cpu is None else round(cpu, 3)
    case.traceback = "Traceback (most recent call last)" in stderr
    lines = [l for l in stderr.strip().splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("mase-lite: error: ")]
    case.message = "\n".join(lines[-12:]) if case.traceback or code not in (0, 2) else "\n".join(errors)[:600]
    if code is None:
        case.outcome, case.why = "defect", why
    elif case.traceback:
        case.outcome, case.why = "defect", "traceback"
    elif code == 0:
        case.outcome = "ran"
        if case.expect == "refused":
            case.outcome, case.why = "defect", "a typo the search could see was not refused"
    elif code == 2 and len(errors) == 1:
        case.outcome = "refused"
        if case.expect == "refused" and case.before_trials is False:
            case.outcome, case.why = "defect", "refused only after trials ran"
    else:
        case.outcome, case.why = "defect", why or (f"exit {code}" if code != 2 else f"exit 2 with {len(errors)} error lines")
    if case.field_hint and case.outcome == "refused":
        case.names_field = case.field_hint in stderr
    return case


# ---------------------------------------------------------------------------------------------- shrinking

TINY_CONFIGS = {
    "bert": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32},
    "llama": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 32},
    "resnet": {"embedding_size": 8, "hidden_sizes": [8, 8, 8], "depths": [1, 1, 1]},
    "vit": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32},
}
DATA_SIZES = {"n_train": 16, "n_test": 8, "max_length": 8, "block_size": 8, "image_size": 16}
STEP_SIZES = {
    "train": {"max_steps": 1, "epochs": 1, "batch_size": 4, "progress": False},
    "evaluate": {"batch_size": 8, "progress": False},
    "calibrate": {"num_batches": 1, "batch_size": 4},
    "gptq": {"num_batches": 1, "batch_size": 4},
    "profile": {"num_batches": 1, "batch_size": 4},
}


def shrink_pipeline(spec: dict) -> dict:
    spec = copy.deepcopy(spec)
    if isinstance(spec.get("data"), dict):
        spec["data"].update({k: v for k, v in DATA_SIZES.items() if k in spec["data"]})
    model = spec.get("model") or {}
    config = model.get("hf_config", {})
    kind = config.get("model_type", "bert")
    model["hf_config"] = {**config, **TINY_CONFIGS[kind]}
    spec["model"] = model
    for step in spec.get("steps", []):
        params = step.setdefault("params", {})
        params.update({k: v for k, v in STEP_SIZES.get(step["pass"], {}).items() if k in params or k == "progress"})
        if step["pass"] == "train":
            params["max_steps"] = 1
        for key in ("dims",):
            if key in params:
                params[key] = {**params[key], "seq": 8}
    return spec


def shrink_search(spec: dict, spec_dir: Path, out: Path) -> dict:
    """The search with one trial (of its first study, when it has several); the pipelines it names are inlined, shrunk."""
    spec = copy.deepcopy(spec)
    spec["n_trials"] = 1
    spec.pop("timeout", None)
    if spec.get("studies"):
        spec["studies"] = spec["studies"][:1]
        for study in spec["studies"]:
            study.pop("n_trials", None)
    for holder in [spec, *(spec.get("studies") or [])]:
        pipeline = holder.get("pipeline")
        if isinstance(pipeline, str):
            pipeline = json.loads((spec_dir / pipeline).read_text())
        if pipeline is not None:
            holder["pipeline"] = shrink_pipeline(pipeline)
            holder["pipeline"].pop("output_dir", None)
    spec["output_dir"] = str(out)
    return spec


def shipped_specs() -> dict[str, tuple[str, dict, Path]]:
    found = {}
    for directory in SPEC_DIRS:
        for path in sorted(directory.glob("*.json")):
            spec = json.loads(path.read_text())
            kind = "search" if "objectives" in spec else "pipeline"
            found[str(path.relative_to(ROOT / "pipelines"))] = (kind, spec, directory)
    return found


# ---------------------------------------------------------------------------------------------- mutating

RAW = "@@raw{}@@"  # a placeholder whose JSON string is replaced by raw text (NaN, a 5000-digit number...)
HUGE_INT = "1" + "0" * 5000
DEEP = "[" * 3000 + "]" * 3000
NAMES = {  # a key whose value is a name, and what a hurried user types instead
    "pass": ["quantise", "Quantize", "trian", "evalute", "prun"],
    "name": ["integr", "minifloat", "int8", "tpe2", "gird", "Random"],
    "dataset": ["synthetic_sentiment", "imbd", "synthetic-shape"],
    "model_type": ["bertt", "llama3", "resnet50"],
    "task": ["classification", "causal_lm"],
    "by": ["types", "Name"],
    "direction": ["max", "maximise"],
    "kind": ["lines", "bar"],
    "schedule": ["cosine_annealing", "linear "],
    "type": ["choices", "integer", "float_log"],
    "split": ["validation", "tests"],
    "method": ["l1", "l2-norm"],
}


def walk(node: Any, path: tuple = ()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, (*path, i))


def get(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


def typo(rng: random.Random, word: str) -> str:
    if len(word) < 3:
        return word + "s"
    i = rng.randrange(1, len(word) - 1)
    how = rng.choice(["swap", "drop", "double", "s"])
    if how == "swap":
        out = word[:i - 1] + word[i] + word[i - 1] + word[i + 1:]
    elif how == "drop":
        out = word[:i] + word[i + 1:]
    elif how == "double":
        out = word[:i] + word[i] + word[i:]
    else:
        out = word.replace("z", "s") if "z" in word else word + "s"
    return out if out != word else word + "x"


class Mutator:
    """Seeded mutations of one spec; each returns (description, JSON text, dotted field it touched) or None."""

    def __init__(self, rng: random.Random, kind: str):
        self.rng, self.kind = rng, kind
        self.ops: list[Callable[[dict], tuple[str, dict, dict, str] | None]] = [
            self.unknown_key, self.typo_key, self.drop_key, self.wrong_type, self.bad_number, self.non_finite,
            self.deep_nesting, self.lone_surrogate, self.bad_name, self.duplicate_key, self.empty, self.null,
            self.huge_size,
        ]
        if kind == "search":
            self.ops += [self.objective_typo, self.constraint_typo, self.plot_typo, self.sampler_typo,
                         self.space_edge]
        else:
            self.ops += [self.step_edge]

    def mutate(self, spec: dict) -> tuple[str, str, str, str]:
        for _ in range(50):
            op = self.rng.choice(self.ops)
            done = op(copy.deepcopy(spec))
            if done is not None:
                desc, new, raws, hint = done
                text = json.dumps(new, indent=1)
                for i, raw in raws.items():
                    text = text.replace(json.dumps(RAW.format(i)), raw)
                expect = "refused" if op.__name__.endswith("_typo") else ""
                return f"{op.__name__}: {desc}", text, hint, expect
        raise RuntimeError("no mutation applies")

    # where to mutate: the search's own fields, or the inline pipeline's
    def _nodes(self, spec: dict, want: Callable[[tuple, Any], bool]) -> list[tuple]:
        return [p for p, n in walk(spec) if p and want(p, n)]

    def _pick(self, spec, want):
        nodes = self._nodes(spec, want)
        return self.rng.choice(nodes) if nodes else None

    @staticmethod
    def _dotted(path: tuple) -> str:
        return ".".join(map(str, path))

    def _set(self, spec: dict, path: tuple, value: Any) -> None:
        get(spec, path[:-1])[path[-1]] = value

    def unknown_key(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, dict)) or ()
        key = self.rng.choice(["zz_unknown", "comment", "verbose", "extra"])
        get(spec, path)[key] = 1
        return f"{self._dotted(path) or '<root>'} += {key}", spec, {}, key

    def typo_key(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(p[-1], str) and not _free_key(p))
        if path is None:
            return None
        parent, key = get(spec, path[:-1]), path[-1]
        new = typo(self.rng, key)
        if new in parent:
            return None
        parent[new] = parent.pop(key)
        return f"{self._dotted(path)} -> {new}", spec, {}, new

    def drop_key(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(p[-1], str) and not _free_key(p))
        if path is None:
            return None
        del get(spec, path[:-1])[path[-1]]
        return f"del {self._dotted(path)}", spec, {}, ""

    def wrong_type(self, spec):
        path = self._pick(spec, lambda p, n: not isinstance(n, (dict, list)) and p[-1] != "output_dir")
        if path is None:
            return None
        value = get(spec, path)
        pool = ["8", True, 2.5, [], {}, [1, 2], 7]
        pool = [v for v in pool if type(v) is not type(value)]
        new = self.rng.choice(pool)
        self._set(spec, path, new)
        return f"{self._dotted(path)} = {json.dumps(new)}", spec, {}, self._dotted(path[-2:])

    def bad_number(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, (int, float)) and not isinstance(n, bool))
        if path is None:
            return None
        new = self.rng.choice([-1, 0, -10**9, 2**32, 2**63, 2**64, 10**30, 1e308, -1e308, 1e-320, RAW.format(0)])
        self._set(spec, path, new)
        shown = "<5001 digits>" if new == RAW.format(0) else repr(new)
        return f"{self._dotted(path)} = {shown}", spec, {0: HUGE_INT}, self._dotted(path[-2:])

    def non_finite(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, (int, float)) and not isinstance(n, bool))
        if path is None:
            return None
        raw = self.rng.choice(["NaN", "Infinity", "-Infinity", "1e999"])
        self._set(spec, path, RAW.format(0))
        return f"{self._dotted(path)} = {raw}", spec, {0: raw}, ""

    def deep_nesting(self, spec):
        path = self._pick(spec, lambda p, n: not isinstance(n, (dict, list)))
        if path is None:
            return None
        depth = self.rng.choice([100, 1500, 100_000])
        raw = self.rng.choice(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth])
        self._set(spec, path, RAW.format(0))
        return f"{self._dotted(path)} nested {depth} deep", spec, {0: raw}, ""

    def lone_surrogate(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, str) or isinstance(p[-1], str))
        if path is None:
            return None
        value = get(spec, path)
        if isinstance(value, str) and self.rng.random() < 0.7:
            self._set(spec, path, RAW.format(0))
            return f"{self._dotted(path)} holds a lone surrogate", spec, {0: json.dumps(value)[:-1] + '\\ud800"'}, ""
        parent = get(spec, path[:-1])
        if not isinstance(parent, dict):
            return None
        parent[RAW.format(0)] = parent.pop(path[-1])
        return f"key {self._dotted(path)} has a lone surrogate", spec, {0: json.dumps(path[-1])[:-1] + '\\udfff"'}, ""

    def bad_name(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, str) and p[-1] in NAMES)
        if path is None:
            return None
        new = self.rng.choice(NAMES[path[-1]])
        self._set(spec, path, new)
        return f"{self._dotted(path)} = {new!r}", spec, {}, new

    def duplicate_key(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, dict) and n) or ()
        node = get(spec, path)
        key = self.rng.choice(list(node))
        items = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in node.items()] + [f"{json.dumps(key)}: {json.dumps(node[key])}"]
        if path:
            self._set(spec, path, RAW.format(0))
            return f"{self._dotted(path)}.{key} twice", spec, {0: "{" + ", ".join(items) + "}"}, key
        return None

    def empty(self, spec):
        path = self._pick(spec, lambda p, n: isinstance(n, (dict, list)) and n)
        if path is None:
            return None
        value = get(spec, path)
        self._set(spec, path, type(value)())
        return f"{self._dotted(path)} emptied", spec, {}, ""

    def null(self, spec):
        path = self._pick(spec, lambda p, n: n is not None and p[-1] != "output_dir")
        if path is None:
            return None
        self._set(spec, path, None)
        return f"{self._dotted(path)} = null", spec, {}, ""

    SIZES = ("n_train", "n_test", "max_length", "block_size", "image_size", "hidden_size", "num_hidden_layers",
             "intermediate_size", "batch_size", "num_batches", "rank", "seq", "batch", "num_attention_heads",
             "vocab_size", "max_position_embeddings", "embedding_size", "max_samples", "n_trials", "population_size",
             "n_startup_trials", "high", "step", "heartbeat_interval", "grace_period", "depths", "hidden_sizes")

    def huge_size(self, spec):
        path = self._pick(spec, lambda p, n: (p[-1] in self.SIZES or (isinstance(p[-1], int) and len(p) > 1
                                              and p[-2] in ("depths", "hidden_sizes")))
                          and isinstance(n, int) and not isinstance(n, bool))
        if path is None:
            return self.huge_config(spec)
        new = self.rng.choice([10**5, 10**8, 10**12, 2**40])
        self._set(spec, path, new)
        return f"{self._dotted(path)} = {new}", spec, {}, self._dotted(path[-2:])

    def huge_config(self, spec):
        pipeline = spec["pipeline"] if self.kind == "search" else spec
        config = pipeline["model"]["hf_config"]
        key = self.rng.choice([k for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")
                               if k in config or k == "vocab_size"])
        config[key] = self.rng.choice([10**5, 10**8])
        where = "pipeline.model.hf_config" if self.kind == "search" else "model.hf_config"
        return f"{where}.{key} = {config[key]}", spec, {}, key

    # search-only
    def objective_typo(self, spec):
        i = self.rng.randrange(len(spec["objectives"]))
        metric = spec["objectives"][i]["metric"]
        label, _, key = metric.partition(".")
        new = self.rng.choice([f"{typo(self.rng, label)}.{key}", f"{label}.{typo(self.rng, key)}",
                               f"{label}.{key.replace('accuracy', 'acc')}", metric.replace("quantized", "quantised")])
        if new == metric:
            new = f"{label}.{key}_"
        spec["objectives"][i]["metric"] = new
        return f"objectives.{i}.metric = {new!r}", spec, {}, new

    def constraint_typo(self, spec):
        metric = spec["objectives"][0]["metric"]
        label, _, key = metric.partition(".")
        new = f"{label}.{typo(self.rng, key)}" if self.rng.random() < 0.5 else "avg_bit.weights"
        spec.setdefault("constraints", []).append({"metric": new, "max": 1e9})
        return f"constraints += {new!r}", spec, {}, new

    def plot_typo(self, spec):
        plots = spec.get("plots") or []
        if not plots:
            metric = spec["objectives"][0]["metric"]
            spec["plots"] = plots = [{"x": "trial.seconds", "y": [metric], "file": "p.png"}]
        plot = self.rng.choice(plots)
        axis = self.rng.choice(["x", "y", "baseline"])
        if axis == "y":
            plot["y"][0] = typo(self.rng, plot["y"][0])
            new = plot["y"][0]
        elif axis == "baseline":
            plot["baseline"] = new = "dense.acuracy"
        else:
            plot["x"] = new = typo(self.rng, plot["x"])
        return f"plots.{axis} = {new!r}", spec, {}, new

    def sampler_typo(self, spec):
        sampler = spec.setdefault("sampler", {"name": "tpe"})
        choice = self.rng.choice(["name", "option", "seed"])
        if choice == "name":
            sampler["name"] = new = self.rng.choice(["TPE", "grid_search", "nsga", "cma-es", "randon"])
        elif choice == "option":
            new = self.rng.choice(["n_startup", "population", "multivariat", "sigma"])
            sampler[new] = 4
        else:
            sampler["seed"] = new = self.rng.choice([-1, 2**32, 2**63])
            new = "seed"
        return f"sampler.{choice} -> {new!r}", spec, {}, str(new)

    def space_edge(self, spec):
        if not spec.get("space"):
            return None
        i = self.rng.randrange(len(spec["space"]))
        entry = spec["space"][i]
        what = self.rng.choice(["path", "swap", "values", "regex", "also", "million"])
        if what == "path":
            entry["path"] = typo(self.rng, entry["path"])
            return f"space.{i}.path = {entry['path']!r}", spec, {}, "path"
        if what == "swap" and "low" in entry:
            entry["low"], entry["high"] = entry["high"], entry["low"] - 1
            return f"space.{i}: low above high", spec, {}, "low"
        if what == "values" and "values" in entry:
            entry["values"] = []
            return f"space.{i}.values = []", spec, {}, "values"
        if what == "regex":
            entry["nodes"] = {"regex": "(("}
            entry["path"] = entry["path"] + ".{node}" if "{node}" not in entry["path"] else entry["path"]
            return f"space.{i}.nodes.regex = '(('", spec, {}, "regex"
        if what == "also":
            entry["also"] = [{"path": entry["path"], "scale": RAW.format(0)}]
            return f"space.{i}.also.0.scale = NaN", spec, {}, ""
        if what == "million":
            spec["space"][i] = {"path": entry["path"], "type": "choice", "values": RAW.format(0)}
            return f"space.{i}.values: 10^6 choices", spec, {0: json.dumps(list(range(10**6)))}, "values"
        spec["sampler"] = {"name": "grid"}
        spec["space"][i] = {"path": entry["path"], "type": "int", "low": 0, "high": 10**8}
        return f"space.{i}: grid over 10^8 ints", spec, {}, ""

    # pipeline-only
    def step_edge(self, spec):
        steps = spec.get("steps") or []
        if not steps:
            return None
        i = self.rng.randrange(len(steps))
        what = self.rng.choice(["string", "no_pass", "format", "regex", "plugin", "path"])
        if what == "string":
            steps[i] = steps[i]["pass"]
            return f"steps.{i} = {steps[i]!r}", spec, {}, f"steps.{i}"
        if what == "no_pass":
            steps[i].pop("pass")
            return f"steps.{i}.pass removed", spec, {}, "pass"
        if what == "format":
            steps.insert(i, {"pass": "quantize", "params": {"by": "type", "rules": {"linear": {"name": "int8"}}}})
            return f"steps.{i}: format 'int8'", spec, {}, "int8"
        if what == "regex":
            steps.insert(i, {"pass": "prune", "params": {"by": "regex", "targets": ["(("], "weight": {"sparsity": 0.5}}})
            return f"steps.{i}: regex '(('", spec, {}, "(("
        if what == "plugin":
            spec["plugins"] = ["no_such_module_xyz"]
            return "plugins = ['no_such_module_xyz']", spec, {}, "no_such_module_xyz"
        steps.insert(i, {"pass": "draw", "params": {"path": "graph.svgz"}})
        return f"steps.{i}: draw to graph.svgz", spec, {}, "svgz"


def _free_key(path: tuple) -> bool:
    """Keys a user names freely (rules per type or node, hf_config fields transformers accepts as extras)."""
    return any(k in ("rules", "hf_config", "kwargs", "dims", "example_inputs") for k in path[:-1])


# ---------------------------------------------------------------------------------------------- part: specs


def spec_cases(seed: int, n_pipeline: int, n_search: int, work: Path, shipped_too: bool = True) -> list[Case]:
    rng = random.Random(seed)
    shipped = shipped_specs()
    cases: list[Case] = []
    for kind, count in (("pipeline", n_pipeline), ("search", n_search)):
        names = [n for n, (k, _, _) in shipped.items() if k == kind]
        mutator = Mutator(rng, kind)
        for i in range(count + len(names)):
            name = names[i % len(names)]
            _, spec, directory = shipped[name]
            if i < len(names) and not shipped_too:
                continue
            case_dir = work / kind / f"{i:03d}"
            out = case_dir / "out"
            spec = shrink_search(spec, directory, out) if kind == "search" else {**shrink_pipeline(spec), "output_dir": str(out)}
            if i < len(names):
                desc, text, hint, expect = "unmutated", json.dumps(spec, indent=1), "", ""
            else:
                desc, text, hint, expect = mutator.mutate(spec)
            case_dir.mkdir(parents=True, exist_ok=True)
            (case_dir / "spec.json").write_text(text)
            cases.append(Case(kind, name, desc, expect=expect, field_hint=hint, directory=str(case_dir)))
    return cases


def run_spec_case(case: Case, case_dir: Path, limit: float = TIME_LIMIT) -> Case:
    command = "search" if case.part == "search" else "run"
    if (case_dir / "out").exists():
        shutil.rmtree(case_dir / "out")
    result = forked(cli([command, str(case_dir / "spec.json")]), case_dir, limit)
    out = case_dir / "out"
    case.before_trials = not (out.exists() and any(out.rglob("trials"))) if case.part == "search" else None
    classify(case, *result)
    return case


# ---------------------------------------------------------------------------------------------- part: checkpoints

TINY_BERT = {"hf_config": TINY_CONFIGS["bert"], "num_labels": 2}
TINY_DATA = {"dataset": "synthetic-sentiment", "n_train": 16, "n_test": 8, "max_length": 8}


def save_checkpoint(work: Path) -> Path:
    spec = {"name": "ckpt", "seed": 0, "data": TINY_DATA, "model": TINY_BERT,
            "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": {
                "name": "integer", "weight_width": 8, "weight_frac_width": 4, "data_in_width": 8, "data_in_frac_width": 4}}}},
                {"pass": "save", "params": {"path": "checkpoint"}}],
            "output_dir": str(work / "saved")}
    work.mkdir(parents=True, exist_ok=True)
    (work / "save.json").write_text(json.dumps(spec))
    code, _, _, err, why, _ = forked(cli(["run", str(work / "save.json")]), work)
    if code != 0:
        raise RuntimeError(f"saving the checkpoint failed: {err} {why}")
    return work / "saved" / "checkpoint"


def _flip(path: Path, rng: random.Random, n: int, region: str = "any") -> None:
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little") + 8 if path.suffix == ".safetensors" else len(data)
    lo, hi = {"header": (0, min(header, len(data))), "data": (min(header, len(data) - 1), len(data)), "any": (0, len(data))}[region]
    for _ in range(n):
        i = rng.randrange(lo, hi)
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _recipe(ckpt: Path, change: Callable[[dict], Any]) -> None:
    recipe = json.loads((ckpt / "recipe.json").read_text())
    out = change(recipe)
    (ckpt / "recipe.json").write_text(out if isinstance(out, str) else json.dumps(recipe))


def corruptions(canary: Path) -> list[tuple[str, Callable[[Path, random.Random], None]]]:
    touch = f"touch {canary}"
    evil_py = f"open({str(canary)!r}, 'w').close()\n"

    def weights(name):
        return lambda c, r: c / name

    def set_model(value):
        return lambda c, r: _recipe(c, lambda d: d.update(model=value))

    def cfg(key, value):
        return lambda c, r: _recipe(c, lambda d: d["model"]["hf_config"].update({key: value}))

    def replace_text(old, new):
        return lambda c, r: _recipe(c, lambda d: json.dumps(d).replace(old, new, 1))

    def fifo(name):
        def make(c, r):
            (c / name).unlink()
            os.mkfifo(c / name)
        return make

    def link(name, target):
        def make(c, r):
            (c / name).unlink()
            (c / name).symlink_to(target if target != "self" else c / name)
        return make

    def tokenizer_code(c, r):
        tok = c / "tokenizer"
        config = json.loads((tok / "tokenizer_config.json").read_text())
        config.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]})
        (tok / "tokenizer_config.json").write_text(json.dumps(config))
        (tok / "evil.py").write_text(evil_py)

    def model_code(c, r):
        config = json.loads((c / "recipe.json").read_text())
        config["model"]["hf_config"]["auto_map"] = {"AutoModel": "evil.Evil"}
        (c / "recipe.json").write_text(json.dumps(config))
        (c / "evil.py").write_text(evil_py)

    def rm(name):
        def make(c, r):
            target = c / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        return make

    def transforms(value):
        return lambda c, r: _recipe(c, lambda d: d.update(transforms=value))

    return [
        ("flip 1 byte of the weights' header", lambda c, r: _flip(c / "model.safetensors", r, 1, "header")),
        ("flip 64 bytes of the weights' header", lambda c, r: _flip(c / "model.safetensors", r, 64, "header")),
        ("flip 64 bytes of the weights' data", lambda c, r: _flip(c / "model.safetensors", r, 64, "data")),
        ("truncate the weights to 0 bytes", lambda c, r: (c / "model.safetensors").write_bytes(b"")),
        ("truncate the weights to 7 bytes", lambda c, r: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:7])),
        ("truncate the weights in half", lambda c, r: (c / "model.safetensors").write_bytes(
            (c / "model.safetensors").read_bytes()[: (c / "model.safetensors").stat().st_size // 2])),
        ("weights header claims 2^60 bytes", lambda c, r: (c / "model.safetensors").write_bytes(
            (2**60).to_bytes(8, "little") + (c / "model.safetensors").read_bytes()[8:])),
        ("delete the weights", rm("model.safetensors")),
        ("delete recipe.json", rm("recipe.json")),
        ("delete the tokenizer", rm("tokenizer")),
        ("weights are a directory", lambda c, r: ((c / "model.safetensors").unlink(), (c / "model.safetensors").mkdir())),
        ("flip 8 bytes of recipe.json", lambda c, r: _flip(c / "recipe.json", r, 8)),
        ("truncate recipe.json", lambda c, r: (c / "recipe.json").write_text((c / "recipe.json").read_text()[:40])),
        ("recipe.json is a list", lambda c, r: (c / "recipe.json").write_text("[]")),
        ("recipe model = 'bert'", set_model("bert")),
        ("recipe input_specs = []", lambda c, r: _recipe(c, lambda d: d.update(input_specs=[]))),
        ("recipe transforms = {}", transforms({})),
        ("recipe num_hidden_layers = '2'", cfg("num_hidden_layers", "2")),
        ("recipe num_hidden_layers = 100000", cfg("num_hidden_layers", 100_000)),
        ("recipe hidden_size = 10^8", cfg("hidden_size", 10**8)),
        ("recipe hidden_size = -1", cfg("hidden_size", -1)),
        ("recipe model_type = 'os'", cfg("model_type", "os")),
        ("recipe NaN", replace_text('"hidden_size": 16', '"hidden_size": NaN')),
        ("recipe duplicate key", replace_text('"hidden_size": 16', '"hidden_size": 16, "hidden_size": 16')),
        ("recipe nested 100000 deep", replace_text('"hidden_size": 16', '"hidden_size": ' + "[" * 100_000 + "]" * 100_000)),
        ("recipe lone surrogate", replace_text('"hidden_size"', '"hidden_size\\ud800"')),
        ("recipe 5000-digit number", replace_text('"hidden_size": 16', '"hidden_size": ' + HUGE_INT)),
        ("recipe factory os:system", set_model({"factory": "os:system", "kwargs": {"command": touch}})),
        ("recipe factory subprocess:run", set_model({"factory": "subprocess:run", "kwargs": {"args": ["touch", str(canary)]}})),
        ("recipe factory builtins:exec", set_model({"factory": "builtins:exec", "kwargs": {"source": evil_py}})),
        ("recipe factory posix:system", set_model({"factory": "posix:system", "kwargs": {"command": touch}})),
        ("recipe hf_class os.system", lambda c, r: _recipe(c, lambda d: d["model"].update(hf_class="os.system"))),
        ("recipe leaf_modules os:system", lambda c, r: _recipe(c, lambda d: d.update(leaf_modules=["os:system"]))),
        ("recipe plugins [evil]", lambda c, r: ((c / "evil.py").write_text(evil_py),
                                                _recipe(c, lambda d: d.update(plugins=[str(c / "evil.py")])))),
        ("recipe transform: draw at the canary", transforms([{"pass": "draw", "params": {"path": str(canary)}}])),
        ("recipe transform: save at the canary", transforms([{"pass": "save", "params": {"path": str(canary)}}])),
        ("model config auto_map to custom code", model_code),
        ("tokenizer auto_map to custom code", tokenizer_code),
        ("flip 16 bytes of tokenizer.json", lambda c, r: _flip(c / "tokenizer" / "tokenizer.json", r, 16)),
        ("tokenizer_config.json wrong types", lambda c, r: (c / "tokenizer" / "tokenizer_config.json").write_text(
            json.dumps({"model_max_length": "x", "tokenizer_class": 5}))),
        ("weights symlink to /etc/passwd", link("model.safetensors", "/etc/passwd")),
        ("weights symlink to /dev/zero", link("model.safetensors", "/dev/zero")),
        ("recipe symlink to /dev/zero", link("recipe.json", "/dev/zero")),
        ("recipe symlink to /dev/urandom", link("recipe.json", "/dev/urandom")),
        ("weights symlink loop", link("model.safetensors", "self")),
        ("weights dangling symlink", link("model.safetensors", "/nonexistent/model.safetensors")),
        ("weights are a FIFO", fifo("model.safetensors")),
        ("recipe is a FIFO", fifo("recipe.json")),
        ("tokenizer.json is a FIFO", lambda c, r: fifo("tokenizer.json")(c / "tokenizer", r)),
        ("checkpoint is an empty directory", lambda c, r: [rm(p.name)(c, r) for p in list(c.iterdir())]),
        ("weights with a tensor dropped", lambda c, r: _tensors(c, lambda t: t.pop(sorted(t)[0]))),
        ("weights with an extra tensor", lambda c, r: _tensors(c, lambda t: t.update(extra=__import__("torch").zeros(3)))),
        ("weights with a tensor reshaped", lambda c, r: _tensors(c, lambda t: t.update({k: t[k].t().contiguous() for k in [k for k in sorted(t) if t[k].dim() == 2 and t[k].shape[0] != t[k].shape[1]][:1]}))),
        ("weights in float64", lambda c, r: _tensors(c, lambda t: t.update({k: v.double() for k, v in t.items() if v.is_floating_point()}))),
        ("weights all NaN", lambda c, r: _tensors(c, lambda t: t.update({k: v.double().fill_(float("nan")).to(v.dtype)
                                                                        for k, v in t.items() if v.is_floating_point()}))),
        ("weights metadata 1 MB", lambda c, r: _tensors(c, lambda t: None, {"x": "y" * 2**20})),
        ("recipe 50 MB of whitespace", lambda c, r: (c / "recipe.json").write_text((c / "recipe.json").read_text() + " " * 50 * 2**20)),
        ("recipe not UTF-8", lambda c, r: (c / "recipe.json").write_bytes(b"\xff\xfe" + (c / "recipe.json").read_bytes())),
        ("checkpoint path is a file", lambda c, r: (shutil.rmtree(c), c.write_text("{}"))),
        ("recipe format '2.0'", lambda c, r: _recipe(c, lambda d: d.update(format="2.0"))),
    ]


CODE_WORDS = ("factory", "hf_class", "leaf_modules", "plugins", "transform", "custom code")


def _tensors(ckpt: Path, change: Callable[[dict], Any], metadata: dict | None = None) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata=metadata)


def ml_load(path: Path) -> Callable[[], int]:
    def call() -> int:
        import mase_lite as ml
        from mase_lite import UserError

        try:
            ml.load(path)
        except UserError as err:
            print(f"mase-lite: error: {err}", file=sys.stderr)
            return 2
        return 0

    return call


def checkpoint_cases(seed: int, work: Path, canary: Path, only: int | None,
                     named: list[str] | None = None) -> tuple[list[tuple[Case, Path, Callable]], Path]:
    rng = random.Random(seed)
    source = save_checkpoint(work)
    kinds = [(n, fn) for n, fn in corruptions(canary)[:only] if not named or any(word in n for word in named)]
    cases = []
    for i, (name, corrupt) in enumerate(kinds):
        ckpt = work / f"c{i:02d}" / "checkpoint"
        shutil.copytree(source, ckpt, symlinks=True)
        corrupt(ckpt, rng)
        load_spec = {"name": "load", "data": TINY_DATA, "model": TINY_BERT,
                     "steps": [{"pass": "load", "params": {"path": str(ckpt)}}], "output_dir": str(ckpt.parent / "out")}
        (ckpt.parent / "load.json").write_text(json.dumps(load_spec))
        recorded = copy.deepcopy(load_spec)
        recorded["steps"][0]["params"]["trust_code"] = True
        recorded["output_dir"] = str(ckpt.parent / "out_report")
        (ckpt.parent / "report.json").write_text(json.dumps({"spec": recorded, "versions": {}, "metrics": {}}))
        loaders = [("mase-lite draw", cli(["draw", str(ckpt), "-o", str(ckpt.parent / "g.json")])),
                   ("load step", cli(["run", str(ckpt.parent / "load.json")])), ("ml.load", ml_load(ckpt))]
        if any(word in name for word in CODE_WORDS):  # a recorded trust_code is ignored: the report is data
            loaders.append(("report recording load trust_code", cli(["run", str(ckpt.parent / "report.json")])))
        for how, fn in loaders:
            cases.append((Case("checkpoint", name, how), ckpt.parent, fn))
    return cases, source


# ---------------------------------------------------------------------------------------------- part: subprocess


def real_cli(argv: list[str], cwd: Path, limit: float = TIME_LIMIT) -> tuple[int | None, float, float, str, str, float]:
    """``python -m mase_lite.cli argv`` in its own process: (exit code, seconds, peak RSS MB, stderr, why, CPU seconds)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(cwd / ".probe_sub_stderr", "w+") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "mase_lite.cli", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=err, env=env)
        why = ""
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - t0 > limit:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode, why = None, f"over {limit:.0f} s"
                break
            time.sleep(0.02)
        seconds = time.monotonic() - t0
        err.seek(0)
        return proc.returncode, seconds, usage.ru_maxrss / 1024, err.read(), why, usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------- part: kills


KILL_PIPELINE = {"name": "tiny", "seed": 0, "data": TINY_DATA, "model": TINY_BERT,
                 "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": {
                     "name": "integer", "weight_width": 8, "weight_frac_width": 4, "data_in_width": 8, "data_in_frac_width": 4}}}},
                     {"pass": "evaluate", "params": {"label": "ptq", "progress": False}}]}


def kill_cases(seed: int, work: Path, n_runs: int, n_workers: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # killed runs: the previous run stays whole (or the new one is complete) and its checkpoint loads
    run_dir = work / "runs"
    run_dir.mkdir(parents=True)
    spec = {"name": "run", "seed": 0, "data": {**TINY_DATA, "n_train": 64}, "model": TINY_BERT,
            "steps": [{"pass": "train", "params": {"max_steps": 30, "batch_size": 4, "progress": False}},
                      {"pass": "evaluate", "params": {"progress": False}}, {"pass": "save", "params": {"path": "checkpoint"}}],
            "output_dir": str(run_dir / "out")}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    code, seconds, *_ = forked(cli(["run", str(run_dir / "spec.json")]), run_dir)
    assert code == 0, "the first run failed"
    for i in range(n_runs):
        before = _files(run_dir / "out")
        delay = rng.uniform(3.0, 3.0 + 1.5 * seconds + 2)
        proc = subprocess.Popen([sys.executable, "-m", "mase_lite.cli", "run", str(run_dir / "spec.json")], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        after = _files(run_dir / "out")
        report = json.loads((run_dir / "out" / "report.json").read_text())
        state = "untouched" if after == before else "replaced by the complete new run" if report["status"] == "ok" else "damaged"
        loads = forked(ml_load(run_dir / "out" / "checkpoint"), run_dir)[0]
        rerun = forked(cli(["run", str(run_dir / "spec.json")]), run_dir)[0]
        leftovers = [p.name for p in run_dir.iterdir() if p.name.startswith(".out")]
        case = Case("kill", "run", f"SIGKILL after {delay:.1f} s: previous run {state}", code=0 if rerun == 0 else rerun)
        ok = state != "damaged" and loads == 0 and rerun == 0 and not leftovers
        case.outcome = "survived" if ok else "defect"
        case.why = "" if ok else f"state {state}, checkpoint load exit {loads}, rerun exit {rerun}, leftovers {leftovers}"
        cases.append(case)
    # killed search workers: resuming keeps every finished trial and runs each grid point once
    for i in range(n_workers):
        sdir = work / f"search{i}"
        sdir.mkdir()
        pipeline = KILL_PIPELINE
        widths = [4, 5, 6, 8, 10, 12]
        search = {"pipeline": pipeline, "space": [{"path": "steps.quantize.params.rules.linear.weight_width", "type": "choice",
                                                   "values": widths, "name": "w"}],
                  "objectives": [{"metric": "ptq.loss", "direction": "minimize"}], "sampler": {"name": "grid", "seed": i},
                  "n_trials": len(widths), "output_dir": str(sdir / "out"), "heartbeat_interval": 1, "grace_period": 2}
        (sdir / "search.json").write_text(json.dumps(search))
        proc = subprocess.Popen([sys.executable, "-m", "mase_lite.cli", "search", str(sdir / "search.json")], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wanted = rng.randint(1, 4)  # trials finished before the kill
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list((sdir / "out").glob("trials/*/report.json"))) >= wanted:
                time.sleep(rng.uniform(0, 0.5))
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        finished = _complete(sdir / "out")
        code = forked(cli(["search", str(sdir / "search.json")]), sdir)[0]
        final = _complete(sdir / "out")
        lost = {n: v for n, v in finished.items() if final.get(n) != v}
        points = sorted(p for p, _ in final.values())
        ok = code == 0 and not lost and points == widths
        case = Case("kill", "search worker", f"SIGKILL after {len(finished)} finished trials", code=code)
        case.outcome = "survived" if ok else "defect"
        case.why = "" if ok else f"resume exit {code}, lost {lost}, grid points run {points}"
        cases.append(case)
    return cases


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _complete(out: Path) -> dict[int, tuple[Any, tuple]]:
    """The study's complete trials: number -> (grid point, values), read with Optuna from the journal."""
    import optuna

    from mase_lite.search.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(None, out, heartbeat_interval=1)
    trials = optuna.load_study(study_name="search", storage=storage).get_trials()
    return {t.number: (t.params["w"], tuple(t.values)) for t in trials if t.state.name == "COMPLETE"}


# ---------------------------------------------------------------------------------------------- report


def table(cases: list[Case]) -> str:
    rows = ["| part | cases | ran (exit 0) | clean refusal (exit 2) | defect | median s | max s | refusals: median / max s "
            "| refusals: median / max CPU s | peak RSS MB median / max |", "|---|---|---|---|---|---|---|---|---|---|"]
    for part in dict.fromkeys(c.part for c in cases if c.part != "kill"):  # kills: survived or not, listed apart
        group = [c for c in cases if c.part == part]
        count = {o: sum(c.outcome == o for c in group) for o in ("ran", "refused", "defect", "survived")}
        secs = [c.seconds for c in group]
        refusals = [c.seconds for c in group if c.outcome == "refused"] or [0.0]
        cpu = [c.cpu_seconds for c in group if c.outcome == "refused" and c.cpu_seconds is not None]
        cpu_text = f"{statistics.median(cpu):.2f} / {max(cpu):.2f}" if cpu else "–"
        ran = count["ran"] + count["survived"]
        rows.append(f"| {part} | {len(group)} | {ran} | {count['refused']} | {count['defect']} | {statistics.median(secs):.2f} "
                    f"| {max(secs):.2f} | {statistics.median(refusals):.2f} / {max(refusals):.2f} | {cpu_text} "
                    f"| {statistics.median(c.peak_mb for c in group):.0f} / {max(c.peak_mb for c in group):.0f} |")
    return "\n".join(rows)


PARTS = ["pipelines", "searches", "checkpoints", "subprocess", "kills", "data", "caches", "imports", "exports"]


def main() -> None:
    from record import add_record_flag  # beside this script; here, as tests load this file by its path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    parser.add_argument("--slice", default="0/1", help="I/N: only spec cases whose index is I modulo N (run N processes)")
    parser.add_argument("--pipeline-cases", type=int, default=300, help="mutated pipeline specs (besides the shipped ones)")
    parser.add_argument("--search-cases", type=int, default=270, help="mutated search specs (besides the shipped ones)")
    parser.add_argument("--no-shipped", action="store_true", help="only mutated specs (not the shipped ones as they are)")
    parser.add_argument("--checkpoints", type=int, help="corruptions to try (default: all)")
    parser.add_argument("--corruption", nargs="+", help="only corruptions whose name holds one of these words")
    parser.add_argument("--subprocess-cases", type=int, default=30)
    parser.add_argument("--data-damage", type=int, default=5, help="data part: cases per byte-level damage and source")
    parser.add_argument("--cache-damage", type=int, default=3, help="caches part: cases per byte-level damage and file")
    parser.add_argument("--run-kills", type=int, default=3)
    parser.add_argument("--worker-kills", type=int, default=3)
    parser.add_argument("--study-kills", type=int, default=2, help="kills per point of a trial's life and storage")
    parser.add_argument("--json", help="write every case's record here as it ends (JSON lines)")
    parser.add_argument("--skip", nargs="+", default=[], metavar="JSONL", help="skip spec cases recorded in these files")
    parser.add_argument("--rerun", nargs="+", default=[], metavar="JSONL",
                        help="run again the spec cases these records count as defects (their --keep directories), e.g. after a fix")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="seconds a case may take before it counts as a hang")
    parser.add_argument("--summarize", nargs="+", metavar="JSONL", help="print the table of records written before, and stop")
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temporary one)")
    add_record_flag(parser)
    args = parser.parse_args()
    if args.summarize:
        summarize([Case(**json.loads(line)) for name in args.summarize for line in Path(name).read_text().splitlines()])
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per case (before torch is imported): the machine is shared
    os.environ["TQDM_DISABLE"] = "1"

    import mase_lite.cli  # noqa: F401  the forked cases share the imports
    import mase_lite.pipeline.runner  # noqa: F401
    import mase_lite.search.engine  # noqa: F401

    t_start = time.monotonic()
    warm_up(Path(tempfile.mkdtemp(prefix="mase_lite_probe_warm_")))
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mase_lite_probe_"))
    work.mkdir(parents=True, exist_ok=True)
    canary = work / "CANARY"
    cases: list[Case] = []
    replayable: list[tuple[Case, list[str], Path]] = []
    try:
        for record in (r for name in args.rerun for r in map(json.loads, Path(name).read_text().splitlines())):
            if record["outcome"] == "defect" and record["part"] in ("pipeline", "search"):
                case = Case(record["part"], record["name"], record["mutation"], expect=record["expect"],
                            field_hint=record["field_hint"], directory=record["directory"])
                run_spec_case(case, Path(case.directory), args.time_limit)
                cases.append(case)
                _progress(case, canary, args.json)
        kinds = [k for k, part in (("pipeline", "pipelines"), ("search", "searches")) if part in args.parts]
        if kinds:
            index, count = map(int, args.slice.split("/"))
            specs = spec_cases(args.seed, args.pipeline_cases, args.search_cases, work / "specs", not args.no_shipped)
            done = {(r["part"], r["directory"]) for name in args.skip for r in map(json.loads, Path(name).read_text().splitlines())}
            specs = [c for i, c in enumerate(specs) if c.part in kinds and i % count == index and (c.part, c.directory) not in done]
            for case in specs:
                case_dir = Path(case.directory)
                run_spec_case(case, case_dir, args.time_limit)
                cases.append(case)
                replayable.append((case, ["search" if case.part == "search" else "run", str(case_dir / "spec.json")], case_dir))
                _progress(case, canary, args.json)
        if "checkpoints" in args.parts:
            found, _ = checkpoint_cases(args.seed, work / "checkpoints", canary, args.checkpoints, args.corruption)
            for case, directory, fn in found:
                classify(case, *forked(fn, directory))
                cases.append(case)
                _progress(case, canary, args.json)
        if "subprocess" in args.parts and replayable:
            rng = random.Random(args.seed + 1)
            for case, argv, case_dir in rng.sample(replayable, min(args.subprocess_cases, len(replayable))):
                if case_dir.joinpath("out").exists():
                    shutil.rmtree(case_dir / "out")
                again = Case("subprocess", case.name, f"{case.part}: {case.mutation}", expect=case.expect, field_hint=case.field_hint)
                classify(again, *real_cli(argv, case_dir, args.time_limit))
                if again.code != case.code:
                    again.outcome, again.why = "defect", f"exit {again.code} as a process, {case.code} in-process"
                cases.append(again)
                _progress(again, canary, args.json)
        if "data" in args.parts:
            from robustness_data import data_cases  # beside this script

            for source, damage, directory, fn in data_cases(args.seed, work / "data", args.data_damage):
                case = Case("data", source, damage)
                classify(case, *forked(fn, directory, args.time_limit))
                cases.append(case)
                _progress(case, canary, args.json)
        if "caches" in args.parts:
            from robustness_caches import cache_cases  # beside this script

            cases += run_verified("cache", cache_cases(args.seed, work / "caches", canary, args.cache_damage), canary, args)
        if "imports" in args.parts or "exports" in args.parts:
            from robustness_compressed_tensors import compressed_tensors_cases  # beside this script
            from robustness_exports import export_cases
            from robustness_gguf import gguf_cases
            from robustness_pt2 import pt2_cases

            makers = [("import", fn) for fn in (gguf_cases, compressed_tensors_cases, pt2_cases) if "imports" in args.parts]
            makers += [("export", export_cases)] if "exports" in args.parts else []
            for part, make in makers:
                cases += run_verified(part, make(args.seed, work / f"{part}s" / make.__name__, canary), canary, args)
        if "kills" in args.parts:
            try:
                from robustness_studies import study_kill_cases

                studies = study_kill_cases(args.seed, work / "studies", KILL_PIPELINE,
                                           lambda spec: forked(cli(["search", str(spec)]), spec.parent)[0], args.study_kills)
                for case in kill_cases(args.seed, work / "kills", args.run_kills, args.worker_kills) + [
                        Case("kill", r["target"], r["what"], code=r["code"], outcome="survived" if r["ok"] else "defect",
                             why=r["why"]) for r in studies]:
                    cases.append(case)
                    _progress(case, canary, args.json)
            except Exception:  # the probe's own failure: reported, the other parts' figures kept
                cases.append(Case("kill", "probe", "kill part failed", outcome="defect", why=traceback.format_exc()))
                _progress(cases[-1], canary, args.json)
    finally:
        canary_seen = any(c.why == "the canary file was created" for c in cases)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - t_start
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print()
    cpu = os.times()
    print(f"seed {args.seed}; {len(cases)} cases in {wall / 60:.1f} min wall, {(cpu.children_user + cpu.children_system) / 60:.1f} min "
          f"CPU of the cases' processes; load average before {' '.join(load_before)}, "
          f"after {' '.join(load_after)}; canary {'CREATED' if canary_seen else 'never created'}")
    summarize(cases)


def run_verified(part: str, found: list[tuple], canary: Path, args: argparse.Namespace) -> list[Case]:
    """Run each ``(source, damage, directory, fn, verify)`` case forked; a wrong outcome by ``verify`` is a defect."""
    done = []
    for source, damage, directory, fn, verify in found:
        case = Case(part, source, damage)
        classify(case, *forked(fn, directory, args.time_limit))
        problem = verify(case.code)
        if problem:
            case.outcome, case.why = "defect", problem
        done.append(case)
        _progress(case, canary, args.json)
    return done


def summarize(cases: list[Case]) -> None:
    print(table(cases))
    refusals = [c for c in cases if c.outcome == "refused" and c.names_field is not None]
    if refusals:
        print(f"refusals of a mutated field whose message quotes it: {sum(c.names_field for c in refusals)}/{len(refusals)}")
    typos = [c for c in cases if c.expect == "refused" and c.part == "search"]
    if typos:
        early = sum(c.outcome == "refused" and c.before_trials for c in typos)
        print(f"typos in objectives/constraints/plots/samplers refused before the first trial: {early}/{len(typos)}")
    defects = [c for c in cases if c.outcome == "defect"]
    for c in (c for c in cases if c.part == "kill"):
        print(f"- kill {c.name}: {c.mutation}: {c.outcome} {c.why}")
    print(f"defects: {len(defects)}")
    for c in defects:
        print(f"- {c.part} {c.name} [{c.mutation}]: {c.why} (exit {c.code}, {c.seconds:.1f} s)\n    "
              + c.message.replace("\n", "\n    "))


WARM_UP = ["finetune.json", "quickstart.json", "tasks/llm_gptq.json", "tasks/llm_w8a8_smooth.json", "tasks/cnn_prune.json",
           "tasks/vit_qat.json", "labs/lab1_prune_sweep.json"]


def warm_up(work: Path) -> None:
    """Run a few shrunk shipped specs in this process, so that every forked case finds transformers' model
    classes, torch.export and Optuna imported and initialised (as a long-running process would)."""
    from mase_lite.cli import main as cli_main

    shipped = shipped_specs()
    with contextlib.redirect_stdout(open(os.devnull, "w")), contextlib.redirect_stderr(open(os.devnull, "w")):
        for i, name in enumerate(WARM_UP):
            kind, spec, directory = shipped[name]
            out = work / str(i)
            spec = shrink_search(spec, directory, out) if kind == "search" else {**shrink_pipeline(spec), "output_dir": str(out)}
            (work / f"{i}.json").write_text(json.dumps(spec))
            cli_main(["search" if kind == "search" else "run", str(work / f"{i}.json")])
    shutil.rmtree(work, ignore_errors=True)


def _progress(case: Case, canary: Path, record: str | None) -> None:
    if canary.exists() or canary.is_symlink():
        case.outcome, case.why = "defect", "the canary file was created"
        shutil.rmtree(canary) if canary.is_dir() else canary.unlink()  # the next case starts without it
    if record:
        with open(record, "a") as f:
            f.write(json.dumps(asdict(case)) + "\n")
    mark = {"ran": ".", "refused": "r", "survived": "k"}.get(case.outcome, "X")
    print(mark, end="", flush=True)


if __name__ == "__main__":
    from record import recording  # beside this script

    with recording("robustness"):
        main()
