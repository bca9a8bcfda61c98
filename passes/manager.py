"""The pass manager: the one place every pass call goes through.

From a pipeline, a search trial or ``ml.passes.<name>(mg, ...)``, a call:

1. validates the params into a deep-frozen copy (a pass that tries to change them fails, and the
   caller's params are never touched);
2. checks the pass's ``requires`` against the facts the graph holds (and ``"data"`` against the
   context), naming the passes that provide what is missing;
3. runs the pass, with the instruments' ``before_pass``/``after_pass`` hooks around it, and reads its
   :class:`~mase_lite.passes.registry.PassResult` (a transform changes its graph in place, or hands
   back another one in ``PassResult.graph``);
4. after an in-place transform: lints the graph, regenerates its code and metadata (once per pass — no
   pass makes these calls itself); after any pass: drops
   the facts the pass invalidates, with their results (``mg.analyses`` and the nodes' metadata),
   before adding those it provides;
5. on failure names the pass and, inside a pipeline, the step's JSON path
   (``steps.1.params.rules.x: ...``).

Module mode: a plain ``nn.Module`` (or a :class:`~mase_lite.ir.module_model.ModuleModel`) runs every pass
registered with ``needs_graph=False``; any other pass fails naming itself. A plain module in gives the
module back: ``model, info = ml.passes.quantize(model, {...})``.

>>> import torch, mase_lite as ml
>>> mg = ml.MaseGraph(torch.nn.Sequential(torch.nn.Linear(4, 4)), example_inputs={"input": torch.randn(2, 4)})
>>> sorted(mg.facts)
['graph', 'metadata']
>>> ml.passes.profile(mg, {"num_batches": 1})
Traceback (most recent call last):
...
mase_lite.passes.manager.MissingRequirement: pass 'profile' needs 'data', which this call lacks: give it data (ml.passes.profile(mg, params, data=...)) or run it in a pipeline with a `data` section
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.nn as nn
from pydantic import BaseModel

from mase_lite.infra.errors import Scope, UserError
from mase_lite.ir.module_model import ModuleModel, inputs_taken
from mase_lite.passes.registry import BASE_FACTS, MODULE_MODE, PassError, PassInfo, PassResult, all_passes, providers_of  # noqa: F401 (BASE_FACTS: its users import it here)

logger = logging.getLogger(__name__)


class PassContractError(RuntimeError):
    """A pass broke the contract (left an invalid graph, returned the wrong thing): a bug in the pass."""


class ReadOnlyParamsError(PassError):
    """A pass tried to change its params."""


def _read_only(self, *args, **kwargs):
    raise ReadOnlyParamsError(
        f"params are read-only ({type(self).__name__}); a pass must copy a value before changing it "
        "(e.g. list(params.targets))"
    )


class FrozenList(list):
    """A list whose mutating methods raise :class:`ReadOnlyParamsError`."""

    append = extend = insert = pop = remove = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only


class FrozenDict(dict):
    """A dict whose mutating methods raise :class:`ReadOnlyParamsError`."""

    __setitem__ = __delitem__ = __ior__ = _read_only
    pop = popitem = clear = update = setdefault = _read_only


def frozen_copy(value: Any) -> Any:
    """A deep copy of ``value`` (params models, dicts, lists) that cannot be changed in place.

    >>> frozen = frozen_copy({"targets": ["relu"]})
    >>> frozen["targets"].append("relu")
    Traceback (most recent call last):
    ...
    mase_lite.passes.manager.ReadOnlyParamsError: params are read-only (FrozenList); a pass must copy a value before changing it (e.g. list(params.targets))
    """
    if isinstance(value, BaseModel):
        copy = value.model_copy()
        for name in type(value).model_fields:
            object.__setattr__(copy, name, frozen_copy(getattr(value, name)))
        return copy
    if isinstance(value, dict):
        return FrozenDict({k: frozen_copy(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        items = [frozen_copy(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else FrozenList(items)
    if isinstance(value, set):
        return frozenset(frozen_copy(v) for v in value)
    return value


@dataclass
class PassContext:
    """The run state a pass may use: the run's data and output directory, and the instruments.

    A pass takes it as a third argument: ``def my_pass(mg, params, ctx)``. ``tokenizer``: one given to a call
    (``ml.passes.export(mg, {...}, tokenizer=tok)``), which ``export`` writes in preference to the data's.
    """

    data: Any = None
    tokenizer: Any = None
    output_dir: Path | None = None
    instruments: tuple["PassInstrument", ...] = ()
    confined: bool = False  # a run reproduced from a report writes only inside output_dir
    reserved: tuple[str, ...] = ()  # names in output_dir the run writes itself (its report, its caches)
    sources: tuple[Path, ...] = ()  # what the run read its model from: never written over

    def path(self, path: str | Path, field: str = "path") -> Path:
        """Where a pass writes ``path``: resolved against the output directory when it is relative and
        there is one. A relative path stays inside the output directory (no ``..``, no link out of it) and names
        neither the directory itself nor a file the run writes (``reserved``); in a ``confined`` run an absolute
        path must lie inside it too. Each refusal is a ``PassError`` naming ``field``."""
        if "\0" in str(path):
            raise PassError(f"{str(path)!r} holds a NUL byte; a path cannot", location=(field,))
        path = Path(path)
        if self.output_dir is None:
            return path
        resolved = path if path.is_absolute() else Path(self.output_dir) / path
        real, base = Path(os.path.realpath(resolved)), Path(os.path.realpath(self.output_dir))
        if (self.confined or not path.is_absolute()) and not real.is_relative_to(base):
            why = ("a run reproduced from a report writes only inside its output_dir" if self.confined else
                   "a relative path names a place inside the run; give an absolute path to write elsewhere")
            raise PassError(f"{str(path)!r} lies outside the run's output_dir; {why}", location=(field,))
        if real == base or (real.parent == base and real.name in self.reserved):
            what = "the run's output_dir itself" if real == base else f"the run's own {real.name}"
            raise PassError(f"{str(path)!r} is {what}; choose a name inside the run", location=(field,))
        return resolved

    def facts(self) -> set[str]:
        """Facts the context itself provides (``"data"`` when the run has data)."""
        return {"data"} if self.data is not None else set()


@dataclass
class PassRun:
    """One call of a pass, as instruments see it; ``record`` is where they write what they measure."""

    info: PassInfo
    params: BaseModel
    context: PassContext
    where: str | None
    mg: Any
    result: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How messages name this call: ``steps.1 (quantize)`` in a pipeline, ``pass 'quantize'`` outside."""
        return f"{self.where} ({self.info.name})" if self.where else f"pass '{self.info.name}'"


