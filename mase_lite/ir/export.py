"""Non-strict ``torch.export`` of a model in capture's train/eval split, and what to say when it fails.

A failure names torch's reason, the model's source line that raised it (and the module whose
forward holds that line) and torch's own suggestion.

>>> dynamic_dims(default_dynamic_shapes({"input_ids": torch.zeros(2, 8, dtype=torch.long), "x": torch.zeros(3)}))
{'input_ids': [0, 1], 'x': [0]}
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
import traceback
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch
import torch.nn as nn
from torch.export import Dim

from mase_lite.infra.errors import UserError
from mase_lite.ir.inputs import sequence_dims

if TYPE_CHECKING:
    from mase_lite.ir.leaves import LeafPlan


class CaptureError(UserError):
    """torch.export could not capture the model, or the inputs do not fit it."""


def _partial_graphs(err: BaseException) -> list[str]:
    """The partial graphs torch attached to ``err`` or an exception it was raised from (``partial_fx_graph``)."""
    found, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(getattr(err, "partial_fx_graph", None), str):
            found.append(err.partial_fx_graph)
        err = err.__cause__ or err.__context__
    return found


@contextlib.contextmanager
def without_partial_graphs() -> Iterator[None]:
    """Run a ``torch.export`` call without the partial graph it prints when tracing fails on a data-dependent value.

    torch's export wrapper prints the exception's ``partial_fx_graph`` (the traced code so far, often a hundred
    lines) to stderr once per nested wrapper, before the error reaches us, which says in two lines where the
    model branched. Stderr is held while exporting and written out afterwards less those dumps; everything else
    (warnings, torch's log lines) passes through.
    """
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException as err:
        text = held.getvalue()
        for graph in _partial_graphs(err):
            text = text.replace(graph + "\n", "")
        sys.stderr.write(text)
        raise
    else:
        sys.stderr.write(held.getvalue())


@contextlib.contextmanager
def _export_modes(model: nn.Module, plan: LeafPlan | None) -> Iterator[None]:
    """Non-leaf modules in train mode, leaf modules in eval mode; restored afterwards.

    Functional dropout inside non-leaf modules is then visible as ``dropout(x, p, True)`` and
    can be turned into a module node, while leaf modules regain run-time control as nodes.
    With ``plan=None`` every module is in eval mode: the graph is the model's eval, exactly.
    """
    saved = {m: m.training for m in model.modules()}
    try:
        for name, m in model.named_modules():
            m.training = plan is not None and (name in plan.stochastic or not plan.is_leaf(name, m))
        yield
    finally:
        for m, mode in saved.items():
            m.training = mode


@contextlib.contextmanager
def caches_off(model: nn.Module) -> Iterator[None]:
    """``use_cache = False`` on every config of the model (decoders keep copies); restored afterwards.

    A cache object is not a tensor pytree, so export cannot return it: the graph is the model's
    forward without its key/value cache, and equals that bit for bit. The model's forward *with*
    a cache concatenates keys into fresh contiguous tensors, and a matmul on another memory layout
    may round differently on some CPUs (GPT-Neo on AMD EPYC: 6e-8), so compare under this context.
    """
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    changed = [c for c in configs.values() if getattr(c, "use_cache", False) is True]
    for c in changed:
        c.use_cache = False
    try:
        yield
    finally:
        for c in changed:
            c.use_cache = True


def _owner_of_line(model: nn.Module, path: str, line: int) -> str | None:
    """The class (and qualified name) of the model's module whose forward holds ``path:line``."""
    seen: set[type] = set()
    for name, m in model.named_modules():
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            forward = inspect.unwrap(cls.forward)
            lines, start = inspect.getsourcelines(forward)
            source = inspect.getsourcefile(forward)
        except (OSError, TypeError):
            continue
        if source and os.path.samefile(source, path) and start <= line < start + len(lines):
            return f"{cls.__name__} ({name or 'the model'})"
    return None


_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, contextlib, np))


