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

>>> import torch
>>> args = weight_args({"name": "scaled_integer", "width": 4, "symmetric": True, "full_range": False,
...                     "granularity": "group", "group_size": 128, "clip": 1.0, "scale_dtype": "float16", "scale": None},
...                    "l", (8, 256))
>>> args
{'num_bits': 4, 'type': 'int', 'symmetric': True, 'strategy': 'group', 'group_size': 128, 'dynamic': False}
"""

from __future__ import annotations

import json
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.deploy.layers import ExportError, Layer, linear_layers, other_quantized_layers, unsupported
from mase_lite.files import follow_umask, staged_directory
from mase_lite.nn.disk_weights import streamed
from mase_lite.nn.quant_functional import QuantizedFunction
from mase_lite.numerics.codes import offset_values, pack_bits

TARGET = "compressed-tensors"
NEAREST = ("int4 or int8 weights per channel or group (scaled_integer, W4A16 / W8A16), scaled_float e4m3 (FP8), "
           "mxfp e2m1 in blocks of 32, or nvfp4 with per_tensor global_scale (NVFP4)")
NVFP4_ARGS = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16,
              "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a sharded checkpoint's map of tensors to files


FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def write(mg, path: str | Path, tokenizer: Any = None, float_dtype: str = "float32") -> dict[str, Any]:
    """Write ``mg`` (a captured graph or a module-mode model of a transformers model) to the directory ``path``;
    ``float_dtype``: the dtype of the tensors that are not quantized (embeddings, norms, float layers), and the
    config's, as checkpoints are usually shipped (float32 keeps the tool's numerics exactly). A model streamed
    from disk (:mod:`mase_lite.nn.disk_weights`) is written one block at a time, one shard per block."""
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
        if not written.groups:
            raise ExportError(f"{TARGET}: the model has no quantized Linear layer to export")
        if len(parts) > 1:
            sizes = sum(f.stat().st_size for f in tmp.glob("*.safetensors"))
            (tmp / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": sizes}, "weight_map": written.files}, indent=2))
        config = _config(hf, written, float_dtype)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
        if getattr(hf, "generation_config", None) is not None and hf.can_generate():
            hf.generation_config.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
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
    inputs = input_args(layer)
    if fmt["name"] == "mxfp":
        tensors = _mxfp4_tensors(layer)
        form = "mxfp4-pack-quantized"
    elif fmt["name"] == "nvfp4":
        tensors = _nvfp4_tensors(layer)
        form = "nvfp4-pack-quantized"
    elif fmt["name"] == "scaled_float":
        rows = layer.codes.shape[0]
        scale = layer.codes.side["scale"]
        tensors = {"weight": layer.codes.unpacked().to(torch.uint8).view(torch.float8_e4m3fn).contiguous(),
                   "weight_scale": scale.reshape(rows, 1) if weights["strategy"] == "channel" else scale.contiguous()}
        form = "float-quantized"
    else:
        tensors = _int_tensors(layer, weights)
        form = "int-quantized" if inputs is not None and weights["num_bits"] == 8 else "pack-quantized"
        if form == "int-quantized":  # int8 codes as they are, and the zero point unpacked
            tensors = {"weight": _signed_codes(layer), "weight_scale": tensors["weight_scale"]}
            if not weights["symmetric"] and layer.codes.format["name"] == "scaled_integer":
                tensors["weight_zero_point"] = (layer.codes.side["zero_point"].to(torch.int64) - 128).to(torch.int8)
    if inputs is not None and inputs.get("global_scale") is not None:
        tensors["input_global_scale"] = inputs.pop("global_scale")
    elif inputs is not None and inputs.get("scale") is not None:
        tensors["input_scale"] = torch.tensor([inputs.pop("scale")], dtype=torch.float32)
    elif inputs is not None:
        inputs.pop("scale")
    return {"weights": weights, "input_activations": inputs, "output_activations": None, "format": form}, tensors


def weight_args(fmt: dict[str, Any], layer: str, shape: tuple[int, ...]) -> dict[str, Any]:
    """compressed-tensors' quantization args of a weight format; refused where it has none."""
    name, columns = fmt["name"], shape[-1]
    if name == "scaled_integer":
        if fmt["width"] > 8:
            raise unsupported(TARGET, layer, f"{fmt['width']}-bit scaled_integer", "at most 8 bits")
        strategy = {"tensor": "tensor", "channel": "channel", "group": "group"}[fmt["granularity"]]
        group = fmt["group_size"] if strategy == "group" else None
        if group is not None and columns % group:
            raise unsupported(TARGET, layer, f"groups of {group} over {columns} columns (a short last group)",
                              "a group size that divides the columns")
        return {"num_bits": fmt["width"], "type": "int", "symmetric": fmt["symmetric"], "strategy": strategy,
                "group_size": group, "dynamic": False}
    if name == "integer":
        if fmt["width"] > 8:
            raise unsupported(TARGET, layer, f"{fmt['width']}-bit integer", "at most 8 bits")
        return {"num_bits": fmt["width"], "type": "int", "symmetric": fmt["signed"], "strategy": "tensor",
                "group_size": None, "dynamic": False}
    if name == "mxint":
        if columns % fmt["block_size"]:
            raise unsupported(TARGET, layer, f"mxint blocks of {fmt['block_size']} over {columns} columns",
                              "blocks that tile a row")
        return {"num_bits": fmt["element_width"], "type": "int", "symmetric": True, "strategy": "group",
                "group_size": fmt["block_size"], "dynamic": False}
    if name == "mxfp" and fmt["element_format"] == "e2m1" and fmt["block_size"] == 32 and columns % 32 == 0:
        return {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
                "dynamic": False, "scale_dtype": "torch.uint8"}
    if name == "scaled_float" and fmt["element"] == "e4m3" and fmt["scale"] is None:
        strategy, group = fmt["granularity"], fmt["group_size"] if fmt["granularity"] == "group" else None
        if group is not None and columns % group:
            raise unsupported(TARGET, layer, f"groups of {group} over {columns} columns (a short last group)",
                              "a group size that divides the columns")
        return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "group_size": group,
                "dynamic": False}
    if name == "nvfp4" and fmt["per_tensor"] == "global_scale" and columns % 16 == 0:
        return dict(NVFP4_ARGS)
    described = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
    raise unsupported(TARGET, layer, f"weight format {name} ({described})", NEAREST)


