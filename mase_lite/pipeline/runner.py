"""Run a pipeline: build model and data, capture, run each step instrumented, write report.json.

Example::

    result = run_pipeline("pipelines/quickstart.json")
    result.report["steps"][0]["seconds"], result.mg, result.output_dir
"""

from __future__ import annotations

import json
import logging
import platform
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mase_lite.errors import UserError, ensure_dir
from mase_lite.files import staged_file
from mase_lite.ir.graph import MaseGraph
from mase_lite.ir.serialize import example_inputs_from_specs
from mase_lite.passes.registry import get_pass
from mase_lite.pipeline.spec import PipelineSpec, check_pipeline, load_spec
from mase_lite.train.seeding import seed_everything

logger = logging.getLogger(__name__)

_PACKAGES = ("mase-lite", "torch", "transformers", "pydantic", "optuna", "safetensors", "tokenizers")


@dataclass
class PipelineResult:
    """What a run leaves: the final graph, the report dict and the output directory."""

    mg: MaseGraph | None
    report: dict[str, Any]
    output_dir: Path


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def json_safe(value: Any) -> Any:
    """``value`` with tensors, paths, sets and numpy scalars turned into plain JSON values."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to ``path`` through a temporary file, so readers never see half a file."""
    with staged_file(path) as tmp:
        tmp.write_text(json.dumps(json_safe(payload), indent=2))


def op_counts(mg: MaseGraph) -> Counter:
    return Counter(n.meta.get("mase", {}).get("op", n.op) for n in mg.model.graph.nodes)


def graph_change(before: Counter, after: Counter) -> dict[str, Any]:
    changed = {op: [before.get(op, 0), after.get(op, 0)] for op in sorted(set(before) | set(after))}
    return {
        "nodes": [sum(before.values()), sum(after.values())],
        "ops": {op: counts for op, counts in changed.items() if counts[0] != counts[1]},
    }


def build_graph(spec: PipelineSpec, output_dir: Path) -> MaseGraph:
    """Model and data from the spec, captured with the data's (or the spec's) inputs."""
    from mase_lite.train import prepare

    model, data = prepare(spec.model, spec.data, output_dir, spec.seed)
    recipe = spec.model.recipe()
    if spec.example_inputs is not None:
        specs = {name: s.model_dump() for name, s in spec.example_inputs.items()}
        mg = MaseGraph(model, example_inputs=example_inputs_from_specs(specs), recipe=recipe)
    else:
        names = spec.inputs or (data.input_names if data is not None else None)
        mg = MaseGraph(model, hf_input_names=names, recipe=recipe)
    mg.data = data
    mg.run_dir = output_dir
    return mg


def run_pipeline(source: str | Path | dict | PipelineSpec, output_dir: str | Path | None = None) -> PipelineResult:
    """Validate the whole pipeline, run it, and write ``<output_dir>/report.json``.

    The report is written even when a step fails; it then names the step and its error,
    and the error is raised again.
    """
    spec = load_spec(source)
    params = check_pipeline(spec)
    out = Path(output_dir or spec.output_dir)
    ensure_dir(out, "output_dir")
    report: dict[str, Any] = {
        "name": spec.name,
        "status": "running",
        "spec": spec.model_dump(mode="json", by_alias=True),
        "versions": package_versions(),
        "seed": spec.seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "steps": [],
        "metrics": {},
    }
    report_path = out / "report.json"
    seed_everything(spec.seed)
    mg: MaseGraph | None = None
    current = "capture"
    try:
        t0 = time.perf_counter()
        mg = build_graph(spec, out)
        report["capture"] = {"seconds": time.perf_counter() - t0, "nodes": len(mg.nodes)}
        bar = tqdm(list(zip(spec.steps, params)), desc=spec.name, unit="step", disable=None)
        for i, (step, step_params) in enumerate(bar):
            current = f"steps.{i} ({step.pass_name})"
            bar.set_postfix_str(step.pass_name)
            before = op_counts(mg)
            t0 = time.perf_counter()
            mg, info = get_pass(step.pass_name)(mg, step_params)
            seconds = time.perf_counter() - t0
            entry = {
                "pass": step.pass_name,
                "seconds": seconds,
                "info": info,
                "graph_change": graph_change(before, op_counts(mg)),
            }
            if step.draw_after:
                entry["drawing"] = str(mg.draw(out / f"step{i:02d}_{step.pass_name}.svg"))
            if "metrics" in info:
                report["metrics"][step.label or info.get("label") or step.pass_name] = info["metrics"]
            report["steps"].append(entry)
            logger.info("step %d %s: %.3f s", i, step.pass_name, seconds)
        report["status"] = "ok"
    except BaseException as err:
        report["status"] = "failed"
        report["failed_step"] = current
        report["error"] = f"{type(err).__name__}: {err}"
        if not isinstance(err, UserError):
            report["traceback"] = traceback.format_exc()
        raise
    finally:
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json_atomic(report_path, report)
    return PipelineResult(mg=mg, report=json_safe(report), output_dir=out)
