"""ONNX: the quantized model for onnxruntime, with QuantizeLinear/DequantizeLinear (opset 21) where a format has
them and exact float values elsewhere.

Weights: integer codes of up to 8 bits (``scaled_integer`` per tensor, channel or group, symmetric or with
zero points; fixed-point ``integer``; ``mxint`` with its power-of-two scales) are stored as INT4/UINT4 (4 bits)
or INT8/UINT8 initializers feeding a DequantizeLinear (per tensor; ``axis=0`` per channel; ``axis=1`` with
``block_size`` per group or block), so onnxruntime decodes the tool's values bit for bit. Every other weight
format is written as its exact float values. Activations (a layer's ``data_in``, a matmul's operands):
8-bit ``scaled_integer`` with a static per-tensor scale on the full two's complement range, or a fixed-point
``integer`` of 8 bits, become a QuantizeLinear/DequantizeLinear pair; any other activation format is refused
before anything is written (ONNX has no operator for it), naming the layer.

A format's ``onnx`` mapping (in its own module) gives a weight's DequantizeLinear from its stored codes
(``tensors(codes)``: ``values``, ``scale``, ``zero``, ``axis``, ``block``, ``bits``, ``signed``, or None), its
``onnx/input`` mapping an activation's Q/DQ (``scheme(fmt)``: scale, zero point, signed, or None).

The graph is ``torch.onnx.export`` of the model's inference program (:func:`.tracing.inference_program`: its
quantized weights swapped for their values for the duration, the model left as it was): it takes the model's
inputs but ``labels`` (``input_ids``, ``attention_mask``; ``pixel_values``), named as the model's, batch and
sequence dimensions dynamic, and returns ``logits``, with no key/value cache.

onnxruntime fuses an int8 per-tensor or per-channel DequantizeLinear -> MatMul into ``MatMulNBits``, which by
default computes with int8 activations (accuracy level 4); the session option
``session.qdq_matmulnbits_accuracy_level = "1"`` keeps float32 activations, the tool's numerics.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from mase_lite import __version__
from mase_lite.deploy.layers import ExportError, Layer, linear_layers, unsupported
from mase_lite.deploy.tracing import inference_program
from mase_lite.infra.files import follow_umask, head_of, staged_file
from mase_lite.layers.quant_functional import QuantizedFunction
from mase_lite.layers.quantized import QuantizedLayer
from mase_lite.numerics.registry import target_mapping
from mase_lite.infra.progress import loggers_at

TARGET = "onnx"
ANY_WEIGHT_FORMAT = True  # a weight format without a mapping here is written as its values
PRODUCER = "mase_lite"  # the model's producer_name: what tells a previous export at a path
OPSET = 21
NEAREST_ACTIVATION = ("8-bit scaled_integer per tensor with a static scale and full_range true, or an 8-bit integer "
                      "(fixed point)")


def _onnx():
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError:
        raise ExportError("the onnx export needs onnx and onnxscript: pip install onnx onnxscript "
                          "(or mase-lite[export])") from None
    return onnx


def write(mg, path: str | Path, tokenizer: Any = None) -> dict[str, Any]:
    """Write ``mg`` (a graph or a module-mode model with example inputs) to the ONNX file ``path``: its inference
    inputs (not ``labels``), returning its logits."""
    onnx = _onnx()
    model = mg.model
    _check_activations(model)
    layers = linear_layers(model)
    dq = {layer.name: _dequantize_spec(layer) for layer in layers}
    dq = {name: spec for name, spec in dq.items() if spec is not None}
    with _quiet_exporter():
        program, inputs, outputs = inference_program(mg, TARGET, unpack=True)
        _copies_before_reshapes(program)
        try:
            program = torch.onnx.export(program, dynamo=True, optimize=False, opset_version=OPSET, input_names=inputs,
                                        output_names=outputs, custom_translation_table=_translations(), verbose=False)
        except Exception as err:  # torch.onnx's refusal, in one line (its summary names the cause)
            lines = str(err).splitlines() or [type(err).__name__]
            cause = next((line for line in lines if line.startswith("<class '")), lines[0])
            cause = re.sub(r"^<class '(?:\w+\.)*(\w+)'>", r"\1", cause)
            raise ExportError(f"{TARGET}: torch.onnx cannot convert this model: {cause}") from None
    proto = program.model_proto
    prefix = "model."
    replaced = _replace_initializers(onnx, proto, dq, prefix)
    proto.producer_name, proto.producer_version = PRODUCER, __version__
    path = Path(path)
    with staged_file(path) as tmp:
        tmp.write_bytes(proto.SerializeToString())  # Python's write: a full disk names this file's file system
        follow_umask(tmp)
    return {"format": TARGET, "path": str(path), "bytes": path.stat().st_size, "opset": OPSET,
            "dequantize_linear": sorted(replaced),
            "float_weights": sorted(lay.name for lay in layers if lay.name not in replaced and lay.weight_format is not None),
            "inputs": inputs, "outputs": [o.name for o in proto.graph.output]}


def is_export(path: Path) -> bool:
    """Whether ``path`` is an ONNX file :func:`write` wrote: its first fields (``ir_version``, then
    ``producer_name``, serialized in field order) name mase_lite."""
    head = head_of(path, 32) or b""
    end = 1
    while end < len(head) and head[end] & 0x80:  # ir_version's varint
        end += 1
    marker = bytes([0x12, len(PRODUCER)]) + PRODUCER.encode()
    return head[:1] == b"\x08" and head[end + 1:end + 1 + len(marker)] == marker


def _copies_before_reshapes(program: torch.export.ExportedProgram) -> None:
    """A contiguous copy of each computed tensor a reshape or view takes. torch.onnx decomposes attention into plain
    products, whose outputs are laid out otherwise than the fused kernel's it was traced with, and then turned T5's
    reshape of a transposed attention output into a view it cannot take ("Cannot view a tensor with shape ..."). ONNX
    has no strides: a copy is an Identity, which onnxruntime removes."""
    graph = program.graph
    for node in list(graph.nodes):
        source = node.args[0] if node.target in (torch.ops.aten.reshape.default, torch.ops.aten.view.default) else None
        if isinstance(source, torch.fx.Node) and source.op == "call_function":
            with graph.inserting_before(node):
                copy = graph.call_function(torch.ops.aten.clone.default, (source,),
                                           {"memory_format": torch.contiguous_format})
            copy.meta["val"] = source.meta["val"].clone(memory_format=torch.contiguous_format)
            node.replace_input_with(source, copy)
    program.graph_module.recompile()


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """torch.onnx's progress lines and its notes on operators of packages not installed, out of the user's way."""
    with (loggers_at(logging.ERROR, "torch.onnx", "torch.onnx._internal.exporter._registration"),
          contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings()):
        warnings.simplefilter("ignore")
        yield


def _check_activations(model: nn.Module) -> None:
    """Every activation quantizer must have a Q/DQ pair (checked before anything is traced or written)."""
    for name, module in model.named_modules():
        operands = ()
        if isinstance(module, QuantizedLayer):
            operands = ("data_in", "data_out")
        elif isinstance(module, QuantizedFunction):
            operands = ("data_in_0", "data_in_1", "data_out")
        for operand in operands:
            quantizer = getattr(module, f"{operand}_quantizer", None)
            if quantizer is not None and _activation_qdq(quantizer.spec.as_dict()) is None:
                fmt = quantizer.spec.as_dict()
                described = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
                raise unsupported(TARGET, name, f"{operand} format {fmt['name']} ({described})", NEAREST_ACTIVATION)


def _activation_qdq(fmt: dict[str, Any]) -> tuple[float, int, bool] | None:
    """(scale, zero point, signed) of an activation format ONNX's QuantizeLinear computes exactly, else None: the
    format's ``onnx/input`` mapping."""
    mapping = target_mapping(fmt["name"], f"{TARGET}/input")
    return mapping.scheme(fmt) if mapping is not None else None