def input_args(layer: Layer) -> dict[str, Any] | None:
    """compressed-tensors' args of the layer's input activations (with ``scale``: the static one), or None."""
    fmt = layer.data_in
    if fmt is None:
        return None
    if fmt["name"] == "nvfp4" and fmt["per_tensor"] == "global_scale" and isinstance(fmt["tensor_amax"], float):
        if layer.weight_format is None or layer.weight_format["name"] != "nvfp4":
            raise unsupported(TARGET, layer.name, "NVFP4 activations beside a weight that is not NVFP4", "NVFP4 weights")
        from mase_lite.numerics.scaled import nvfp4_global_scale

        amax = torch.tensor(fmt["tensor_amax"], dtype=torch.float32)
        global_scale = _written_global_scale(nvfp4_global_scale(amax)).reshape(1)
        return {**NVFP4_ARGS, "dynamic": "local", "global_scale": global_scale}
    if fmt["name"] == "scaled_float" and fmt["element"] == "e4m3" and fmt["granularity"] in ("tensor", "channel") \
            and not (fmt["granularity"] == "channel" and fmt["scale"] is not None):
        strategy = "tensor" if fmt["granularity"] == "tensor" else "token"
        return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "group_size": None,
                "dynamic": fmt["scale"] is None, "scale": fmt["scale"]}
    exact = (fmt["name"] == "scaled_integer" and fmt["width"] == 8 and fmt["symmetric"] and fmt["full_range"]
             and fmt["clip"] == 1.0 and fmt["scale_dtype"] == "float32" and fmt["granularity"] in ("tensor", "channel"))
    if not exact or (fmt["granularity"] == "channel" and fmt["scale"] is not None):
        raise unsupported(TARGET, layer.name, f"activation format {fmt['name']} "
                          f"({', '.join(f'{k}={v}' for k, v in fmt.items() if k != 'name')})",
                          "8-bit scaled_integer activations with full_range true (its grid), per tensor with a static "
                          "scale or dynamic per tensor or per token (granularity channel); the same in scaled_float "
                          "e4m3 (FP8); or nvfp4 with per_tensor "
                          "global_scale and a calibrated tensor_amax beside nvfp4 weights")
    strategy = "tensor" if fmt["granularity"] == "tensor" else "token"
    return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": strategy, "group_size": None,
            "dynamic": fmt["scale"] is None, "scale": fmt["scale"]}


