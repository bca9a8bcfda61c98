"""The number-format registry: name -> params model, value function, saturation bounds, stored bits.

A format is registered once, by the module of its family::

    @register_format("integer", params=IntegerParams, bits=lambda p, shape: float(p.width),
                     bounds=integer_bounds)
    def integer(x: Tensor, p: IntegerParams) -> Tensor: ...

Value functions receive a float32 tensor and return a float32 tensor of the same shape; the
public entry point :func:`mase_lite.numerics.quantize` handles dtypes, devices and gradients.
A format dict ``{"name": "integer", "width": 8, "frac_width": 4}`` is the canonical spelling of
a format in configs and metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError
from torch import Tensor

from mase_lite.infra.errors import UserError

Shape = tuple[int, ...]
Bounds = tuple[Tensor | float, Tensor | float]


class FormatError(UserError):
    """A format name or format parameter the user got wrong."""


class Unfit(FormatError):
    """A target cannot hold these params for this weight: ``why`` names the constraint, ``nearest`` what would fit,
    ``field`` the config key at fault where it is not the format (e.g. ``activations``)."""

    def __init__(self, why: str, nearest: str, field: str | None = None):
        super().__init__(f"{why}; nearest: {nearest}")
        self.why, self.nearest, self.field = why, nearest, field


@dataclass(frozen=True)
class Codec:
    """How a format stores a tensor as codes (see :mod:`mase_lite.numerics.codes`).

    ``side(x32, params)``: the values the format shares, derived from the float32 tensor it quantizes
    exactly as the format derives them (``{name: tensor}``: scales, zero points, shared exponents), or
    None where these params cannot be stored as codes (a random draw). ``codes(values, side, params)``: the
    unsigned int64 code of each quantized float32 value (``ValueError`` for a value the codes cannot hold).
    ``decode(codes, side, params)``: the float32 values of the codes. ``bits(params)``: bits per code.
    """

    bits: Callable[[Any], int]
    side: Callable[[Tensor, Any], dict[str, Tensor] | None]
    codes: Callable[[Tensor, dict[str, Tensor], Any], Tensor]
    decode: Callable[[Tensor, dict[str, Tensor], Any], Tensor]


GroupQuantizer = tuple[dict[str, Tensor], Callable[[Tensor], Tensor]]


@dataclass(frozen=True)
class Calibrated:
    """The parameter of a format that calibration may choose (``"auto"`` in a spec): ``key``;
    ``from_amax(params, amax)`` its value for a range covering the magnitude ``amax`` (``params``: the
    format dict's other values); ``candidates(params, amax, grid)`` the values an ``mse`` search tries
    (default: the values of ``from_amax`` at the fractions ``1/grid .. 1`` of ``amax``)."""

    key: str
    from_amax: Callable[[dict[str, Any], float], Any]
    candidates: Callable[[dict[str, Any], float, int], list] | None = None

    def search_space(self, params: dict[str, Any], amax: float, grid: int) -> list:
        if self.candidates is not None:
            return self.candidates(params, amax, grid)
        return [self.from_amax(params, (k + 1) / grid * amax) for k in range(grid)]


class FormatParams(BaseModel):
    """Base of every format's params: unknown keys are errors, no silent type coercion, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class NumberFormat:
    """One registered number format.

    ``quantize(x32, params)`` gives the quantized float32 values; ``bounds(x32, params)`` the
    smallest and largest value each element can take (broadcastable), used by the clipped
    straight-through estimator; ``bits(params, shape)`` the stored bits per element, shared
    scales included (``shape`` matters only for formats with per-row or per-tensor scales);
    ``operands`` limits the operands the format is usable for (``None``: any). ``group(params, row)``,
    for a format whose values in a row of length ``row`` depend only on the row's groups of consecutive
    elements (their extreme values), is the group's length (1: element by element); ``None`` for a
    format that has no such groups (it cannot be driven column by column, as GPTQ does). ``codec`` stores
    its values as codes (:class:`Codec`); ``None``: a checkpoint keeps the float values.
    ``group_quantizer(params, values)``, for a format with groups and a codec: given the values of one group
    per row (``[rows, k]`` float32), the shared values the group fixes (``codec.side(values)``) and a function
    quantizing any float32 values of these rows (``[rows]``) under them; ``None``: GPTQ probes the format. One that
    also takes ``importance`` (a weight per column of the group, ``[k]``) chooses the shared values by the error so
    weighted: GPTQ gives it the Hessian's diagonal (the inputs' mean squares, llama.cpp's importance matrix).
    ``calibrated``: the parameter calibration may choose (:class:`Calibrated`); ``None``: none.
    """

    name: str
    params: type[FormatParams]
    quantize: Callable[[Tensor, Any], Tensor]
    bounds: Callable[[Tensor, Any], Bounds]
    bits: Callable[[Any, Shape | None], float]
    operands: frozenset[str] | None = None
    doc: str = ""
    group: Callable[[Any, int], int] | None = None
    codec: Codec | None = None
    group_quantizer: Callable[[Any, Tensor], GroupQuantizer] | None = None
    calibrated: Calibrated | None = None

    def validate(self, params: Mapping[str, Any] | FormatParams) -> FormatParams:
        """``params`` as this format's frozen params model; a :class:`FormatError` naming the key otherwise."""
        if isinstance(params, self.params):
            return params
        if isinstance(params, FormatParams):
            params = params.model_dump()
        try:
            return self.params.model_validate(dict(params))
        except ValidationError as err:
            raise FormatError(describe_validation_error(self, err)) from None

    def as_dict(self, params: FormatParams) -> dict[str, Any]:
        """The canonical format dict: ``{"name": ..., every parameter with its value}``."""
        return {"name": self.name, **params.model_dump(mode="json")}


_FORMATS: dict[str, NumberFormat] = {}


@dataclass(frozen=True)
class TargetMapping:
    """How one format is held by one target (an export target, or the packed layers as ``"packed"``), registered by
    the format's own module with :func:`register_mapping`. Each target defines what its callables take and give
    (its module's docstring says): ``scheme`` describes the params in the target's terms (data: a GGUF type name,
    compressed-tensors' quantization args, a packed kernel) or raises :class:`Unfit`; ``tensors`` gives what the
    target stores for a weight's stored codes; ``side``, where the target needs it, reads such tensors back into the
    codec's side."""

    scheme: Callable[..., Any] | None = None
    tensors: Callable[..., Any] | None = None
    side: Callable[..., Any] | None = None


_MAPPINGS: dict[tuple[str, str], TargetMapping] = {}


def fitting_groups(columns: int, group: int) -> str:
    """What to use instead of groups of ``group`` where they do not tile ``columns``: the largest divisors of
    ``columns`` up to ``group`` (the largest, and the largest multiple of 16 or 8), or one scale per row.

    >>> fitting_groups(688, 128)
    'use groups of 86 or 16, or granularity channel'
    """
    divisors = [d for d in range(min(group, columns), 0, -1) if columns % d == 0]
    picks = [divisors[0]] + [next((d for d in divisors if d % m == 0), None) for m in (16, 8)]
    picks = list(dict.fromkeys(d for d in picks if d is not None and d > 1))
    listed = " or ".join(map(str, picks))
    return f"use groups of {listed}, or granularity channel" if picks else "use granularity channel"


def check_tiles(columns: int, size: int, what: str, nearest: str | None = None) -> None:
    """Raise :class:`Unfit` where ``what`` of ``size`` (``groups``, ``blocks``) leave a short last one in a row of
    ``columns``; ``nearest``: what fits instead (default: :func:`fitting_groups`)."""
    if columns % size:
        raise Unfit(f"{what} of {size} over {columns} columns (a short last {what.split()[-1].removesuffix('s')})",
                    nearest or fitting_groups(columns, size))


def register_mapping(format_name: str, target: str, scheme: Callable[..., Any] | None, tensors: Callable[..., Any] | None = None,
                     side: Callable[..., Any] | None = None) -> TargetMapping:
    """Declare how format ``format_name`` is held by ``target``; returns the mapping."""
    mapping = TargetMapping(scheme, tensors, side)
    if _MAPPINGS.get((format_name, target), mapping) != mapping:
        raise FormatError(f"format '{format_name}' already has a mapping for {target}")
    _MAPPINGS[format_name, target] = mapping
    return mapping


def target_mapping(format_name: str, target: str) -> TargetMapping | None:
    """The mapping of format ``format_name`` for ``target``; None where the format declares none."""
    return _MAPPINGS.get((format_name, target))


def mapped_formats(target: str) -> list[str]:
    """The formats that declare a mapping for ``target``, sorted."""
    return sorted(name for name, t in _MAPPINGS if t == target)


def register_format(
    name: str,
    *,
    params: type[FormatParams],
    bits: Callable[[Any, Shape | None], float],
    bounds: Callable[[Tensor, Any], Bounds],
    operands: tuple[str, ...] | None = None,
    group: Callable[[Any, int], int] | None = None,
    codec: Codec | None = None,
    group_quantizer: Callable[[Any, Tensor], GroupQuantizer] | None = None,
    calibrated: Calibrated | None = None,
) -> Callable[[Callable[[Tensor, Any], Tensor]], Callable[[Tensor, Any], Tensor]]:
    """Register the value function it decorates as format ``name``; returns the function unchanged."""

    def decorate(fn: Callable[[Tensor, Any], Tensor]) -> Callable[[Tensor, Any], Tensor]:
        if name in _FORMATS and _FORMATS[name].quantize is not fn:
            raise FormatError(f"a number format named '{name}' is already registered")
        _FORMATS[name] = NumberFormat(
            name=name,
            params=params,
            quantize=fn,
            bounds=bounds,
            bits=bits,
            operands=frozenset(operands) if operands is not None else None,
            doc=(fn.__doc__ or "").strip(),
            group=group,
            codec=codec,
            group_quantizer=group_quantizer,
            calibrated=calibrated,
        )
        return fn

    return decorate


def format_names() -> list[str]:
    """Names of every registered number format, sorted."""
    return sorted(_FORMATS)


def get_format(name: Any) -> NumberFormat:
    """The registered format ``name``; a :class:`FormatError` listing the known formats otherwise."""
    if not isinstance(name, str) or name not in _FORMATS:
        raise FormatError(f"format name: unknown format {name!r}; known formats: {', '.join(format_names())}")
    return _FORMATS[name]


def parse_format(fmt: Mapping[str, Any] | str, **params: Any) -> tuple[NumberFormat, FormatParams]:
    """A format given as a name plus keyword params, or as a format dict, validated.

    >>> fmt, p = parse_format({"name": "integer", "width": 8, "frac_width": 4})
    >>> fmt.as_dict(p)
    {'name': 'integer', 'width': 8, 'frac_width': 4, 'signed': True, 'floor': False}
    """
    if isinstance(fmt, Mapping):
        if params:
            raise FormatError(
                f"give format params either in the format dict or as keywords, not both (got {sorted(params)})"
            )
        if "name" not in fmt:
            raise FormatError(f"a format dict needs a 'name' key; known formats: {', '.join(format_names())}")
        params = {k: v for k, v in fmt.items() if k != "name"}
        fmt = fmt["name"]
    number_format = get_format(fmt)
    return number_format, number_format.validate(params)


def describe_validation_error(fmt: NumberFormat, err: ValidationError) -> str:
    """One line per problem, naming the format, the key, the bad value and what is allowed."""
    allowed = ", ".join(fmt.params.model_fields)
    lines: list[str] = []
    merged: dict[str, dict] = {}  # a value refused by every member of a union (an int, or "auto"): one line
    for e in err.errors():
        key = str(e["loc"][0]) if e["loc"] else ""
        if key in merged:
            merged[key]["msg"] += f", or {e['msg'].removeprefix('Input should be ')}"
            continue
        merged[key] = e = dict(e)
    for key, e in merged.items():
        if e["type"] == "extra_forbidden":
            lines.append(f"format '{fmt.name}': unknown key '{key}'; allowed keys: {allowed}")
        elif e["type"] == "missing":
            lines.append(f"format '{fmt.name}': {key} is required; keys: {allowed}")
        elif not key:
            lines.append(f"format '{fmt.name}': {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"format '{fmt.name}': {key}={e.get('input')!r}: {e['msg']}")
    return "\n".join(lines)
