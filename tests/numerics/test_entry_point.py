"""The entry point: every format on every rank and float dtype, gradients, bits per element, errors."""

import copy
import math

import pytest
import torch

from mase_lite.infra.errors import UserError
from mase_lite.numerics import FormatError, bits_per_element, format_dict, format_names, quantize
from mase_lite.numerics import mx
from mase_lite.numerics.ggml import TYPES as GGML_FORMATS

EVERY_FORMAT = {
    "integer": {"width": 8, "frac_width": 4},
    "minifloat_ieee": {"width": 8, "exponent_width": 4},
    "minifloat_denorm": {"width": 8, "exponent_width": 4},
    "log": {"width": 6},
    "block_fp": {"width": 6, "block_size": 4},
    "block_minifloat": {"width": 8, "exponent_width": 3, "block_size": 4},
    "block_log": {"width": 5, "block_size": 4},
    "binary": {},
    "binary_scaling": {},
    "binary_residual_sign": {"levels": 2},
    "ternary": {},
    "mxint": {"element_width": 8, "block_size": 4},
    "mxfp": {"element_format": "e2m1", "block_size": 4},
    "scaled_integer": {"width": 6, "granularity": "group", "group_size": 4},
    "nvfp4": {},
    "scaled_float": {"granularity": "group", "group_size": 4},
}
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 5), (2, 1, 3, 5)]


def test_every_registered_format_is_covered_here():
    """ggml's block formats take whole super-blocks only: tests/numerics/test_ggml_formats.py covers their shapes."""
    assert sorted([*EVERY_FORMAT, *GGML_FORMATS]) == format_names()


@pytest.mark.parametrize("name", sorted(EVERY_FORMAT))
@pytest.mark.parametrize("shape", SHAPES)
def test_shape_dtype_and_zero_are_kept(name, shape):
    x = torch.randn(shape)
    y = quantize(x, name, **EVERY_FORMAT[name])
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    zeros = quantize(torch.zeros(shape), name, **EVERY_FORMAT[name])
    if name not in ("binary", "binary_scaling", "binary_residual_sign"):  # ±1 formats have no zero code
        assert torch.equal(zeros, torch.zeros(shape))


@pytest.mark.parametrize("name", sorted(EVERY_FORMAT))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_equal_the_float32_computation_cast_once(name, dtype):
    torch.manual_seed(1)
    x = (torch.randn(4, 8) * 3).to(dtype)
    y = quantize(x, name, **EVERY_FORMAT[name])
    assert y.dtype == dtype
    expected = quantize(x.float(), name, **EVERY_FORMAT[name]).to(dtype)
    assert torch.equal(y.isnan(), expected.isnan())
    assert torch.equal(y.nan_to_num(0.0), expected.nan_to_num(0.0))


@pytest.mark.parametrize("dtype, width", [(torch.float16, 12), (torch.bfloat16, 9)])
def test_integer_values_are_exact_in_half_dtypes_up_to_the_documented_width(dtype, width):
    x = torch.linspace(-2.0**width, 2.0**width, 5001)
    y32 = quantize(x, "integer", width=width, frac_width=width - 4)
    assert torch.equal(y32.to(dtype).float(), y32)


def test_float16_values_rounded_past_float16_max_saturate_instead_of_overflowing():
    # e5m2 with bias 15 reaches 1.75 * 2**16; float16 65504 rounds to 2**16 in it
    x = torch.tensor([65504.0, -65504.0], dtype=torch.float16)
    y = quantize(x, "minifloat_ieee", width=8, exponent_width=5)
    assert y.tolist() == [65504.0, -65504.0]


def test_empty_tensors_come_back_unchanged():
    for shape in [(0,), (3, 0), (0, 4, 2)]:
        y = quantize(torch.zeros(shape), "block_fp", width=8)
        assert y.shape == shape


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_unsupported_dtypes_are_refused(dtype):
    with pytest.raises(FormatError, match=r"is not supported; allowed: float32, float16, bfloat16"):
        quantize(torch.zeros(3, dtype=dtype), "integer", width=8, frac_width=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(EVERY_FORMAT))
