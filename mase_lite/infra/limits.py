"""Sizes a user types are checked against the memory the machine has before anything is allocated.

>>> check_fits("data.max_length", 10**15, "the tokenized data")
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: data.max_length: the tokenized data would need about 1000000.0 GB, more than the ... GB of memory available
>>> check_fits("data.max_length", 1024, "the tokenized data")   # fits: no error
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mase_lite.infra.errors import UserError


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_bytes() -> int:
    """Memory this process may still take: what the kernel reports available (else the machine's RAM),
    or under a cgroup limit that limit less what the group already uses, whichever is lower."""
    available = _meminfo("MemAvailable") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _read_int(limit_file)
        if limit is not None:
            available = min(available, limit - (_read_int(usage_file) or 0))
    return max(available, 0)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def check_fits(field: str, estimate: float, what: str) -> None:
    """Raise a ``UserError`` naming ``field`` when ``estimate`` bytes exceed the memory this process may take."""
    available = memory_bytes()
    if estimate > available:
        raise UserError(f"{what} would need about {_gb(estimate)}, more than the {_gb(available)} of memory available", location=(field,))


# peak memory reading a text file into lines or rows, per byte of the file (measured: 2 for one line, 7-9 for lines
# of 40 characters and JSON or CSV rows; a file of very short lines takes more)
TEXT_PER_BYTE = 10

MODULE_BYTES = 50_000  # a module's Python objects and its share of a captured graph (~47 KB measured, BERT layers)
DEEP = 8  # a count of layers, blocks or experts above this is measured at one and two, then extrapolated
_COUNT = re.compile(r"(^|_)(layers?|depths?|blocks?|experts)$|^n_layers?$")


def _counts(config: Any) -> dict[Any, int]:
    """The config's counts of repeated modules (``num_hidden_layers``, ``n_layer``, ``depths[i]``, ``num_experts``...)."""
    fields = config if isinstance(config, dict) else config.to_dict() if hasattr(config, "to_dict") else {}
    found: dict[Any, int] = {}
    for name, value in fields.items():
        if not (isinstance(name, str) and _COUNT.search(name)):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = value
        elif isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            found.update({(name, i): v for i, v in enumerate(value)})
    return found


def _probe(config: Any, counts: dict[Any, int]) -> Any:
    """A copy of ``config`` with ``counts`` set; lists as long as a changed count are cut to the new one
    (per-layer settings such as ``layer_types``)."""
    config = copy.deepcopy(config)
    get, put = ((config.get, config.__setitem__) if isinstance(config, dict)
                else (lambda k: getattr(config, k), lambda k, v: setattr(config, k, v)))
    for key, value in counts.items():
        if isinstance(key, tuple):
            items = list(get(key[0]))
            items[key[1]] = value
            put(key[0], items)
            continue
        before = get(key)
        put(key, value)
        attributes = config if isinstance(config, dict) else vars(config)
        for name, attr in list(attributes.items()):
            if isinstance(attr, list) and len(attr) == before and name != key:
                put(name, attr[:value])
    return config


def _measure(build: Callable[[Any], object], config: Any, field: str) -> int:
    import torch

    try:
        with torch.device("meta"):
            model = build(config)
    except UserError:
        raise
    except Exception as err:  # the model's own constructor rejects the values: report it as the user's input
        reason = (str(err).splitlines() or [""])[0]  # torch appends its C++ stack frames to some messages
        raise UserError(f"the model cannot be built from these values ({type(err).__name__}: {reason})", location=(field,)) from None
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"the build gave {type(model).__name__}, not an nn.Module", location=(field,))
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) + MODULE_BYTES * sum(1 for _ in model.modules())


def model_bytes(build: Callable[[Any], object], config: Any, field: str) -> int:
    """Memory of the model ``build(config)`` makes: its parameters and buffers, measured on the meta device
    (nothing allocated), and :data:`MODULE_BYTES` per module. A deep model (a count of layers, blocks or
    experts above :data:`DEEP`) is measured at one and two of each and extrapolated: building 100 000
    layers, even on the meta device, would take minutes and gigabytes.

    A build that fails on the values it was given (negative or zero sizes) raises a ``UserError`` naming ``field``.
    """
    deep = {k: v for k, v in _counts(config).items() if v > DEEP}
    if not deep:
        return _measure(build, config, field)
    ones = {k: 1 for k in deep}
    base = _measure(build, _probe(config, ones), field)
    total = base
    for key, count in deep.items():
        total += (count - 1) * (_measure(build, _probe(config, {**ones, key: 2}), field) - base)
    return total
