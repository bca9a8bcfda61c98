"""The chunk drivers: results independent of the chunk size, padding per row, any shape."""

import pytest
import torch

from mase_lite.numerics import chunks
from mase_lite.numerics.blocks import from_blocks, to_blocks
from mase_lite.numerics.chunks import map_blocks, map_elements


def below_block_max(blocks, out, amax):
    torch.sub(blocks, amax, out=out)


def per_block_max(amax):
    return below_block_max, amax


@pytest.mark.parametrize("chunk_elements", [1, 20, 50, 10**6])
@pytest.mark.parametrize("shape", [(7, 37), (3, 2, 16), (5, 1), (), (40,)])
def test_map_blocks_equals_the_whole_tensor_computation(monkeypatch, chunk_elements, shape):
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", chunk_elements)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    blocks = to_blocks(x, 8)  # zero-padded per row: a pad can be a block's largest magnitude
    expected = from_blocks(blocks - blocks.abs().amax(-1, keepdim=True), x.shape)
    assert torch.equal(map_blocks(x, 8, per_block_max), expected)


def test_map_blocks_groups_rows_and_hands_the_kernel_whole_rows_of_blocks(monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 20)
    seen = []

    def prepare(amax):
        seen.append(("group", tuple(amax.shape)))
        return record, amax

    def record(blocks, out, amax):
        seen.append((tuple(blocks.shape), tuple(amax.shape)))
        out.copy_(blocks)

    x = torch.arange(3 * 10.0).reshape(3, 10)
    assert torch.equal(map_blocks(x, 4, prepare), x)
    # a padded row is 12 wide: one row per chunk of 20; a group holds at most 20 blocks (6 rows)
    assert seen == [("group", (3, 3, 1))] + [((1, 3, 4), (1, 3, 1))] * 3

    seen.clear()
    x = torch.arange(12 * 4.0).reshape(12, 4)
    assert torch.equal(map_blocks(x, 2, prepare), x)
    # 5 rows per chunk, groups of 10 rows (at most 20 blocks, whole chunks)
    assert seen == [("group", (10, 2, 1)), ((5, 2, 2), (5, 2, 1)), ((5, 2, 2), (5, 2, 1)),
                    ("group", (2, 2, 1)), ((2, 2, 2), (2, 2, 1))]


def test_map_blocks_makes_blocks_holding_nan_or_inf_nan():
    x = torch.tensor([[1.0, float("inf"), 2.0, 3.0], [float("nan"), 0.0, -1.0, 1.0]])
    y = map_blocks(x, 2, lambda amax: (lambda b, out: out.copy_(b),))
    nan = float("nan")
    assert torch.equal(y.isnan(), torch.tensor([[nan, nan, 2.0, 3.0], [nan, nan, -1.0, 1.0]]).isnan())
    assert y[:, 2:].tolist() == [[2.0, 3.0], [-1.0, 1.0]]


def test_map_blocks_reads_non_contiguous_inputs_and_keeps_empty_ones():
    x = torch.randn(6, 9).t()
    assert torch.equal(map_blocks(x, 4, per_block_max), map_blocks(x.contiguous(), 4, per_block_max))
    for shape in [(0,), (3, 0), (0, 5)]:
        assert map_blocks(torch.zeros(shape), 4, per_block_max).shape == shape


def test_map_elements_splits_flat_chunks(monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 4)
    sizes = []

    def double(chunk, out):
        sizes.append(chunk.numel())
        torch.mul(chunk, 2.0, out=out)

    x = torch.arange(10.0).reshape(2, 5).t()
    assert torch.equal(map_elements(x, double), x * 2)
    assert sizes == [4, 4, 2]


def test_other_devices_take_the_tensor_as_one_chunk():
    sizes = []
    chunks.map_elements(torch.empty(100_000, device="meta"), lambda chunk, out: sizes.append(chunk.numel()))
    assert sizes == [100_000]
