"""GGUF: a llama.cpp file of a decoder LM (Llama, Mistral, Qwen2, Qwen3), written with the ``gguf`` package
(llama.cpp's own Python library), from each quantized Linear's stored codes.

Quantized weights map exactly, or are refused naming the layer:

- ``Q8_0`` (blocks of 32, a float16 scale, int8 codes): ``mxint`` 8-bit in blocks of 32 (the scale
  ``2**(E - 133)`` must be a float16 value: a block of weights below ``2**-24 * 127`` is refused), and 8-bit
  symmetric ``scaled_integer`` in groups of 32 whose scales are float16 values (``scale_dtype: float16``);
- ``Q4_0`` (blocks of 32, a float16 scale, codes ``q - 8``): 4-bit symmetric ``scaled_integer`` in groups of
  32 (either grid) and ``mxint`` 4-bit, with float16 scales as above;
- ``MXFP4`` (blocks of 32, an E8M0 scale, E2M1 codes): ``mxfp`` E2M1 in blocks of 32.

Float tensors are written as F32 (or F16). llama.cpp quantizes activations its own way, so a model with
quantized activations is refused. Llama's query and key rows are permuted to llama.cpp's rotary layout,
as its converter does (whole rows move, so each block's codes stay exact). The tokenizer goes in too:
WordPiece (the runs' own) as llama.cpp's ``bert`` vocabulary, byte-level BPE as ``gpt2`` with its merges.

>>> GGUF_ARCHITECTURES
{'llama': 'llama', 'mistral': 'llama', 'qwen2': 'qwen2', 'qwen3': 'qwen3'}
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mase_lite.deploy.layers import ExportError, Layer, linear_layers, other_quantized_layers, unsupported
from mase_lite.files import follow_umask, staged_file
from mase_lite.nn.quant_functional import QuantizedFunction
from mase_lite.numerics.codes import offset_values

TARGET = "gguf"
NEAREST = ("Q8_0 (mxint 8-bit or 8-bit scaled_integer in groups of 32 with float16 scales), Q4_0 (4-bit symmetric "
           "scaled_integer or mxint in groups of 32, float16 scales) or MXFP4 (mxfp e2m1 in blocks of 32)")
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
FLOAT_TYPES = ("F32", "F16")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ExportError("the gguf export needs the gguf package: pip install gguf (or mase-lite[export])") from None
    return gguf


def write(mg, path: str | Path, tokenizer: Any = None, float_type: str = "F32") -> dict[str, Any]:
    """Write ``mg`` (a transformers decoder LM, captured or in module mode) to the GGUF file ``path``."""
    gguf = _gguf()
    if float_type not in FLOAT_TYPES:
        raise ExportError(f"float_type={float_type!r} is unknown; allowed: {', '.join(FLOAT_TYPES)}")
    model = mg.model
    hf = getattr(mg, "source_model", model)
    config = getattr(hf, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in GGUF_ARCHITECTURES:
        raise ExportError(f"{TARGET} writes decoder LMs of model type {', '.join(GGUF_ARCHITECTURES)}; this model is "
                          f"{model_type or type(hf).__name__}")
    refused = other_quantized_layers(model) + [n for n, m in model.named_modules() if isinstance(m, QuantizedFunction)]
    if refused:
        raise unsupported(TARGET, refused[0], "a quantized layer that is not a Linear", "quantize Linear layers only")
    arch = GGUF_ARCHITECTURES[model_type]
    layers = {layer.name: layer for layer in linear_layers(model)}
    planned = {name: _plan(layer) for name, layer in layers.items()}  # every refusal before anything is written
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), config.num_hidden_layers)
    tensors: list[tuple[str, np.ndarray, Any]] = []
    counts: Counter[str] = Counter()
    for name, tensor in _float_tensors(model, layers).items():
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ExportError(f"{TARGET}: no llama.cpp tensor for {name!r} ({model_type})")
        array = _permuted(name, tensor.detach().float(), config, arch).numpy()
        one_d = array.ndim == 1
        kind = "F32" if one_d or float_type == "F32" else "F16"
        tensors.append((target, array.astype(np.float32 if kind == "F32" else np.float16), None))
        counts[kind] += 0 if one_d else 1
    for name, (qtype, blocks) in planned.items():
        layer = layers[name]
        target = names.get_name(name + ".weight", try_suffixes=(".weight",))
        if target is None:
            raise ExportError(f"{TARGET}: no llama.cpp tensor for {name!r} ({model_type})")
        if qtype is None:
            kind = float_type
            array = _permuted(name, layer.weight.float(), config, arch).numpy()
            tensors.append((target, array.astype(np.float32 if kind == "F32" else np.float16), None))
        else:
            kind = qtype
            tensors.append((target, _permuted(name, blocks, config, arch).numpy(), getattr(gguf.GGMLQuantizationType, qtype)))
        counts[kind] += 1
        if layer.bias is not None:
            bias = _permuted(name, layer.bias.float(), config, arch).numpy()
            tensors.append((target.removesuffix(".weight") + ".bias", bias.astype(np.float32), None))
    file_type = counts.most_common(1)[0][0] if counts else "F32"
    path = Path(path)
    with staged_file(path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch)
        _metadata(writer, gguf, hf, config, arch, file_type)
        if tokenizer is not None:
            _vocabulary(writer, gguf, tokenizer, config.vocab_size)
        for target, array, raw in tensors:
            writer.add_tensor(target, np.ascontiguousarray(array), raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        follow_umask(tmp)
    return {"format": TARGET, "path": str(path), "architecture": arch, "bytes": path.stat().st_size,
            "tensors": len(tensors), "types": dict(counts)}


def _plan(layer: Layer) -> tuple[str | None, Tensor | None]:
    """The GGML type and blocks (uint8 ``[out, bytes per row]``) of a layer's weight; ``(None, None)`` for float."""
    if layer.data_in is not None or layer.data_out is not None:
        raise unsupported(TARGET, layer.name, "quantized activations (llama.cpp quantizes them its own way)",
                          "weight-only quantization")
    fmt = layer.weight_format
    if fmt is None:
        return None, None
    if layer.codes is None:
        raise unsupported(TARGET, layer.name, f"weight format {fmt['name']} (no stored codes for its values)", NEAREST)
    columns = layer.codes.shape[-1]
    blocks_of_32 = columns % 32 == 0
    name = fmt["name"]
    if name == "mxfp" and fmt["element_format"] == "e2m1" and fmt["block_size"] == 32 and blocks_of_32:
        scale = _finite_mx_scale(layer)
        return "MXFP4", _mxfp4_blocks(layer.codes.unpacked(), scale)
    if name == "mxint" and fmt["block_size"] == 32 and blocks_of_32 and fmt["element_width"] in (8, 4):
        exponent = _finite_mx_scale(layer).to(torch.int64) - 127 - (fmt["element_width"] - 2)
        scale = torch.where(exponent < -149, torch.zeros((), dtype=torch.float64), torch.ldexp(torch.ones(()), exponent.double()))
        signed = offset_values(layer.codes.unpacked(), fmt["element_width"])
        return _integer_blocks(layer, signed, scale.float(), fmt["element_width"])
    if (name == "scaled_integer" and fmt["symmetric"] and fmt["width"] in (8, 4) and blocks_of_32
            and (fmt["granularity"] == "group" and fmt["group_size"] == 32)):
        side = layer.codes.side
        if "scale" in side:
            scale = side["scale"].float()
        else:
            exponent = side["scale_exponent"].to(torch.float64)
            scale = torch.where(exponent == -128, 0.0, torch.pow(2.0, exponent)).float()
        signed = offset_values(layer.codes.unpacked(), fmt["width"])
        return _integer_blocks(layer, signed, scale, fmt["width"])
    described = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
    raise unsupported(TARGET, layer.name, f"weight format {name} ({described})", NEAREST)