class PassInstrument:
    """Hooks around every pass call (MLIR's pass instrumentation): subclass and override what you need."""

    def before_pass(self, run: PassRun) -> None:
        """Called after params are validated and requirements checked, before the pass runs."""

    def after_pass(self, run: PassRun) -> None:
        """Called after the pass ran and the graph was recompiled; ``run.mg`` is the new graph."""

    def on_error(self, run: PassRun, error: BaseException) -> None:
        """Called when the pass (or its contract check) failed."""


_GLOBAL_INSTRUMENTS: list[PassInstrument] = []


@contextlib.contextmanager
def instrument(*instruments: PassInstrument) -> Iterator[None]:
    """Apply ``instruments`` to every pass call inside the block (user scripts, searches).

    >>> from mase_lite.passes.instruments import Timing
    >>> with instrument(Timing()):
    ...     pass
    """
    _GLOBAL_INSTRUMENTS.extend(instruments)
    try:
        yield
    finally:
        for inst in instruments:
            _GLOBAL_INSTRUMENTS.remove(inst)


class MissingRequirement(PassError):
    """A pass needs a fact (``fact``) that the graph or the call lacks."""

    def __init__(self, message: str, fact: str):
        super().__init__(message)
        self.fact = fact


def check_requirements(
    info: PassInfo, available: set[str], label: str, lacking: str = "the graph does not hold (or a transform since invalidated)",
    params: BaseModel | None = None,
) -> None:
    """Raise a :class:`MissingRequirement` naming what ``info`` called with ``params`` needs beyond ``available``
    and who provides it."""
    for need in info.requirements(params):
        if need in available:
            continue
        if need == "data":
            raise MissingRequirement(
                f"{label} needs 'data', which this call lacks: give it data "
                f"(ml.passes.{info.name}(mg, params, data=...)) or run it in a pipeline with a `data` section",
                need,
            )
        providers = providers_of(need)
        hint = f"run one of: {', '.join(providers)} before it" if providers else "no registered pass provides it"
        raise MissingRequirement(f"{label} needs {need!r}, which {lacking}; {hint}", need)


def _located(err: UserError, run: PassRun) -> UserError:
    """``err`` located at the pass: at the field of its params it names (``steps.1.params.rules.x``,
    ``pass 'quantize' params.rules.x``), else at the pass (``steps.1 (quantize)``, ``pass 'quantize'``)."""
    field = run.info.field_path(err.location)
    if field is None:
        return err.within(run.where, Scope(f"({run.info.name})")) if run.where else err.within(Scope(f"pass '{run.info.name}'"))
    err.location = field
    return _in_params(err, run.info, run.where)


