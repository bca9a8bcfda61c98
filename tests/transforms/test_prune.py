"""The prune, prune_finalize and sparsity passes on BERT and a small CNN."""

import copy
import logging

import pytest
import torch
from torch.nn.utils import parametrize

import mase_lite.passes as passes
from mase_lite.infra.errors import UserError
from mase_lite.layers.pruning import activation_pruner_of, weight_mask_of

COURSE_CONFIG = {
    "weight": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"},
    "activation": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"},
}


def linear_modules(mg):
    return {n.name: mg.modules[n.target] for n in mg.nodes if n.meta["mase"]["op"] == "linear"}


def test_l1_local_prunes_exactly_the_requested_count_of_smallest_weights(bert):
    originals = {name: m.weight.detach().clone() for name, m in linear_modules(bert).items()}
    bert, info = passes.prune(bert, {"weight": {"sparsity": 0.3}})
    assert set(info["nodes"]) == set(originals) and len(originals) == 14
    for name, module in linear_modules(bert).items():
        assert int((module.weight == 0).sum()) == round(0.3 * module.weight.numel()) == info["nodes"][name]["weight_pruned"]
    w, original = bert.modules["classifier"].weight, originals["classifier"]
    threshold = original.abs().flatten().sort().values[round(0.3 * 256) - 1]
    assert bool((original.abs()[w == 0] <= threshold).all()) and bool((original.abs()[w != 0] >= threshold).all())
    assert torch.equal(w[w != 0], original[w != 0])


def test_course_config_shape_prunes_weights_and_activations(bert, bert_inputs):
    config = copy.deepcopy(COURSE_CONFIG)
    bert, info = passes.prune(bert, config)
    assert config == COURSE_CONFIG
    query = bert.modules["bert.encoder.layer.0.attention.self.query"]
    assert weight_mask_of(query) is not None and activation_pruner_of(query).sparsity == 0.5
    bert.model(**bert_inputs)
    _, report = passes.sparsity(bert)
    entry = report["nodes"]["bert_encoder_layer_0_attention_self_query"]
    assert entry["weight_sparsity"] == 0.5 and entry["weight_zeros"] == 128 * 128 // 2
    # each sample is 11 tokens x 128 features; half of them are zeroed (some may be zero already)
    assert entry["activation_sparsity"] >= 0.5
    assert report["weight_sparsity"] == pytest.approx(0.5, abs=1e-6)


def test_pruned_node_keeps_its_op_so_type_selection_still_finds_it(bert):
    bert, _ = passes.prune(bert, {"by": "name", "targets": ["classifier"]})
    node = next(n for n in bert.nodes if n.name == "classifier")
    assert node.meta["mase"]["op"] == "linear"
    bert, info = passes.prune(bert, {"weight": {"sparsity": 0.75}, "by": "type", "targets": ["linear"]})
    assert "classifier" in info["nodes"]
    assert len(bert.modules["classifier"].parametrizations.weight) == 1
    assert int((bert.modules["classifier"].weight == 0).sum()) == round(0.75 * 256)


def test_global_scope_prunes_the_total_across_selected_weights(bert):
    names = ["bert_encoder_layer_0_attention_self_query", "classifier"]
    bert, info = passes.prune(bert, {"by": "name", "targets": names, "weight": {"sparsity": 0.4, "scope": "global"}})
    total = 128 * 128 + 2 * 128
    assert sum(e["weight_pruned"] for e in info["nodes"].values()) == round(0.4 * total)


@pytest.mark.parametrize("granularity", ["row", "channel"])
def test_structured_pruning_removes_whole_output_rows(bert, granularity):
    bert, _ = passes.prune(
        bert, {"by": "regex", "targets": [r".*layer_0_intermediate_dense"], "weight": {"sparsity": 0.25, "granularity": granularity}}
    )
    w = bert.modules["bert.encoder.layer.0.intermediate.dense"].weight
    zero_rows = (w == 0).all(dim=1)
    assert int(zero_rows.sum()) == round(0.25 * 512) == 128
    assert int((w == 0).sum()) == 128 * 128


