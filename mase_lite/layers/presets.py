"""Named quantization schemes, in the style of torchao's configs and llm-compressor's presets: each is exactly the
layer config a user would write for every Linear, on the grids the runtimes use (compressed-tensors' full two's
complement range), so the result exports as it is.

>>> PRESETS["W4A16"]["weight"]["group_size"]
128
>>> sorted(PRESETS)
['FP8', 'MXFP4', 'MXINT8', 'NVFP4', 'Q4_0', 'Q4_K', 'Q5_K', 'Q6_K', 'Q8_0', 'W4A16', 'W8A16', 'W8A8']
"""

from __future__ import annotations

import re
from types import MappingProxyType

_W8_CHANNEL = {"name": "scaled_integer", "width": 8, "granularity": "channel", "full_range": True}

PRESETS = MappingProxyType({
    # int4 weights in groups of 128 with float16 scales, float activations (GPTQ/AWQ checkpoints; vLLM's W4A16)
    "W4A16": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128,
                         "full_range": True, "scale_dtype": "float16"}},
    # int8 weights per output channel, float activations
    "W8A16": {"weight": dict(_W8_CHANNEL)},
    # int8 weights per channel and int8 activations per token, dynamic (vLLM's W8A8 int8)
    "W8A8": {"weight": dict(_W8_CHANNEL), "data_in": dict(_W8_CHANNEL)},
    # FP8 E4M3 weights per output channel and activations per token, dynamic (vLLM's FP8_DYNAMIC)
    "FP8": {"weight": {"name": "scaled_float"}, "data_in": {"name": "scaled_float"}},
    # OCP MX: int8 / E2M1 elements sharing an E8M0 scale per 32 (GGUF Q8_0 / MXFP4)
    "MXINT8": {"weight": {"name": "mxint", "element_width": 8}},
    "MXFP4": {"weight": {"name": "mxfp", "element_format": "e2m1"}},
    # NVIDIA's FP4 weights: E2M1 elements, an E4M3 scale per 16, a float32 global scale per tensor (vLLM's NVFP4A16)
    "NVFP4": {"weight": {"name": "nvfp4", "per_tensor": "global_scale"}},
    # llama.cpp's own types for every Linear (llama-quantize --pure): Q8_0, Q4_0 and the K-quants
    **{name.upper(): {"weight": {"name": name}} for name in ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k")},
})

# llama.cpp's mixed recipes (llama-quantize's Q4_K_M, Q5_K_M for Llama-family models): the base type, and the type
# of the output head and of the value projections and down projections of the layers use_more_bits picks
MIXED_PRESETS = MappingProxyType({"Q4_K_M": ("q4_k", "q6_k"), "Q5_K_M": ("q5_k", "q6_k")})
# llama.cpp's type for a row whose length is not a multiple of a K-quant's 256 (llama-quant.cpp's fallbacks)
K_FALLBACK = MappingProxyType({"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"})
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose value and down projections get more bits: the first and last eighth
    and every third layer between.

    >>> [i for i in range(16) if use_more_bits(i, 16)]
    [0, 1, 4, 7, 10, 13, 14, 15]
    """
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def mixed_rules(preset: str, columns: dict[str, int], head: str | None, tied: bool = False) -> dict[str, dict | None]:
    """The weight format of each Linear (module path -> columns) under mixed preset ``preset``, as llama-quantize
    chooses: the head (``head``; left float where ``tied`` to the embedding, which is written once) and the value and
    down projections of :func:`use_more_bits` layers in the larger type, the rest in the base type; a row that
    256 does not tile takes llama.cpp's fallback, one that 32 does not tile stays float.

    >>> rules = mixed_rules("Q4_K_M", {"model.layers.0.self_attn.v_proj": 256, "model.layers.0.self_attn.q_proj": 576,
    ...                                 "lm_head": 256}, "lm_head")
    >>> {k: v and v["weight"]["name"] for k, v in rules.items()}
    {'model.layers.0.self_attn.v_proj': 'q6_k', 'model.layers.0.self_attn.q_proj': 'q5_0', 'lm_head': 'q6_k'}
    """
    base, more = MIXED_PRESETS[preset]
    indices = {path: int(found.group(1)) for path in columns if (found := _LAYER.search(path))}
    layers = max(indices.values(), default=-1) + 1
    rules: dict[str, dict | None] = {}
    for path, width in columns.items():
        if path == head and tied:
            rules[path] = None
            continue
        projection = path.endswith(("v_proj", "down_proj")) and path in indices
        kind = more if path == head or (projection and use_more_bits(indices[path], layers)) else base
        if width % 256:
            kind = K_FALLBACK[kind]
        rules[path] = None if width % 32 else {"weight": {"name": kind}}
    return rules


def mixed_types(model, preset: str) -> dict[str, str]:
    """The type :func:`mixed_rules` gives each Linear of ``model`` (a transformers causal LM: its head ``lm_head``)
    under ``preset``, for the Linears it quantizes (module path -> format name).

    >>> import torch
    >>> model = torch.nn.Module()
    >>> model.layers = torch.nn.ModuleList([torch.nn.Linear(256, 8)])
    >>> model.lm_head = torch.nn.Linear(512, 10)
    >>> mixed_types(model, "Q4_K_M")
    {'layers.0': 'q4_k', 'lm_head': 'q6_k'}
    """
    from torch import nn

    columns = {name: m.in_features for name, m in model.named_modules() if type(m) is nn.Linear}
    head = "lm_head" if "lm_head" in columns else None
    tied = head is not None and bool(tied_with(model, head))
    return {name: rule["weight"]["name"] for name, rule in mixed_rules(preset, columns, head, tied).items() if rule}


def tied_with(model, path: str) -> list[str]:
    """The other modules holding module ``path``'s weight (an output head tied to the embedding), in order."""
    weight = model.get_submodule(path).weight
    owners = [name.rpartition(".")[0] for name, param in model.named_parameters(remove_duplicate=False)
              if param is weight]
    return [owner for owner in owners if owner != path]