def _translations() -> dict:
    """``mase_lite::fake_quantize`` as ONNX: a QuantizeLinear/DequantizeLinear pair (formats checked before)."""
    import onnx
    from onnxscript import opset21 as op

    def fake_quantize(x, fmt: str, ste: str):
        scale, zero, signed = _activation_qdq(json.loads(fmt))
        kind = onnx.TensorProto.INT8 if signed else onnx.TensorProto.UINT8
        s = op.Constant(value=onnx.helper.make_tensor("scale", onnx.TensorProto.FLOAT, [], [scale]))
        z = op.Constant(value=onnx.helper.make_tensor("zero_point", kind, [], [zero]))
        return op.DequantizeLinear(op.QuantizeLinear(x, s, z), s, z)

    return {torch.ops.mase_lite.fake_quantize.default: fake_quantize}


def _dequantize_spec(layer: Layer) -> dict[str, Any] | None:
    """How a layer's weight is a DequantizeLinear: its codes (numpy), scale, zero point, axis, block size, ONNX
    element type; None where the format has no integer codes of at most 8 bits (the float values are written).
    The format's ``onnx`` mapping gives them from the stored codes (``values``, ``scale``, ``zero``, ``axis``,
    ``block``, ``bits``, ``signed``), or None."""
    fmt, codes = layer.weight_format, layer.codes
    mapping = target_mapping(fmt["name"], TARGET) if fmt is not None and codes is not None else None
    spec = mapping.tensors(codes) if mapping is not None else None
    return None if spec is None else _spec(**spec)


