"""compressed-tensors: a Hugging Face model directory that transformers (with the ``compressed-tensors`` package),
vLLM and SGLang load, written from the stored codes of each quantized Linear.

Schemes, by the weight's format (every value exact: the runtime decodes the same codes and scales):

- ``scaled_integer`` of up to 8 bits per tensor, channel or group (symmetric, the full two's complement
  range, or with zero points) and ``integer`` (a power-of-two scale per tensor): ``pack-quantized`` (codes
  packed into int32, ``weight_scale``, ``weight_zero_point``); with int8 activations, ``int-quantized``;
- ``mxint`` (blocks of 32 or any size that tiles a row): int codes in groups of the block with float32
  power-of-two scales, ``pack-quantized``;
- ``mxfp`` E2M1 in blocks of 32: ``mxfp4-pack-quantized`` (E2M1 nibbles, E8M0 scales);
- ``scaled_float`` E4M3 per tensor, channel or group: ``float-quantized`` (``float8_e4m3fn`` weights, float32
  ``weight_scale``); with FP8 activations (static per tensor, dynamic per tensor or token), vLLM's FP8 W8A8;
- ``nvfp4`` with ``per_tensor="global_scale"`` (compressed-tensors' own convention, the ``NVFP4`` preset):
  ``nvfp4-pack-quantized`` (E2M1 nibbles, E4M3 scales per 16, ``weight_global_scale``); with NVFP4 input
  activations of a calibrated ``tensor_amax`` (``input_global_scale``), compressed-tensors' W4A4 ``NVFP4``.

Activations (``data_in``): ``scaled_integer`` with ``full_range`` (compressed-tensors' own grid), 8 bits,
per tensor with a static scale (``input_scale``) or dynamic per tensor or per token; NVFP4 as above. Everything else is
refused before anything is written, naming the layer, its format and the nearest scheme. Float Linears go to
``ignore``; a quantized bias is written as its (exact) float values.

Each format says how it is held here in its own module (``register_mapping(name, "compressed-tensors", scheme,
tensors)``): ``scheme(fmt, shape)`` gives the weight's quantization args (with ``format``, the compression format,
where the format fixes it; an int scheme's form is chosen here) or None, or raises ``Unfit``; ``tensors(codes,
args)`` gives an int scheme's ``weight_scale`` and signed ``zero_point`` (the codes are packed here) or the other
schemes' tensors as written. Activations: ``register_mapping(name, "compressed-tensors/input", scheme)``,
``scheme(fmt, weight_fmt)`` the input args (with a static ``scale`` or ``global_scale``) or None.

>>> import torch
>>> args = weight_args({"name": "scaled_integer", "width": 4, "symmetric": True, "full_range": False,
...                     "granularity": "group", "group_size": 128, "clip": 1.0, "scale_dtype": "float16", "scale": None},
...                    "l", (8, 256))
>>> args
{'num_bits': 4, 'type': 'int', 'symmetric': True, 'strategy': 'group', 'group_size': 128, 'dynamic': False}
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.deploy.layers import ExportError, Layer, linear_layers, other_quantized_layers, unsupported
from mase_lite.infra.files import follow_umask, staged_directory
from mase_lite.runtime.disk_weights import streamed
from mase_lite.layers.quant_functional import QuantizedFunction
from mase_lite.numerics.codes import offset_values, pack_bits
from mase_lite.numerics.registry import Unfit, target_mapping

TARGET = "compressed-tensors"
MARKER = ".mase_lite_export.json"  # a file naming the writer: what tells a previous export at a path
NEAREST = ("int4 or int8 weights per channel or group (scaled_integer, W4A16 / W8A16), scaled_float e4m3 (FP8), "
           "mxfp e2m1 in blocks of 32, or nvfp4 with per_tensor global_scale (NVFP4)")
NEAREST_ACTIVATION = ("8-bit scaled_integer activations with full_range true (its grid), per tensor with a static "
                      "scale or dynamic per tensor or per token (granularity channel); the same in scaled_float "
                      "e4m3 (FP8); or nvfp4 with per_tensor global_scale and a calibrated tensor_amax beside nvfp4 "
                      "weights")
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a sharded checkpoint's map of tensors to files


FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def is_export(path: Path) -> bool:
    """Whether ``path`` is a directory :func:`write` wrote (it holds the writer's marker file)."""
    marker = path / MARKER
    if not path.is_dir() or path.is_symlink() or not marker.is_file() or marker.is_symlink():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == TARGET
    except (OSError, ValueError, AttributeError):
        return False


def write(mg, path: str | Path, tokenizer: Any = None, float_dtype: str = "float32") -> dict[str, Any]:
    """Write ``mg`` (a captured graph or a module-mode model of a transformers model) to the directory ``path`` (a
    model without quantized layers as a plain Hugging Face directory); ``float_dtype``: the dtype of the tensors that are not quantized (embeddings, norms, float layers), and the
    config's, as checkpoints are usually shipped (float32 keeps the tool's numerics exactly). A model streamed
    from disk (:mod:`mase_lite.runtime.disk_weights`) is written one block at a time, one shard per block."""
    if float_dtype not in FLOAT_DTYPES:
        raise ExportError(f"float_dtype={float_dtype!r} is unknown; allowed: {', '.join(FLOAT_DTYPES)}")
    model, hf = mg.model, _hf_model(mg)
    refused = other_quantized_layers(model)
    if refused:
        raise unsupported(TARGET, refused[0], "a quantized layer that is not a Linear", "quantize Linear layers only")
    functions = [n for n, m in model.named_modules() if isinstance(m, QuantizedFunction)]
    if functions:
        raise unsupported(TARGET, functions[0], "a quantized matmul/add/mul (only Linear layers are schemes)",
                          "leave functional ops float")
    disk = streamed(hf)
    parts = disk.parts() if disk is not None else [("", None)]
    dtype = getattr(torch, float_dtype)
    written = _Written()
    path = Path(path)
    with staged_directory(path) as tmp:
        for i, (prefix, skip) in enumerate(parts):
            with disk.resident(prefix, skip=skip) if disk is not None else nullcontext():
                tensors = written.part(model, prefix, skip, dtype)
            name = WEIGHTS_FILE if len(parts) == 1 else f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            safetensors.torch.save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            written.files.update({key: name for key in tensors})
            del tensors
        if len(parts) > 1:
            sizes = sum(f.stat().st_size for f in tmp.glob("*.safetensors"))
            (tmp / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": sizes}, "weight_map": written.files}, indent=2))
        config = _config(hf, written, float_dtype)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
        if getattr(hf, "generation_config", None) is not None and hf.can_generate():
            hf.generation_config.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({"format": TARGET, "writer": "mase_lite"}))
        for file in tmp.rglob("*"):
            if file.is_file():
                follow_umask(file)
    return {"format": TARGET, "path": str(path), "groups": len(written.groups), "quantized": sorted(written.replaced),
            "ignore": written.ignore, "bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file())}


class _Written:
    """What the parts of a model written so far hold: config groups, float layers, quantized layers, files."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}
        self.ignore: list[str] = []
        self.replaced: set[str] = set()
        self.tied = False
        self.files: dict[str, str] = {}

    def part(self, model: nn.Module, prefix: str, skip: str | None, dtype: torch.dtype) -> dict[str, Tensor]:
        """The tensors of the module at ``prefix`` (but those under ``skip``), quantized layers as their schemes."""
        module = model.get_submodule(prefix)
        tensors, replaced = {}, set()
        for layer in linear_layers(module, skip=_relative(skip, prefix)):
            layer.name = f"{prefix}.{layer.name}" if prefix else layer.name
            scheme = layer_scheme(layer)
            if scheme is None:
                self.ignore.append(layer.name)
                continue
            config, layer_tensors = scheme
            key = json.dumps(config, sort_keys=True)
            self.groups.setdefault(key, {**config, "targets": []})["targets"].append(layer.name)
            tensors.update({f"{layer.name}.{k}": v for k, v in layer_tensors.items()})
            if layer.bias is not None:
                tensors[f"{layer.name}.bias"] = layer.bias.contiguous().to(dtype)
            replaced.add(layer.name)
        self.replaced |= replaced
        state = _float_state(module, prefix, skip, replaced)
        tied = _quantized_and_tied(module, prefix, replaced)
        self.tied = self.tied or bool(tied)
        state.update({name: t.detach() for name, t in tied.items()})
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        return {**state, **tensors}


def _relative(name: str | None, prefix: str) -> str | None:
    if name is None or not prefix:
        return name
    return name.removeprefix(f"{prefix}.")


def _config(hf: nn.Module, written: _Written, float_dtype: str) -> dict[str, Any]:
    config = hf.config.to_dict()
    config["architectures"] = [type(hf).__name__]
    config["dtype"] = float_dtype
    if written.tied:
        config["tie_word_embeddings"] = False
    if not written.groups:  # a float model: the plain Hugging Face directory a study starts from
        return config
    formats = sorted({g["format"] for g in written.groups.values()})
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": formats[0] if len(formats) == 1 else "mixed-precision",
        "quantization_status": "compressed",
        "config_groups": {f"group_{i}": group for i, group in enumerate(written.groups.values())},
        "ignore": written.ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
    }
    return config


def _hf_model(mg) -> nn.Module:
    hf = mg.source_model if hasattr(mg, "source_model") else mg.model
    from transformers import PreTrainedModel

    if not isinstance(hf, PreTrainedModel):
        raise ExportError(f"{TARGET} writes transformers models; this model is a {type(hf).__name__}")
    return hf


def _float_state(module: nn.Module, prefix: str, skip: str | None, replaced: set[str]) -> dict[str, Tensor]:
    """The tensors of ``module`` (at ``prefix``; none under ``skip``) but the quantized layers' weights, biases and
    quantizers, one name per tied group."""
    out, seen = {}, set()
    for local, tensor in module.state_dict(keep_vars=True).items():
        name = f"{prefix}.{local}" if prefix else local
        owner = name.rpartition(".")[0]
        if skip is not None and name.startswith(f"{skip}."):
            continue
        if owner in replaced or "_quantizer." in name or any(name.startswith(f"{r}.") for r in replaced):
            continue
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out[name] = tensor.detach().contiguous()
    return out


def _quantized_and_tied(module: nn.Module, prefix: str, replaced: set[str]) -> dict[str, Tensor]:
    """The float tensors a quantized layer shares with another module (a tied output head): written untied."""
    names: dict[int, list[str]] = {}
    params = {}
    for local, param in module.named_parameters(remove_duplicate=False):
        name = f"{prefix}.{local}" if prefix else local
        names.setdefault(id(param), []).append(name)
        params[name] = param
    tied = {}
    for group in names.values():
        if len(group) > 1 and any(n.rpartition(".")[0] in replaced for n in group):
            tied.update({n: params[group[0]] for n in group if n.rpartition(".")[0] not in replaced})
    return tied


def layer_scheme(layer: Layer) -> tuple[dict[str, Any], dict[str, Tensor]] | None:
    """The config group (weights, input activations, format) and the tensors of one layer; None for a float one."""
    if layer.data_out is not None:
        raise unsupported(TARGET, layer.name, f"an output format ({layer.data_out['name']})", "no output quantization")
    fmt = layer.weight_format
    if fmt is None:
        if layer.data_in is not None:
            raise unsupported(TARGET, layer.name, "quantized activations with a float weight", NEAREST)
        return None
    if layer.codes is None:
        raise unsupported(TARGET, layer.name, f"weight format {fmt['name']} (no stored codes for its values)", NEAREST)
    weights = weight_args(fmt, layer.name, layer.codes.shape)
    form = weights.pop("format", None)
    inputs = input_args(layer)
    try:
        held = target_mapping(fmt["name"], TARGET).tensors(layer.codes, weights)
    except Unfit as unfit:
        raise unsupported(TARGET, layer.name, unfit.why, unfit.nearest) from None
    if weights["type"] == "int":  # the format gives scales and signed zero points; the codes are packed here
        form = "int-quantized" if inputs is not None and weights["num_bits"] == 8 else "pack-quantized"
        tensors = _int_tensors(layer, weights, held, packed=form == "pack-quantized")
    else:
        tensors = held
    if inputs is not None and inputs.get("global_scale") is not None:
        tensors["input_global_scale"] = inputs.pop("global_scale")
    elif inputs is not None and inputs.get("scale") is not None:
        tensors["input_scale"] = torch.tensor([inputs.pop("scale")], dtype=torch.float32)
    elif inputs is not None:
        inputs.pop("scale")
    return {"weights": weights, "input_activations": inputs, "output_activations": None, "format": form}, tensors


def weight_args(fmt: dict[str, Any], layer: str, shape: tuple[int, ...]) -> dict[str, Any]:
    """compressed-tensors' quantization args of a weight format (with ``format``, its compression format, where the
    format fixes it); refused where it has none."""
    mapping = target_mapping(fmt["name"], TARGET)
    try:
        args = mapping.scheme(fmt, tuple(shape)) if mapping is not None else None
    except Unfit as unfit:
        raise unsupported(TARGET, layer, unfit.why, unfit.nearest) from None
    if args is None:
        described = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
        raise unsupported(TARGET, layer, f"weight format {fmt['name']} ({described})", NEAREST)
    return dict(args)


def input_args(layer: Layer) -> dict[str, Any] | None:
    """compressed-tensors' args of the layer's input activations (with ``scale`` or ``global_scale``: the static
    one), or None."""
    fmt = layer.data_in
    if fmt is None:
        return None
    mapping = target_mapping(fmt["name"], f"{TARGET}/input")
    try:
        args = mapping.scheme(fmt, layer.weight_format) if mapping is not None else None
    except Unfit as unfit:
        raise unsupported(TARGET, layer.name, unfit.why, unfit.nearest) from None
    if args is None:
        raise unsupported(TARGET, layer.name, f"activation format {fmt['name']} "
                          f"({', '.join(f'{k}={v}' for k, v in fmt.items() if k != 'name')})", NEAREST_ACTIVATION)
    return dict(args)


def _int_tensors(layer: Layer, weights: dict[str, Any], held: dict[str, Tensor], packed: bool) -> dict[str, Tensor]:
    """An int scheme's tensors: ``weight_packed`` (int32, dense; ``weight`` int8 where not ``packed``), ``weight_scale``,
    ``weight_shape`` and, asymmetric, ``weight_zero_point`` (packed per group or channel, int8 per tensor)."""
    codes, bits = layer.codes, weights["num_bits"]
    rows = codes.shape[0] if len(codes.shape) == 2 else 1
    out = {"weight_scale": held["weight_scale"]}
    if packed:
        out["weight_packed"] = pack_rows(codes.unpacked().reshape(rows, -1), bits)
        out["weight_shape"] = torch.tensor(list(codes.shape), dtype=torch.int64)
    else:
        out["weight"] = offset_values(codes.unpacked(), codes.bits).to(torch.int8)
    zero = held.get("zero_point")
    if zero is not None:
        grouped = packed and weights["strategy"] in ("group", "channel")
        out["weight_zero_point"] = (pack_rows((zero + (1 << (bits - 1))).t(), bits).t().contiguous() if grouped
                                    else zero.to(torch.int8))
    return out


def pack_rows(unsigned: Tensor, bits: int) -> Tensor:
    """Each row's ``bits``-bit unsigned codes packed densely, least significant bit first, into int32 words
    (compressed-tensors' ``pack_to_int32`` of the signed codes, which offsets them by ``2**(bits-1)`` first).

    >>> pack_rows(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]]), 4).tolist()
    [[-2023406815, 9]]
    """
    rows = []
    for row in unsigned:
        packed = pack_bits(row, bits)
        packed = torch.nn.functional.pad(packed, (0, -packed.numel() % 4))
        rows.append(packed.view(torch.int32))
    return torch.stack(rows)
