"""Pack a model's Linear layers to GGML's K-quants in place, one layer at a time, each float weight released before the
next is packed: every Linear in one type (``q2_k`` .. ``q6_k``) or each in its own (a mapping: module path ->
type, such as :func:`mase_lite.layers.presets.mixed_types` gives for llama-quantize's ``Q4_K_M`` or ``Q5_K_M``), the
weights the same bits as the GGUF file the tool exports for the same choice.

Example::

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    >>> pack_linears(model, "q4_k", skip=("2",))
    1
    >>> type(model[0]).__name__, type(model[2]).__name__
    ('KQuantLinear', 'Linear')
"""

from __future__ import annotations

from typing import Mapping

from torch import nn

from mase_lite.infra.errors import UserError
from mase_lite.infra.heap import return_free_memory
from mase_lite.kernels.int8_activations.cpu_kernel import KQUANT_KINDS, SUPER
from mase_lite.kernels.kquants.module import KQuantLinear


def pack_linears(model: nn.Module, types: str | Mapping[str, str] = "q4_k", skip: tuple[str, ...] = (),
                 activations: str = "float") -> int:
    """Replace Linears of ``model`` by :class:`KQuantLinear` with ``activations`` ``float`` or ``int8``: with ``types``
    a K-quant (``q2_k`` .. ``q6_k``), every Linear whose inputs are a multiple of 256 and whose name does not
    start with one of ``skip``; with a mapping, the Linears it names, each in its type. Returns how many were packed."""
    if isinstance(types, str):
        if types not in KQUANT_KINDS:
            raise UserError(f"pack_linears: {types!r} is not a K-quant that packs; allowed: {', '.join(KQUANT_KINDS)}")
        types = {name: types for name, module in model.named_modules()
                 if type(module) is nn.Linear and module.in_features % SUPER == 0 and not name.startswith(tuple(skip))}
    wrong = {name: kind for name, kind in types.items() if kind not in KQUANT_KINDS}
    if wrong:
        raise UserError(f"pack_linears: {wrong} are not K-quants that pack; allowed: {', '.join(KQUANT_KINDS)}"[:400])
    for name, kind in types.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, KQuantLinear.from_linear(getattr(parent, child), {"name": kind}, activations))
    return_free_memory()
    return len(types)
