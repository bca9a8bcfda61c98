"""GGUF files as models of this tool: a llama.cpp file of a decoder LM (Llama, Mistral, Qwen2, Qwen3) whose Q8_0,
Q4_0, MXFP4, K-quant and IQ4_NL tensors become quantized layers of the equivalent formats holding the stored values
(Q4_0 and Q8_0 as 4- and 8-bit ``scaled_integer`` in groups of 32 with float16 scales, MXFP4 as ``mxfp`` E2M1, the
ggml block types as the formats of :mod:`mase_lite.numerics.ggml`), and its vocabulary as a transformers tokenizer.
The file is data: it is validated (:mod:`mase_lite.deploy.gguf_file`) and nothing in it is run. The writer is
:mod:`mase_lite.deploy.gguf`.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mase_lite.deploy.gguf import gguf_package, permuted
from mase_lite.deploy.layers import ExportError
from mase_lite.deploy import gguf_file
from mase_lite.infra.errors import UserError, short
from mase_lite.infra.limits import check_fits, model_bytes
from mase_lite.numerics.ggml import GGML_TYPE_NAMES, from_ggml_blocks, ggml_values

logger = logging.getLogger(__name__)

CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}
# tokenizer metadata an import keeps (on the tokenizer, as gguf_metadata) and an export writes back unchanged:
# llama.cpp picks its pre-tokenizer by tokenizer.ggml.pre
CARRIED = {"tokenizer.ggml.pre": str, "tokenizer.ggml.add_bos_token": bool, "tokenizer.ggml.add_eos_token": bool}
QUANTIZED_TYPES = ("MXFP4", *GGML_TYPE_NAMES.values())
FLOAT_TYPES = ("F32", "F16", "F64")
MAX_SIZE = 2**31 - 1  # a width or count of a model (torch indexes its kernels with int32)
MAX_CONTEXT = 2**24
ROLES = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
         ("sep_token", "seperator_token_id"), ("pad_token", "padding_token_id"), ("mask_token", "mask_token_id"))


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a regular file that starts with GGUF's magic bytes, or anything but a directory named
    ``*.gguf`` (which the reader refuses, saying why: a FIFO is never opened)."""
    return gguf_file.is_gguf(path)