def _finite_mx_scale(layer: Layer) -> Tensor:
    scale = layer.codes.side["scale"]
    if bool((scale == 0xFF).any()):
        raise unsupported(TARGET, layer.name, "an MX block holding NaN or Inf", "finite weights")
    return scale


def _integer_blocks(layer: Layer, signed: Tensor, scale: Tensor, bits: int) -> tuple[str, Tensor]:
    """Q8_0 or Q4_0 blocks: the float16 scale (exact, or the layer is refused), then the codes."""
    half = scale.half()
    codes_zero = (signed.reshape(*scale.shape, 32) == 0).all(-1)
    inexact = (half.float() != scale) & ~codes_zero
    if bool(inexact.any()):
        row, block = (int(i) for i in inexact.nonzero()[0])
        raise unsupported(TARGET, layer.name, f"the scale {float(scale[row, block]):.6g} of block {block} of row {row} "
                          "is not a float16 value", "scale_dtype float16 (and weights within float16's range)")
    d = torch.where(codes_zero, torch.zeros((), dtype=torch.float16), half).view(torch.uint8).reshape(*scale.shape, 2)
    blocks = signed.reshape(*scale.shape, 32)
    if bits == 8:
        qs = blocks.to(torch.int8).view(torch.uint8)
        return "Q8_0", torch.cat([d, qs], -1).reshape(scale.shape[0], -1)
    nibbles = (blocks + 8).to(torch.uint8)  # Q4_0: the low nibbles hold elements 0-15, the high ones 16-31
    qs = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    return "Q4_0", torch.cat([d, qs], -1).reshape(scale.shape[0], -1)


