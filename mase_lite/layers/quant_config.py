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

Canonically (what the JSON Schema describes) a config is a :class:`QuantSpec`: one format object per
operand, each a member of a union discriminated on the format ``name`` (so an editor completes each
format's own fields), plus ``inputs`` for "every input operand" (data_in, weight and bias of a layer;
both inputs of a functional op) — what the flat form means when no key names an operand.

``{"name": null}`` (or ``None``) means: leave this node alone. ``"storage": "packed"`` with
``{"name": "mxint", "element_width": 8}`` asks for a packed MXINT8 weight instead of fake quantization;
``"activations": "int8"`` beside it quantizes the packed layer's input to int8 per block of 32 (inference only).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_serializer, model_validator
from pydantic_core import PydanticCustomError, core_schema
from torch import Tensor

from mase_lite.infra.errors import UserError, short, validation_problems
from mase_lite.numerics import FormatParams, NumberFormat, apply_format, get_format
from mase_lite.numerics.registry import format_names
from mase_lite.numerics.ste import SteKind

LAYER_OPERANDS: tuple[str, ...] = ("data_in", "weight", "bias", "data_out")
FUNCTION_OPERANDS: tuple[str, ...] = ("data_in_0", "data_in_1", "data_out")
STORAGES: tuple[str, ...] = ("fake", "packed")
ACTIVATIONS: tuple[str, ...] = ("float", "int8")

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
    activations: str = "float"  # a packed layer's input: float, or int8 per block of 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", MappingProxyType(dict(self.operands)))

    def __deepcopy__(self, memo: dict) -> "QuantConfig":
        return self  # immutable: a copied quantized layer shares its config

    def get(self, operand: str) -> OperandFormat | None:
        return self.operands.get(operand)

    def formats(self) -> dict[str, dict[str, Any]]:
        """``{operand: format dict}`` of every quantized operand."""
        return {name: spec.as_dict() for name, spec in self.operands.items()}



def _format_model(fmt: NumberFormat) -> type[BaseModel]:
    """The format's params model plus its ``name`` tag and the gradient to use."""

    def _mase_block_size(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("block_size"), (list, tuple)):
            value = list(data["block_size"])
            if not value or any(v != 1 for v in value[:-1]):
                raise PydanticCustomError(
                    "block_size",
                    "block_size={value} is not supported; blocks run along the last dimension only, so give one "
                    "number (or a list like [1, 16])",
                    {"value": value},
                )
            data = {**data, "block_size": value[-1]}
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None or k == "name"}
        return data

    return create_model(
        f"{fmt.name}_format",
        __base__=fmt.params,
        __doc__=fmt.doc.splitlines()[0] if fmt.doc else f"The {fmt.name} format.",
        __validators__={"_mase_block_size": model_validator(mode="before")(classmethod(_mase_block_size))},
        name=(Literal[fmt.name], Field(description="number format")),
        ste=(SteKind, Field("identity", description="gradient: identity everywhere, or clipped where saturated")),
    )


_FORMAT_MODELS: dict[str, tuple[type, type[BaseModel]]] = {}  # name -> (its params class, its spec model)


def format_model(name: str) -> type[BaseModel]:
    """The spec model of registered format ``name`` (built on first use, again if the format was registered anew)."""
    fmt = get_format(name)
    cached = _FORMAT_MODELS.get(name)
    if cached is None or cached[0] is not fmt.params:
        cached = _FORMAT_MODELS[name] = (fmt.params, _format_model(fmt))
    return cached[1]


def _validate_format(value: Any) -> BaseModel:
    """A format object checked against the format its ``name`` names, in the registry as it is now (a plug-in's
    format registered after this module was imported included)."""
    if isinstance(value, BaseModel) and isinstance(getattr(value, "name", None), str):
        value = value.model_dump()
    if not isinstance(value, Mapping):
        raise PydanticCustomError("model_type", "Input should be a valid dictionary or object to extract fields from")
    if "name" not in value:
        raise PydanticCustomError("format_name", "give the format's name as 'name' (or 'format'); known formats: {known}",
                                  {"known": ", ".join(format_names())})
    name = value.get("name")
    if name not in format_names():
        raise PydanticCustomError("format_name", _unknown_format(name).replace("{", "{{").replace("}", "}}"))
    return format_model(name).model_validate(dict(value))