def _written_global_scale(scale: Tensor) -> Tensor:
    """An NVFP4 global scale as written: 1 where it is infinite (a tensor of zeros, whose codes are all zero under
    any scale), as compressed-tensors has it."""
    return torch.where(torch.isfinite(scale), scale, torch.ones_like(scale)).float()


def _signed_codes(layer: Layer) -> Tensor:
    """The weight's codes as compressed-tensors' signed integers (int8): offset codes less ``2**(bits-1)``."""
    return offset_values(layer.codes.unpacked(), layer.codes.bits).to(torch.int8)


def _int_tensors(layer: Layer, weights: dict[str, Any]) -> dict[str, Tensor]:
    """``weight_packed`` (int32, dense), ``weight_scale``, ``weight_shape`` and, asymmetric, ``weight_zero_point``."""
    codes, fmt, bits = layer.codes, layer.codes.format, weights["num_bits"]
    rows = codes.shape[0] if len(codes.shape) == 2 else 1
    unsigned = codes.unpacked().reshape(rows, -1)
    if fmt["name"] == "integer" and not fmt["signed"]:  # unsigned codes: zero point -2**(w-1) in CT's signed codes
        scale = torch.tensor([2.0 ** -fmt["frac_width"]])
        zero = torch.full((1,), -(1 << (bits - 1)), dtype=torch.int8)
        return {"weight_packed": pack_rows(unsigned, bits), "weight_scale": scale, "weight_shape": _shape(codes),
                "weight_zero_point": zero}
    if fmt["name"] == "integer":
        return {"weight_packed": pack_rows(unsigned, bits), "weight_scale": torch.tensor([2.0 ** -fmt["frac_width"]]),
                "weight_shape": _shape(codes)}
    if fmt["name"] == "mxint":
        scale = codes.side["scale"]
        if bool((scale == 0xFF).any()):
            raise unsupported(TARGET, layer.name, "an MX block holding NaN or Inf", "finite weights")
        exponent = scale.to(torch.float64) - 127 - (fmt["element_width"] - 2)
        return {"weight_packed": pack_rows(unsigned, bits), "weight_scale": torch.pow(2.0, exponent).float(),
                "weight_shape": _shape(codes)}
    side = codes.side
    if "scale_exponent" in side:
        exponent = side["scale_exponent"].to(torch.float64)
        scale = torch.where(exponent == -128, 0.0, torch.pow(2.0, exponent)).float()
    else:
        scale = side["scale"]
    out = {"weight_packed": pack_rows(unsigned, bits), "weight_scale": scale.contiguous(), "weight_shape": _shape(codes)}
    if not fmt["symmetric"]:  # CT's zero point in its signed codes: ours less 2**(w-1)
        zero = side["zero_point"].to(torch.int64)
        if weights["strategy"] in ("group", "channel"):
            out["weight_zero_point"] = pack_rows(zero.t(), bits).t().contiguous()
        else:
            out["weight_zero_point"] = (zero - (1 << (bits - 1))).to(torch.int8)
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


def _shape(codes) -> Tensor:
    return torch.tensor(list(codes.shape), dtype=torch.int64)


