"""Pack a model's Linear layers to 4-bit in place, one layer at a time, each float weight released before the
next is packed; then the freed memory goes back to the operating system.

Example::

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    >>> pack_linears(model, "q4_0", skip=("2",))
    1
    >>> type(model[0]).__name__, type(model[2]).__name__
    ('Packed4Linear', 'Linear')
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mase_lite.infra.errors import UserError
from mase_lite.infra.heap import return_free_memory
from mase_lite.kernels.packed4.module import Packed4Linear, packable

FORMATS = {
    # GGUF's Q4_0: 4-bit integers -8..7 in blocks of 32 with a float16 scale (amax / 7.5, compressed-tensors' grid)
    "q4_0": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32, "full_range": True,
             "scale_dtype": "float16"},
    "mxint4": {"name": "mxint", "element_width": 4},
    "mxfp4": {"name": "mxfp", "element_format": "e2m1"},
}


def pack_linears(model: nn.Module, fmt: str | dict[str, Any] = "q4_0", skip: tuple[str, ...] = (),
                 activations: str = "float") -> int:
    """Replace every ``nn.Linear`` of ``model`` whose name does not start with one of ``skip`` (and whose inputs
    are a multiple of 32) by a :class:`Packed4Linear` of ``fmt`` (``q4_0``, ``mxint4``, ``mxfp4`` or a packable
    format dict) with ``activations`` ``float`` or ``int8`` (inference: see the layer); returns how many were
    packed."""
    fmt = FORMATS.get(fmt, fmt) if isinstance(fmt, str) else fmt
    if not isinstance(fmt, dict) or not packable(fmt):
        raise UserError(f"pack_linears: {fmt!r} is not a 4-bit format that packs; named ones: {', '.join(FORMATS)}")
    names = [name for name, module in model.named_modules()
             if type(module) is nn.Linear and module.in_features % 32 == 0 and not name.startswith(tuple(skip))]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Packed4Linear.from_linear(getattr(parent, child), fmt, activations=activations))
    return_free_memory()
    return len(names)
