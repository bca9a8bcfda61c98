"""scaled_integer and nvfp4 against values derived by hand from their definitions, at the edges."""

import math

import pytest
import torch

from mase_lite.numerics import FormatError, bits_per_element, quantize
from mase_lite.numerics.codes import encode


def si(x, **params):
    return quantize(torch.as_tensor(x, dtype=torch.float32), {"name": "scaled_integer", **params})


def test_symmetric_per_row_scale_and_ties_to_even():
    # row 0: amax 7, width 4 -> qmax 7, scale 1: 3.5 is a tie -> 4 (even), 2.5 -> 2; row 1: amax 14 -> scale 2
    x = [[3.5, -7.0, 2.5, 0.4], [14.0, 5.0, -3.0, 1.0]]
    assert si(x, width=4).tolist() == [[4.0, -7.0, 2.0, 0.0], [14.0, 4.0, -4.0, 0.0]]
    assert si(x, width=4, granularity="tensor").tolist() == [[4.0, -8.0, 2.0, 0.0], [14.0, 4.0, -4.0, 0.0]]


def test_the_full_two_complement_range_by_hand():
    """full_range: codes -8..7 and scale amax / 7.5 (compressed-tensors' grid): amax 7.5 -> scale 1; 7.5 rounds
    to 8 and saturates at 7, -7.5 reaches -8, 3.75 -> 4 (a tie: even); per tensor too."""
    x = [[3.75, -7.5, 1.2, 0.0, 7.5]]
    assert si(x, width=4, full_range=True).tolist() == [[4.0, -8.0, 1.0, 0.0, 7.0]]
    assert si(x, width=4, full_range=True, granularity="tensor", scale=0.5).tolist() == [[3.5, -4.0, 1.0, 0.0, 3.5]]
    assert bits_per_element({"name": "scaled_integer", "width": 4, "full_range": True}) == 4.0
    with pytest.raises(FormatError, match="full_range is a symmetric grid"):
        si(x, width=4, full_range=True, symmetric=False)


def test_calibration_maps_the_amax_to_the_grids_edge():
    from mase_lite.numerics.calibration import choose

    values = torch.tensor([0.5, -15.0, 3.0])
    assert choose("scaled_integer", {"width": 4, "scale": "auto"}, values) == 15.0 / 7
    assert choose("scaled_integer", {"width": 4, "scale": "auto", "full_range": True}, values) == 15.0 / 7.5


def test_clip_saturates_the_outliers():
    # clip 0.5: scale = 0.5 * 8 / 7 -> 8 saturates at 7 * scale = 4
    got = si([[8.0, 1.0, -8.0]], width=4, clip=0.5).tolist()[0]
    scale = torch.tensor(4.0, dtype=torch.float32) / 7
    assert got == [4.0, (torch.tensor(1.0) / scale).round().item() * scale.item(), -4.0]


def test_groups_that_do_not_divide_the_row_have_their_own_scale():
    x = torch.tensor([[1.0, 2.0, 4.0, 100.0, 8.0]])  # groups of 2: [1, 2], [4, 100], [8]
    got = si(x, width=8, granularity="group", group_size=2)
    scales = torch.tensor([2.0, 100.0, 8.0]) / 127
    expected = torch.cat([(x[0, :2] / scales[0]).round() * scales[0], (x[0, 2:4] / scales[1]).round() * scales[1],
                          (x[0, 4:] / scales[2]).round() * scales[2]])
    assert torch.equal(got[0], expected)


def test_asymmetric_zero_point_by_hand():
    # width 2 -> codes 0..3; range [-1, 2] -> scale 1, zero point 1: codes round(x) + 1
    assert si([[-1.0, 0.5, 2.0, 1.5, 0.0]], width=2, symmetric=False).tolist() == [[-1.0, 0.0, 2.0, 2.0, 0.0]]
    # all positive: the range starts at 0, so zero stays zero exactly
    got = si([[0.0, 0.3, 3.0]], width=3, symmetric=False)
    assert got[0, 0].item() == 0.0 and got[0, 2].item() == pytest.approx(3.0)


def test_scale_storage_float16_bfloat16_and_power_of_two():
    x = torch.tensor([[1.0, 0.5, 0.01]])
    exact = 1.0 / 127
    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        scale = (torch.tensor(1.0) / 127).to(dtype).float()
        assert torch.equal(si(x, scale_dtype=name), (x / scale).round().clamp(-127, 127) * scale)
        assert scale.item() != pytest.approx(exact, rel=1e-7)
    # 1/127 lies between 2**-7 and 2**-6: the stored scale goes up to 2**-6, so nothing clips
    assert si(x, scale_dtype="pow2").tolist() == [[1.0, 0.5, 0.015625]]


