"""``lora_merge``: fold LoRA adapters back into plain Linears (weight ``W + alpha/rank * B @ A``).

Example::

    mg, info = ml.passes.lora_merge(mg)                     # every adapter
    mg, info = ml.passes.lora_merge(mg, {"by": "name", "targets": ["classifier"]})
"""

from __future__ import annotations

from pydantic import Field

from mase_lite.nn.lora import LoRALinear
from mase_lite.passes.registry import PassError, register_pass
from mase_lite.passes.select import Selection, select_modules


class LoRAMergeParams(Selection):
    """Which LoRA modules to merge (all by default)."""

    targets: list[str] = Field(default_factory=lambda: [LoRALinear.mase_op], description="ops, node names or patterns")


@register_pass("lora_merge", kind="transform", params=LoRAMergeParams)
def lora_merge(mg, params: LoRAMergeParams):
    """Replace each selected ``LoRALinear`` with the equivalent ``nn.Linear``."""
    modules = mg.modules
    merged = select_modules(mg, params)
    for target, name in merged.items():
        if not isinstance(modules[target], LoRALinear):
            raise PassError(f"lora_merge: node {name!r} is a {type(modules[target]).__name__}, not a LoRALinear")
    for target in merged:
        mg.replace_module(target, modules[target].merged())
    return mg, {"merged": list(merged.values())}
