"""Captured graphs kept per architecture, so a model seen before is not exported again.

A capture is keyed by the model's architecture (module tree with each module's class and plain
attributes, a transformers config, parameter and buffer shapes, dtypes and devices), the input
names with their dtypes and static sizes, the dynamic shapes and the leaf-module classes. A hit
copies the stored graph (its nodes, not any weight) and binds the new model's own parameters and
buffers to it; the caller then checks it against the model exactly as after an export.

Example::

    >>> import torch
    >>> a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    >>> key = architecture_key(a, {"x": torch.randn(3, 4)}, {"x": {0: "batch"}}, ())
    >>> key == architecture_key(b, {"x": torch.randn(5, 4)}, {"x": {0: "batch"}}, ())
    True
    >>> key == architecture_key(torch.nn.Linear(4, 3), {"x": torch.randn(3, 4)}, {"x": {0: "batch"}}, ())
    False
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.ir.leaves import rename_node

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _plain(value: Any) -> Any:
    """A hashable summary of an attribute: itself when plain, recursively for containers, else its type."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}:{value.__qualname__}"
    return type(value).__qualname__


def _config_key(config: Any) -> str:
    """A transformers config as canonical JSON (its source path left out: it does not change the graph)."""
    data = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    data["_attn_implementation"] = getattr(config, "_attn_implementation", None)
    return json.dumps(data, sort_keys=True, default=str)


def _module_key(module: nn.Module, configs: dict[int, str]) -> tuple:
    attrs = []
    for name, value in vars(module).items():
        if name.startswith("_") or name == "training":
            continue
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            if id(value) not in configs:
                configs[id(value)] = _config_key(value)
            attrs.append((name, "config", configs[id(value)]))
        else:
            attrs.append((name, _plain(value)))
    return (type(module), tuple(attrs))


def _tensor_key(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, t.device, t.requires_grad)


def _dim_key(spec: Any) -> Any:
    if spec is None:
        return None
    return (getattr(spec, "__name__", None), getattr(spec, "min", None), getattr(spec, "max", None), str(spec))


def _dynamic_key(dynamic_shapes: dict[str, Any] | None) -> tuple:
    out = []
    for name, spec in sorted((dynamic_shapes or {}).items()):
        if isinstance(spec, dict):
            out.append((name, tuple(sorted((int(d), _dim_key(v)) for d, v in spec.items()))))
        elif isinstance(spec, (list, tuple)):
            out.append((name, tuple((i, _dim_key(v)) for i, v in enumerate(spec))))
        else:
            out.append((name, _dim_key(spec)))
    return tuple(out)


def _input_key(name: str, value: Any, dynamic: Any) -> tuple:
    """An input's dtype and static sizes; a dynamic dim counts only as 0, 1 or more (export specialises 0 and 1)."""
    if not isinstance(value, torch.Tensor):
        return (name, _plain(value))
    dims = set(dynamic) if isinstance(dynamic, dict) else {i for i, v in enumerate(dynamic or ()) if v is not None}
    sizes = tuple(("dyn", min(s, 2)) if i in dims else s for i, s in enumerate(value.shape))
    return (name, value.dtype, value.device, sizes)


def architecture_key(
    model: nn.Module, example_inputs: dict[str, Any], dynamic_shapes: dict[str, Any] | None, leaf_modules: tuple[type, ...]
) -> tuple:
    """What a captured graph depends on besides the weights' values (see the module docstring)."""
    configs: dict[int, str] = {}
    modules = tuple((name, _module_key(m, configs)) for name, m in model.named_modules())
    first: dict[int, str] = {}  # tied tensors: each name with the first name of its tensor
    tensors = tuple(
        (name, _tensor_key(t), first.setdefault(id(t), name))
        for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    )
    inputs = tuple(_input_key(k, v, (dynamic_shapes or {}).get(k)) for k, v in example_inputs.items())
    return (modules, tensors, inputs, _dynamic_key(dynamic_shapes), tuple(leaf_modules))


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A new graph with the same nodes, names and codegen; each node's metadata dict and the dicts
    and lists in it are copied (fake-tensor values are shared: nothing changes them)."""
    new = fx.Graph()
    copied = new.graph_copy(graph, {}, return_output_node=True)
    if copied is not None:
        value, output = copied
        new.output(value, type_expr=getattr(output, "type", None)).meta = dict(output.meta)
    new.set_codegen(graph._codegen)  # the pytree specs of the inputs and outputs: never changed in place
    for old, node in zip(graph.nodes, new.nodes):
        if node.name != old.name:  # a name the capture gave that fx's copy would change (``0`` -> ``_0``)
            rename_node(new, node, old.name)
        node.meta = {k: copy.copy(v) if isinstance(v, (dict, list)) else v for k, v in node.meta.items()}
    return new


@dataclass
class Template:
    """A captured graph without weights: what a capture of the same architecture reuses."""

    graph: fx.Graph
    extras: dict[str, Any]  # graph targets that are not the model's (lifted constants, dropout modules)
    specs: dict[str, Any]  # the exported module's pytree input/output specs
    train_limits: list[str]
    records: list[logging.LogRecord] = field(default_factory=list)  # what the first capture logged


class CaptureCache:
    """Templates by :func:`architecture_key`, least recently used dropped beyond ``size``; ``hits`` counts
    the captures that reused one, ``misses`` those that exported (a template whose check failed included)."""

    def __init__(self, size: int = 32):
        self.size = size
        self.hits = 0
        self.misses = 0
        self._templates: OrderedDict[tuple, Template] = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, key: tuple) -> Template | None:
        with self._mutex:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
            return template

    def count(self, hit: bool) -> None:
        """Count a capture that reused a template (``hit``) or exported."""
        with self._mutex:
            if hit:
                self.hits += 1
            else:
                self.misses += 1

    def put(self, key: tuple, template: Template) -> None:
        with self._mutex:
            self._templates[key] = template
            self._templates.move_to_end(key)
            while len(self._templates) > self.size:
                self._templates.popitem(last=False)

    def clear(self) -> None:
        """Forget every template (and the hit and miss counts)."""
        with self._mutex:
            self._templates.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._templates)


CACHE = CaptureCache()


class LogRecorder(logging.Handler):
    """Keeps the records the IR's loggers emit while attached, to replay them on a cache hit."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == threading.get_ident():
            self.records.append(record)


def replay(records: list[logging.LogRecord]) -> None:
    """Emit the records again through their loggers (those their level now lets through)."""
    for record in records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(copy.copy(record))
