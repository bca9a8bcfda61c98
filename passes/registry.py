"""The pass registry: every pass, built-in or third-party, registers here the same way.

A pass is a plain function ``fn(mg, params) -> PassResult`` — or ``fn(mg, params, ctx)`` when it
needs the run's data or output directory (a :class:`~mase_lite.passes.manager.PassContext`) —
where ``params`` is a deep-frozen instance of the pass's pydantic model. A transform changes ``mg``
in place; the pass manager then recompiles it and refreshes its metadata, once. Every call goes
through :mod:`mase_lite.passes.manager`, and a caller unpacks it as ``mg, info = ml.passes.<name>(mg, ...)``.

>>> from pydantic import BaseModel
>>> from mase_lite.passes import PassResult, register_pass
>>> class CountOpParams(BaseModel):
...     op: str = "dropout"
>>> @register_pass("doc_count_op", kind="analysis", params=CountOpParams)
... def doc_count_op(mg, params):
...     '''Count the nodes of one op.'''
...     return PassResult({"count": sum(n.meta["mase"]["op"] == params.op for n in mg.nodes)})
>>> doc_count_op.name, doc_count_op.kind, sorted(doc_count_op.params.model_fields)
('doc_count_op', 'analysis', ['op'])
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mase_lite.infra.errors import Scope, UserError, validation_problems

logger = logging.getLogger(__name__)

PassKind = Literal["analysis", "transform"]
# the metric keys a pass reports: fixed, or a function of its params and the model's task; None: not declared
Metrics = tuple[str, ...] | Callable[[BaseModel, str], Any] | None
ENTRY_POINT_GROUP = "mase_lite.passes"
ALL_FACTS = "*"
BASE_FACTS = frozenset({"graph", "metadata"})  # what every captured graph holds
MODULE_MODE = ("needs the captured data-flow graph, which module mode (a plain nn.Module, or \"capture\": \"modules\") "
               "does not have; capture the model (\"capture\": \"graph\") or leave it out")


class PassParams(BaseModel):
    """Base of the built-in passes' params models: unknown keys are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Seed = Annotated[int, Field(ge=0, lt=2**64, description="seed of the pass's random generator (torch takes 0 .. 2**64 - 1)")]


class NoParams(PassParams):
    """Params of a pass that takes none."""


class PassError(UserError):
    """A user-caused pass failure: bad params, an impossible selection, a missing requirement."""


@dataclass
class PassResult:
    """What a pass returns.

    ``info``: JSON-serialisable details (report.json's step entry). ``metrics``: numbers a run reports
    under ``metrics[<label or pass>]`` and a search may use as objectives (``"<label>.<key>"``).
    ``label``: the name of those metrics (default: the step's label, else the pass's name).
    ``graph``: set only by a pass that hands back another graph than the one it got (``load``);
    every other transform changes its graph in place. ``replay_params``: the params a load replays a
    structural transform with, where they differ from the call's (``quantize`` gives the formats it chose
    from calibration data, so a checkpoint loads without data). ``changed=False``: a transform that left the
    graph as it was (``quantize`` with ``bypass``): nothing is recompiled, invalidated or recorded.

    >>> PassResult({"count": 3}, metrics={"count": 3}).public_info()
    {'count': 3, 'metrics': {'count': 3}}
    """

    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    label: str | None = None
    graph: Any = None
    replay_params: dict[str, Any] | None = None
    changed: bool = True

    def public_info(self) -> dict[str, Any]:
        """``info`` as a caller unpacks it (and report.json records it): with ``metrics`` and ``label`` when set."""
        extra = {k: v for k, v in (("metrics", self.metrics), ("label", self.label)) if v is not None}
        return {**self.info, **extra}


def _frozen_model(params: type[BaseModel]) -> type[BaseModel]:
    """``params`` itself when its instances are frozen and reject unknown keys, else a subclass that does."""
    config = params.model_config
    if config.get("frozen") and config.get("extra") == "forbid":
        return params
    frozen = type(params.__name__, (params,), {"model_config": ConfigDict(**{**config, "frozen": True, "extra": "forbid"})})
    frozen.__module__ = params.__module__
    frozen.__doc__ = params.__doc__
    return frozen


