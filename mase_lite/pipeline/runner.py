"""Run a pipeline: build model and data, capture, run each step instrumented, write report.json.

Example::

    result = run_pipeline("pipelines/quickstart.json")
    result.report["steps"][0]["seconds"], result.mg, result.output_dir
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import shutil
import time
import traceback
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
from tqdm import tqdm

from mase_lite.infra import progress
from mase_lite.infra.errors import UserError, describe, ensure_dir, show_paths_as
from mase_lite.infra.files import check_writable, staged_directory, staged_file
from mase_lite.infra.lock import DirectoryLock
from mase_lite.ir.capture import CaptureError
from mase_lite.ir.graph import MaseGraph
from mase_lite.ir.module_model import ModuleModel
from mase_lite.ir.serialize import example_inputs_from_specs
from mase_lite.passes.instruments import DrawAfter, GraphChange, Timing, VerifyAfterEach
from mase_lite.passes.manager import PassContext, PassInstrument, PassRun, run_pass
from mase_lite.passes.registry import get_pass
from mase_lite.pipeline.preflight import check_targets
from mase_lite.pipeline.spec import PipelineSpec, StepSpec, check_pipeline, graph_steps, load_spec
from mase_lite.workloads.seeding import seed_everything

logger = logging.getLogger(__name__)

REPORT = "report.json"
_CACHES = ("hf_cache", "data_cache")  # hub downloads and tokenized data (mase_lite.workloads), reused by the next run
_MAX_NAME = 200  # bytes of an output directory's name: its staging directory adds ~30 (a file name has at most 255)
_PACKAGES = ("mase-lite", "torch", "transformers", "pydantic", "optuna", "safetensors", "tokenizers")


@dataclass
class PipelineResult:
    """What a run leaves: the final graph, the report dict, the output directory and the run's data."""

    mg: MaseGraph | None
    report: dict[str, Any]
    output_dir: Path
    data: Any = None


def beside_report(source: Any, field: str) -> Path:
    """A new directory beside the report ``source`` names (``reproduced``, else ``reproduced-2``, ...): a report is
    data, possibly someone else's, so what it reproduces is written where the user's command says, never to the
    directory the report records."""
    if not isinstance(source, (str, Path)):
        raise UserError(f"a run or search reproduced from a report writes only where you say: give {field}",
                        location=(field,))
    parent = Path(source).parent
    for n in range(1, 10_000):
        candidate = parent / ("reproduced" if n == 1 else f"reproduced-{n}")
        if not candidate.exists():
            return candidate
    raise UserError(f"{parent} holds 9999 reproductions already: give {field}", location=(field,))


def thread_settings() -> dict[str, Any]:
    """The threads the run computes with: torch's count and what chose it (:mod:`mase_lite.infra.cores`), the cores the
    process may use, and whether native kernels choose per call between one thread and all
    by timing (:mod:`mase_lite.numerics.native.threads`)."""
    from mase_lite.infra import cores
    from mase_lite.numerics.native import threads

    return {"torch": torch.get_num_threads(), "cores": cores.usable_cores(), "chosen_by": cores.REASON,
            "adaptive": threads.ADAPTIVE}


@functools.cache  # read once per process: every trial of a search asks
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


class StepCache(Protocol):
    """Where a run may resume from a state saved after its first steps (the search's prefix cache)."""

    def restore(self, spec: PipelineSpec, ctx: PassContext) -> tuple[int, MaseGraph, list[dict[str, Any]]] | None:
        """``(steps done, graph after them, their report entries)`` with ``ctx.data`` set, or ``None`` to
        build, capture and run from the start. Called before the model is built."""

    def store(self, spec: PipelineSpec, done: int, mg: MaseGraph, entries: list[dict[str, Any]], ctx: PassContext) -> None:
        """Called after the capture (``done == 0``) and after each step; the cache decides what to keep."""