def test_zero_nan_inf_and_empty():
    assert si([[0.0, -0.0, 0.0]]).tolist() == [[0.0, 0.0, 0.0]]
    assert math.copysign(1, si([[-0.001, 1.0]], width=3)[0, 0].item()) == 1.0  # a zero code is +0.0
    got = si([[float("nan"), 1.0, float("inf"), -float("inf")]], width=8)
    assert math.isnan(got[0, 0].item()) and got[0, 1:].tolist() == [1.0, 1.0, -1.0]  # amax over finite values
    assert si(torch.empty(0, 3)).shape == (0, 3)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 9), (2, 2, 3, 4)])
def test_any_rank_and_half_precision_inputs(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    fmt = {"name": "scaled_integer", "width": 6, "granularity": "group", "group_size": 4}
    y = quantize(x, fmt)
    assert y.shape == x.shape
    rows = x.reshape(-1, shape[-1])
    for row, got in zip(rows, y.reshape(-1, shape[-1])):
        for start in range(0, len(row), 4):
            part = row[start : start + 4]
            scale = part.abs().max() / 31
            assert torch.equal(got[start : start + 4], (part / scale).round().clamp(-31, 31) * scale + 0.0)
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(quantize(x.to(dtype), fmt), quantize(x.to(dtype).float(), fmt).to(dtype))


def test_static_scale_and_its_rules():
    assert si([[0.3, 5.0]], width=8, granularity="tensor", scale=0.25).tolist() == [[0.25, 5.0]]
    with pytest.raises(FormatError, match="a static scale is one per tensor"):
        si([[1.0]], scale=0.5)
    with pytest.raises(ValueError, match="scale='auto' is chosen by calibration"):
        si([[1.0]], granularity="tensor", scale="auto")


def test_gradients_identity_and_clipped():
    x = torch.tensor([[8.0, 1.0, -8.0]], requires_grad=True)
    quantize(x, {"name": "scaled_integer", "width": 4, "clip": 0.5}, ste="clipped").sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 0.0]]


def test_stored_bits_count_every_scale_and_zero_point():
    fmt = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128, "scale_dtype": "float16"}
    assert bits_per_element(fmt) == 4 + 16 / 128
    assert bits_per_element({**fmt, "symmetric": False}) == 4 + (16 + 4) / 128
    assert bits_per_element(fmt, (2, 200)) == 4 + 4 * 16 / 400  # two rows of two groups (the second one short)
    assert bits_per_element({"name": "scaled_integer", "width": 8}, (64, 256)) == 8 + 32 / 256
    assert bits_per_element({"name": "scaled_integer", "width": 8, "granularity": "tensor"}, (64, 256)) == 8 + 32 / 16384


def nv(x, **params):
    return quantize(torch.as_tensor(x, dtype=torch.float32), {"name": "nvfp4", **params})


def test_nvfp4_by_hand():
    # tensor amax 6: tensor scale 6 / 2688; block 0 (amax 6) gets E4M3 scale 448 -> decoding scale 1
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([6.0, 3.1, -0.2, 1.25])
    x[0, 16:18] = torch.tensor([0.5, -0.25])
    y = nv(x)
    assert y[0, :4].tolist() == [6.0, 3.0, -0.0, 1.0]  # 1.25 is a tie between 1 and 1.5: even mantissa, 1
    # block 1 (amax 0.5): 0.5 / 6 * 2688 / 6 = 37.33 -> E4M3 rounds to 36; 0.5 * 448 / 36 = 6.2 saturates at 6
    scale = 6 / 2688 * 36
    assert y[0, 16].item() == pytest.approx(6 * scale, rel=1e-6)
    assert y[0, 17].item() == pytest.approx(-3 * scale, rel=1e-6)  # -0.25 * 448 / 36 = -3.11 -> -3
    assert (y[0, 18:] == 0).all()