class _FormatSpec:
    """The type of one operand's format: validated against the registry when validated; its JSON Schema is the
    union of the formats registered when the schema is asked for."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_plain_validator_function(
            _validate_format, serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v, info: v.model_dump(mode=info.mode, by_alias=info.by_alias), info_arg=True))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        members = {name: handler(format_model(name).__pydantic_core_schema__) for name in format_names()}
        mapping = {name: m["$ref"] for name, m in members.items() if "$ref" in m}
        union: dict[str, Any] = {"oneOf": list(members.values())}
        if len(mapping) == len(members):
            union["discriminator"] = {"propertyName": "name", "mapping": mapping}
        return union


FormatSpec = _FormatSpec
_OPERAND_FIELDS = ("inputs",) + LAYER_OPERANDS + FUNCTION_OPERANDS[:2]


def _operand_field(operand: str) -> tuple[Any, Any]:
    doc = {
        "inputs": "every input operand (data_in, weight, bias of a layer; both inputs of a functional op)",
        "data_in": "the layer's input (of a functional op: both inputs)",
        "weight": "the layer's weight (of a functional op: the second input)",
    }.get(operand, f"the {operand} operand")
    return (FormatSpec | None, Field(None, description=f"format of {doc}; null: not quantized"))


class _QuantSpecBase(BaseModel):
    """The number format of each operand of one layer or op; MASE's flat keys are accepted too."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    storage: Literal["fake", "packed"] = Field(
        "fake", description="fake: quantize-dequantize in float; packed: MXINT8, or 4-bit, codes + scales (weight only)"
    )
    activations: Literal["float", "int8"] = Field(
        "float", description="packed only: float inputs, or int8 (each input quantized per block of 32 and multiplied "
        "in integers, as llama.cpp does; inference only)"
    )

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, data: Any) -> Any:
        """MASE's flat form (``name`` plus ``<operand>_<param>`` keys) and ``format`` for ``name``, as nested."""
        if not isinstance(data, Mapping):
            return data
        if "name" in data:
            return _from_flat(data)
        out = {}
        for key, spec in data.items():
            if isinstance(spec, Mapping) and "format" in spec:
                if "name" in spec:
                    raise PydanticCustomError("format_name", "give the format's name as 'name' (or 'format'), exactly once")
                spec = {"name": spec["format"], **{k: v for k, v in spec.items() if k != "format"}}
            out[key] = spec
        return out

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """The nested form, or MASE's flat form (``name`` plus ``<operand>_<param>`` keys)."""
        nested = handler(core_schema)
        flat = {
            "type": "object",
            "title": "MASE flat form",
            "required": ["name"],
            "properties": {
                "name": {"enum": [*format_names(), None], "description": "number format of every operand named"},
                "storage": {"enum": ["fake", "packed"]},
                "activations": {"enum": list(ACTIVATIONS)},
            },
            "additionalProperties": {"type": ["number", "string", "boolean", "array", "null"]},
        }
        return {"anyOf": [nested, flat]}

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Any) -> dict[str, Any]:
        """Dump the operands the config named (a ``null`` among them is meaningful: "not this one")."""
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set or k == "storage"}


QuantSpec = create_model(
    "QuantSpec",
    __base__=_QuantSpecBase,
    __doc__=_QuantSpecBase.__doc__,
    **{operand: _operand_field(operand) for operand in _OPERAND_FIELDS},
)


def _from_flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """MASE's flat keys as the nested form; unprefixed params are shared, prefixed ones override them."""
    name = config["name"]
    if name is None:
        return {}
    if not isinstance(name, str) or name not in format_names():
        raise PydanticCustomError("format_name", _unknown_format(name).replace("{", "{{").replace("}", "}}"))
    known = set(format_model(name).model_fields) - {"name"}
    prefixes = sorted(_OPERAND_FIELDS[1:], key=len, reverse=True)
    shared: dict[str, Any] = {}
    per_operand: dict[str, dict[str, Any]] = {}
    for key, value in config.items():
        if key in ("name", "storage", "activations"):
            continue
        operand = next((p for p in prefixes if key.startswith(p + "_") and key[len(p) + 1 :] in known), None)
        param = key[len(operand) + 1 :] if operand else key
        if operand is None and param not in known:
            spellings = [*known, *(f"{o}_{k}" for o in prefixes for k in known)]
            near = difflib.get_close_matches(key, spellings, n=1)
            raise PydanticCustomError(
                "flat_key",
                "{key}: unknown key for format '{name}'; {near}use <operand>_<param> or <param> with operands "
                "{operands} and params {params}",
                {"key": key, "name": name, "near": f"did you mean {near[0]!r}? " if near else "",
                 "operands": ", ".join(_OPERAND_FIELDS[1:]), "params": ", ".join(sorted(known))},
            )
        if value is not None:
            (per_operand.setdefault(operand, {}) if operand else shared)[param] = value
    storage = config.get("storage", "fake")
    top = {"storage": storage, **({"activations": config["activations"]} if "activations" in config else {})}
    if not per_operand:
        return {**top, ("weight" if storage == "packed" else "inputs"): {"name": name, **shared}}
    nested: dict[str, Any] = dict(top)
    for operand, params in per_operand.items():
        merged = dict(shared)
        for alias, targets in _FUNCTION_ALIASES.items():  # data_in_0 also takes what data_in says (flat form)
            if operand in targets and alias in per_operand:
                merged.update(per_operand[alias])
        nested[operand] = {"name": name, **merged, **params}
    return nested


