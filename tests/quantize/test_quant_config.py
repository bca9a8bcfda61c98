"""Layer configs: MASE's flat keys, the nested form, operand aliases, and every config error."""

import copy

import pytest
import torch

from mase_lite.layers.quant_config import (
    FUNCTION_OPERANDS,
    QuantConfigError,
    parse_quant_config,
)

INT8 = {"name": "integer", "width": 8, "frac_width": 4, "signed": True, "floor": False}
INT4 = {"name": "integer", "width": 4, "frac_width": 2, "signed": True, "floor": False}

MASE_FLAT = {
    "name": "integer",
    "data_in_width": 8, "data_in_frac_width": 4,
    "weight_width": 8, "weight_frac_width": 4,
    "bias_width": 8, "bias_frac_width": 4,
}


def test_mase_flat_keys_give_one_format_per_operand():
    cfg = parse_quant_config(MASE_FLAT)
    assert cfg.formats() == {"data_in": INT8, "weight": INT8, "bias": INT8}
    assert cfg.storage == "fake"


def test_flat_keys_only_quantize_the_operands_they_name():
    cfg = parse_quant_config({"name": "integer", "weight_width": 4, "weight_frac_width": 2, "data_out_width": 8, "data_out_frac_width": 4})
    assert cfg.formats() == {"weight": INT4, "data_out": INT8}


def test_unprefixed_params_are_shared_and_prefixed_ones_override():
    cfg = parse_quant_config({"name": "integer", "width": 8, "frac_width": 4})
    assert cfg.formats() == {"data_in": INT8, "weight": INT8, "bias": INT8}
    cfg = parse_quant_config({"name": "integer", "width": 8, "frac_width": 4, "weight_width": 4, "weight_frac_width": 2, "data_in_ste": "clipped"})
    assert cfg.formats() == {"weight": INT4, "data_in": INT8}
    assert cfg.get("data_in").ste == "clipped" and cfg.get("weight").ste == "identity"


def test_flat_block_size_lists_and_none_values_as_mase_writes_them():
    cfg = parse_quant_config({"name": "block_fp", "weight_width": 8, "weight_exponent_width": 8, "weight_exponent_bias": None, "weight_block_size": [1, 16]})
    assert cfg.formats()["weight"] == {"name": "block_fp", "width": 8, "exponent_width": 8, "exponent_bias": None, "block_size": 16}


def test_formats_without_params_quantize_the_inputs():
    assert set(parse_quant_config({"name": "ternary"}).formats()) == {"data_in", "weight", "bias"}


def test_nested_form_with_format_alias_ste_and_null():
    cfg = parse_quant_config({
        "data_in": {"format": "integer", "width": 8, "frac_width": 4},
        "weight": {"name": "minifloat_ieee", "width": 8, "exponent_width": 4, "ste": "clipped"},
        "bias": None,
    })
    assert cfg.formats() == {
        "data_in": INT8,
        "weight": {"name": "minifloat_ieee", "width": 8, "exponent_width": 4, "exponent_bias": None},
    }
    assert cfg.get("weight").ste == "clipped" and cfg.get("bias") is None


@pytest.mark.parametrize("config", [None, {"name": None}, {}, {"weight": None}])
def test_configs_that_quantize_nothing(config):
    assert parse_quant_config(config) is None