def test_nvfp4_static_amax_zero_nan_inf():
    assert nv([[6.0, 3.0]], tensor_amax=6.0).tolist() == [[6.0, 3.0]]
    assert nv([[4.0, 2.0]], tensor_amax=2.0)[0, 0].item() == 2.0  # past the calibrated amax: saturates
    assert nv(torch.zeros(2, 16)).abs().sum() == 0
    got = nv([[float("nan"), 6.0, float("inf"), -float("inf")]])
    assert math.isnan(got[0, 0].item()) and got[0, 1:].tolist() == [6.0, 6.0, -6.0]
    assert bits_per_element({"name": "nvfp4"}, (4, 16)) == 4.5 + 32 / 64
    with pytest.raises(FormatError, match="block_size"):
        nv([[1.0]], block_size=32)


def test_nvfp4_matches_torchao_when_installed():
    """torchao is optional (never a dependency); when present, its emulation agrees bit for bit."""
    nvfp4_tensor = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor", reason="torchao is not installed")
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(32, 64, generator=g), torch.randn(16, 64, generator=g) * torch.exp(3 * torch.randn(16, 64, generator=g)),
              torch.randint(-12, 13, (16, 64), generator=g).float() / 2):
        scale = nvfp4_tensor.per_tensor_amax_to_scale(x.abs().max())
        reference = nvfp4_tensor.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale).dequantize(torch.float32)
        assert torch.equal(quantize(x, {"name": "nvfp4"}), reference)


def test_nvfp4_global_scale_by_hand():
    # amax 8: global scale (1/8) * 2688 = 336; block 0 (amax 8): 8 / 6 * 336 = 448 -> decoding scale 448 / 336
    # = 4/3 in float32; 4 / (4/3) = 3, -0.5 / (4/3) = -0.375 -> -0.5. Block 1 (amax 1): 1 / 6 * 336 = 56 -> 1/6
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([8.0, 4.0, -0.5])
    x[0, 16] = 1.0
    y = nv(x, per_tensor="global_scale")
    scale0 = torch.tensor(448.0) / torch.tensor(336.0)
    assert y[0, :3].tolist() == (torch.tensor([6.0, 3.0, -0.5]) * scale0).tolist()
    assert y[0, 16].item() == (6 * (torch.tensor(56.0) / torch.tensor(336.0))).item()
    assert (y[0, 3:16] == 0).all() and (y[0, 17:] == 0).all()
    # amax 7: (1/7) * 2688 rounds to 384.00003 in float32 (not 384), as compressed-tensors has it
    assert encode(torch.tensor([[7.0] * 16]), {"name": "nvfp4", "per_tensor": "global_scale"}).side[
        "global_scale"].item() == (torch.reciprocal(torch.tensor(7.0)) * 2688).item() != 384.0
    # a block far below the tensor's amax takes a subnormal E4M3 scale (no clamp at 2**-6)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 16] = 2688.0, 6 * 2**-9
    y = nv(x, per_tensor="global_scale")  # global scale 1; block 1's scale 2**-9 exactly: element 6
    assert y[0, 16].item() == 6 * 2**-9
    assert nv(x)[0, 16].item() == 2**-6  # torchao clamps the block scale at 2**-6: 0.75 ties to the element 1
    assert nv(torch.zeros(2, 16), per_tensor="global_scale").abs().sum() == 0
    got = nv([[float("nan"), 6.0, float("inf"), -float("inf")]], per_tensor="global_scale")
    assert math.isnan(got[0, 0].item()) and got[0, 1:].tolist() == [6.0, 6.0, -6.0]


def test_nvfp4_global_scale_is_compressed_tensors_nvfp4():
    """compressed-tensors' own fake quantization (llm-compressor's NVFP4 path) agrees bit for bit."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is a dev extra")
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    args = preset_name_to_scheme("NVFP4A16", ["Linear"]).weights
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(32, 64, generator=g) * torch.exp(3 * torch.randn(32, 64, generator=g)) for _ in range(6)]
    cases.append(torch.randint(-12, 13, (16, 64), generator=g).float() / 2)
    spread = torch.randn(8, 64, generator=g)
    spread[:, :16] *= 1e4  # the other blocks' scales fall to E4M3 subnormals
    cases.append(spread)
    differs = 0
    for x in cases:
        global_scale = generate_gparam(x.min(), x.max())
        blocks = x.reshape(x.shape[0], -1, 16)
        scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args, global_scale=global_scale)
        reference = fake_quantize(x, scale, zero, args, global_scale=global_scale)
        assert torch.equal(quantize(x, {"name": "nvfp4", "per_tensor": "global_scale"}), reference)
        differs += not torch.equal(quantize(x, {"name": "nvfp4"}), reference)
    assert differs >= 4  # torchao's convention is another format
