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
MARKER = ".mase_lite_export.json"  # a file naming the writer: what tells a previous export at a path
NEAREST = ("int4 or int8 weights per channel or group (scaled_integer, W4A16 / W8A16), scaled_float e4m3 (FP8), "
           "mxfp e2m1 in blocks of 32, or nvfp4 with per_tensor global_scale (NVFP4)")
NVFP4_ARGS = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16,
              "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}
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
# Reading others' directories lives in compressed_tensors_import (hostile files refused in one line); these names stay
# importable from here.

from mase_lite.deploy.compressed_tensors_import import (  # noqa: E402,F401
    READ_FORMATS, _decoded, is_checkpoint, nvfp4_amax_of, read, unpack_rows,
)