class _Keep(PassInstrument):
    """Keeps the record the other instruments wrote for the last pass."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def after_pass(self, run: PassRun) -> None:
        self.record = run.record


def capture_inputs(model: Any, data: Any, task: str, names: list[str] | None) -> dict[str, Any]:
    """How to capture ``model``: ``{"hf_input_names": [...]}`` (a transformers model's examples made from its
    config) or ``{"example_inputs": {...}}`` (the data's first rows: images, and models without a config).

    Without ``names``, the task's inputs that the model's forward takes (all of them when it takes ``**kwargs``).
    """
    from mase_lite.ir.inputs import forward_parameters
    from mase_lite.workloads.tasks import TASKS

    if names is None:
        offered = data.input_names if data is not None else [n for n in TASKS[task].input_names if n != "labels"]
        accepted = forward_parameters(model)
        names = [n for n in offered if n in accepted] or offered
    if data is not None and (not hasattr(model, "config") or task == "image-classification"):
        batch = data.example_batch(3)
        return {"example_inputs": {n: batch[n] for n in names if n in batch}}
    return {"hf_input_names": names}


def build_graph(spec: PipelineSpec, output_dir: Path) -> tuple[MaseGraph | ModuleModel, Any]:
    """Model and data from the spec, moved to the spec's device and captured with the data's (or the spec's)
    inputs — or, by the spec's ``capture``, held as a plain module (module mode)."""
    from mase_lite.workloads import prepare
    from mase_lite.workloads.devices import resolve_device

    model, data = prepare(spec.model, spec.data, output_dir, spec.seed)
    if not spec.model.stream:  # a streamed model's tensors are read onto the CPU when a block is resident
        model.to(resolve_device(spec.device))
    recipe = spec.model.recipe()
    if spec.example_inputs is not None:
        specs = {name: s.model_dump() for name, s in spec.example_inputs.items()}
        inputs: dict[str, Any] = {"example_inputs": example_inputs_from_specs(specs)}
    else:
        inputs = capture_inputs(model, data, spec.model.task, spec.inputs)
    if spec.capture != "modules":
        try:
            return MaseGraph(model, recipe=recipe, **inputs), data
        except CaptureError as err:
            if spec.capture == "graph":
                raise
            _fall_back(spec, model, err)
    return module_model(model, inputs, recipe), data


def module_model(model: Any, inputs: dict[str, Any], recipe: dict[str, Any] | None) -> ModuleModel:
    """``model`` in module mode, with the example inputs a capture would have used."""
    from mase_lite.ir.inputs import hf_example_inputs

    examples = inputs.get("example_inputs")
    if examples is None:
        examples = hf_example_inputs(model, list(inputs["hf_input_names"]))
    return ModuleModel(model, example_inputs=examples, recipe=recipe)


def _fall_back(spec: PipelineSpec, model: Any, err: CaptureError) -> None:
    """``"capture": "auto"`` after torch.export refused ``model``: log why (export's first lines name the
    source line it refused), or fail naming the steps that need the graph."""
    reason = "\n".join(str(err).splitlines()[:2])
    problems = graph_steps(spec)
    if problems:
        raise UserError(f"capture: auto: {reason}\nmodule mode cannot run the pipeline:", problems=problems) from None
    logger.warning("capture: auto: running %s in module mode, because %s", type(model).__name__, reason)


def metrics_key(step: StepSpec, info: dict[str, Any]) -> str:
    """The name a step's metrics get in the report: its label, else the pass's own label, else the pass."""
    return step.label or info.get("label") or step.pass_name


def _check_stageable(out: Path) -> None:
    """A run is staged beside its directory and replaces it whole: the directory must not hold the
    process's working directory, and its name must leave room for the staging directory's."""
    if Path.cwd().is_relative_to(Path(os.path.abspath(out))):
        raise UserError(f"{str(out)!r} is or contains the current directory; choose a directory inside it", location=("output_dir",))
    if len(os.fsencode(out.name)) > _MAX_NAME:
        raise UserError(f"the name {out.name[:40]!r}... is longer than {_MAX_NAME} bytes; choose a shorter one", location=("output_dir",))


def _check_replaceable(out: Path) -> None:
    """Only a previous run's directory (it has a report.json), an empty directory or nothing may be replaced."""
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_dir() and not out.is_symlink() and ((out / REPORT).is_file() or not any(out.iterdir())):
        return
    raise UserError(
        f"output_dir: {out} exists and is not a run directory (no {REPORT} in it); a run replaces its "
        "output_dir whole, so choose a new or empty directory, or move this one away"
    )


def _sources(spec: PipelineSpec) -> tuple[Path, ...]:
    """The local files the run reads its model from (a pretrained directory or file, checkpoints it loads)."""
    named = [spec.model.pretrained] + [getattr(step.params, "path", None) for step in spec.steps if step.pass_name == "load"]
    return tuple(Path(p) for p in named if isinstance(p, str) and os.path.lexists(p))


def _carry_caches(out: Path, staging: Path) -> None:
    """Hard-link the previous run's download and tokenized-data caches into the new run directory."""
    for name in _CACHES:
        if (out / name).is_dir():
            shutil.copytree(out / name, staging / name, symlinks=True, copy_function=os.link)


def _rebase(value: Any, staging: str, out: str) -> Any:
    """``value`` with every mention of the staging directory naming the run's final directory instead."""
    if isinstance(value, str):
        return value.replace(staging, out)
    if isinstance(value, Path):
        return Path(str(value).replace(staging, out))
    if isinstance(value, dict):
        return {k: _rebase(v, staging, out) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rebase(v, staging, out) for v in value)
    return value


def _run_steps(spec: PipelineSpec, ctx: PassContext, report: dict[str, Any], instruments: tuple[PassInstrument, ...],
               cache: StepCache | None, final: Callable[[Any], Any]) -> MaseGraph:
    """Build and capture (or restore from ``cache``), then run each step, recording it in ``report``
    with paths under the run's final directory (``final``); a failure names its step in ``report``."""
    current = "capture"
    try:
        t0 = time.perf_counter()
        done = 0
        restored = cache.restore(spec, ctx) if cache is not None else None  # skips build and capture on a hit
        if restored is None:
            mg, ctx.data = build_graph(spec, ctx.output_dir)
            check_targets(spec.steps, mg)  # an export its quantize steps cannot meet: refused before any step
            if cache is not None:
                cache.store(spec, 0, mg, [], ctx)
        else:
            done, mg, entries = restored
            report["steps"] = [{**entry, "cached": True} for entry in entries]
            for step, entry in zip(spec.steps, entries):
                if "metrics" in entry["info"]:
                    report["metrics"][metrics_key(step, entry["info"])] = entry["info"]["metrics"]
        report["capture"] = {"seconds": time.perf_counter() - t0, "mode": getattr(mg, "capture", "graph"),
                             "nodes": len(mg.nodes)}
        base = (Timing(), GraphChange(), *((VerifyAfterEach(),) if spec.verify_each else ()), *instruments)
        bar = tqdm(total=len(spec.steps), initial=done, desc=spec.name, unit="step", disable=progress.bars_disabled())
        for i in range(done, len(spec.steps)):
            step = spec.steps[i]
            current = f"steps.{i} ({step.pass_name})"
            bar.set_postfix_str(step.pass_name)
            progress.line(f"{spec.name}: {current} of {len(spec.steps)} ...")
            keep = _Keep()
            draw = (DrawAfter(ctx.output_dir, f"step{i:02d}"),) if step.draw_after else ()
            ctx.instruments = (*base, *draw, keep)
            outcome = run_pass(get_pass(step.pass_name), mg, step.params, ctx, where=f"steps.{i}")
            mg, info = outcome
            entry = {"pass": step.pass_name, "info": info}
            entry.update({k: v for k, v in keep.record.items() if not k.startswith("_")})
            entry = final(entry)
            if outcome.result.metrics is not None:
                report["metrics"][metrics_key(step, entry["info"])] = final(outcome.result.metrics)
            report["steps"].append(entry)
            logger.info("step %d %s: %.3f s", i, step.pass_name, entry.get("seconds", 0.0))
            progress.line(f"{spec.name}: {current} done in {entry.get('seconds', 0.0):.1f} s")
            if cache is not None:
                cache.store(spec, i + 1, mg, report["steps"], ctx)
            bar.update()
        bar.close()
    except BaseException:
        report["failed_step"] = current
        raise
    return mg


def _record_failure(report: dict[str, Any], err: BaseException, final: Callable[[Any], Any], aliases: dict[str, str]) -> None:
    """The error in ``report`` (a traceback too, unless the user caused it); ``err`` and the report name
    paths under the run's final directory (``aliases``: staging directory -> final one) when shown."""
    show_paths_as(err, aliases)
    report["status"] = "failed"
    report["error"] = f"{type(err).__name__}: {describe(err)}"
    if not isinstance(err, UserError):
        report["traceback"] = final(traceback.format_exc())


def run_pipeline(
    source: str | Path | dict | PipelineSpec,
    output_dir: str | Path | None = None,
    *,
    instruments: tuple[PassInstrument, ...] = (),
    cache: StepCache | None = None,
    recorded: bool = False,
) -> PipelineResult:
    """Validate the whole pipeline, run it, and write ``<output_dir>/report.json``.

    Every step runs through the pass manager with timing and graph-change instruments (plus
    ``instruments``); ``cache`` may resume the run after its first steps. The report is written
    even when a step fails; it then names the step and its error, and the error is raised again.
    A spec read from a report, or ``recorded`` (a search over a report's pipeline), is data: see
    :func:`mase_lite.pipeline.spec.load_spec`; its steps write only inside ``output_dir``, which for a report is the
    one given here, else a new directory beside the report (never the directory the report records).

    The run is written into a staging directory beside ``output_dir`` that replaces it whole at the
    end, failed or not (:func:`mase_lite.infra.files.staged_directory`): a killed run leaves the previous
    run as it was. Paths in the report and in errors name ``output_dir``.
    """
    spec = load_spec(source, recorded=recorded)
    check_pipeline(spec)
    if output_dir is None and spec.recorded and not recorded:  # a report reproduced: never its recorded directory
        output_dir = beside_report(source, "output_dir")
    out = Path(output_dir or spec.output_dir)
    ensure_dir(out, "output_dir")
    for place in (out, out.parent):  # the run is staged beside its directory, which it then replaces
        check_writable(place, "output_dir")
    _check_stageable(out)
    report: dict[str, Any] = {
        "name": spec.name,
        "status": "running",
        "spec": spec.model_dump(mode="json", by_alias=True),
        "versions": package_versions(),
        "seed": spec.seed,
        "threads": thread_settings(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "steps": [],
        "metrics": {},
    }
    seed_everything(spec.seed)
    mg: MaseGraph | None = None
    failure: BaseException | None = None
    lock = DirectoryLock(out, "output_dir").acquire()  # one run per directory, held until the new one is in
    try:
        _check_replaceable(out)
        with staged_directory(out) as staging:
            _carry_caches(out, staging)
            final = functools.partial(_rebase, staging=str(staging), out=str(out))
            ctx = PassContext(output_dir=staging, confined=spec.recorded, reserved=(REPORT, *_CACHES),
                              sources=_sources(spec))
            try:
                mg = _run_steps(spec, ctx, report, instruments, cache, final)
                report["status"] = "ok"
            except BaseException as err:  # the failed run's directory replaces the old one too
                failure = err
                _record_failure(report, err, final, {str(staging): str(out)})
            finally:
                report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                write_json_atomic(staging / REPORT, report)
    finally:
        lock.release()
    if failure is not None:
        raise failure
    return PipelineResult(mg=mg, report=json_safe(report), output_dir=out, data=ctx.data)
