"""Import: a compressed-tensors directory (as llm-compressor writes it) as a model of this tool, each quantized Linear
a quantized layer of the equivalent format holding the stored values.

The directory is someone else's data, read so that whatever it holds is imported exactly or refused in one line (an
``ExportError`` naming the file and the field or tensor), never a traceback, a hang or a silently different model:

- ``config.json`` is read strictly (:mod:`mase_lite.infra.jsonio`) and each field this reader uses is checked for its
  type; the model is built from ``model_type`` through transformers' registry (no ``auto_map``, no code);
- a quantized checkpoint of another tool (``quant_method`` gptq, awq, bitsandbytes, fp8...) is refused by name:
  transformers would load it with its quantized layers left at random;
- what would change the model without this reader applying it (output activations, a KV-cache scheme, sparse
  compression, transforms, GPTQ's group index) is refused;
- the sizes the config declares are checked against the number of tensors and the memory before anything is
  built, and the model is laid out on the meta device and every tensor's header checked against it before
  anything is allocated;
- targets are matched in time linear in the names (:mod:`mase_lite.deploy.targets`); the tensors are read by
  :mod:`.shards` (regular files inside the directory, an index followed exactly, no tensor in two files, no NaN
  or infinity);
- codes and scales must decode to finite weights of the equivalent format, bit for bit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.deploy.layers import ExportError
from mase_lite.importers.shards import FLOAT, Shards, read_bytes, read_json
from mase_lite.deploy.targets import MAX_STATES, Targets, TargetError
from mase_lite.infra.errors import UserError, short
from mase_lite.infra.limits import check_fits, model_bytes

METHOD = "compressed-tensors"
READ_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "mxfp4-pack-quantized", "nvfp4-pack-quantized")
CONFIG = "config.json"
MODEL_DTYPES = ("float32", "bfloat16", "float16")
SCALES = ("F32", "F16", "BF16")  # the scale dtypes of the formats (scale_dtype)
INTS = ("I64", "I32", "I16", "I8", "U8", "BOOL")
MAX_CONFIG_STATES = 5 * MAX_STATES  # automaton states of all the regexes of a config
_COUNT = re.compile(r"(^|_)(layers?|depths?|blocks?|experts)$|^n_layers?$")  # counts of repeated modules (as limits')
_UNAPPLIED = {"kv_cache_scheme": "KV-cache quantization", "transform_config": "a transform (rotation) of the weights"}
_KINDS: dict[str, Callable[[Any], bool]] = {
    "an object": lambda v: isinstance(v, dict), "a list": lambda v: isinstance(v, list),
    "a string": lambda v: isinstance(v, str), "true or false": lambda v: type(v) is bool,
    "a positive integer": lambda v: type(v) is int and v > 0,
    "true, false or 'local'": lambda v: type(v) is bool or v == "local",
}
_ARGS = {"num_bits": "a positive integer", "type": "a string", "strategy": "a string", "group_size": "a positive integer",
         "symmetric": "true or false", "dynamic": "true, false or 'local'", "actorder": "a string"}
Spec = tuple[tuple[str, ...], tuple[int, ...]]  # a tensor's allowed dtypes (safetensors' names) and its shape


@dataclass
class _Group:
    """One config group: where it is in the config, its format, targets and quantization args."""

    where: str
    form: str
    targets: Targets
    weights: dict[str, Any]
    inputs: dict[str, Any] | None


@dataclass
class _Layer:
    """One targeted Linear: its group and the tensors its values are read from (key under the layer -> spec)."""

    group: _Group
    tensors: dict[str, Spec]


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory whose ``config.json`` declares a ``quantization_config``: a compressed-tensors
    checkpoint, or another tool's quantized one, which :func:`read` refuses by name. The config is read leniently
    here (NaN included, through a link anywhere), so that :func:`read`, not transformers, refuses what the strict
    reading refuses."""
    try:
        config = json.loads(read_bytes(Path(path) / CONFIG, None))
    except (ExportError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("quantization_config") is not None


def read(path: str | Path, auto_class: Any) -> nn.Module:
    """The model of a compressed-tensors directory with each quantized Linear a quantized layer of the equivalent
    format holding the stored values (``auto_class``: the task's transformers Auto class)."""
    root = Path(path)
    file = root / CONFIG
    config = read_json(file, root)
    groups, ignore = _quantization(config, file)
    build = auto_class.from_config
    with Shards(root) as shards:
        hf_config = _hf_config(config, len(shards.where), file)
        _check_size(build, hf_config, config, shards, file)
        with torch.device("meta"):
            skeleton = _built(build, hf_config, file)
        plan = _plan(skeleton, groups, ignore, shards, file)
        state = _float_state(skeleton, plan, shards)
        model = _built(build, hf_config, file)
        for name, layer in plan.items():
            _quantize(model, name, layer, shards)
        model.load_state_dict(_loaded_state(state, shards, type(model).__name__), strict=False)
    return model.eval()


# the config ------------------------------------------------------------------------------------------------

def _field(data: dict[str, Any], key: str, kind: str, where: str, file: Path) -> Any:
    """``data[key]`` if it is absent, null or of ``kind`` (a key of :data:`_KINDS`); else an ``ExportError``."""
    value = data.get(key)
    if value is None or _KINDS[kind](value):
        return value
    raise ExportError(f"{file}: {where}.{key} = {short(value)}: expected {kind}")


def _quantization(config: dict[str, Any], file: Path) -> tuple[list[_Group], Targets]:
    """The config groups and the ``ignore`` targets of the ``quantization_config``, every field checked."""
    where = "quantization_config"
    quantization = config.get(where)
    if not isinstance(quantization, dict):
        raise ExportError(f"{file}: {where} = {short(quantization)}: expected an object")
    method = quantization.get("quant_method")
    if method != METHOD:
        raise ExportError(f"{file}: {where}.quant_method = {short(method)}: not readable here (transformers would leave "
                          f"its quantized layers at random); readable: {METHOD!r} directories, as llm-compressor "
                          "writes them, and GGUF files")
    status = quantization.get("quantization_status")
    if status != "compressed":
        raise ExportError(f"{file}: {where}.quantization_status = {short(status)}: only compressed checkpoints store "
                          "codes")
    for key, what in _UNAPPLIED.items():
        if quantization.get(key):
            raise ExportError(f"{file}: {where}.{key} = {short(quantization[key])}: {what} has no equivalent here")
    sparsity = _field(quantization, "sparsity_config", "an object", where, file) or {}
    if sparsity.get("format", "dense") != "dense":
        raise ExportError(f"{file}: {where}.sparsity_config.format = {short(sparsity['format'])}: sparse compression "
                          "has no equivalent here")
    default = _field(quantization, "format", "a string", where, file)
    states = [MAX_CONFIG_STATES]  # what the config's regexes may still take
    ignore = _targets(quantization, "ignore", where, file, states)
    groups = []
    for name, group in (_field(quantization, "config_groups", "an object", where, file) or {}).items():
        at = f"{where}.config_groups.{name}"
        if not isinstance(group, dict):
            raise ExportError(f"{file}: {at} = {short(group)}: expected an object")
        form = _field(group, "format", "a string", at, file) or default
        if form not in READ_FORMATS:
            raise ExportError(f"{file}: {at}.format: config group {name!r} is in format {form!r}, which has no "
                              f"equivalent here; readable: {', '.join(READ_FORMATS)}")
        if group.get("output_activations") is not None:
            raise ExportError(f"{file}: {at}.output_activations = {short(group['output_activations'])}: output "
                              "quantization has no equivalent here")
        weights, inputs = (_args(group, key, at, file) for key in ("weights", "input_activations"))
        groups.append(_Group(at, form, _targets(group, "targets", at, file, states), weights or {}, inputs))
    return groups, ignore


def _targets(data: dict[str, Any], key: str, where: str, file: Path, states: list[int]) -> Targets:
    """``data[key]`` as targets, their regexes taking at most ``states[0]`` automaton states (less what they take)."""
    listed = _field(data, key, "a list", where, file) or []
    try:
        targets = Targets(listed, states[0])
    except TargetError as err:
        raise ExportError(f"{file}: {where}.{key}.{err.index} = {short(listed[err.index])}: {err}") from None
    states[0] -= targets.states
    return targets


def _args(group: dict[str, Any], key: str, where: str, file: Path) -> dict[str, Any] | None:
    """A group's quantization args (``weights``, ``input_activations``), each field this reader uses checked; a
    null one left out (its default applies)."""
    args = _field(group, key, "an object", where, file)
    if args is None:
        return None
    for name, kind in _ARGS.items():
        _field(args, name, kind, f"{where}.{key}", file)
    return {k: v for k, v in args.items() if v is not None}


def _hf_config(config: dict[str, Any], tensors: int, file: Path) -> Any:
    """The transformers config of ``config.json``, its counts of repeated modules checked against the ``tensors``
    the checkpoint holds first (building the config of 2**32 layers alone would take minutes)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ExportError(f"{file}: model_type {short(model_type)} is not a model type transformers knows")
    for key in ("dtype", "torch_dtype"):
        if config.get(key) not in (None, *MODEL_DTYPES):
            raise ExportError(f"{file}: {key} = {short(config[key])}: expected one of {', '.join(MODEL_DTYPES)}")
    for key, value in _counts(config):
        counts = value if isinstance(value, list) else [value]
        if all(type(c) is int for c in counts) and sum(counts) > tensors:
            raise ExportError(f"{file}: {key} = {short(value)}, but the checkpoint holds {tensors} tensors, fewer than "
                              "one per module it counts")
    fields = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    try:
        return CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as err:  # the config's own field checks (huggingface_hub's strict dataclasses among them)
        raise ExportError(f"{file}: not a valid {model_type} config: {_reason(err)}") from None


def _counts(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The fields of ``config`` (and of the configs in it: a vision-language model's ``text_config``) that count
    repeated modules: ``num_hidden_layers``, ``n_layer``, ``depths``, ``num_local_experts``..."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _counts(value, f"{prefix}{key}.")
        elif _COUNT.search(key):
            yield f"{prefix}{key}", value


def _check_size(build: Callable[[Any], nn.Module], hf_config: Any, config: dict[str, Any], shards: Shards,
                file: Path) -> None:
    """Refuse a model (measured on the meta device) and tensors that would not fit in memory."""
    sizes = sorted(((v, k) for k, v in config.items() if type(v) is int), reverse=True)[:3]
    what = f"a {hf_config.model_type} model of this config ({', '.join(f'{k} = {v}' for v, k in sizes)}) and its tensors"
    try:
        check_fits(str(file), model_bytes(build, hf_config, str(file)) + shards.nbytes, what)
    except UserError as err:
        raise ExportError(str(err)) from None


def _built(build: Callable[[Any], nn.Module], hf_config: Any, file: Path) -> nn.Module:
    try:
        return build(hf_config)
    except Exception as err:  # the model's own constructor refuses the config's values
        raise ExportError(f"{file}: the model cannot be built from this config ({_reason(err)})") from None


def _reason(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])[:300]


# the layers ------------------------------------------------------------------------------------------------

def _plan(skeleton: nn.Module, groups: list[_Group], ignore: Targets, shards: Shards,
          file: Path) -> dict[str, _Layer]:
    """Every Linear a config group targets (and ``ignore`` does not), with the tensors it is read from: their
    headers checked against the layer's shape."""
    linears = [(n, m) for n, m in skeleton.named_modules() if type(m) is nn.Linear and not ignore.matches(n, m)]
    plan: dict[str, _Layer] = {}
    for group in groups:
        for name, module in linears:
            if name not in plan and group.targets.matches(name, module):
                plan[name] = _Layer(group, _layer_tensors(name, module, group, shards, file))
    return plan


def _layer_tensors(name: str, module: nn.Linear, group: _Group, shards: Shards, file: Path) -> dict[str, Spec]:
    """The tensors of one targeted Linear its format reads (and those it may hold), checked against the headers;
    a scheme with no equivalent format is refused naming the config group (``file``: the config)."""
    rows, columns = module.out_features, module.in_features
    weights, form = group.weights, group.form
    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    readable = f"{file}: {group.where}.weights: layer {name!r}: weights {json.dumps(weights)[:300]} have no " \
               "equivalent format here (int of 2-8 bits per tensor, channel or group, FP8 E4M3, MXFP4 or NVFP4"
    if form in ("mxfp4-pack-quantized", "nvfp4-pack-quantized"):
        block = 32 if form.startswith("mx") else 16
        if (bits, kind, weights.get("group_size", block)) != (4, "float", block) or columns % block \
                or weights.get("dynamic") or not weights.get("symmetric", True):
            raise ExportError(f"{readable}; {form} is 4-bit symmetric floats in blocks of {block} that tile a row)")
        need = {"weight_packed": (("U8",), (rows, columns // 2)), "weight_scale": (("U8",), (rows, columns // 32))}
        if block == 16:
            need.update(weight_scale=(("F8_E4M3",), (rows, columns // 16)), weight_global_scale=(FLOAT, (1,)))
    else:
        fp8 = form == "float-quantized"
        known = (kind, bits) == ("float", 8) if fp8 else kind == "int" and isinstance(bits, int) and 1 < bits <= 8
        if not known or strategy not in ("tensor", "channel", "group") or weights.get("dynamic") \
                or weights.get("actorder") == "group":
            raise ExportError(f"{readable}; no dynamic weights, no actorder group)")
        scale = _scale_shape(name, group, rows, columns, file)
        need = {"weight_scale": (SCALES, scale)}
        if fp8:
            need["weight"] = (("F8_E4M3",), (rows, columns))
        elif form == "int-quantized":
            need["weight"] = (("I8",), (rows, columns))
        else:
            need.update(weight_packed=(("I32",), (rows, -(-columns * bits // 32))), weight_shape=(("I64", "I32"), (2,)))
        if not weights.get("symmetric", True) and not fp8:
            packed = form == "pack-quantized" and strategy != "tensor"
            need["weight_zero_point"] = (("I32",), (-(-rows * bits // 32), scale[1])) if packed else (("I8",), scale)
        elif f"{name}.weight_zero_point" in shards.where:  # a symmetric scheme's zero point: all zero, checked on load
            need["weight_zero_point"] = (INTS, scale)
    need.update(_input_tensors(name, group, file))
    if module.bias is not None:
        need["bias"] = (FLOAT, (rows,))
    optional = ("weight_shape", "input_zero_point")
    need = {k: v for k, v in need.items() if k not in optional or f"{name}.{k}" in shards.where}
    for key, (dtypes, shape) in need.items():
        shards.check(f"{name}.{key}", dtypes, shape, f"layer {name!r} ({form})")
    return need


def _scale_shape(name: str, group: _Group, rows: int, columns: int, file: Path) -> tuple[int, ...]:
    strategy, size = group.weights["strategy"], group.weights.get("group_size")
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (rows, 1)
    if size is None or columns % size:
        raise ExportError(f"{file}: {group.where}.weights.group_size = {size}: layer {name!r} has {columns} columns, "
                          "which groups of it do not tile")
    return rows, columns // size


def _input_tensors(name: str, group: _Group, file: Path) -> dict[str, Spec]:
    args = group.inputs
    if not args:
        return {}
    if args.get("type") == "float" and args.get("num_bits") == 4 and args.get("group_size") == 16:
        return {"input_global_scale": (FLOAT, (1,))}
    if not (args.get("type") in ("int", "float") and args.get("num_bits") == 8 and args.get("symmetric", True)
            and args.get("strategy") in ("tensor", "token")):
        raise ExportError(f"{file}: {group.where}.input_activations: layer {name!r}: input activations "
                          f"{json.dumps(args)[:300]} have no equivalent format here (8-bit symmetric int or FP8 per "
                          "tensor or token, or NVFP4)")
    if args.get("dynamic", False):
        return {}
    if args["strategy"] != "tensor":
        raise ExportError(f"{file}: {group.where}.input_activations: layer {name!r}: static input activations need "
                          "a per-tensor input_scale")
    return {"input_scale": (FLOAT, (1,)), "input_zero_point": (INTS, (1,))}


def _quantize(model: nn.Module, name: str, layer: _Layer, shards: Shards) -> None:
    """Replace the Linear ``name`` of ``model`` by the quantized layer holding its stored values."""
    from mase_lite.layers.quantized import quantize_module

    module = model.get_submodule(name)
    tensors = {key: shards.load(f"{name}.{key}", *spec, f"layer {name!r}") for key, spec in layer.tensors.items()}
    refuse = _Refusal(name, shards)
    try:
        fmt, encoded = _weight_codes(module, layer.group, tensors, refuse)
        data_in = _input_format(layer.group.inputs, tensors, refuse)
        quantized = quantize_module(module, {"weight": fmt, **({"data_in": data_in} if data_in else {})})
        quantized.restore_parameter("weight", encoded)
    except ExportError:
        raise
    except UserError as err:  # a format's own refusal of these values
        raise refuse("weight", str(err)) from None
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, quantized)
    if "bias" in tensors:
        with torch.no_grad():
            quantized.bias.copy_(tensors["bias"])


class _Refusal:
    """Refusals of one layer's values, naming the tensor at fault and its file."""

    def __init__(self, name: str, shards: Shards):
        self.name, self.shards = name, shards

    def __call__(self, key: str, what: str) -> ExportError:
        tensor = f"{self.name}.{key}"
        if tensor not in self.shards.where:  # the values of several: the layer's codes
            tensor = next(t for t in (f"{self.name}.weight_packed", f"{self.name}.weight") if t in self.shards.where)
        return ExportError(f"{self.shards.where[tensor]}: tensor {tensor!r}: {what}")


def _weight_codes(module: nn.Linear, group: _Group, tensors: dict[str, Tensor], refuse: _Refusal):
    """The weight format and the stored codes of one targeted Linear, from its checked tensors."""
    from mase_lite.numerics.codes import encode

    rows, columns = module.out_features, module.in_features
    weights, form = group.weights, group.form
    if "weight_shape" in tensors and tensors["weight_shape"].tolist() != [rows, columns]:
        raise refuse("weight_shape", f"{tensors['weight_shape'].tolist()}, but the layer is [{rows}, {columns}]")
    if form in ("mxfp4-pack-quantized", "nvfp4-pack-quantized"):
        packed = tensors["weight_packed"]
        codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(rows, columns).to(torch.int64)
        if form == "mxfp4-pack-quantized":
            if bool((tensors["weight_scale"] == 0xFF).any()):
                raise refuse("weight_scale", "holds the E8M0 NaN (255)")
            fmt, side = {"name": "mxfp", "element_format": "e2m1", "block_size": 32}, {"scale": tensors["weight_scale"]}
        else:
            fmt = {"name": "nvfp4", "per_tensor": "global_scale"}
            side = {"global_scale": tensors["weight_global_scale"].float(), "block_scale": tensors["weight_scale"]}
    elif form == "float-quantized":
        fmt = {"name": "scaled_float", "granularity": weights["strategy"], "group_size": weights.get("group_size") or 128}
        codes = tensors["weight"].view(torch.uint8).to(torch.int64)
        side = {"scale": tensors["weight_scale"].float()}
    else:
        bits, scale = weights["num_bits"], tensors["weight_scale"]
        fmt = {"name": "scaled_integer", "width": bits, "symmetric": weights.get("symmetric", True),
               "granularity": weights["strategy"], "group_size": weights.get("group_size") or 128,
               "scale_dtype": str(scale.dtype).removeprefix("torch.")}
        if fmt["symmetric"]:
            fmt["full_range"] = True
        if form == "int-quantized":
            codes = _offset(tensors["weight"], bits, lambda what: refuse("weight", what))
        else:
            codes = unpack_rows(tensors["weight_packed"], bits, columns)
        side = {"scale": scale}
        zero = tensors.get("weight_zero_point")
        if zero is not None and fmt["symmetric"] and bool(zero.any()):
            raise refuse("weight_zero_point", "not zero in a symmetric scheme")
        if zero is not None and not fmt["symmetric"]:
            if zero.dtype == torch.int32:  # packed along the rows
                zero = unpack_rows(zero.t().contiguous(), bits, rows).t()
            else:
                zero = _offset(zero, bits, lambda what: refuse("weight_zero_point", what))
            side["zero_point"] = zero.reshape(scale.shape).to(torch.uint8)
    values = _decoded(fmt, codes, side, module.weight.dtype)
    if not bool(torch.isfinite(values).all()):
        raise refuse("weight_scale", "the codes and scales decode to NaN or infinite weights")
    encoded = encode(values, fmt, side=side, values=values)
    if encoded is None:
        raise refuse("weight_scale", f"the codes and scales do not decode to values of {fmt['name']}")
    return fmt, encoded


def _offset(signed: Tensor, bits: int, refuse: Callable[[str], ExportError]) -> Tensor:
    """compressed-tensors' signed codes as this tool's offset ones (plus ``2**(bits-1)``), each within ``bits``."""
    codes = signed.to(torch.int64) + (1 << (bits - 1))
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 1 << bits):
        raise refuse(f"codes outside the {bits}-bit range")
    return codes


def _decoded(fmt: dict, codes: Tensor, side: dict[str, Tensor], dtype: torch.dtype) -> Tensor:
    from mase_lite.numerics.codes import Encoded, decode, pack_bits
    from mase_lite.numerics.registry import parse_format

    number_format, params = parse_format(fmt)
    bits = number_format.codec.bits(params)
    return decode(Encoded(number_format.as_dict(params), bits, pack_bits(codes.reshape(-1), bits), dict(side),
                          tuple(codes.shape), dtype, codes))


def _input_format(args: dict | None, tensors: dict[str, Tensor], refuse: _Refusal) -> dict[str, Any] | None:
    """The input activations' format of one layer (its args and tensors checked by :func:`_input_tensors`)."""
    if not args:
        return None
    if "input_global_scale" in tensors:
        amax = nvfp4_amax_of(tensors["input_global_scale"].float().reshape(-1)[0])
        if amax is None:
            raise refuse("input_global_scale", "NVFP4 input activations need the global scale of a finite amax")
        return {"name": "nvfp4", "per_tensor": "global_scale", "tensor_amax": amax}
    fmt = {"name": "scaled_integer", "width": 8, "full_range": True} if args["type"] == "int" else {"name": "scaled_float"}
    fmt["granularity"] = "tensor" if args["strategy"] == "tensor" else "channel"
    if "input_scale" in tensors:
        fmt["scale"] = float(tensors["input_scale"].float().reshape(-1)[0])
        if fmt["scale"] <= 0:
            raise refuse("input_scale", f"{fmt['scale']}: a static input scale is positive")
        if bool(tensors.get("input_zero_point", torch.zeros(1)).any()):
            raise refuse("input_zero_point", "not zero in a symmetric scheme")
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
    """The inverse of ``compressed_tensors.pack_rows``: each row's first ``columns`` unsigned codes (int64)."""
    from mase_lite.numerics.codes import unpack_bits

    if words.dtype != torch.int32 or words.dim() != 2:
        raise ExportError(f"packed codes must be a 2-D int32 tensor, got {words.dtype} of shape {list(words.shape)}")
    return torch.stack([unpack_bits(row.contiguous().view(torch.uint8), bits, columns) for row in words])


# the other tensors -----------------------------------------------------------------------------------------

def _float_state(skeleton: nn.Module, plan: dict[str, _Layer], shards: Shards) -> dict[str, list[tuple[str, Spec]]]:
    """The tensors of the model but the quantized layers', grouped by the parameter they load (tied names share
    one: at least one of them is stored), their headers checked; and no tensor left that the model does not hold."""
    model = type(skeleton).__name__
    groups: dict[int, list[tuple[str, Spec]]] = {}
    for key, tensor in skeleton.state_dict(keep_vars=True).items():
        if key.rpartition(".")[0] not in plan:
            spec = (FLOAT if tensor.is_floating_point() else INTS, tuple(tensor.shape))
            groups.setdefault(id(tensor), []).append((key, spec))
    state = {}
    for names in groups.values():
        stored = [(key, spec) for key, spec in names if key in shards.where]
        if not stored:
            raise ExportError(f"{shards.root}: the checkpoint does not fit a {model} of its config: it lacks {names[0][0]}")
        for key, (dtypes, shape) in stored:
            shards.check(key, dtypes, shape, f"a {model} of this config")
        state[stored[0][0]] = stored
    used = {f"{name}.{key}" for name, layer in plan.items() for key in layer.tensors}
    used |= {key for stored in state.values() for key, _ in stored}
    for key in sorted(set(shards.where) - used)[:1]:
        raise ExportError(f"{shards.where[key]}: the checkpoint does not fit a {model} of its config: tensor {key!r} "
                          "is none of its tensors (nor of a targeted layer's format)")
    return state


def _loaded_state(state: dict[str, list[tuple[str, Spec]]], shards: Shards, model: str) -> dict[str, Tensor]:
    """The float tensors, each parameter's from one name; tied names stored twice must hold the same values."""
    out = {}
    for stored in state.values():
        tensors = [(key, shards.load(key, *spec, f"a {model} of this config")) for key, spec in stored]
        first_key, first = tensors[0]
        for key, tensor in tensors[1:]:
            if not torch.equal(tensor, first):
                raise ExportError(f"{shards.where[key]}: tensor {key!r} differs from {first_key!r}, which the model "
                                  "ties it to")
        out[first_key] = first
    return out