def test_cuda_results_equal_cpu_results(name):
    torch.manual_seed(0)
    x = torch.randn(3, 9)
    y = quantize(x.cuda(), name, **EVERY_FORMAT[name])
    assert y.device.type == "cuda"
    assert torch.equal(y.cpu(), quantize(x, name, **EVERY_FORMAT[name]))


@pytest.mark.parametrize("name", sorted(EVERY_FORMAT))
def test_gradient_is_straight_through_by_default(name):
    x = (torch.randn(3, 8) * 4).requires_grad_()
    quantize(x, name, **EVERY_FORMAT[name]).backward(torch.arange(24.0).reshape(3, 8))
    assert torch.equal(x.grad, torch.arange(24.0).reshape(3, 8))


CLIPPED = [
    ("integer", {"width": 8, "frac_width": 4}, [0.0, 7.9, 7.95, -8.0, -8.01, 100.0], [1, 1, 0, 1, 0, 0]),
    ("minifloat_ieee", {"width": 8, "exponent_width": 4}, [1.0, 479.0, 480.0, 481.0, -1e4], [1, 1, 1, 0, 0]),
    ("log", {"width": 4}, [0.1, 16.0, 17.0, -20.0], [1, 1, 0, 0]),
    ("binary", {}, [0.5, -1.0, 1.5, -3.0], [1, 1, 0, 0]),
    ("ternary", {"threshold": 0.5}, [0.2, 1.0, 3.0, -1.0], [1, 1, 0, 1]),  # alpha = 5/3
    # block of 4, width 4: amax 3.9 -> step 0.5, largest 3.5
    ("block_fp", {"width": 4, "block_size": 4}, [3.9, 3.5, -3.6, 1.0], [0, 1, 0, 1]),
    # mxint8, floor rule: amax 1.99 -> scale 1, largest 127/64 = 1.984375
    ("mxint", {"element_width": 8, "block_size": 4}, [1.99, 1.984375, -1.0, 0.5], [0, 1, 1, 1]),
]


@pytest.mark.parametrize("name, params, values, keep", CLIPPED)
def test_clipped_gradient_is_zero_where_the_input_saturated(name, params, values, keep):
    x = torch.tensor(values, requires_grad=True)
    quantize(x, name, ste="clipped", **params).sum().backward()
    assert x.grad.tolist() == [float(k) for k in keep]


def test_clipped_gradient_for_float16():
    x = torch.tensor([1.0, 100.0], dtype=torch.float16, requires_grad=True)
    y = quantize(x, "integer", width=8, frac_width=4, ste="clipped")
    y.sum().backward()
    assert x.grad.dtype == torch.float16 and x.grad.tolist() == [1.0, 0.0]


def test_block_minifloat_backward_works():  # MASE's crashes
    x = torch.randn(4, 32, requires_grad=True)
    quantize(x, "block_minifloat", width=8, exponent_width=4, block_size=16, ste="clipped").pow(2).sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).all()


def test_no_graph_is_built_without_requires_grad():
    y = quantize(torch.randn(3), "integer", width=8, frac_width=4)
    assert y.grad_fn is None and not y.requires_grad


def test_unknown_ste_is_refused():
    with pytest.raises(FormatError, match=r"ste='straight' is unknown; allowed: identity, clipped"):
        quantize(torch.zeros(2), "integer", width=8, frac_width=4, ste="straight")


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(UserError, match=r"unknown format 'int8'; known formats: binary, .*integer, .*ternary"):
        quantize(torch.zeros(2), "int8")


def test_format_dict_or_name_and_keywords_but_not_both():
    x = torch.randn(5)
    fmt = {"name": "integer", "width": 6, "frac_width": 2}
    assert torch.equal(quantize(x, fmt), quantize(x, "integer", width=6, frac_width=2))
    with pytest.raises(FormatError, match=r"not both"):
        quantize(x, fmt, width=4)
    with pytest.raises(FormatError, match=r"needs a 'name' key"):
        quantize(x, {"width": 4})


def test_a_format_dict_is_never_mutated_and_gives_the_same_result_every_time():
    fmt = {"name": "block_minifloat", "width": 8, "exponent_width": 4, "block_size": 8}
    frozen = copy.deepcopy(fmt)
    x = torch.randn(4, 16)
    first = quantize(x, fmt)
    for _ in range(100):
        assert torch.equal(quantize(x, fmt), first)
    assert fmt == frozen