@dataclass(frozen=True)
class PassInfo:
    """What the registry knows of one pass; calling it runs the pass through the pass manager."""

    name: str
    fn: Callable[..., tuple[Any, dict]]
    kind: PassKind
    params: type[BaseModel]
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    requires_for: Callable[[BaseModel], tuple[str, ...]] | None = None
    invalidates: tuple[str, ...] = ()
    doc: str = ""
    module: str = field(default="")
    replay: bool = False
    takes_context: bool = False
    metrics: Metrics = None
    needs_graph: bool = True
    streams: bool | Callable[[BaseModel], bool] = False

    def streams_with(self, params: BaseModel | None) -> bool:
        """Whether a call with ``params`` runs on a model streamed from disk (``streams``, or what it says of them)."""
        return self.streams(params) if callable(self.streams) else self.streams

    def requirements(self, params: BaseModel | None) -> tuple[str, ...]:
        """The facts a call with ``params`` requires: ``requires``, and those its params add (``prune`` with
        a calibrated method needs data)."""
        if self.requires_for is None or params is None:
            return self.requires
        return (*self.requires, *self.requires_for(params))

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    def validate(self, params: BaseModel | dict | None) -> BaseModel:
        """Turn a dict (or None) into this pass's frozen params model; the input is not touched. A bad
        value is a :class:`PassError` located at the field (``pass 'quantize' params.rules.x``)."""
        try:
            return self.parse(params)
        except PassError as err:
            raise err.within(f"pass '{self.name}' params") from None

    def parse(self, params: BaseModel | dict | None) -> BaseModel:
        """:meth:`validate`, its errors located relative to the params (the caller says whose they are)."""
        if params is None:
            params = {}
        if isinstance(params, self.params):
            return params
        if isinstance(params, BaseModel):
            params = params.model_dump()
        if not isinstance(params, dict):
            raise PassError(f"must be a JSON object, got {type(params).__name__}")
        try:
            return self.params.model_validate(params)
        except ValidationError as err:
            from mase_lite.layers.quant_config import explain_format_error  # rules' number formats, as the user wrote them

            explain = lambda e: explain_format_error(e, params)  # noqa: E731
            raise PassError(problems=validation_problems(err, model=self.params, explain=explain)) from None

    def field_path(self, location: tuple) -> tuple | None:
        """``location`` as a path into this pass's params when it starts with one of their fields (or with
        ``<pass name>.<field>``, how a helper the pass shares names it); ``None`` when it does not."""
        if not location or not isinstance(location[0], str) or isinstance(location[0], Scope):
            return None
        head, *rest = location[0].split(".")
        if head == self.name and rest:
            location = (".".join(rest), *location[1:])
            head = rest[0]
        fields = {key for name, f in self.params.model_fields.items() for key in (name, f.alias) if key}
        return location if head.split("[")[0] in fields else None

    def metric_names(self, params: BaseModel, task: str) -> set[str] | None:
        """The keys this pass may report under ``info["metrics"]`` (``"per_class.*"``: any key below
        ``per_class``) for ``params`` and the model's task. A built-in pass declares every metric it
        reports (none when it declares none); ``None``: a plug-in that does not say."""
        if self.metrics is None:
            return set() if self.name in builtin_passes() else None
        return set(self.metrics(params, task) if callable(self.metrics) else self.metrics)

    def drops(self, facts: set[str]) -> set[str]:
        """The facts of ``facts`` this pass invalidates."""
        return set(facts) if ALL_FACTS in self.invalidates else set(facts) & set(self.invalidates)

    def facts_after(self, facts: set[str], graph: bool = True, changed: bool = True) -> set[str]:
        """The facts held after this pass ran where ``facts`` were held (``"data"``, the run's, is never dropped);
        ``graph``: a captured graph, which always holds :data:`BASE_FACTS`; a transform that says it ``changed``
        nothing invalidates nothing. The one rule for the pipeline check before a run and the manager during it."""
        dropped = self.drops(set(facts) - {"data"}) if changed else set()
        return (set(facts) - dropped) | (set(BASE_FACTS) if graph else set()) | set(self.provides)

    def __call__(self, mg, params: BaseModel | dict | None = None, *, context=None, **context_fields):
        """Run the pass on ``mg`` through the pass manager (see :func:`mase_lite.passes.manager.run_pass`)."""
        from mase_lite.passes.manager import PassContext, run_pass

        if "data" in context_fields:
            from torch import nn

            from mase_lite.workloads.batches import as_data

            # a plain module (module mode) is the model itself: a transformers model's ``.model`` is its backbone
            model = mg if isinstance(mg, nn.Module) else getattr(mg, "source_model", getattr(mg, "model", mg))
            context_fields["data"] = as_data(context_fields["data"], model)
        if isinstance(context_fields.get("tokenizer"), (str, Path)):  # a directory or hub name, loaded once here
            from mase_lite.workloads.tokenizer import load_tokenizer

            context_fields["tokenizer"] = load_tokenizer(context_fields["tokenizer"], field="tokenizer")
        if context is None:
            context = PassContext(**context_fields)
        elif context_fields:
            raise PassError(f"pass '{self.name}': give either context= or its fields ({', '.join(context_fields)}), not both")
        return run_pass(self, mg, params, context)


_REGISTRY: dict[str, PassInfo] = {}
_ENTRY_POINTS_LOADED = False


def _takes_context(fn: Callable) -> bool:
    positional = [
        p for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in positional)