def test_function_operands_and_their_aliases():
    cfg = parse_quant_config({"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 4, "weight_frac_width": 2}, FUNCTION_OPERANDS)
    assert cfg.formats() == {"data_in_0": INT8, "data_in_1": INT4}
    cfg = parse_quant_config({"name": "integer", "width": 8, "frac_width": 4, "data_in_0_width": 4, "data_in_0_frac_width": 2}, FUNCTION_OPERANDS)
    assert cfg.formats() == {"data_in_0": INT4}
    cfg = parse_quant_config({"data_in": {"name": "integer", "width": 8, "frac_width": 4}, "data_in_1": None}, FUNCTION_OPERANDS)
    assert cfg.formats() == {"data_in_0": INT8}
    assert set(parse_quant_config({"name": "integer", "width": 8, "frac_width": 4}, FUNCTION_OPERANDS).formats()) == {"data_in_0", "data_in_1"}


def test_packed_storage_quantizes_the_weight_only():
    cfg = parse_quant_config({"name": "mxint", "element_width": 8, "storage": "packed"})
    assert cfg.storage == "packed"
    assert cfg.formats() == {"weight": {"name": "mxint", "element_width": 8, "block_size": 32, "scale_rule": "floor"}}


ERRORS = [
    ({"name": "integer", "weight_width": 8, "weight_frac_width": 9}, r"config\.weight: frac_width=9 must be <= width=8"),
    ({"name": "minifloat_ieee", "weight_width": 8, "weight_exponent_width": 8}, r"config\.weight: .*exponent_width=8 must be < width=8"),
    ({"name": "int8", "weight_width": 8}, r"config: unknown format 'int8'; known formats: binary, "),
    ({"name": "integer", "weight_widht": 8}, r"config: weight_widht: unknown key for format 'integer'; did you mean "
                                             r"'weight_width'\? use <operand>_<param>"),
    ({"name": "integer", "weight_width": 8}, r"config\.weight_frac_width: Field required"),
    ({"name": "integer", "weight_width": 0, "frac_width": 0}, r"config\.weight_width: Input should be greater than or equal to 1 \(got 0\)"),
    ({"name": "integer", "width": 40, "frac_width": 4}, r"config\.width: Input should be less than or equal to 32 \(got 40\)"),
    ({"weight": {"name": "integer", "width": 0}}, r"config\.weight\.width: Input should be greater than or equal to 1"),
    ({"name": "binary_scaling"}, r"format 'binary_scaling' is usable for weight only, not data_in"),
    ({"name": "integer", "width": 8, "frac_width": 4, "ste": "smooth"}, r"config\.ste: Input should be 'identity' or 'clipped' \(got 'smooth'\)"),
    ({"name": "integer", "width": 8, "frac_width": 4, "storage": "disk"}, r"config\.storage: Input should be 'fake' or 'packed' \(got 'disk'\)"),
    ({"name": "integer", "width": 8, "frac_width": 4, "storage": "packed"}, r"'packed' needs a layer weight in format mxint with element_width 8"),
    ({"name": "mxint", "element_width": 6, "storage": "packed"}, r"'packed' needs a layer weight in format mxint with element_width 8, or 4-bit"),
    ({"name": "mxint", "element_width": 8, "data_in_element_width": 8, "weight_element_width": 8, "storage": "packed"}, r"'packed' quantizes the weight only; remove the config of data_in"),
    ({"name": "block_fp", "weight_width": 8, "weight_block_size": [4, 16]}, r"block_size=\[4, 16\] is not supported; blocks run along the last dimension"),
    ({"weights": {"name": "integer", "width": 8, "frac_width": 4}}, r"config\.weights: unknown key; allowed keys: activations, bias, data_in, data_in_0, data_in_1, data_out, inputs, storage, weight"),
    ({"weight": {"width": 8}}, r"config\.weight: give the format's name as 'name' \(or 'format'\); known formats: binary, "),
    ({"weight": 8}, r"config\.weight: Input should be a valid dictionary or object to extract fields from \(got 8\)"),
    ("integer", r"config: a quantization config must be an object, got str"),
]


@pytest.mark.parametrize("config, match", ERRORS)
def test_config_errors_name_the_key(config, match):
    with pytest.raises(QuantConfigError, match=match):
        parse_quant_config(config)


def test_parsing_never_mutates_the_config():
    config = {"name": "block_fp", "weight_width": 8, "weight_block_size": [1, 16], "weight_exponent_bias": None,
              "data_in_width": 6}
    frozen = copy.deepcopy(config)
    first = parse_quant_config(config)
    for _ in range(100):
        assert parse_quant_config(config) == first
    assert config == frozen


def test_a_flat_rule_of_the_quantize_pass_is_named_by_the_key_written():
    import mase_lite as ml
    from mase_lite.passes import PassError

    mg = ml.MaseGraph(torch.nn.Sequential(torch.nn.Linear(8, 8)), example_inputs={"input": torch.randn(2, 8)})
    with pytest.raises(PassError) as caught:
        ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"name": "integer", "weight_width": 0, "frac_width": 0}}})
    assert str(caught.value) == ("pass 'quantize' params.rules.linear.weight_width: Input should be greater than or "
                                 "equal to 1 (got 0)")


def test_int8_activations_are_a_packed_layers_setting():
    from mase_lite.kernels.packed4 import Packed4Linear
    from mase_lite.layers.quantized import quantize_module

    mx8 = {"name": "mxint", "element_width": 8}
    flat = quantize_module(torch.nn.Linear(64, 8), {**mx8, "storage": "packed", "activations": "int8"})
    q4 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}
    nested = quantize_module(torch.nn.Linear(64, 8), {"weight": q4, "storage": "packed", "activations": "int8"})
    assert flat.activations == "int8" and isinstance(nested, Packed4Linear) and nested.activations == "int8"
    assert quantize_module(torch.nn.Linear(64, 8), {**mx8, "storage": "packed"}).activations == "float"
    with pytest.raises(QuantConfigError, match=r"config\.activations: activations 'int8' applies to a packed layer"):
        parse_quant_config({"weight": mx8, "activations": "int8"})
    with pytest.raises(QuantConfigError, match=r"config\.activations: activations 'int8' takes MXINT8 in blocks of 32, not 16"):
        parse_quant_config({"weight": {**mx8, "block_size": 16}, "storage": "packed", "activations": "int8"})
    with pytest.raises(QuantConfigError, match=r"activations"):
        parse_quant_config({"weight": mx8, "storage": "packed", "activations": "int4"})
