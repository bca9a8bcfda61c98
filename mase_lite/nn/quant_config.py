"""Per-operand quantization configs of one layer or op, parsed from MASE's flat keys or a nested form.

Operands: a layer (Linear, Conv1d, Conv2d) has ``data_in``, ``weight``, ``bias``, ``data_out``; a
functional op (matmul, bmm, add, mul) has ``data_in_0``, ``data_in_1``, ``data_out``, where
``data_in`` names both inputs and ``weight`` the second one (MASE's spelling).

Nested (canonical) form — one format dict per operand, ``null`` or absent means "not quantized";
``"format"`` is accepted for ``"name"``; ``"ste"`` picks the gradient (identity or clipped)::

    {"data_in": {"name": "integer", "width": 8, "frac_width": 4},
     "weight": {"name": "integer", "width": 8, "frac_width": 4, "ste": "clipped"},
     "bias": null}

Flat (MASE) form — ``name`` plus ``<operand>_<param>`` keys. Unprefixed params are shared by every
operand; when no key names an operand, the layer's inputs (data_in, weight, bias; both inputs of a
functional op) are quantized::

    {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
     "weight_width": 8, "weight_frac_width": 4, "bias_width": 8, "bias_frac_width": 4}

``{"name": null}`` (or ``None``) means: leave this node alone. ``"storage": "packed"`` with
``{"name": "mxint", "element_width": 8}`` asks for a packed MXINT8 weight instead of fake quantization.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from torch import Tensor

from mase_lite.errors import UserError
from mase_lite.numerics import FormatError, FormatParams, NumberFormat, apply_format, get_format
from mase_lite.numerics.ste import STE_KINDS

LAYER_OPERANDS: tuple[str, ...] = ("data_in", "weight", "bias", "data_out")
FUNCTION_OPERANDS: tuple[str, ...] = ("data_in_0", "data_in_1", "data_out")
STORAGES: tuple[str, ...] = ("fake", "packed")

# Operand names a config may use for a functional op, and the operands each one stands for.
_FUNCTION_ALIASES = {"data_in": ("data_in_0", "data_in_1"), "weight": ("data_in_1",)}


class QuantConfigError(UserError):
    """A quantization config that cannot be applied: unknown key, impossible format, wrong operand."""


@dataclass(frozen=True)
class OperandFormat:
    """The validated number format of one operand, and its straight-through estimator."""

    format: NumberFormat
    params: FormatParams
    ste: str = "identity"

    def as_dict(self) -> dict[str, Any]:
        """The canonical format dict (what node metadata stores)."""
        return self.format.as_dict(self.params)

    def __call__(self, x: Tensor) -> Tensor:
        return apply_format(x, self.format, self.params, self.ste)


@dataclass(frozen=True)
class QuantConfig:
    """The quantized operands of one layer or op (operands not listed stay in their dtype)."""

    operands: Mapping[str, OperandFormat] = field(default_factory=dict)
    storage: str = "fake"

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", MappingProxyType(dict(self.operands)))

    def get(self, operand: str) -> OperandFormat | None:
        return self.operands.get(operand)

    def formats(self) -> dict[str, dict[str, Any]]:
        """``{operand: format dict}`` of every quantized operand."""
        return {name: spec.as_dict() for name, spec in self.operands.items()}


def parse_quant_config(
    config: Mapping[str, Any] | QuantConfig | None,
    operands: tuple[str, ...] = LAYER_OPERANDS,
    where: str = "config",
) -> QuantConfig | None:
    """A validated :class:`QuantConfig`, or ``None`` when the config says "do not quantize".

    ``where`` prefixes error messages (e.g. ``rules.linear``). The input is never modified.

    >>> cfg = parse_quant_config({"name": "integer", "weight_width": 8, "weight_frac_width": 4})
    >>> cfg.formats()
    {'weight': {'name': 'integer', 'width': 8, 'frac_width': 4, 'signed': True, 'floor': False}}
    """
    if config is None or isinstance(config, QuantConfig):
        return config
    if not isinstance(config, Mapping):
        raise QuantConfigError(f"{where}: a quantization config must be an object, got {type(config).__name__}")
    if "name" in config:
        return _parse_flat(config, operands, where)
    return _parse_nested(config, operands, where)


def _accepted_operands(operands: tuple[str, ...]) -> tuple[str, ...]:
    aliases = tuple(_FUNCTION_ALIASES) if operands == FUNCTION_OPERANDS else ()
    return operands + aliases


def _expand(operand: str, operands: tuple[str, ...]) -> tuple[str, ...]:
    if operands == FUNCTION_OPERANDS and operand in _FUNCTION_ALIASES:
        return _FUNCTION_ALIASES[operand]
    return (operand,)


def _precedence(operand: str) -> int:
    """Aliases first, so a specific operand's keys override them."""
    return {"data_in": 0, "weight": 1}.get(operand, 2) if operand in _FUNCTION_ALIASES else 2


def _normalise_value(param: str, value: Any, where: str) -> Any:
    """MASE writes block sizes as lists (``[1, 16]``); only blocks along the last dimension exist here."""
    if param == "block_size" and isinstance(value, (list, tuple)):
        if not value or any(v != 1 for v in value[:-1]):
            raise QuantConfigError(
                f"{where}: block_size={list(value)} is not supported; blocks run along the last dimension "
                "only, so give one number (or a list like [1, 16])"
            )
        return value[-1]
    return value