def register_pass(
    name: str,
    *,
    kind: PassKind,
    params: type[BaseModel] = NoParams,
    requires: tuple[str, ...] | list[str] | Callable[[BaseModel], tuple[str, ...]] = (),
    provides: tuple[str, ...] | list[str] = (),
    invalidates: tuple[str, ...] | list[str] | None = None,
    replay: bool | None = None,
    metrics: Metrics = None,
    needs_graph: bool = True,
    streams: bool | Callable[[BaseModel], bool] = False,
) -> Callable[[Callable], PassInfo]:
    """Register ``fn(mg, params[, ctx]) -> PassResult`` as pass ``name``; returns the callable pass.

    ``requires`` and ``provides`` name metadata facts (e.g. ``"profile"``; ``"data"`` means the run
    has data); ``requires`` may be a function of the params giving them (``prune`` needs data for some methods); ``invalidates`` the facts a run of this pass makes stale (default: every fact for a
    transform, none for an analysis). Pipelines are checked against them before they run, and every
    call is checked against the graph. ``replay`` (default: true for transforms) records the call so
    a saved graph can be rebuilt with the same structure; passes that only change weights (training)
    set it to false. ``params`` is any pydantic model; its instances are frozen and reject unknown keys.
    ``metrics`` names the keys of the ``info["metrics"]`` the pass reports (a tuple, or a function of
    its params and the model's task): a search checks its objectives against them before the first trial.
    ``needs_graph=False`` says the pass works on modules alone, so it also runs on a plain ``nn.Module``
    (module mode, :mod:`mase_lite.ir.module_model`); the pass manager refuses module mode to the others.
    ``streams=True`` says it also runs on a model whose weights stay on disk (``model.stream``,
    :mod:`mase_lite.runtime.disk_weights`): it makes a block resident before reading its tensors; a function of the
    params says so per call (``export`` streams to compressed-tensors only).
    """
    if kind not in ("analysis", "transform"):
        raise PassError(f"pass '{name}': kind must be 'analysis' or 'transform', got {kind!r}")
    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise PassError(
            f"pass '{name}': params must be a pydantic model class (a subclass of pydantic.BaseModel), "
            f"got {params!r}"
        )
    if invalidates is None:
        invalidates = (ALL_FACTS,) if kind == "transform" else ()
    taken = _package_attribute(name)
    if taken is not None:
        raise PassError(
            f"pass '{name}': the name is taken by {taken} (ml.passes.{name} would reach it, not the pass); "
            "choose another name"
        )

    def decorate(fn: Callable) -> PassInfo:
        module = getattr(fn, "__module__", "")
        existing = _REGISTRY.get(name)
        if existing is not None and (existing.module, existing.fn.__qualname__) != (module, fn.__qualname__):
            raise PassError(f"a pass named '{name}' is already registered (by {existing.module})")
        info = PassInfo(
            name=name,
            fn=fn,
            kind=kind,
            params=_frozen_model(params),
            requires=() if callable(requires) else tuple(requires),
            requires_for=requires if callable(requires) else None,
            provides=tuple(provides),
            invalidates=tuple(invalidates),
            doc=fn.__doc__ or "",
            module=module,
            replay=(kind == "transform") if replay is None else replay,
            takes_context=_takes_context(fn),
            metrics=tuple(metrics) if isinstance(metrics, (list, tuple)) else metrics,
            needs_graph=needs_graph,
            streams=streams,
        )
        _REGISTRY[name] = info
        return info

    return decorate


def _package_attribute(name: str) -> str | None:
    """What ``mase_lite.passes.<name>`` is when it is not a pass: an attribute or a submodule of the package."""
    import mase_lite.passes as package

    if name in {m.name for m in pkgutil.iter_modules(package.__path__)}:
        return f"the module mase_lite.passes.{name}"
    return f"mase_lite.passes.{name}" if name in vars(package) else None


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # a broken plug-in must not break the tool
            logger.warning("could not load pass plug-in %s (%s): %s", ep.name, ep.value, err)


_BUILTIN_NAME = re.compile(r'@register_pass\(\s*"([^"]+)"')


@lru_cache(maxsize=1)
def builtin_passes() -> dict[str, str]:
    """Built-in pass name -> the module that registers it, read from the pass files without importing them.

    Built-in passes are imported on first use, so a run imports only the passes it names.
    """
    root, package = Path(__file__).parent, __name__.rpartition(".")[0]
    index = {}
    for family in ("analysis", "transforms"):
        for path in sorted((root / family).glob("[!_]*.py")):
            for name in _BUILTIN_NAME.findall(path.read_text()):
                index[name] = f"{package}.{family}.{path.stem}"
    return index


def pass_names() -> list[str]:
    """The names of every pass, built-in or plug-in, without importing the built-in ones."""
    _load_entry_points()
    return sorted(set(_REGISTRY) | set(builtin_passes()))


def get_pass(name: str) -> PassInfo:
    """The registered pass ``name``; a clear error listing the known passes otherwise."""
    _load_entry_points()
    if name not in _REGISTRY and name in builtin_passes():
        importlib.import_module(builtin_passes()[name])
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PassError(f"unknown pass '{name}'; registered passes: {', '.join(pass_names())}") from None


def all_passes() -> dict[str, PassInfo]:
    """Every registered pass by name, plug-ins included (imports every built-in pass)."""
    _load_entry_points()
    for module in sorted(set(builtin_passes().values())):
        importlib.import_module(module)
    return dict(sorted(_REGISTRY.items()))


def providers_of(fact: str) -> list[str]:
    """Names of the passes that provide ``fact``."""
    return [p.name for p in all_passes().values() if fact in p.provides]