def _model_frame(err: BaseException) -> tuple[str | None, int, str]:
    """The innermost frame outside torch, numpy, the standard library and mase_lite, through chained errors."""
    skip = _LIBRARIES + (os.path.dirname(os.path.dirname(__file__)) + os.sep, "<")
    found: tuple[str | None, int, str] = (None, 0, "")
    seen: set[int] = set()
    chain: BaseException | None = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        frames = [f for f in traceback.extract_tb(chain.__traceback__) if not f.filename.startswith(skip)]
        if frames:
            found = (frames[-1].filename, frames[-1].lineno or 0, (frames[-1].line or "").strip())
        chain = chain.__cause__ or chain.__context__
    return found


def describe_export_failure(model: nn.Module, err: Exception) -> str:
    """torch's reason, the model's source line that raised it (and its module), and torch's suggestion."""
    text = str(err)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(err).__name__
    msg = f"torch.export could not capture {type(model).__name__}: {type(err).__name__}: {head}"
    call = re.search(r'raised this error:\s*File "([^"]+)", line (\d+), in \w+\n\s*(.*)', text)
    where = re.findall(r'File "([^"]+)", line (\d+)', text)
    if call:
        path, line, code = call.group(1), int(call.group(2)), call.group(3).strip()
    elif where:
        (path, line), code = (where[-1][0], int(where[-1][1])), ""
    else:
        path, line, code = _model_frame(err)
    if path:
        owner = os.path.exists(path) and _owner_of_line(model, path, line)
        msg += f"\n  at {path}:{line}" + (f" in {owner}" if owner else "") + (f": {code}" if code else "")
    msg += "".join(f"\n  {ln}" for ln in lines if ln.startswith("Caused by"))
    hints = [ln for ln in lines if re.match(r"(consider|suggested fix|you can|try)", ln, re.I)]
    msg += "".join(f"\n  torch suggests: {ln}" for ln in hints[:3])
    return msg


def export_model(
    model: nn.Module,
    example_inputs: dict[str, Any],
    dynamic_shapes: dict[str, Any] | None,
    plan: LeafPlan | None,
    preserve: tuple[str, ...] = (),
) -> torch.export.ExportedProgram:
    """Non-strict export with the modes of :func:`_export_modes` (``plan=None``: the model's eval)."""
    with _export_modes(model, plan), caches_off(model), torch.no_grad():
        try:
            with without_partial_graphs():
                return torch.export.export(
                    model,
                    (),
                    dict(example_inputs),
                    strict=False,
                    dynamic_shapes=dynamic_shapes,
                    preserve_module_call_signature=preserve,
                )
        except Exception as err:
            raise CaptureError(describe_export_failure(model, err)) from err


def default_dynamic_shapes(example_inputs: dict[str, Any]) -> dict[str, Any]:
    """``Dim.AUTO`` on the batch and sequence dims of :func:`~mase_lite.ir.inputs.sequence_dims`."""
    dims = sequence_dims(example_inputs)
    return {name: ({d: Dim.AUTO for d in dims[name]} if name in dims else None) for name in example_inputs}


def dynamic_dims(dynamic_shapes: dict[str, Any] | None) -> dict[str, list[int]]:
    """The dims that ``dynamic_shapes`` makes dynamic, per input, in a JSON-friendly form.

    >>> dynamic_dims({"input_ids": {0: Dim.AUTO, 1: Dim.AUTO}, "x": None})
    {'input_ids': [0, 1]}
    """
    dims: dict[str, list[int]] = {}
    for name, spec in (dynamic_shapes or {}).items():
        if isinstance(spec, dict):
            dims[name] = sorted(int(d) for d, v in spec.items() if v is not None)
        elif isinstance(spec, (list, tuple)):
            dims[name] = [i for i, v in enumerate(spec) if v is not None]
    return {k: v for k, v in dims.items() if v}


def dynamic_shapes_of(dims: dict[str, list[int]], example_inputs: dict[str, Any]) -> dict[str, Any]:
    """``torch.export`` dynamic shapes (``Dim.AUTO``) from :func:`dynamic_dims`'s form."""
    return {name: ({int(d): Dim.AUTO for d in dims[name]} if dims.get(name) else None) for name in example_inputs}
