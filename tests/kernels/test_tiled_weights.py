"""Layers with int8 activations hold their weights tiled for the kernel (tiles of 8 rows, each block transposed; the
K-quants' records paired where the kernels take their kind so): the same bits as the weights in rows at every level,
thread count and batch; everything that reads the weights (the state dict, a load, dequantizing, an export's codes,
float activations) still sees rows; rows that make no whole tile stay in rows."""

import copy

import pytest
import torch

from mase_lite.kernels import cpu, mxint8
from mase_lite.kernels.int8_activations import cpu_kernel
from mase_lite.kernels.kquants import KQuantLinear
from mase_lite.kernels.packed4 import Packed4Linear
from mase_lite.layers.quantized import quantize_module
from tests.kernels.test_int8_activations import FORMATS

LEVELS = cpu.available_levels()
K_QUANTS = ("q4_k", "q6_k", "q2_k")  # records paired
KINDS = [*FORMATS, "mxint8", *K_QUANTS]


def make(kind: str, out_features: int = 64, in_features: int = 160, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind in K_QUANTS:  # inputs a multiple of 256, two super-blocks at least (one is paired as it is)
        linear = torch.nn.Linear(max(512, -(-in_features // 256) * 256), out_features)
        return KQuantLinear.from_linear(linear, {"name": kind}, activations="int8")
    linear = torch.nn.Linear(in_features, out_features)
    if kind == "mxint8":
        return mxint8.MXInt8Linear.from_linear(linear, activations="int8")
    return Packed4Linear.from_quantized(quantize_module(linear, {"weight": FORMATS[kind]}), activations="int8")


def in_rows(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The kernel's output from the layer's weights in rows (never tiled)."""
    if isinstance(layer, KQuantLinear):
        return cpu_kernel.linear_kquants_many(x, [(*layer.rows(), layer.fmt["name"], layer.bias)])[0]
    data, scales = layer.rows()
    if isinstance(layer, Packed4Linear):
        return cpu_kernel.linear_nibbles(x, data, scales, *layer.integer_table(), layer.bias)
    return cpu_kernel.linear_codes(x, data, scales, layer.bias)


def test_tile_and_untile_are_each_others_inverse_by_hand():
    nibbles = torch.arange(16 * 32, dtype=torch.int32).to(torch.uint8).view(16, 32)  # 16 rows, 2 blocks of 16 bytes
    scales = torch.arange(32, dtype=torch.float32).view(16, 2)
    tiled, tiled_scales = cpu_kernel.tile(nibbles, scales)
    # tile 0, block 0: vector 0 holds bytes 0..3 of rows 0..7, then vector 1 bytes 4..7 ...
    assert tiled.flatten()[:12].tolist() == [0, 1, 2, 3, 32, 33, 34, 35, 64, 65, 66, 67]
    assert tiled.flatten()[32:36].tolist() == [4, 5, 6, 7]
    assert tiled.flatten()[128:132].tolist() == [16, 17, 18, 19]  # block 1 of tile 0 follows block 0
    assert tiled_scales.flatten()[:10].tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 1, 3]  # block 0 of rows 0..7, then 1
    back = cpu_kernel.untile(tiled, tiled_scales)
    assert torch.equal(back[0], nibbles) and torch.equal(back[1], scales)


@pytest.mark.parametrize("kind", KINDS)
def test_tiled_weights_give_the_bits_of_rows_at_every_level_thread_count_and_batch(kind, monkeypatch):
    previous = torch.get_num_threads()
    try:
        for out_features in (8, 64, 200):
            layer = make(kind, out_features, 4096 if out_features == 8 else 160, seed=out_features)
            for level in LEVELS:
                monkeypatch.setenv(cpu.LEVEL_ENV, level)
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    for rows in (1, 2, 5, 9):
                        x = torch.randn(rows, layer.in_features)
                        with torch.no_grad():
                            got = layer(x)
                        expected = in_rows(layer, x)
                        if expected is None:  # the torch level: the reference, from rows
                            assert level == "torch"
                            continue
                        assert layer._tiled, (level, out_features)
                        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (level, threads, rows)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("kind", KINDS)
def test_what_reads_the_weights_sees_rows(kind):
    layer, twin = make(kind), make(kind)
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        before = layer(x)  # tiles it
    assert layer._tiled and not twin._tiled
    name = layer._tiled_names[0]
    assert not torch.equal(getattr(layer, name), getattr(twin, name))  # tiled in place
    state, twin_state = layer.state_dict(), twin.state_dict()
    assert state.keys() == twin_state.keys() and all(torch.equal(state[k], twin_state[k]) for k in state)
    assert torch.equal(layer.dequantized_weight(), twin.dequantized_weight())
    a, b = layer.encoded(), twin.encoded()
    assert torch.equal(a.packed, b.packed) and all(torch.equal(a.side[k], b.side[k]) for k in a.side)
    # a load writes rows, and the layer tiles them again: what a decoding step holding its tensors reads
    held = getattr(layer, name)
    layer.load_state_dict(twin_state)
    assert layer._tiled and getattr(layer, name) is held
    with torch.no_grad():
        assert torch.equal(layer(x), before)
    # a deep copy keeps the order it copies; float activations compute from rows
    copied = copy.deepcopy(layer)
    assert copied._tiled and torch.equal(copied.state_dict()[name], twin_state[name])
    layer.activations = twin.activations = "float"
    with torch.no_grad():
        assert torch.equal(layer(x), twin(x))
    assert not layer._tiled


@pytest.mark.parametrize("kind", KINDS)
def test_rows_that_make_no_whole_tile_stay_in_rows(kind):
    layer = make(kind, out_features=13)
    x = torch.randn(2, layer.in_features)
    with torch.no_grad():
        out = layer(x)
    assert not layer._tiled and layer.int8_weights().tiled is False
    expected = in_rows(layer, x)
    assert expected is None or torch.equal(out, expected)
    assert cpu_kernel.linear_codes(torch.randn(1, 64), torch.zeros(12, 64, dtype=torch.int8),
                                   torch.zeros(12, 2, dtype=torch.uint8), None, tiled=True) is None  # refused
    odd = [(torch.zeros(13, 148, dtype=torch.uint8), "q4_k", None)]
    assert cpu_kernel.linear_kquants_many(torch.randn(1, 256), odd, tiled=True) is None  # no whole pairs: refused


def test_layers_sharing_an_input_run_tiled_in_one_call():
    layers = [make("q4_0", 64, 160, seed=s) for s in range(3)]
    fused = Packed4Linear.fused(layers)
    x = torch.randn(4, 160)
    with torch.no_grad():
        together = fused(x)
    assert all(m._tiled for m in layers)
    for m, out in zip(layers, together):
        assert torch.equal(out, in_rows(m, x))
    assert all(w.tiled for w in (m.int8_weights() for m in layers))