def _mxfp4_blocks(codes: Tensor, scale: Tensor) -> Tensor:
    """MXFP4 blocks: the E8M0 scale, then E2M1 codes (low nibbles elements 0-15, high nibbles 16-31)."""
    rows = codes.shape[0]
    nibbles = codes.reshape(*scale.shape, 32).to(torch.uint8)
    qs = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    return torch.cat([scale.unsqueeze(-1), qs], -1).reshape(rows, -1)


def _float_tensors(model: torch.nn.Module, layers: dict[str, Layer]) -> dict[str, Tensor]:
    """Every tensor but those of the Linear layers (written from their codes) and quantizers, once per tied group."""
    out, seen = {}, set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name.rpartition(".")[0] in layers or "_quantizer." in name or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if tensor.is_floating_point():
            out[name] = tensor
    return out


def _permuted(name: str, tensor: Tensor, config: Any, arch: str) -> Tensor:
    """Llama's query and key rows in llama.cpp's rotary layout (pairs interleaved, per head), as its converter does."""
    if arch != "llama" or not name.endswith(("self_attn.q_proj", "self_attn.k_proj")):
        return tensor
    heads = config.num_attention_heads
    if name.endswith("k_proj"):
        heads = getattr(config, "num_key_value_heads", None) or heads
    rows = tensor.shape[0]
    return tensor.reshape(heads, 2, rows // heads // 2, *tensor.shape[1:]).swapaxes(1, 2).reshape(tensor.shape)


def _metadata(writer, gguf, hf, config, arch: str, file_type: str) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_name(getattr(config, "name_or_path", "") or type(hf).__name__)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if theta is not None:
        writer.add_rope_freq_base(float(theta))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)
    file_types = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0",
                  "MXFP4": "MOSTLY_MXFP4_MOE"}
    writer.add_file_type(getattr(gguf.LlamaFileType, file_types[file_type]))


def _vocabulary(writer, gguf, tokenizer, vocab_size: int) -> None:
    """The tokenizer as llama.cpp reads it: WordPiece as ``bert`` (continuations lose ``##``, words gain U+2581),
    byte-level BPE as ``gpt2`` with its merges; special tokens are CONTROL, ids past the vocabulary UNUSED."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    kind = spec["model"]["type"]
    vocab = tokenizer.get_vocab()
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    by_id = {i: token for token, i in vocab.items()}
    if max(by_id, default=-1) >= vocab_size:
        raise ExportError(f"{TARGET}: the tokenizer has {max(by_id) + 1} tokens, the model's vocabulary {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL)
        else:
            if kind == "WordPiece":
                token = token[2:] if token.startswith("##") else "\u2581" + token
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    if kind == "WordPiece":
        writer.add_tokenizer_model("bert")
    elif kind == "BPE":
        writer.add_tokenizer_model("gpt2")
        merges = spec["model"].get("merges", [])
        writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    else:
        raise ExportError(f"{TARGET}: a {kind} tokenizer has no llama.cpp vocabulary here; WordPiece and BPE do")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("sep", writer.add_sep_token_id),
                      ("pad", writer.add_pad_token_id), ("mask", writer.add_mask_token_id)):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