def _int(path: Path, meta: dict[str, Any], key: str, default: int | None = None, high: int = MAX_SIZE) -> int:
    value = meta.get(key, default)
    if value is None:
        raise ExportError(f"{path}: {key} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ExportError(f"{path}: {key} = {short(value)}: give an integer from 1 to {high}")
    return value


def _positive(path: Path, meta: dict[str, Any], key: str, default: float, high: float) -> float:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < high:
        raise ExportError(f"{path}: {key} = {short(value)}: give a number above 0 and below {high:g}")
    return float(value)


def _strings(path: Path, meta: dict[str, Any], key: str) -> list[str] | None:
    value = meta.get(key)
    if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ExportError(f"{path}: {key} = {short(value)}: give an array of strings")
    return value


def _sizes(path: Path, file: gguf_file.GGUFFile, arch: str) -> dict[str, Any]:
    """The model's sizes from the file's metadata, each a positive integer in range, consistent with the others
    (head counts dividing) and with the tensors the file holds (blocks, widths, vocabulary)."""
    meta, tensors = file.metadata, file.tensors
    key = {name: f"{arch}.{name}" for name in ("embedding_length", "attention.head_count", "attention.head_count_kv",
                                               "attention.key_length", "block_count", "feed_forward_length",
                                               "vocab_size", "context_length")}
    if "token_embd.weight" not in tensors:
        raise ExportError(f"{path}: tensor 'token_embd.weight' is missing")
    hidden = _int(path, meta, key["embedding_length"])
    heads = _int(path, meta, key["attention.head_count"], high=hidden)
    kv_heads = _int(path, meta, key["attention.head_count_kv"], heads, high=heads)
    if heads % kv_heads:
        raise ExportError(f"{path}: {key['attention.head_count_kv']} = {kv_heads} does not divide "
                          f"{key['attention.head_count']} = {heads}")
    if key["attention.key_length"] not in meta and hidden % heads:
        raise ExportError(f"{path}: {key['attention.head_count']} = {heads} does not divide "
                          f"{key['embedding_length']} = {hidden}")
    head_dim = _int(path, meta, key["attention.key_length"], hidden // heads, high=hidden)
    if head_dim % 2:
        raise ExportError(f"{path}: {key['attention.key_length']} = {head_dim}: the rotary embedding pairs a head's "
                          "dimensions; give an even head size")
    tokens = _strings(path, meta, "tokenizer.ggml.tokens")
    vocab = _int(path, meta, key["vocab_size"], len(tokens) if tokens else tensors["token_embd.weight"].dims[-1])
    if tokens is not None and len(tokens) != vocab:
        raise ExportError(f"{path}: {key['vocab_size']} = {vocab}, but tokenizer.ggml.tokens holds {len(tokens)} tokens")
    blocks = _int(path, meta, key["block_count"])
    found = sorted({int(name.split(".")[1]) for name in tensors if re.fullmatch(r"blk\.\d{1,9}\..+", name)})
    if found != list(range(blocks)):
        raise ExportError(f"{path}: {key['block_count']} = {blocks}, but the file's tensors are of blocks {short(found)}")
    sizes = {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
             "vocab_size": vocab, "num_hidden_layers": blocks,
             "intermediate_size": _int(path, meta, key["feed_forward_length"])}
    held = (("token_embd.weight", 0, hidden, key["embedding_length"]), ("token_embd.weight", 1, vocab, key["vocab_size"]),
            ("blk.0.ffn_up.weight", 1, sizes["intermediate_size"], key["feed_forward_length"]),
            ("blk.0.attn_q.weight", 1, heads * head_dim, key["attention.head_count"]),
            ("blk.0.attn_k.weight", 1, kv_heads * head_dim, key["attention.head_count_kv"]))
    for name, dim, expected, field in held:
        dims = tensors[name].dims if name in tensors else None
        if dims is not None and (len(dims) <= dim or dims[dim] != expected):
            raise ExportError(f"{path}: {field} makes tensor {name!r} {expected} wide in dimension {dim}; the file's "
                              f"is {list(dims)}")
    return {**sizes, "max_position_embeddings": _int(path, meta, key["context_length"], 2048, high=MAX_CONTEXT),
            "rms_norm_eps": _positive(path, meta, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, 1.0),
            "rope_theta": _positive(path, meta, f"{arch}.rope.freq_base", 10000.0, 1e12)}


def _token_ids(meta: dict[str, Any], vocab: int) -> dict[str, int | None]:
    """The file's BOS and EOS ids for the config (generation stops at its EOS, not at a config class's default);
    none where the file gives no id of the vocabulary."""
    ids = {key: meta.get(f"tokenizer.ggml.{key}") for key in ("bos_token_id", "eos_token_id")}
    return {key: i if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab else None
            for key, i in ids.items()}


def _built(path: Path, auto_class: Any, config: Any, arch: str) -> torch.nn.Module:
    """The model of ``config``, once its memory (measured on the meta device) fits."""
    from transformers import logging as hf_logging

    def build(config: Any) -> torch.nn.Module:
        return auto_class.from_config(config).eval()

    fields = ", ".join(f"{arch}.{k}={getattr(config, v)}" for k, v in (
        ("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
        ("feed_forward_length", "intermediate_size"), ("vocab_size", "vocab_size")))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        check_fits(fields, model_bytes(build, config, fields), f"the {arch} model its metadata describes")
        return build(config)
    except ExportError:
        raise
    except UserError as err:
        raise ExportError(f"{path}: {err}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def read(path: str | Path, auto_class: Any) -> torch.nn.Module:
    """The model of a GGUF file (Llama, Mistral, Qwen2, Qwen3) with Q8_0, Q4_0 and MXFP4 weights as quantized layers
    of the equivalent formats (8- and 4-bit ``scaled_integer`` on the full range in groups of 32 with float16 scales;
    ``mxfp`` E2M1) holding the stored values; other GGML types are dequantized to float by gguf's dequantizer
    (logged). The file is data: nothing in it is run; it is validated (:mod:`mase_lite.deploy.gguf_file`), its sizes checked against
    its tensors, and the model's memory estimated before the model is built."""
    import transformers

    path = Path(path)
    gguf = gguf_package()
    file = gguf_file.read_file(path)
    arch = file.metadata.get("general.architecture")
    if not isinstance(arch, str) or arch not in CONFIGS:
        raise ExportError(f"{path}: general.architecture = {short(arch)} has no reader here; readable: {', '.join(CONFIGS)}")
    tensors = file.tensors
    sizes = _sizes(path, file, arch)
    try:
        config = getattr(transformers, CONFIGS[arch])(**sizes, **_token_ids(file.metadata, sizes["vocab_size"]),
                                                      tie_word_embeddings="output.weight" not in tensors,
                                                      attention_bias=any(n.endswith("attn_q.bias") for n in tensors))
    except (ValueError, TypeError) as err:  # transformers' own checks of the values
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        raise ExportError(f"{path}: its metadata makes no {arch} configuration ({reason})") from None
    model = _built(path, auto_class, config, arch)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), config.num_hidden_layers)
    expected = model.state_dict()
    hf_of = {}
    for hf_name in expected:
        target = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if target is not None:
            hf_of[target] = hf_name
    unknown = sorted(set(tensors) - set(hf_of))
    if unknown:
        raise ExportError(f"{path}: tensor {short(unknown[0])} has no place in a {type(model).__name__}")
    missing = sorted(set(hf_of) - set(tensors) - ({"output.weight"} if config.tie_word_embeddings else set()))
    if missing:
        raise ExportError(f"{path}: tensor {missing[0]!r} (the model's {hf_of[missing[0]]}) is missing")
    for target, info in tensors.items():
        shape = tuple(expected[hf_of[target]].shape)
        if info.shape != shape:
            raise ExportError(f"{path}: tensor {target!r} is {list(info.shape)}, the model's {hf_of[target]} "
                              f"{list(shape)}")
    state = {}
    for target, info in tensors.items():
        hf_name = hf_of[target]
        owner = hf_name.rpartition(".")[0]
        module = model.get_submodule(owner)
        if hf_name.endswith(".weight") and type(module) is torch.nn.Linear and info.type in QUANTIZED_TYPES:
            _quantized_layer(model, owner, module, info.type, file.array(target), config, arch, path)
            continue
        values = torch.from_numpy(np.array(_float_values(gguf, file, info))).float()
        _finite(path, target, values)
        state[hf_name] = _unpermuted(owner, values, config, arch).to(expected[hf_name].dtype)
    model.load_state_dict(state, strict=False)
    return model


def _float_values(gguf, file: gguf_file.GGUFFile, info: gguf_file.TensorInfo) -> np.ndarray:
    if info.type in FLOAT_TYPES:
        return file.array(info.name)
    logger.info("%s: %s is dequantized to float (no equivalent format)", info.name, info.type)
    try:
        return gguf.quants.dequantize(file.array(info.name), gguf.GGMLQuantizationType[info.type])
    except NotImplementedError:
        raise ExportError(f"{file.path}: tensor {info.name!r} is {info.type}, which has no dequantizer here") from None


def _quantized_layer(model, name: str, module: torch.nn.Linear, qtype: str, blocks: np.ndarray, config, arch: str,
                     path: Path) -> None:
    """Replace ``module`` by its quantized layer holding the codes of a Q8_0, Q4_0, MXFP4 or ggml block-format tensor
    (a K-quant, IQ4_NL: the same format here)."""
    from mase_lite.importers.compressed_tensors import _decoded
    from mase_lite.layers.quantized import quantize_module
    from mase_lite.numerics.codes import encode

    rows, columns = module.out_features, module.in_features
    ggml = next((fmt_name for fmt_name, kind in GGML_TYPE_NAMES.items() if kind == qtype), None)
    if ggml is not None:  # ggml's own block formats: read as the same formats
        fmt = {"name": ggml}
        codes, side = from_ggml_blocks(ggml, np.asarray(blocks, dtype=np.uint8), (rows, columns))
        decoded = lambda codes, side: ggml_values(codes, side, ggml).to(module.weight.dtype)  # noqa: E731
    else:
        fmt, codes, side = _legacy_blocks(qtype, np.asarray(blocks), rows, columns, name, path)
        decoded = lambda codes, side: _decoded(fmt, codes, side, module.weight.dtype)  # noqa: E731
    order = _row_order(name, rows, config, arch)
    codes, side = codes[order], {k: v[order] for k, v in side.items()}
    values = decoded(codes, side)
    _finite(path, name, values)
    encoded = encode(values, fmt, side=side, values=values)
    if encoded is None:
        raise ExportError(f"{path}: {name}: its {qtype} blocks do not decode to values of {fmt['name']}")
    layer = quantize_module(module, {"weight": fmt})
    layer.restore_parameter("weight", encoded)
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)


def _legacy_blocks(qtype: str, blocks: np.ndarray, rows: int, columns: int, name: str,
                   path: Path) -> tuple[dict[str, Any], Tensor, dict[str, Tensor]]:
    """The equivalent format (OCP MX's ``mxfp`` E2M1), the codes and the side of an MXFP4 tensor's blocks."""
    raw = torch.from_numpy(np.array(blocks, dtype=np.uint8)).reshape(rows, columns // 32, -1)
    head, qs = raw[..., :1], raw[..., 1:].to(torch.int64)
    codes = torch.cat([qs & 0xF, qs >> 4], -1).reshape(rows, columns)
    if bool((head == 0xFF).any()):
        raise ExportError(f"{path}: {name}: an MXFP4 scale 0xFF (2**128 in GGML, NaN in OCP MX) has no equivalent")
    return {"name": "mxfp", "element_format": "e2m1", "block_size": 32}, codes, {"scale": head.reshape(rows, -1)}


def _finite(path: Path, name: str, values: Tensor) -> None:
    """Refuse a tensor holding NaN or infinite weights: a model computed from them is no model."""
    if not bool(torch.isfinite(values).all()):
        raise ExportError(f"{path}: tensor {name!r} holds NaN or infinite values (a damaged scale or weight)")


def _row_order(name: str, rows: int, config, arch: str) -> Tensor:
    """The rows of a tensor written with :func:`~mase_lite.deploy.gguf.permuted`, in Hugging Face's order."""
    index = torch.arange(rows)
    written = permuted(name, index, config, arch)
    order = torch.empty_like(index)
    order[written] = index
    return order


def _unpermuted(name: str, tensor: Tensor, config, arch: str) -> Tensor:
    if arch != "llama" or not name.endswith(("self_attn.q_proj", "self_attn.k_proj")):
        return tensor
    return tensor[_row_order(name, tensor.shape[0], config, arch)]


_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {  # tokenizer.ggml.pre: the splits llama.cpp applies, in turn, before byte-level BPE
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "roberta-bpe"), (_GPT2_SPLIT,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    (r"\p{N}", _GPT2_SPLIT)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), (_LLAMA3_SPLIT,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), (_LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}"),)),
}
"""How a byte-level vocabulary's text is cut into words, by the ``tokenizer.ggml.pre`` llama.cpp writes; another or no
``pre`` gets GPT-2's cut (transformers' ByteLevel)."""


def read_tokenizer(path: str | Path):
    """The GGUF file's vocabulary as a transformers tokenizer: ``bert`` (WordPiece: U+2581 words, bare
    continuations) or ``gpt2`` (byte-level BPE with its merges); None when the file has no vocabulary. Only the
    file's metadata is read (validated as :func:`mase_lite.deploy.gguf_file.metadata` validates it)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    gguf = gguf_package()
    meta = gguf_file.metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None
    if kind not in ("bert", "gpt2"):
        raise ExportError(f"{path}: tokenizer.ggml.model = {short(kind)} has no reader here; readable: bert, gpt2")
    tokens = _strings(path, meta, "tokenizer.ggml.tokens")
    if not tokens:
        raise ExportError(f"{path}: tokenizer.ggml.tokens is missing or empty")
    ids = {key: meta.get(f"tokenizer.ggml.{key}") for _, key in ROLES}
    for key, token_id in ids.items():
        if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int)):
            raise ExportError(f"{path}: tokenizer.ggml.{key} = {short(token_id)}: give a token id")
    types = meta.get("tokenizer.ggml.token_type", [gguf.TokenType.NORMAL] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens):
        raise ExportError(f"{path}: tokenizer.ggml.token_type = {short(types)}: give one type per token "
                          f"({len(tokens)})")
    control = {i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL}
    if kind == "bert":
        vocab = {}
        for i, token in enumerate(tokens):
            spelled = token if i in control else token[1:] if token.startswith("\u2581") else "##" + token
            vocab.setdefault(spelled, i)
        unk = 0 if ids["unknown_token_id"] is None else ids["unknown_token_id"]
        if not 0 <= unk < len(tokens):
            raise ExportError(f"{path}: tokenizer.ggml.unknown_token_id = {unk}: give a token id below {len(tokens)}")
        backend = Tokenizer(models.WordPiece(vocab=vocab, unk_token=tokens[unk], max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
    else:
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in _strings(path, meta, "tokenizer.ggml.merges") or []]
        for i, merge in enumerate(merges):
            if len(merge) != 2 or not all(merge) or not all(part in vocab for part in (*merge, "".join(merge))):
                raise ExportError(f"{path}: tokenizer.ggml.merges[{i}] = {short(' '.join(merge))}: give two tokens "
                                  "of the vocabulary, separated by a space, whose join is one too")
        backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        splits = PRE_SPLITS.get(meta.get("tokenizer.ggml.pre"))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if splits is None else \
            pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        backend.decoder = decoders.ByteLevel()
    # control tokens (a chat template's <|im_start|>, <|im_end|>) are whole special tokens, as llama.cpp parses them
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in sorted(control)])
    roles = {role: tokens[ids[key]] for role, key in ROLES if ids[key] is not None and 0 <= ids[key] < len(tokens)}
    carried = {key: meta[key] for key, kind in CARRIED.items() if isinstance(meta.get(key), kind)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_input_names=["input_ids", "attention_mask"],
                                        gguf_metadata=carried, **roles)
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        tokenizer.chat_template = template
    return tokenizer
