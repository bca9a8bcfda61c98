"""GGUF: a llama.cpp file of a decoder LM (Llama, Mistral, Qwen2, Qwen3), written with the ``gguf`` package
(llama.cpp's own Python library), from each quantized Linear's stored codes.

Quantized weights map exactly, or are refused naming the layer:

- ``Q8_0`` (blocks of 32, a float16 scale, int8 codes): ``mxint`` 8-bit in blocks of 32 (the scale
  ``2**(E - 133)`` must be a float16 value: a block of weights below ``2**-24 * 127`` is refused), and 8-bit
  symmetric ``scaled_integer`` in groups of 32 whose scales are float16 values (``scale_dtype: float16``);
- ``Q4_0`` (blocks of 32, a float16 scale, codes ``q - 8``): 4-bit symmetric ``scaled_integer`` in groups of
  32 (either grid) and ``mxint`` 4-bit, with float16 scales as above;
- ``MXFP4`` (blocks of 32, an E8M0 scale, E2M1 codes): ``mxfp`` E2M1 in blocks of 32;
- ``Q4_0``, ``Q8_0``, ``Q2_K`` .. ``Q6_K`` and ``IQ4_NL``: the formats ``q4_0``, ``q8_0``, ``q2_k`` .. ``q6_k`` and
  ``iq4_nl`` (:mod:`mase_lite.numerics.ggml`: llama.cpp's own types, their scales chosen at least as well as
  llama.cpp chooses them), whose codes are llama.cpp's block bytes; the import (:mod:`mase_lite.importers.gguf`)
  reads every Q4_0, Q8_0, K-quant and IQ4_NL tensor back as these formats (MXFP4 as ``mxfp``).

Each format declares its GGUF type in its own module (``register_mapping(name, "gguf", scheme, tensors)``:
``scheme(fmt, shape)`` the GGML type name or None, or ``Unfit``; ``tensors(codes, type)`` the blocks, uint8
``[rows, bytes]``).

Float matrices are written as F32 (or F16: ``float_dtype``), vectors as F32. llama.cpp quantizes activations its own way, so a model with
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

from mase_lite.deploy import gguf_file
from mase_lite.deploy.layers import ExportError, Layer, linear_layers, other_quantized_layers, unsupported
from mase_lite.infra.errors import UserError
from mase_lite.infra.files import follow_umask, staged_file
from mase_lite.layers.quant_functional import QuantizedFunction
from mase_lite.numerics.registry import Unfit, target_mapping

TARGET = "gguf"
MARKER = "mase_lite.export"  # a metadata key naming the writer: what tells a previous export at a path
NEAREST = ("Q8_0 (mxint 8-bit or 8-bit scaled_integer in groups of 32 with float16 scales), Q4_0 (4-bit symmetric "
           "scaled_integer or mxint in groups of 32, float16 scales), MXFP4 (mxfp e2m1 in blocks of 32), or a ggml "
           "block format (q2_k .. q6_k, iq4_nl)")
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
FLOAT_DTYPES = {"float32": "F32", "float16": "F16"}


def gguf_package():
    try:
        import gguf
    except ImportError:
        raise ExportError("the gguf export needs the gguf package: pip install gguf (or mase-lite[export])") from None
    return gguf


def is_export(path: Path) -> bool:
    """Whether ``path`` is a GGUF file :func:`write` wrote (its metadata holds the writer's marker)."""
    try:
        return gguf_file.is_gguf(path) and gguf_file.metadata(path).get(MARKER) == TARGET
    except UserError:
        return False


def write(mg, path: str | Path, tokenizer: Any = None, float_dtype: str = "float32") -> dict[str, Any]:
    """Write ``mg`` (a transformers decoder LM, captured or in module mode) to the GGUF file ``path``; float matrices
    (embeddings, float layers) in ``float_dtype`` (float32 or float16), vectors (norms, biases) in float32."""
    gguf = gguf_package()
    if float_dtype not in FLOAT_DTYPES:
        raise ExportError(f"float_dtype={float_dtype!r} is unknown; allowed: {', '.join(FLOAT_DTYPES)}")
    float_type = FLOAT_DTYPES[float_dtype]
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
    tied = _tied_head(model, hf)
    if tied in layers and layers[tied].weight_format is None:
        del layers[tied]  # a float head that is the embedding: llama.cpp reads token_embd for both, as transformers ties
    else:
        tied = None
    planned = {name: _plan(layer) for name, layer in layers.items()}  # every refusal before anything is written
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), config.num_hidden_layers)
    tensors: list[tuple[str, np.ndarray, Any]] = []
    counts: Counter[str] = Counter()
    for name, tensor in _float_tensors(model, layers, skip=tied).items():
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ExportError(f"{TARGET}: no llama.cpp tensor for {name!r} ({model_type})")
        array = permuted(name, tensor.detach().float(), config, arch).numpy()
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
            array = permuted(name, layer.weight.float(), config, arch).numpy()
            tensors.append((target, array.astype(np.float32 if kind == "F32" else np.float16), None))
        else:
            kind = qtype
            tensors.append((target, permuted(name, blocks, config, arch).numpy(), getattr(gguf.GGMLQuantizationType, qtype)))
        counts[kind] += 1
        if layer.bias is not None:
            bias = permuted(name, layer.bias.float(), config, arch).numpy()
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
    mapping = target_mapping(fmt["name"], TARGET)
    try:
        qtype = mapping.scheme(fmt, tuple(layer.codes.shape)) if mapping is not None else None
        if qtype is None:
            described = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
            raise unsupported(TARGET, layer.name, f"weight format {fmt['name']} ({described})", NEAREST)
        blocks = mapping.tensors(layer.codes, qtype)
    except Unfit as unfit:
        raise unsupported(TARGET, layer.name, unfit.why, unfit.nearest) from None
    return qtype, torch.as_tensor(blocks)