def _unknown_format(name: Any) -> str:
    return f"unknown format {name!r}; known formats: {', '.join(format_names())}"


def _explain(error: dict) -> QuantConfigError | None:
    """Format-name errors in words: the unknown name and the known formats."""
    if error["type"] == "union_tag_invalid":
        return QuantConfigError(_unknown_format(error["ctx"]["tag"]), location=error["loc"])
    if error["type"] == "union_tag_not_found":
        return QuantConfigError(
            f"give the format's name as 'name' (or 'format'); known formats: {', '.join(format_names())}",
            location=error["loc"],
        )
    return None


def format_key_error(error: dict, document: Any) -> QuantConfigError | None:
    """An unknown key of a number format's params (pydantic's ``extra_forbidden``), in words: the format's keys
    and the nearest one (``widht``: did you mean 'width'?), found by following the error's path through the
    validated ``document``; None for another error."""
    if error["type"] != "extra_forbidden":
        return None
    node, path = document, []
    for part in error["loc"][:-1]:  # parts that are not keys or indices are the unions' tags
        if isinstance(node, Mapping) and part in node or isinstance(node, list) and isinstance(part, int) and part < len(node):
            node, path = node[part], [*path, part]
    name = node.get("name", node.get("format")) if isinstance(node, Mapping) else None
    if not isinstance(name, str) or name not in format_names():
        return None
    key, keys = str(error["loc"][-1]), sorted(get_format(name).params.model_fields)
    near = difflib.get_close_matches(key, keys, n=1)
    return QuantConfigError(f"unknown key for format '{name}'; {f'did you mean {near[0]!r}? ' if near else ''}"
                            f"allowed keys: {', '.join(keys)} (got {short(error['input'])})", location=(*path, key))


def flat_key_error(error: dict, document: Any) -> QuantConfigError | None:
    """A problem of a rule written in MASE's flat form, located at the key the user wrote (``weight_width``,
    or ``width`` shared by every operand), not at the nested form it was read as; None for another error."""
    node, path, loc = document, [], list(error["loc"])
    while loc and not (isinstance(node, Mapping) and "name" in node):
        part = loc.pop(0)
        if isinstance(node, Mapping) and part in node or isinstance(node, list) and isinstance(part, int) and part < len(node):
            node, path = node[part], [*path, part]
    if not (isinstance(node, Mapping) and "name" in node) or not loc or loc[0] not in _OPERAND_FIELDS or loc[0] in node:
        return None
    params = [str(part) for part in loc[1:] if part not in format_names()]  # the union's tag is the format's name
    if not params:
        return None  # a problem of the operand's whole format: said at the operand
    operand, param = str(loc[0]), params[-1]
    key = next((k for k in (f"{operand}_{param}", param) if k in node), f"{operand}_{param}")
    bad = error.get("input")
    got = "" if isinstance(bad, (dict, list)) else f" (got {short(bad)})"
    return QuantConfigError(f"{error['msg'].removeprefix('Value error, ')}{got}", location=(*path, key))


def explain_format_error(error: dict, document: Any) -> QuantConfigError | None:
    """A number format's problem in a rule, in the words and at the key the user wrote (see the functions above)."""
    return _explain(error) or format_key_error(error, document) or flat_key_error(error, document)


def _precedence(operand: str) -> int:
    """``inputs`` first, then the aliases of a functional op, so a specific operand overrides them."""
    return {"inputs": 0, "data_in": 1, "weight": 2}.get(operand, 3)


def _expand(operand: str, operands: tuple[str, ...]) -> tuple[str, ...]:
    if operand == "inputs":
        return tuple(o for o in operands if o != "data_out")
    if operands == FUNCTION_OPERANDS and operand in _FUNCTION_ALIASES:
        return _FUNCTION_ALIASES[operand]
    return (operand,)