def test_format_dict_spells_every_parameter():
    assert format_dict({"name": "integer", "width": 8, "frac_width": 4}) == {
        "name": "integer", "width": 8, "frac_width": 4, "signed": True, "floor": False,
    }
    assert format_dict("mxint") == {"name": "mxint", "element_width": 8, "block_size": 32, "scale_rule": "floor"}


BITS = [
    ({"name": "integer", "width": 8, "frac_width": 4}, None, 8.0),  # not 12: MASE adds the frac width
    ({"name": "integer", "width": 16, "frac_width": 16, "signed": False}, None, 16.0),
    ({"name": "minifloat_ieee", "width": 6, "exponent_width": 3}, None, 6.0),
    ({"name": "minifloat_denorm", "width": 8, "exponent_width": 4}, None, 8.0),
    ({"name": "log", "width": 5}, None, 5.0),
    ({"name": "block_fp", "width": 8, "exponent_width": 8, "block_size": 16}, None, 8.5),
    ({"name": "block_minifloat", "width": 8, "exponent_width": 4, "exponent_bias_width": 8, "block_size": 16}, None, 8.5),
    ({"name": "block_log", "width": 4, "exponent_bias_width": 8, "block_size": 32}, None, 4.25),
    ({"name": "binary"}, None, 1.0),
    ({"name": "binary_scaling"}, None, 1.0),
    ({"name": "binary_scaling"}, (16, 32), 2.0),
    ({"name": "binary_scaling"}, [8, 2, 2, 2], 5.0),
    ({"name": "binary_residual_sign", "levels": 3}, None, 3.0),
    ({"name": "binary_residual_sign", "levels": 3}, (4, 8), 6.0),
    ({"name": "ternary"}, None, 2.0),
    ({"name": "ternary"}, (10, 16), 2.2),
    ({"name": "ternary", "scaling": False}, (10, 16), 2.0),
    ({"name": "mxint", "element_width": 8}, None, 8.25),
    ({"name": "mxint", "element_width": 4, "block_size": 16}, None, 4.5),
    ({"name": "mxfp", "element_format": "e2m1"}, None, 4.25),
    ({"name": "mxfp", "element_format": "e3m2"}, None, 6.25),
    ("float32", None, 32.0),
    ("bfloat16", None, 16.0),
    ("int64", None, 64.0),
]


@pytest.mark.parametrize("fmt, shape, bits", BITS)
def test_bits_per_element(fmt, shape, bits):
    assert bits_per_element(fmt, shape) == pytest.approx(bits, abs=1e-12)


def test_bits_per_element_validates_the_format():
    with pytest.raises(FormatError, match=r"frac_width=9 must be <= width=8"):
        bits_per_element({"name": "integer", "width": 8, "frac_width": 9})


def test_mx_formats_are_wired_to_the_mx_functions():
    x = torch.randn(3, 70)
    assert torch.equal(quantize(x, "mxint", element_width=6), mx.mxint(x, element_width=6))
    assert torch.equal(
        quantize(x, "mxfp", element_format="e5m2", block_size=16, scale_rule="rceil"),
        mx.mxfp(x, element_format="e5m2", block_size=16, scale_rule="rceil"),
    )
    with pytest.raises(FormatError, match=r"element_width=7"):
        quantize(x, "mxint", element_width=7)
    with pytest.raises(FormatError, match=r"scale_rule='up'"):
        quantize(x, "mxfp", scale_rule="up")


def test_nan_policy_per_family():
    x = torch.tensor([1.0, math.nan, 0.5, 0.25])
    for name in ("integer", "minifloat_ieee", "binary", "ternary"):
        y = quantize(x, name, **EVERY_FORMAT[name])
        assert math.isnan(y[1].item()) and not y[[0, 2, 3]].isnan().any(), name
    # OCP: the block decodes to NaN; the block formats follow the same rule
    assert quantize(x, "mxint", element_width=8).isnan().all()
    assert quantize(x, "block_fp", **EVERY_FORMAT["block_fp"]).isnan().all()