def _tied_head(model: torch.nn.Module, hf: Any) -> str | None:
    """The name of the output head when it holds the input embedding's own weight (a float head of a model that ties
    them), else None: such a head is written once, as the embedding."""
    try:
        embedding, head = hf.get_input_embeddings(), hf.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if embedding is None or head is None or getattr(head, "weight", None) is not embedding.weight:
        return None
    return next((name for name, module in model.named_modules() if module is head), None)


def _float_tensors(model: torch.nn.Module, layers: dict[str, Layer], skip: str | None = None) -> dict[str, Tensor]:
    """Every tensor but those of the Linear layers (written from their codes), the quantizers' and the module
    ``skip``'s, once per tied group."""
    out, seen = {}, set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        owner = name.rpartition(".")[0]
        if owner in layers or owner == skip or "_quantizer." in name or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if tensor.is_floating_point():
            out[name] = tensor
    return out


def permuted(name: str, tensor: Tensor, config: Any, arch: str) -> Tensor:
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
    writer.add_string(MARKER, TARGET)
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
    # llama.cpp's file type of the most common tensor type: MOSTLY_<type>, the K-quants' _M mix, MXFP4's _MOE
    names = ["ALL_F32"] if file_type == "F32" else [f"MOSTLY_{file_type}{tail}" for tail in ("", "_M", "_MOE")]
    writer.add_file_type(next(gguf.LlamaFileType[n] for n in names if n in gguf.LlamaFileType.__members__))


def _vocabulary(writer, gguf, tokenizer, vocab_size: int) -> None:
    """The tokenizer as llama.cpp reads it: WordPiece as ``bert`` (continuations lose ``##``, words gain U+2581),
    byte-level BPE as ``gpt2`` with its merges; special tokens are CONTROL, ids past the vocabulary UNUSED; the
    pre-tokenizer and BOS/EOS settings a GGUF import carried (:data:`mase_lite.importers.gguf.CARRIED`), and the chat
    template."""
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
    carried = tokenizer.init_kwargs.get("gguf_metadata") or {}  # what a GGUF file the tokenizer came from said
    writer.add_tokenizer_pre(carried.get("tokenizer.ggml.pre", "default"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("sep", writer.add_sep_token_id),
                      ("pad", writer.add_pad_token_id), ("mask", writer.add_mask_token_id)):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(bool(carried.get("tokenizer.ggml.add_bos_token", False)))
    writer.add_add_eos_token(bool(carried.get("tokenizer.ggml.add_eos_token", False)))
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        writer.add_chat_template(tokenizer.chat_template)