def test_structured_pruning_of_conv_output_channels(cnn, cnn_input):
    conv = cnn.modules["conv"]
    scores = conv.weight.detach().abs().flatten(1).mean(1)
    cnn, _ = passes.prune(cnn, {"by": "name", "targets": ["conv"], "weight": {"sparsity": 0.5, "granularity": "channel"}})
    zero_channels = (conv.weight == 0).flatten(1).all(1)
    assert zero_channels.tolist() == (scores <= scores.sort().values[3]).tolist()
    assert int(zero_channels.sum()) == 4


def test_random_pruning_is_seeded_and_exact(bert, clone):
    first, second = clone(bert), bert
    params = {"by": "name", "targets": ["classifier"], "weight": {"method": "random", "sparsity": 0.5, "seed": 3}}
    passes.prune(first, params)
    passes.prune(second, params)
    a, b = first.modules["classifier"].weight, second.modules["classifier"].weight
    assert torch.equal(a == 0, b == 0) and int((a == 0).sum()) == 128


def test_params_dict_is_reused_unchanged_across_graphs(cnn, clone):
    params = {"weight": {"sparsity": 0.5, "granularity": "elementwise"}, "by": "type", "targets": ["linear", "conv2d"]}
    snapshot = copy.deepcopy(params)
    other = clone(cnn)
    _, info_a = passes.prune(cnn, params)
    _, info_b = passes.prune(other, params)
    assert params == snapshot and info_a == info_b


def test_selection_matching_nothing_is_an_error_or_a_warning(cnn, caplog):
    with pytest.raises(UserError, match=r"selection by name with targets \['nope'\] matches no node"):
        passes.prune(cnn, {"by": "name", "targets": ["nope"]})
    with caplog.at_level(logging.WARNING):
        _, info = passes.prune(cnn, {"by": "name", "targets": ["nope"], "allow_empty": True})
    assert info == {"nodes": {}} and "matches no node" in caplog.text


def test_bad_configs_name_the_field_and_the_allowed_values(cnn):
    with pytest.raises(UserError, match=r"activation\.scope: Input should be 'local' \(got 'global'\)"):
        passes.prune(cnn, {"activation": {"scope": "global"}})
    with pytest.raises(UserError, match=r"weight\.method: Input should be 'random', 'l1-norm', 'wanda' or 'sparsegpt' \(got 'l2'\)"):
        passes.prune(cnn, {"weight": {"method": "l2"}})
    with pytest.raises(UserError, match=r"weight\.sparsity: Input should be less than or equal to 1"):
        passes.prune(cnn, {"weight": {"sparsity": 1.5}})
    with pytest.raises(UserError, match=r"node 'relu' \(ReLU\) has no weight to prune"):
        passes.prune(cnn, {"by": "name", "targets": ["relu"]})


def test_activation_only_pruning_on_a_weightless_module(cnn, cnn_input):
    cnn, info = passes.prune(cnn, {"by": "name", "targets": ["relu"], "weight": None, "activation": {"sparsity": 1.0}})
    assert info["nodes"] == {"relu": {"activation_sparsity": 1.0}}
    out = cnn.model(x=cnn_input)
    expected = cnn.modules["fc2"](cnn.modules["relu1"](cnn.modules["bn1"](cnn.modules["fc1"](torch.zeros(5, 128)))))
    torch.testing.assert_close(out, expected)


def test_zero_and_full_sparsity(cnn, cnn_input):
    reference = cnn.model(x=cnn_input)
    cnn, info = passes.prune(cnn, {"weight": {"sparsity": 0.0}})
    torch.testing.assert_close(cnn.model(x=cnn_input), reference, rtol=0, atol=0)
    cnn, info = passes.prune(cnn, {"by": "name", "targets": ["fc2"], "weight": {"sparsity": 1.0}})
    assert torch.equal(cnn.model(x=cnn_input), cnn.modules["fc2"].bias.expand(5, 10))