def _spec(values: Tensor, scale: Tensor, zero: Tensor | None, axis: int | None, block: int | None, bits: int,
          signed: bool) -> dict[str, Any]:
    return {"values": values.to(torch.int64).numpy(), "scale": scale.contiguous().numpy(),
            "zero": None if zero is None else zero.numpy(), "axis": axis, "block": block, "bits": 4 if bits <= 4 else 8,
            "signed": signed}


def _replace_initializers(onnx, proto, specs: dict[str, dict[str, Any]], prefix: str) -> list[str]:
    """Each quantized weight's float initializer replaced by a DequantizeLinear of its codes (same output name)."""
    import numpy as np

    graph = proto.graph
    index = {init.name: i for i, init in enumerate(graph.initializer)}
    kinds = {(4, True): onnx.TensorProto.INT4, (4, False): onnx.TensorProto.UINT4,
             (8, True): onnx.TensorProto.INT8, (8, False): onnx.TensorProto.UINT8}
    nodes, replaced = [], []
    for layer, spec in specs.items():
        name = f"{prefix}{layer}.weight"
        if name not in index:
            continue
        kind = kinds[spec["bits"], spec["signed"]]
        values = spec["values"].astype(np.int8 if spec["signed"] else np.uint8)
        quantized = onnx.helper.make_tensor(f"{name}_quantized", kind, values.shape, values.flatten().tolist())
        scale = onnx.numpy_helper.from_array(spec["scale"].astype(np.float32), f"{name}_scale")
        new = [quantized, scale]
        inputs = [quantized.name, scale.name]
        if spec["zero"] is not None:
            zero = onnx.helper.make_tensor(f"{name}_zero_point", kind, spec["zero"].shape,
                                           spec["zero"].astype(np.uint8).flatten().tolist())
            new.append(zero)
            inputs.append(zero.name)
        attributes = {}
        if spec["axis"] is not None:
            attributes["axis"] = spec["axis"]
        if spec["block"] is not None:
            attributes["block_size"] = spec["block"]
        graph.initializer.extend(new)
        nodes.append(onnx.helper.make_node("DequantizeLinear", inputs, [name], name=f"{name}_dequantize", **attributes))
        replaced.append(layer)
    gone = {f"{prefix}{layer}.weight" for layer in replaced}
    keep = [init for init in graph.initializer if init.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return replaced
