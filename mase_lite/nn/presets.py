"""Named quantization schemes, in the style of torchao's configs and llm-compressor's presets: each is exactly the
layer config a user would write for every Linear, on the grids the runtimes use (compressed-tensors' full two's
complement range), so the result exports as it is.

>>> PRESETS["W4A16"]["weight"]["group_size"]
128
>>> sorted(PRESETS)
['FP8', 'MXFP4', 'MXINT8', 'NVFP4', 'Q4_0', 'Q4_K', 'Q5_K', 'Q6_K', 'Q8_0', 'W4A16', 'W8A16', 'W8A8']
"""

from __future__ import annotations

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
