"""Errors a user can cause. The CLI turns every ``UserError`` into a one-line message and exit code 2."""

import math
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


ECHO = 72  # characters of a bad value shown in a message


class UserError(ValueError):
    """A bad spec, an unknown name, an impossible parameter, a missing input: the user can fix it."""


def short(value: Any, limit: int = ECHO) -> str:
    """``repr(value)`` cut to about ``limit`` characters (and safe for integers too long to print).

    >>> short("x" * 500)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (502 characters)"
    """
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"<an integer of about {int(value.bit_length() * math.log10(2))} digits>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def ensure_dir(directory: str | Path, field: str) -> Path:
    """Create ``directory`` (and its parents) or raise a ``UserError`` naming ``field`` and the reason."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{field}: cannot create directory {str(directory)!r} ({err.strerror})") from None
    return directory


def _unwrap(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and ``Optional``."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    args = [a for a in get_args(tp) if a is not type(None)]
    if get_origin(tp) in (Union, UnionType) and len(args) == 1:
        return _unwrap(args[0])
    return tp


def _union_member(tp: Any, tag: Any) -> type[BaseModel] | None:
    """The member of a tagged union of models whose literal tag is ``tag`` (the part pydantic adds to a path)."""
    members = get_args(tp) if get_origin(tp) in (Union, UnionType) else (tp,)  # a union of one is its member
    for member in map(_unwrap, members):
        if isinstance(member, type) and issubclass(member, BaseModel) and tag not in member.model_fields:
            for f in member.model_fields.values():
                if get_origin(f.annotation) is Literal and tag in get_args(f.annotation):
                    return member
    return None


def _walk(model: Any, loc: tuple) -> tuple[list[str], Any]:
    """The path a user wrote (union tags dropped) and the type found at its end (``None`` if lost)."""
    current, shown = model, []
    for part in loc:
        current = _unwrap(current)
        member = _union_member(current, part)
        if member is not None:
            current = member
            continue
        shown.append(str(part))
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {(f.alias or name): f.annotation for name, f in current.model_fields.items()}
            current = fields.get(str(part))
        elif get_origin(current) in (list, tuple, dict) and get_args(current):
            current = get_args(current)[-1]
        else:
            current = None
    return shown, _unwrap(current)


def allowed_keys(model: Any, loc: tuple) -> list[str]:
    """The keys allowed in the object ``loc`` points into, when the path can be followed through ``model``."""
    _, container = _walk(model, loc[:-1])
    if isinstance(container, type) and issubclass(container, BaseModel):
        return sorted((f.alias or name) for name, f in container.model_fields.items())
    return []


def format_validation_error(
    err: ValidationError, prefix: str = "", model: Any = None, explain: Callable[[dict], str | None] | None = None
) -> str:
    """One line per problem: the JSON path, what is wrong or allowed, and the bad value.

    >>> from pydantic import BaseModel, ConfigDict
    >>> class Step(BaseModel):
    ...     model_config = ConfigDict(extra="forbid")
    ...     width: int = 8
    >>> try:
    ...     Step.model_validate({"widht": 4})
    ... except ValidationError as err:
    ...     print(format_validation_error(err, prefix="steps.0.params", model=Step))
    steps.0.params.widht: unknown key; allowed keys: width (got 4)

    ``explain(error)`` may return a whole line for an error (e.g. an unknown pass with a did-you-mean).
    """
    lines = []
    for e in err.errors():
        line = explain(e) if explain is not None else None
        if line is not None:
            lines.append(line)
            continue
        shown, _ = _walk(model, tuple(e["loc"])) if model is not None else ([str(p) for p in e["loc"]], None)
        where = ".".join([prefix] * bool(prefix) + shown) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = allowed_keys(model, tuple(e["loc"]))
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        bad = e.get("input")
        got = "" if isinstance(bad, (dict, list)) else f" (got {short(bad)})"
        lines.append(f"{where}: {msg}{got}")
    return "\n".join(lines)
