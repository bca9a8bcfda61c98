"""Errors a user can cause. The CLI turns every ``UserError`` into a message and exit code 2.

A ``UserError`` carries its message and a *location*: the path of keys (and named scopes) it happened
at. Each layer it travels through prefixes its own part (:meth:`UserError.within`): a pass names the
field of its params, the pass manager the step, a search the space entry. It is formatted once, when
shown (``str(err)``, :func:`describe`):

>>> err = UserError("must be positive (got 0)", location=("rules", "x"))
>>> str(err.within("steps", 1, "params"))
'steps.1.params.rules.x: must be positive (got 0)'
>>> str(UserError("boom", location=("steps", 1, Scope("(explode)"))))
'steps.1 (explode): boom'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


ECHO = 72  # characters of a bad value shown in a message


class Scope(str):
    """A location part that is not a key: a named scope (``pass 'quantize'``) or an aside on the key before
    it (``(quantize)``, ``(steps.q.params.width = 2)``). It follows that key after a space; what comes after
    it follows ``: ``."""


def format_location(location: Iterable[Any]) -> str:
    """The location as a user reads it: keys joined by dots, scopes set apart.

    >>> format_location(("steps", 1, Scope("(load)"), "transforms", 0))
    'steps.1 (load): transforms.0'
    """
    text, after_scope = "", False
    for part in location:
        scope = isinstance(part, Scope)
        if text:
            text += ": " if after_scope else (" " if scope else ".")
        text += str(part)
        after_scope = scope
    return text


class UserError(ValueError):
    """A bad spec, an unknown name, an impossible parameter, a missing input: the user can fix it.

    ``location``: where it happened, as keys (and :class:`Scope` parts); ``problems``: the errors it groups
    (one per bad field of a spec), located relative to it.
    """

    def __init__(self, message: str = "", location: Iterable[Any] = (), problems: Iterable[UserError] = ()):
        super().__init__(message)
        self.message = message
        self.location = tuple(location)
        self.problems = list(problems)

    def within(self, *prefix: Any) -> UserError:
        """This error, located inside ``prefix`` (the caller's part of the path); returns ``self``."""
        self.location = (*prefix, *self.location)
        return self

    def lines(self, outer: tuple = ()) -> list[str]:
        """The message and each problem, one per line, each preceded by its location."""
        where = format_location((*outer, *self.location))
        lines = [f"{where}: {self.message}" if where else self.message] if self.message or not self.problems else []
        for problem in self.problems:
            lines += problem.lines((*outer, *self.location))
        return lines

    def __str__(self) -> str:
        return shown_paths("\n".join(self.lines()), self)

    def __reduce__(self):  # pickled with its location and problems (a subclass may have its own constructor)
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type, args: tuple, state: dict) -> UserError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


def show_paths_as(err: BaseException, aliases: dict[str, str]) -> None:
    """Have ``err`` name ``aliases``' values where it names their keys when it is shown (a run's staging
    directory is shown as the run's directory, which it becomes); the error itself is not rewritten."""
    err.path_aliases = {**getattr(err, "path_aliases", {}), **aliases}


def shown_paths(text: str, err: BaseException) -> str:
    """``text`` (said of ``err``) with the paths ``err`` shows otherwise (:func:`show_paths_as`) replaced."""
    for path, alias in getattr(err, "path_aliases", {}).items():
        text = text.replace(path, alias)
    return text


def describe(err: BaseException) -> str:
    """``err`` as the CLI and a run's report show it: ``<location>: <message>`` (a ``UserError``) or its
    text, with the paths it was asked to show otherwise (:func:`show_paths_as`).

    >>> err = OSError(2, "No such file or directory", "/tmp/.run.staging-1/x")
    >>> show_paths_as(err, {"/tmp/.run.staging-1": "/tmp/run"})
    >>> describe(err)
    "[Errno 2] No such file or directory: '/tmp/run/x'"
    """
    return shown_paths(str(err), err)


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
        raise UserError(f"cannot create directory {str(directory)!r} ({err.strerror})", location=(field,)) from None
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


def validation_problems(
    err: ValidationError, model: Any = None, explain: Callable[[dict], UserError | None] | None = None
) -> list[UserError]:
    """One located ``UserError`` per problem of ``err``: the JSON path (union tags dropped), what is wrong
    or allowed, and the bad value. ``explain(error)`` may return the error to give instead (e.g. an
    unknown pass with a did-you-mean).
    """
    problems = []
    for e in err.errors():
        explained = explain(e) if explain is not None else None
        if explained is not None:
            problems.append(explained)
            continue
        shown, _ = _walk(model, tuple(e["loc"])) if model is not None else ([str(p) for p in e["loc"]], None)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = allowed_keys(model, tuple(e["loc"]))
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        bad = e.get("input")
        got = "" if isinstance(bad, (dict, list)) else f" (got {short(bad)})"
        problems.append(UserError(f"{msg}{got}", location=shown))  # a problem of the whole document has no location
    return problems


def format_validation_error(
    err: ValidationError, prefix: str = "", model: Any = None, explain: Callable[[dict], UserError | None] | None = None
) -> str:
    """One line per problem (:func:`validation_problems`), each located under ``prefix``.

    >>> from pydantic import BaseModel, ConfigDict
    >>> class Step(BaseModel):
    ...     model_config = ConfigDict(extra="forbid")
    ...     width: int = 8
    >>> try:
    ...     Step.model_validate({"widht": 4})
    ... except ValidationError as err:
    ...     print(format_validation_error(err, prefix="steps.0.params", model=Step))
    steps.0.params.widht: unknown key; allowed keys: width (got 4)
    """
    return "\n".join(UserError(location=(prefix,) if prefix else (), problems=validation_problems(err, model, explain)).lines())