def _in_params(err: UserError, info: PassInfo, where: str | None) -> UserError:
    """``err``, located in a pass's params, located at the step (``steps.1.params``) or the pass."""
    return err.within(where, "params") if where else err.within(f"pass '{info.name}' params")


def _validated(info: PassInfo, params: BaseModel | dict | None, where: str | None) -> BaseModel:
    try:
        return frozen_copy(info.parse(params))
    except PassError as err:
        raise _in_params(err, info, where) from None


class PassOutcome(tuple):
    """What a call returns: unpacks to ``(graph, info)`` (``info`` as :meth:`PassResult.public_info` gives it),
    with the pass's typed :class:`PassResult` in ``.result``."""

    result: PassResult

    def __new__(cls, graph, result: PassResult):
        self = super().__new__(cls, (graph, result.public_info()))
        self.result = result
        return self


def _as_result(out: Any, label: str) -> PassResult:
    """The pass's :class:`PassResult` (a pass returns nothing else: the caller unpacks ``mg, info`` from the call)."""
    if not isinstance(out, PassResult):
        hint = " (the older (graph, info) form: return PassResult(info, metrics=...) instead)" if isinstance(out, tuple) else ""
        raise PassContractError(f"{label} returned {type(out).__name__}; a pass returns a PassResult{hint}")
    if not isinstance(out.info, dict) or not isinstance(out.metrics, (dict, type(None))):
        raise PassContractError(f"{label} returned a PassResult whose info or metrics is not a dict")
    return out


def _module_mode_error(info: PassInfo, label: str) -> PassError:
    able = ", ".join(p.name for p in all_passes().values() if not p.needs_graph)
    return PassError(f"{label} {MODULE_MODE}. Passes that run on modules: {able}")


def run_pass(info: PassInfo, mg, params: BaseModel | dict | None, context: PassContext, where: str | None = None):
    """Run ``info`` on ``mg`` (a graph, a :class:`ModuleModel`, or a plain ``nn.Module``: module mode)
    under the contract above; returns a :class:`PassOutcome` (``mg, info = ...``)."""
    plain = isinstance(mg, nn.Module)
    offered = getattr(context.data, "input_names", None)
    target = ModuleModel(mg, input_names=inputs_taken(mg, offered) if offered else None) if plain else mg
    run = PassRun(info, _validated(info, params, where), context, where, target)
    if info.needs_graph and isinstance(target, ModuleModel):
        raise _module_mode_error(info, run.label)
    check_requirements(info, set(target.facts) | context.facts(), run.label, params=run.params)
    instruments = (*_GLOBAL_INSTRUMENTS, *context.instruments)
    for inst in instruments:
        inst.before_pass(run)
    try:
        args = (target, run.params, context) if info.takes_context else (target, run.params)
        result = _as_result(info.fn(*args), run.label)
        new = target if result.graph is None else result.graph
        run.result = result.public_info()
        changed = result.changed or new is not target
        if info.kind == "transform" and new is target and changed:
            _settle_transform(run, target)
        facts = info.facts_after(target.facts, graph=not isinstance(new, ModuleModel), changed=changed)
        _drop_analyses(new, set(target.facts) - facts)
        new.facts = facts
        run.mg = new
    except BaseException as err:
        for inst in instruments:
            inst.on_error(run, err)
        if isinstance(err, UserError):
            raise _located(err, run) from None
        err.add_note(f"while running {run.label}")
        raise
    if info.replay and changed:
        replayed = result.replay_params if result.replay_params is not None else run.params.model_dump(mode="json")
        new.record_transform(info.name, replayed, info.module)
    for inst in instruments:
        inst.after_pass(run)
    return PassOutcome(new.model if plain and isinstance(new, ModuleModel) else new, result)


def _drop_analyses(mg, stale: set[str]) -> None:
    """Forget the results of ``stale`` analyses, on the graph and on every node: a fact the graph no
    longer holds has no data left behind, and a fact it holds keeps its data through metadata refreshes."""
    analyses = getattr(mg, "analyses", None)
    if analyses is None:
        return
    for fact in stale:
        analyses.pop(fact, None)
        for node in mg.nodes:
            node.meta.get("mase", {}).pop(fact, None)


def _settle_transform(run: PassRun, mg) -> None:
    """After a transform that changed ``mg`` in place: lint, regenerate its code and refresh its metadata,
    once (passes make none of these calls; a module-mode model has nothing to regenerate)."""
    if isinstance(mg, ModuleModel):
        return
    try:
        mg.model.graph.lint()
    except Exception as err:
        raise PassContractError(f"{run.label} left an invalid graph: {err}") from err
    mg.recompile()