def _parse_flat(config: Mapping[str, Any], operands: tuple[str, ...], where: str) -> QuantConfig | None:
    name = config["name"]
    if name is None:
        return None
    fmt = _format(name, where)
    storage = config.get("storage", "fake")
    accepted = _accepted_operands(operands)
    known = set(fmt.params.model_fields) | {"ste"}
    prefixes = sorted(accepted, key=len, reverse=True)
    shared: dict[str, Any] = {}
    per_operand: dict[str, dict[str, Any]] = {}
    for key, value in config.items():
        if key in ("name", "storage"):
            continue
        operand = next((p for p in prefixes if key.startswith(p + "_") and key[len(p) + 1 :] in known), None)
        param = key[len(operand) + 1 :] if operand else key
        if operand is None and param not in known:
            raise QuantConfigError(
                f"{where}.{key}: unknown key for format '{name}'; use <operand>_<param> or <param> with "
                f"operands {', '.join(accepted)} and params {', '.join(sorted(known))}"
            )
        if value is None:
            continue
        target = per_operand.setdefault(operand, {}) if operand else shared
        target[param] = _normalise_value(param, value, f"{where}.{key}")
    if per_operand:
        chosen: dict[str, dict[str, Any]] = {}
        for operand in sorted(per_operand, key=_precedence):
            for real in _expand(operand, operands):
                chosen.setdefault(real, dict(shared)).update(per_operand[operand])
    else:
        defaults = ("weight",) if storage == "packed" else tuple(o for o in operands if o != "data_out")
        chosen = {operand: dict(shared) for operand in defaults}
    specs = {operand: _operand(fmt, params, operand, where) for operand, params in chosen.items()}
    return _finish(specs, storage, operands, where)


def _parse_nested(config: Mapping[str, Any], operands: tuple[str, ...], where: str) -> QuantConfig | None:
    accepted = _accepted_operands(operands)
    storage = config.get("storage", "fake")
    chosen: dict[str, tuple[NumberFormat, dict[str, Any]]] = {}
    for operand in sorted((k for k in config if k != "storage"), key=_precedence):
        if operand not in accepted:
            raise QuantConfigError(
                f"{where}.{operand}: unknown key; allowed keys: {', '.join(accepted + ('storage',))} "
                "(or the flat form with 'name')"
            )
        spec = config[operand]
        if spec is None:
            for real in _expand(operand, operands):
                chosen.pop(real, None)
            continue
        if not isinstance(spec, Mapping):
            raise QuantConfigError(f"{where}.{operand}: expected a format object or null, got {type(spec).__name__}")
        if ("name" in spec) == ("format" in spec):
            raise QuantConfigError(f"{where}.{operand}: give the format's name as 'name' (or 'format'), exactly once")
        fmt_name = spec["name"] if "name" in spec else spec["format"]
        params = {
            k: _normalise_value(k, v, f"{where}.{operand}.{k}")
            for k, v in spec.items()
            if k not in ("name", "format") and v is not None
        }
        for real in _expand(operand, operands):
            chosen[real] = (_format(fmt_name, f"{where}.{operand}"), params)
    specs = {operand: _operand(fmt, params, operand, where) for operand, (fmt, params) in chosen.items()}
    if not specs:
        return None
    return _finish(specs, storage, operands, where)


def _format(name: Any, where: str) -> NumberFormat:
    try:
        return get_format(name)
    except FormatError as err:
        raise QuantConfigError(f"{where}: {err}") from None


def _operand(fmt: NumberFormat, params: dict[str, Any], operand: str, where: str) -> OperandFormat:
    if fmt.operands is not None and operand not in fmt.operands:
        raise QuantConfigError(
            f"{where}: format '{fmt.name}' is usable for {', '.join(sorted(fmt.operands))} only, not {operand}"
        )
    params = dict(params)
    ste = params.pop("ste", "identity")
    if ste not in STE_KINDS:
        raise QuantConfigError(f"{where}.{operand}: ste={ste!r} is unknown; allowed: {', '.join(STE_KINDS)}")
    try:
        validated = fmt.validate(params)
    except FormatError as err:
        raise QuantConfigError(f"{where}.{operand}: {err}") from None
    return OperandFormat(fmt, validated, ste)


def _finish(specs: dict[str, OperandFormat], storage: Any, operands: tuple[str, ...], where: str) -> QuantConfig:
    if storage not in STORAGES:
        raise QuantConfigError(f"{where}.storage: {storage!r} is unknown; allowed: {', '.join(STORAGES)}")
    if storage == "packed":
        weight = specs.get("weight")
        is_mxint8 = weight is not None and weight.format.name == "mxint" and weight.params.element_width == 8
        if operands != LAYER_OPERANDS or not is_mxint8:
            raise QuantConfigError(
                f"{where}.storage: 'packed' needs a layer weight in format mxint with element_width 8"
            )
        others = sorted(set(specs) - {"weight"})
        if others:
            raise QuantConfigError(
                f"{where}.storage: 'packed' quantizes the weight only; remove the config of {', '.join(others)}"
            )
    return QuantConfig(specs, storage)
