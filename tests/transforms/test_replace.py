"""The replace pass: Identity or a registered constructor, with a shape check."""

import copy

import pytest
import torch
import torch.nn as nn

import mase_lite.passes as passes
from mase_lite.infra.errors import UserError
from mase_lite.layers.replacements import register_replacement


def test_linear_to_identity_on_bert(bert, bert_inputs):
    params = {"by": "name", "targets": ["bert_encoder_layer_1_attention_output_dense"], "with": "identity"}
    snapshot = copy.deepcopy(params)
    bert, info = passes.replace(bert, params)
    assert params == snapshot
    assert info == {"replaced": {"bert_encoder_layer_1_attention_output_dense": "Identity"}}
    assert isinstance(bert.modules["bert.encoder.layer.1.attention.output.dense"], nn.Identity)
    node = next(n for n in bert.nodes if n.name == "bert_encoder_layer_1_attention_output_dense")
    assert node.meta["mase"]["op"] == "identity"
    assert bert.model(**bert_inputs).logits.shape == (3, 2)


def test_identity_that_cannot_fit_names_both_shapes(bert):
    with pytest.raises(
        UserError,
        match=r"Identity \(from 'identity'\) in place of Linear does not fit node 'bert_encoder_layer_0_intermediate_dense': "
        r"for input shape \[3, 13, 128\] float32 the node returns shape \[3, 13, 512\] float32 "
        r"but the replacement returns shape \[3, 13, 128\] float32",
    ):
        passes.replace(bert, {"by": "regex", "targets": [".*intermediate_dense"], "with": "identity"})
    assert isinstance(bert.modules["bert.encoder.layer.0.intermediate.dense"], nn.Linear)


def test_conv_to_identity_on_the_cnn_fails_on_channels(cnn):
    with pytest.raises(UserError, match=r"node 'conv': .* returns shape \[4, 8, 8, 8\] float32 but the replacement returns shape \[4, 3, 8, 8\]"):
        passes.replace(cnn, {"by": "type", "targets": ["conv2d"], "with": "identity"})


def test_replacement_of_another_width_does_not_fit(cnn):
    with pytest.raises(UserError, match=r"node 'fc2': for input shape \[4, 32\] float32 the node returns shape \[4, 10\]"):
        passes.replace(cnn, {"by": "name", "targets": ["fc2"], "with": {"module": "linear", "params": {"out_features": 11}}})


def test_replacement_that_cannot_take_the_input(cnn):
    register_replacement("test_narrow_linear")(lambda old: nn.Linear(7, old.out_features))
    with pytest.raises(
        UserError,
        match=r"Linear \(from 'test_narrow_linear'\) in place of Linear cannot take the input of node 'fc2' "
        r"\(shape \[4, 32\] float32\): mat1 and mat2 shapes cannot be multiplied",
    ):
        passes.replace(cnn, {"by": "name", "targets": ["fc2"], "with": {"module": "test_narrow_linear"}})


def test_registered_constructor_with_params(cnn, cnn_input):
    reference = cnn.model(x=cnn_input)
    cnn, info = passes.replace(
        cnn, {"by": "name", "targets": ["fc2"], "with": {"module": "low_rank_linear", "params": {"rank": 10}}}
    )
    assert info["replaced"] == {"fc2": "Sequential"}
    fc2 = cnn.modules["fc2"]
    assert fc2[0].weight.shape == (10, 32) and fc2[1].weight.shape == (10, 10)
    torch.testing.assert_close(cnn.model(x=cnn_input), reference, rtol=1e-4, atol=1e-4)


def test_activation_swap_by_type(cnn):
    cnn, info = passes.replace(cnn, {"by": "type", "targets": ["relu"], "with": {"module": "activation", "params": {"name": "gelu"}}})
    assert info["replaced"] == {"relu": "GELU", "relu1": "GELU"}
    assert [n.meta["mase"]["op"] for n in cnn.nodes if n.name in ("relu", "relu1")] == ["gelu", "gelu"]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"by": "name", "targets": ["fc1"]}, r"with: Field required"),
        ({"by": "name", "targets": ["fc1"], "with": "zero"}, r"with\.literal\['identity'\]: Input should be 'identity' \(got 'zero'\)"),
        ({"by": "name", "targets": ["fc1"], "with": {"module": "conv"}}, r"unknown replacement 'conv'; registered: activation, identity"),
        ({"by": "name", "targets": ["fc1"], "with": {"module": "linear", "params": {"width": 3}}}, r"allowed keys: out_features, bias"),
        ({"by": "name", "targets": ["fc9"], "with": "identity"}, r"matches no node"),
    ],
)
def test_bad_params_are_clear_errors(cnn, params, message):
    with pytest.raises(UserError, match=message):
        passes.replace(cnn, params)


def test_recorded_params_use_the_with_key(cnn):
    cnn, _ = passes.replace(cnn, {"by": "name", "targets": ["relu1"], "with": "identity"})
    assert cnn.history[-1] == {
        "pass": "replace",
        "params": {"by": "name", "targets": ["relu1"], "allow_empty": False, "with": "identity"},
        "module": "mase_lite.passes.transforms.replace",
    }


def test_replacement_follows_the_graph_mode_and_dtype(cnn):
    cnn.model.train()
    cnn, _ = passes.replace(cnn, {"by": "name", "targets": ["fc2"], "with": {"module": "linear"}})
    assert cnn.modules["fc2"].training
    assert cnn.modules["fc2"].weight.dtype == torch.float32
