"""Pack a model's Linear layers to MXINT8 in place, one layer at a time, each float weight released
before the next is packed; then hand the freed memory back to the operating system.

Resident memory after packing is then about the packed layers plus the rest of the model, and the
peak while packing is the model plus one layer's packed copy. (A float weight something else still
holds — a tied embedding, an optimizer — stays, of course.) The freed memory goes back to the system
(:func:`mase_lite.infra.heap.return_free_memory`).

Example::

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    >>> pack_linears(model, skip=("2",))
    1
    >>> type(model[0]).__name__, type(model[2]).__name__
    ('MXInt8Linear', 'Linear')
"""

from __future__ import annotations

from torch import nn

from mase_lite.kernels.mxint8.codec import DEFAULT_BLOCK_SIZE
from mase_lite.kernels.mxint8.module import MXInt8Linear
from mase_lite.infra.heap import return_free_memory


def pack_linears(model: nn.Module, skip: tuple[str, ...] = (), block_size: int = DEFAULT_BLOCK_SIZE,
                 scale_rule: str = "floor", activations: str = "float") -> int:
    """Replace every ``nn.Linear`` of ``model`` whose name does not start with one of ``skip`` by an
    :class:`MXInt8Linear` (``activations``: ``float`` or ``int8``, see the layer); returns how many were packed."""
    names = [name for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and not name.startswith(tuple(skip))]  # names only: no module kept
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, MXInt8Linear.from_linear(getattr(parent, child), block_size, scale_rule, activations))
    return_free_memory()
    return len(names)