def _mxfp4_tensors(layer: Layer) -> dict[str, Tensor]:
    """E2M1 codes two per byte (low nibble first) and the E8M0 scale codes."""
    codes = layer.codes
    scale = codes.side["scale"]
    if bool((scale == 0xFF).any()):
        raise unsupported(TARGET, layer.name, "an MX block holding NaN or Inf", "finite weights")
    rows, columns = codes.shape
    packed = pack_bits(codes.unpacked(), 4).reshape(rows, columns // 2)
    return {"weight_packed": packed, "weight_scale": scale.contiguous()}


def _nvfp4_tensors(layer: Layer) -> dict[str, Tensor]:
    """E2M1 codes two per byte (low nibble first), the E4M3 block scales and the float32 global scale."""
    codes = layer.codes
    rows, columns = codes.shape
    return {"weight_packed": pack_bits(codes.unpacked(), 4).reshape(rows, columns // 2),
            "weight_scale": codes.side["block_scale"].contiguous(),
            "weight_global_scale": _written_global_scale(codes.side["global_scale"].reshape(1))}


# Import ------------------------------------------------------------------------------------------------

READ_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "mxfp4-pack-quantized", "nvfp4-pack-quantized")


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory whose ``config.json`` says compressed-tensors."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        quantization = json.loads(config.read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(quantization, dict) and quantization.get("quant_method") == "compressed-tensors"


def read(path: str | Path, auto_class: Any) -> nn.Module:
    """The model of a compressed-tensors directory (as llm-compressor writes it) with each quantized Linear a
    quantized layer of the equivalent format holding the stored values (``auto_class``: the task's transformers
    Auto class). The files are data: the model is built from its config's ``model_type`` through transformers'
    registry (no ``auto_map``, no code), the tensors are read with safetensors."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = Path(path)
    config_dict = _json(path / "config.json")
    quantization = config_dict.pop("quantization_config")
    model_type = config_dict.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ExportError(f"{path / 'config.json'}: model_type {model_type!r} is not a model type transformers knows")
    status = quantization.get("quantization_status")
    if status != "compressed":
        raise ExportError(f"{path}: quantization_status {status!r}: only compressed checkpoints store codes")
    for key in ("auto_map", "quantization_config"):
        config_dict.pop(key, None)
    try:
        config = CONFIG_MAPPING[model_type].from_dict(config_dict)
        model = auto_class.from_config(config)
    except (ValueError, TypeError) as err:
        raise ExportError(f"{path / 'config.json'}: not a valid {model_type} config: {err}") from None
    tensors = _read_tensors(path)
    quantized = _quantize_groups(model, quantization, tensors, path)
    state = {k: v for k, v in tensors.items() if k.rpartition(".")[0] not in quantized}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {n for n in missing if n.endswith(".weight") and getattr(config, "tie_word_embeddings", False)}
    left = [n for n in missing if n.rpartition(".")[0] not in quantized and "_quantizer." not in n and n not in tied]
    if left or unexpected:
        raise ExportError(f"{path}: the checkpoint does not fit a {type(model).__name__} of its config "
                          f"({', '.join((left or unexpected)[:5])})")
    return model.eval()


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ExportError(f"{path}: not a readable JSON file: {err}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a JSON object")
    return data


def _read_tensors(path: Path) -> dict[str, Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{path}: no .safetensors file")
    tensors: dict[str, Tensor] = {}
    for file in files:
        try:
            tensors.update(safetensors.torch.load_file(str(file)))
        except (OSError, ValueError, RuntimeError) as err:
            raise ExportError(f"{file} is not a readable safetensors file: {err}") from None
    return tensors


def _matches(name: str, module: nn.Module, target: str) -> bool:
    """compressed-tensors' target rule: the module's name, ``re:`` a regex from its start, or a class name."""
    if target.startswith("re:"):
        return re.match(target.removeprefix("re:"), name) is not None
    return target == name or any(cls.__name__ == target for cls in type(module).__mro__)


def _quantize_groups(model: nn.Module, quantization: dict[str, Any], tensors: dict[str, Tensor], path: Path) -> set[str]:
    """Every Linear a config group targets (and ``ignore`` does not), replaced by its quantized layer."""
    from mase_lite.nn.quantized import quantize_module

    ignore = quantization.get("ignore") or []
    groups = quantization.get("config_groups") or {}
    done: set[str] = set()
    for group_name, group in groups.items():
        form = group.get("format") or quantization.get("format")
        if form not in READ_FORMATS:
            raise ExportError(f"{path}: config group {group_name!r} is in format {form!r}, which has no equivalent "
                              f"here; readable: {', '.join(READ_FORMATS)}")
        for name, module in list(model.named_modules()):
            if type(module) is not nn.Linear or name in done or any(_matches(name, module, i) for i in ignore):
                continue
            if not any(_matches(name, module, t) for t in group.get("targets", [])):
                continue
            fmt, data_in, encoded = _layer_codes(name, module, group, form, tensors, path)
            layer = quantize_module(module, {"weight": fmt, **({"data_in": data_in} if data_in else {})})
            layer.restore_parameter("weight", encoded)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, layer)
            if f"{name}.bias" in tensors:
                with torch.no_grad():
                    layer.bias.copy_(tensors[f"{name}.bias"])
            done.add(name)
    return done


def _layer_codes(name: str, module: nn.Module, group: dict, form: str, tensors: dict[str, Tensor], path: Path):
    """The weight format, the input format and the stored codes of one targeted Linear."""
    from mase_lite.numerics.codes import encode

    weights = group.get("weights") or {}
    rows, columns = module.out_features, module.in_features

    def tensor(key: str) -> Tensor:
        if f"{name}.{key}" not in tensors:
            raise ExportError(f"{path}: layer {name!r} lacks tensor {name}.{key}")
        return tensors[f"{name}.{key}"]

    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    if form == "mxfp4-pack-quantized":
        fmt = {"name": "mxfp", "element_format": "e2m1", "block_size": 32}
        packed, scale = tensor("weight_packed"), tensor("weight_scale")
        codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(rows, columns).to(torch.int64)
        side = {"scale": scale.to(torch.uint8)}
    elif form == "nvfp4-pack-quantized":
        fmt = {"name": "nvfp4", "per_tensor": "global_scale"}
        packed = tensor("weight_packed")
        codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(rows, columns).to(torch.int64)
        side = {"global_scale": tensor("weight_global_scale").float().reshape(1),
                "block_scale": tensor("weight_scale").to(torch.float8_e4m3fn)}
    elif form == "float-quantized" and kind == "float" and bits == 8 and strategy in ("tensor", "channel", "group"):
        weight, scale = tensor("weight"), tensor("weight_scale").float()
        if weight.dtype != torch.float8_e4m3fn:
            raise ExportError(f"{path}: layer {name!r}: float-quantized weights of {weight.dtype}, not float8_e4m3fn")
        fmt = {"name": "scaled_float", "granularity": strategy, "group_size": weights.get("group_size") or 128}
        codes = weight.view(torch.uint8).to(torch.int64)
        side = {"scale": scale.reshape(1) if strategy == "tensor" else scale.reshape(rows, -1)}
    elif form != "float-quantized" and kind == "int" and isinstance(bits, int) and 1 < bits <= 8 and strategy in ("tensor", "channel", "group"):
        scale = tensor("weight_scale")
        granularity = strategy
        group_size = weights.get("group_size") or 128
        fmt = {"name": "scaled_integer", "width": bits, "symmetric": bool(weights.get("symmetric", True)),
               "granularity": granularity, "group_size": group_size,
               "scale_dtype": str(scale.dtype).removeprefix("torch.")}
        if fmt["symmetric"]:
            fmt["full_range"] = True
        if form == "int-quantized":
            codes = tensor("weight").to(torch.int64) + (1 << (bits - 1))
        else:
            codes = unpack_rows(tensor("weight_packed"), bits, columns)
        side = {"scale": scale.reshape(1) if strategy == "tensor" else scale}
        if not fmt["symmetric"]:
            zero = tensor("weight_zero_point")
            if form == "pack-quantized" and strategy in ("group", "channel"):
                zero = unpack_rows(zero.t().contiguous(), bits, rows).t()
            else:
                zero = zero.to(torch.int64) + (1 << (bits - 1))
            side["zero_point"] = zero.reshape(side["scale"].shape).to(torch.uint8)
    else:
        raise ExportError(f"{path}: layer {name!r}: weights {json.dumps(weights)} have no equivalent format here "
                          "(int of 2-8 bits per tensor, channel or group, FP8 E4M3, MXFP4 or NVFP4)")
    values = _decoded(fmt, codes, side, module.weight.dtype)
    encoded = encode(values, fmt, side=side, values=values)
    if encoded is None:
        raise ExportError(f"{path}: layer {name!r}: its codes do not decode to values of {fmt['name']}")
    return fmt, _input_format(name, group.get("input_activations"), tensors, path), encoded


def _decoded(fmt: dict, codes: Tensor, side: dict[str, Tensor], dtype: torch.dtype) -> Tensor:
    from mase_lite.numerics.codes import Encoded, decode, pack_bits
    from mase_lite.numerics.registry import parse_format

    number_format, params = parse_format(fmt)
    bits = number_format.codec.bits(params)
    return decode(Encoded(number_format.as_dict(params), bits, pack_bits(codes.reshape(-1), bits), dict(side),
                          tuple(codes.shape), dtype, codes))


def _input_format(name: str, args: dict | None, tensors: dict[str, Tensor], path: Path) -> dict[str, Any] | None:
    if not args:
        return None
    if args.get("type") == "float" and args.get("num_bits") == 4 and args.get("group_size") == 16:
        scale = tensors.get(f"{name}.input_global_scale")
        amax = None if scale is None else nvfp4_amax_of(scale.float().reshape(-1)[0])
        if amax is None:
            raise ExportError(f"{path}: layer {name!r}: NVFP4 input activations need an input_global_scale of a "
                              "finite amax")
        return {"name": "nvfp4", "per_tensor": "global_scale", "tensor_amax": amax}
    kind = args.get("type")
    if not (kind in ("int", "float") and args.get("num_bits") == 8 and args.get("symmetric", True)
            and args.get("strategy") in ("tensor", "token")):
        raise ExportError(f"{path}: layer {name!r}: input activations {json.dumps(args)} have no equivalent format here "
                          "(8-bit symmetric int or FP8 per tensor or token, or NVFP4)")
    fmt = {"name": "scaled_integer", "width": 8, "full_range": True} if kind == "int" else {"name": "scaled_float"}
    fmt["granularity"] = "tensor" if args["strategy"] == "tensor" else "channel"
    if not args.get("dynamic", False):
        scale = tensors.get(f"{name}.input_scale")
        if scale is None or args["strategy"] != "tensor":
            raise ExportError(f"{path}: layer {name!r}: static input activations need a per-tensor input_scale")
        fmt["scale"] = float(scale.float().reshape(-1)[0])
    return fmt


def nvfp4_amax_of(global_scale: Tensor) -> float | None:
    """The float32 amax whose NVFP4 global scale is ``global_scale`` exactly (None if there is none).

    >>> nvfp4_amax_of(torch.tensor(336.0))
    8.0
    """
    from mase_lite.numerics.scaled import nvfp4_global_scale

    guess = (torch.tensor(2688.0) / global_scale.float()).reshape(1)
    if not bool(torch.isfinite(guess).all()) or float(guess) <= 0:
        return None
    bits = guess.view(torch.int32)
    for step in (0, -1, 1, -2, 2, -3, 3):
        amax = (bits + step).view(torch.float32)
        if torch.equal(nvfp4_global_scale(amax), global_scale.float().reshape(1)):
            return float(amax)
    return None


def unpack_rows(words: Tensor, bits: int, columns: int) -> Tensor:
    """The inverse of :func:`pack_rows`: each row's first ``columns`` unsigned codes (int64)."""
    from mase_lite.numerics.codes import unpack_bits

    if words.dtype != torch.int32 or words.dim() != 2:
        raise ExportError(f"packed codes must be a 2-D int32 tensor, got {words.dtype} of shape {list(words.shape)}")
    return torch.stack([unpack_bits(row.contiguous().view(torch.uint8), bits, columns) for row in words])
