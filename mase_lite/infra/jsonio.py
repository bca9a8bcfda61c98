"""Reading JSON that people write or hand over (specs, reports, checkpoints' recipes): strict and bounded.

Strict: duplicate keys, ``NaN``/``Infinity``, numbers beyond a float, lone surrogates and nesting
deeper than :data:`MAX_DEPTH` are refused with a ``UserError`` naming the file (and the place),
never a ``RecursionError`` or a traceback.

>>> loads('{"seed": 1, "seed": 2}', "spec.json")
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: spec.json: the key 'seed' appears twice in one object
>>> loads('{"scale": NaN}', "spec.json")
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: spec.json: NaN is not a JSON number
>>> short("x" * 500)
"'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (502 characters)"
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from mase_lite.infra.errors import UserError, short

MAX_DEPTH = 64  # specs nest ~10 deep; Python's own parser gives up near 1000


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"the key {short(key)} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> float:
    raise _Refused(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"the number {short(text)} is beyond the range of a float")
    return value


class _Refused(Exception):
    """A value the strict reader refuses (raised inside the parser's hooks)."""


def check_value(value: Any, source: str) -> None:
    """Refuse what strict JSON cannot hold: nesting deeper than :data:`MAX_DEPTH`, non-finite floats, lone
    surrogates, keys that are not strings. ``source`` names the file or object in the message."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        at = f" at {where[1:]}" if where else ""
        if depth > MAX_DEPTH:
            raise UserError(f"{source}: nested deeper than {MAX_DEPTH} levels{at}")
        if isinstance(node, str):
            _check_text(node, source, at)
        elif isinstance(node, float) and not math.isfinite(node):
            raise UserError(f"{source}{at}: {node} is not a JSON number")
        elif isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise UserError(f"{source}{at}: the key {short(key)} is not a string")
                _check_text(key, source, at)
                stack.append((child, f"{where}.{key}", depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((child, f"{where}.{i}", depth + 1) for i, child in enumerate(node))


def _check_text(text: str, source: str, at: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f"{source}{at}: {short(text)} holds a lone surrogate ({err.object[err.start]!r}), not text") from None


def loads(data: bytes | str, source: str) -> Any:
    """The JSON value in ``data``, strictly read (see the module docstring); errors name ``source``."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"{source}: not UTF-8 text (byte {err.start}): a JSON file is UTF-8 text") from None
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)
    except _Refused as err:
        raise UserError(f"{source}: {err}") from None
    except RecursionError:
        raise UserError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{source}: not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except ValueError:  # the only other: an integer longer than Python converts
        raise UserError(f"{source}: a number has more than {sys.get_int_max_str_digits()} digits") from None
    check_value(value, source)
    return value


def read_json(path: str | Path, what: str = "spec") -> Any:
    """The JSON value in the regular file ``path`` (a FIFO or a device is refused, not read)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such {what} file: {path}" if not path.exists() else f"{path}: not a regular file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror})") from None
    return loads(data, str(path))