def resolve(spec: BaseModel, operands: tuple[str, ...] = LAYER_OPERANDS, where: str = "config") -> QuantConfig | None:
    """The :class:`QuantConfig` a validated :class:`QuantSpec` gives for a layer or a functional op."""
    given = [o for o in _OPERAND_FIELDS if o in spec.model_fields_set]
    accepted = ("inputs",) + operands + (tuple(_FUNCTION_ALIASES) if operands == FUNCTION_OPERANDS else ())
    wrong = [o for o in given if o not in accepted]
    if wrong:
        raise QuantConfigError(f"not an operand here; allowed keys: {', '.join(accepted + ('storage', 'activations'))}", location=(where, wrong[0]))
    chosen: dict[str, OperandFormat | None] = {}
    for operand in sorted(given, key=_precedence):
        value = getattr(spec, operand)
        for real in _expand(operand, operands):
            chosen[real] = None if value is None else _operand(value, real, f"{where}.{operand}")
    specs = {k: v for k, v in chosen.items() if v is not None}
    if not specs:
        return None
    return _finish(specs, spec.storage, operands, where, spec.activations)


def _operand(value: BaseModel, operand: str, where: str) -> OperandFormat:
    fmt = get_format(value.name)
    if fmt.operands is not None and operand not in fmt.operands:
        raise QuantConfigError(f"format '{fmt.name}' is usable for {', '.join(sorted(fmt.operands))} only, not {operand}", location=(where,))
    params = fmt.params.model_construct(**{k: getattr(value, k) for k in fmt.params.model_fields})
    return OperandFormat(fmt, params, value.ste)


def _finish(specs: dict[str, OperandFormat], storage: str, operands: tuple[str, ...], where: str,
            activations: str = "float") -> QuantConfig:
    if activations != "float" and storage != "packed":
        raise QuantConfigError(f"activations {activations!r} applies to a packed layer; add \"storage\": \"packed\"",
                               location=(where, "activations"))
    if storage == "packed":
        weight = specs.get("weight")
        from mase_lite.kernels.packed4.module import packed_kind
        from mase_lite.numerics.registry import Unfit

        try:
            kind = packed_kind(weight.format.as_dict(weight.params), activations) if weight is not None else None
        except Unfit as unfit:
            raise QuantConfigError(unfit.why, location=(where, unfit.field or "storage")) from None
        if operands != LAYER_OPERANDS or kind is None:
            raise QuantConfigError("'packed' needs a layer weight in format mxint with element_width 8, or 4-bit: "
                                   "mxint element_width 4, mxfp e2m1 or scaled_integer width 4 (symmetric) in blocks "
                                   "of 32, q4_0, iq4_nl, q8_0 or a K-quant (q2_k .. q6_k)", location=(where, "storage"))
        others = sorted(set(specs) - {"weight"})
        if others:
            raise QuantConfigError(
                f"'packed' quantizes the weight only; remove the config of {', '.join(others)}", location=(where, "storage")
            )
    return QuantConfig(specs, storage, activations)


def validate_spec(config: Any, where: str = "config") -> BaseModel | None:
    """``config`` (flat, nested or a :class:`QuantSpec`) as a :class:`QuantSpec`; ``None`` for "leave alone"."""
    if config is None or isinstance(config, QuantSpec):
        return config
    if not isinstance(config, Mapping):
        raise QuantConfigError(f"a quantization config must be an object, got {type(config).__name__}", location=(where,))
    try:
        return QuantSpec.model_validate(config)
    except ValidationError as err:
        raise QuantConfigError(problems=validation_problems(
            err, model=QuantSpec, explain=lambda e: explain_format_error(e, config)), location=(where,)) from None


def parse_quant_config(
    config: Mapping[str, Any] | BaseModel | QuantConfig | None,
    operands: tuple[str, ...] = LAYER_OPERANDS,
    where: str = "config",
) -> QuantConfig | None:
    """A validated :class:`QuantConfig`, or ``None`` when the config says "do not quantize".

    ``where`` prefixes error messages (e.g. ``rules.linear``). The input is never modified.

    >>> cfg = parse_quant_config({"name": "integer", "weight_width": 8, "weight_frac_width": 4})
    >>> cfg.formats()
    {'weight': {'name': 'integer', 'width': 8, 'frac_width': 4, 'signed': True, 'floor': False}}
    >>> parse_quant_config({"inputs": {"name": "integer", "width": 8, "frac_width": 4}, "bias": None}).formats().keys()
    dict_keys(['data_in', 'weight'])
    """
    if isinstance(config, QuantConfig):
        return config
    spec = validate_spec(config, where)
    return None if spec is None else resolve(spec, operands, where)
