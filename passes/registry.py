"""The pass registry: every pass, built-in or third-party, registers here the same way.

A pass is a plain function ``fn(mg, params) -> (mg, info)`` where ``params`` is an
instance of the pass's pydantic model (frozen: a pass cannot mutate it) and ``info``
is a JSON-serialisable dict.

Example::

    from pydantic import Field
    from mase_lite.passes import register_pass, PassParams

    class CountParams(PassParams):
        op: str = Field("dropout", description="op name to count")

    @register_pass("count_op", kind="analysis", params=CountParams)
    def count_op(mg, params):
        n = sum(1 for node in mg.nodes if node.meta["mase"]["op"] == params.op)
        return mg, {"count": n}

    mg, info = mase_lite.passes.count_op(mg, {"op": "dropout"})
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import UnionType
from typing import Any, Callable, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from mase_lite.errors import UserError

logger = logging.getLogger(__name__)

PassKind = Literal["analysis", "transform"]
ENTRY_POINT_GROUP = "mase_lite.passes"


class PassParams(BaseModel):
    """Base of every pass's params model: unknown keys are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(PassParams):
    """Params of a pass that takes none."""


class PassError(UserError):
    """A user-caused pass failure: bad params, an impossible selection, a missing requirement."""


@dataclass(frozen=True)
class PassInfo:
    """What the registry knows of one pass."""

    name: str
    fn: Callable[..., tuple[Any, dict]]
    kind: PassKind
    params: type[PassParams]
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    doc: str = ""
    module: str = field(default="")
    replay: bool = False

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    def validate(self, params: PassParams | dict | None) -> PassParams:
        """Turn a dict (or None) into this pass's frozen params model; the input is not touched."""
        if params is None:
            params = {}
        if isinstance(params, self.params):
            return params
        if isinstance(params, BaseModel):
            params = params.model_dump()
        if not isinstance(params, dict):
            raise PassError(f"pass '{self.name}': params must be a JSON object, got {type(params).__name__}")
        try:
            return self.params.model_validate(params)
        except ValidationError as err:
            raise PassError(
                format_validation_error(err, prefix=f"pass '{self.name}' params", model=self.params)
            ) from None

    def __call__(self, mg, params: PassParams | dict | None = None):
        validated = self.validate(params)
        mg, info = self.fn(mg, validated)
        if self.replay and hasattr(mg, "record_transform"):
            mg.record_transform(self.name, validated.model_dump(mode="json"))
        return mg, dict(info or {})


_REGISTRY: dict[str, PassInfo] = {}
_ENTRY_POINTS_LOADED = False


def register_pass(
    name: str,
    *,
    kind: PassKind,
    params: type[PassParams] = NoParams,
    requires: tuple[str, ...] | list[str] = (),
    provides: tuple[str, ...] | list[str] = (),
    replay: bool | None = None,
) -> Callable[[Callable], PassInfo]:
    """Register ``fn(mg, params) -> (mg, info)`` as pass ``name``; returns the callable pass.

    ``requires`` and ``provides`` name metadata facts (e.g. ``"profile"``) so a pipeline's
    order is checked before it runs. ``replay`` (default: true for transforms) records the
    call in the graph's history so ``MaseGraph.load`` can rebuild the same structure;
    passes that only change weights (training) set it to false.
    """
    if kind not in ("analysis", "transform"):
        raise PassError(f"pass '{name}': kind must be 'analysis' or 'transform', got {kind!r}")
    if not (isinstance(params, type) and issubclass(params, PassParams)):
        raise PassError(f"pass '{name}': params must be a subclass of mase_lite.passes.PassParams")

    def decorate(fn: Callable) -> PassInfo:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise PassError(f"a pass named '{name}' is already registered (by {_REGISTRY[name].module})")
        info = PassInfo(
            name=name,
            fn=fn,
            kind=kind,
            params=params,
            requires=tuple(requires),
            provides=tuple(provides),
            doc=fn.__doc__ or "",
            module=getattr(fn, "__module__", ""),
            replay=(kind == "transform") if replay is None else replay,
        )
        _REGISTRY[name] = info
        return info

    return decorate


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


def get_pass(name: str) -> PassInfo:
    """The registered pass ``name``; a clear error listing the known passes otherwise."""
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise PassError(f"unknown pass '{name}'; registered passes: {known}") from None


def all_passes() -> dict[str, PassInfo]:
    """Every registered pass by name, plug-ins included."""
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def _strip_optional(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    if get_origin(tp) in (Union, UnionType) and len(args) == 1:
        return args[0]
    return tp


def _field_keys(model: type[BaseModel]) -> dict[str, Any]:
    return {(f.alias or name): f.annotation for name, f in model.model_fields.items()}


def _allowed_keys(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    """The keys allowed where ``loc`` points, when the path can be followed through ``model``."""
    current: Any = model
    for part in loc[:-1]:
        current = _strip_optional(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            current = _field_keys(current).get(str(part))
        elif get_origin(current) in (list, dict) and get_args(current):
            current = get_args(current)[-1]
        else:
            return []
    current = _strip_optional(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(_field_keys(current))
    return []


def format_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per problem: the JSON path, what is wrong or allowed, and the bad value."""
    lines = []
    for e in err.errors():
        where = ".".join([prefix] * bool(prefix) + [str(p) for p in e["loc"]]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, tuple(e["loc"]))
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        bad = e.get("input")
        got = "" if isinstance(bad, (dict, list)) else f" (got {bad!r})"
        lines.append(f"{where}: {msg}{got}")
    return "\n".join(lines)
