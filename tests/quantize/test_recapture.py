"""A model holding the project's quantized modules captures again: each quantizer is one opaque operator,
so export meets no data-dependent branch; each quantized layer stays one node with its formats; outputs
and straight-through gradients are those of the eager model (with the native kernels and without)."""

import pytest
import torch
import torch.nn as nn

import mase_lite as ml
from mase_lite.kernels.mxint8 import MXInt8Linear
from mase_lite.layers.quantized import quantize_module

CONFIGS = {
    "mxint": {"weight": {"name": "mxint", "element_width": 8}, "data_in": {"name": "mxint", "element_width": 6}},
    "mxfp": {"inputs": {"name": "mxfp", "element_format": "e2m1"}},
    "block_fp": {"weight": {"name": "block_fp", "width": 6}, "data_out": {"name": "block_fp", "width": 8}},
    "scaled_integer": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16}},
    "nvfp4": {"inputs": {"name": "nvfp4"}},
}


def model(config: dict) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 8)).eval()
    net[0] = quantize_module(net[0], config)
    net[2] = MXInt8Linear.from_linear(net[2])
    return net


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_recapture_is_bit_exact_and_keeps_one_node_per_layer(name, native, monkeypatch):
    monkeypatch.setenv("MASE_LITE_NATIVE", native)
    net = model(CONFIGS[name])
    mg = ml.MaseGraph(net, example_inputs={"input": torch.randn(3, 32)})
    modules = [n for n in mg.nodes if n.op == "call_module"]
    assert [n.meta["mase"]["module"] for n in modules] == [type(net[0]).__name__, "ReLU", "MXInt8Linear"]
    assert modules[0].meta["mase"]["params"]["weight"]["format"] != "float32" or name in ("mxfp", "nvfp4")
    for rows in (1, 5, 11):
        x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows))
        with torch.no_grad():
            assert torch.equal(mg.model(input=x), net(x))


def test_straight_through_gradients_through_the_operator():
    layer = quantize_module(nn.Linear(4, 2), {"data_in": {"name": "integer", "width": 4, "frac_width": 2, "ste": "clipped"}})
    x = torch.tensor([[0.5, 3.0, -5.0, 1.0]], requires_grad=True)
    layer(x).sum().backward()
    expected = layer.weight.sum(0).detach() * torch.tensor([1.0, 0.0, 0.0, 1.0])  # 3.0 and -5.0 saturate (|x| > 1.75)
    assert torch.allclose(x.grad[0], expected)