def test_masks_hold_through_training_steps(cnn, cnn_input):
    cnn, _ = passes.prune(cnn, {"weight": {"sparsity": 0.6}})
    fc1 = cnn.modules["fc1"]
    pruned = fc1.weight == 0
    kept_before = fc1.weight.detach()[~pruned].clone()
    cnn.model.train()
    optimizer = torch.optim.SGD(cnn.model.parameters(), lr=0.5)
    for _ in range(2):
        optimizer.zero_grad()
        cnn.model(x=cnn_input).square().mean().backward()
        assert fc1.parametrizations.weight.original.grad[pruned].abs().sum() == 0
        optimizer.step()
    assert bool((fc1.weight[pruned] == 0).all())
    assert not torch.equal(fc1.weight.detach()[~pruned], kept_before)


def test_finalize_bakes_masks_into_the_same_parameters(bert, bert_inputs):
    bert, _ = passes.prune(bert, {"by": "regex", "targets": [".*layer_0_attention_self_(query|key|value)"], "weight": {"sparsity": 0.5}})
    query = bert.modules["bert.encoder.layer.0.attention.self.query"]
    original = query.parametrizations.weight.original
    expected = bert.model(**bert_inputs).logits
    bert, info = passes.prune_finalize(bert)
    assert sorted(info["baked"]) == [f"bert.encoder.layer.0.attention.self.{m}" for m in ("key", "query", "value")]
    assert not parametrize.is_parametrized(query) and query.weight is original
    assert int((query.weight == 0).sum()) == 128 * 64
    assert not any("mask" in k for k in bert.model.state_dict())
    torch.testing.assert_close(bert.model(**bert_inputs).logits, expected, rtol=0, atol=0)
    assert passes.sparsity(bert)[1]["nodes"]["bert_encoder_layer_0_attention_self_query"]["masked"] is False


def test_finalize_removes_activation_hooks_on_request(cnn, cnn_input):
    reference = cnn.model(x=cnn_input)
    cnn, _ = passes.prune(cnn, {"weight": {"sparsity": 0.0}, "activation": {"sparsity": 0.5, "method": "random"}})
    assert not torch.equal(cnn.model(x=cnn_input), reference)
    cnn, info = passes.prune_finalize(cnn, {"activations": "keep"})
    assert info["activation_hooks_removed"] == [] and activation_pruner_of(cnn.modules["fc1"]) is not None
    cnn, info = passes.prune_finalize(cnn, {"activations": "remove"})
    assert sorted(info["activation_hooks_removed"]) == ["conv", "fc1", "fc2"]
    assert all(not m._forward_pre_hooks for m in cnn.model.modules() if m is not cnn.model)
    torch.testing.assert_close(cnn.model(x=cnn_input), reference, rtol=0, atol=0)


def test_sparsity_report_without_pruning_counts_existing_zeros(cnn):
    with torch.no_grad():
        cnn.modules["fc2"].weight[:3] = 0.0
    _, info = passes.sparsity(cnn, {"by": "name", "targets": ["fc2", "conv"]})
    assert info["nodes"]["fc2"] == {
        "masked": False, "weight_zeros": 96, "weight_total": 320, "weight_sparsity": 0.3, "activation_sparsity": None
    }
    assert info["weight_sparsity"] == 96 / (320 + 8 * 3 * 9)


def test_bfloat16_cnn_keeps_its_dtype_and_exact_counts(cnn, cnn_input):
    cnn.model.to(torch.bfloat16)
    cnn, info = passes.prune(cnn, {"weight": {"sparsity": 0.5}, "activation": {"sparsity": 0.25}})
    fc1 = cnn.modules["fc1"]
    assert fc1.weight.dtype == torch.bfloat16 and weight_mask_of(fc1).mask.dtype == torch.bool
    assert info["nodes"]["fc1"]["weight_pruned"] == 128 * 32 // 2
    out = cnn.model(x=cnn_input.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (5, 10)
    assert activation_pruner_of(fc1).achieved >= 0.25
