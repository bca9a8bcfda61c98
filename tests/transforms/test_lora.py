"""The lora, lora_merge and report_trainable passes on BERT and a small CNN."""

import copy

import pytest
import torch
import torch.nn as nn

import mase_lite.passes as passes
from mase_lite.infra.errors import UserError
from mase_lite.layers.lora import LoRALinear
from mase_lite.passes.replay import load_graph

QV = {"by": "regex", "targets": [r".*attention_self_(query|value)"]}


def adapters(mg):
    return {name: m for name, m in mg.modules.items() if isinstance(m, LoRALinear)}


def perturb_adapters(mg, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in adapters(mg).values():
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=gen) * 0.1)


def test_output_unchanged_at_insertion_in_train_and_eval(bert, bert_inputs):
    reference = bert.model(**bert_inputs).logits
    bert, info = passes.lora(bert, QV | {"rank": 4, "dropout": 0.5})
    assert info["adapted"] == [
        "bert_encoder_layer_0_attention_self_query",
        "bert_encoder_layer_0_attention_self_value",
        "bert_encoder_layer_1_attention_self_query",
        "bert_encoder_layer_1_attention_self_value",
    ]
    assert torch.equal(bert.model(**bert_inputs).logits, reference)
    assert all(n.meta["mase"]["op"] == "lora_linear" for n in bert.nodes if n.name in info["adapted"])


def test_only_adapters_train_and_the_bias_is_kept(bert):
    query = bert.modules["bert.encoder.layer.0.attention.self.query"]
    weight, bias = query.weight, query.bias
    bert, info = passes.lora(bert, QV | {"rank": 4})
    wrapped = bert.modules["bert.encoder.layer.0.attention.self.query"]
    assert wrapped.base is query and wrapped.base.bias is bias and wrapped.base.weight is weight
    trainable = {name for name, p in bert.model.named_parameters() if p.requires_grad}
    assert trainable == {
        f"bert.encoder.layer.{i}.attention.self.{m}.lora_{ab}" for i in (0, 1) for m in ("query", "value") for ab in "AB"
    }
    assert info["trainable"] == 4 * 4 * (128 + 128)
    _, report = passes.report_trainable(bert)
    assert report["trainable"] == 4096 and report["total"] == info["total"]
    assert report["modules"]["bert.encoder.layer.0.attention.self.query"] == {"trainable": 1024, "total": 1024}
    assert report["modules"]["bert.encoder.layer.0.attention.self.query.base"] == {"trainable": 0, "total": 128 * 129}


def test_gradient_reaches_adapters_only(bert, bert_inputs):
    bert, _ = passes.lora(bert, QV | {"rank": 2})
    perturb_adapters(bert)
    bert.model.train()
    bert.model(**bert_inputs).loss.backward()
    for name, p in bert.model.named_parameters():
        if ".lora_" in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_b_is_zero_so_only_b_gets_gradient_at_first(cnn, cnn_input):
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc1"], "rank": 3})
    cnn.model.train()
    cnn.model(x=cnn_input).sum().backward()
    lora = cnn.modules["fc1"]
    assert lora.lora_A.grad.abs().sum() == 0 and lora.lora_B.grad.abs().sum() > 0


def test_mase_and_tutorial_keys_are_both_understood(cnn, clone):
    other = clone(cnn)
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc1"], "r": 6, "lora_alpha": 1.0, "lora_dropout": 0.5})
    other, _ = passes.lora(other, {"by": "name", "targets": ["fc1"], "rank": 6, "alpha": 1.0, "dropout": 0.5})
    for mg in (cnn, other):
        lora = mg.modules["fc1"]
        assert (lora.rank, lora.alpha, lora.dropout.p, lora.scaling) == (6, 1.0, 0.5, 1.0 / 6)


def test_alpha_defaults_to_rank(cnn):
    cnn, _ = passes.lora(cnn, {"rank": 5})
    assert {m.scaling for m in adapters(cnn).values()} == {1.0}


@pytest.mark.parametrize(
    "params, message",
    [
        ({"alpha": 1.0, "lora_alpha": 2.0}, r"lora_alpha: unknown key"),
        ({"rank": 0}, r"rank: Input should be greater than or equal to 1 \(got 0\)"),
        ({"dropout": 1.0}, r"dropout: Input should be less than 1"),
        ({"by": "type", "targets": ["conv2d"]}, r"node 'conv' is a Conv2d; LoRA adapts nn.Linear modules only"),
        ({"by": "name", "targets": ["fc9"]}, r"matches no node"),
    ],
)
def test_bad_params_are_clear_errors(cnn, params, message):
    with pytest.raises(UserError, match=message):
        passes.lora(cnn, params)


def test_freeze_adapted_leaves_other_parameters_trainable(cnn):
    cnn, info = passes.lora(cnn, {"by": "name", "targets": ["fc2"], "rank": 2, "freeze": "adapted"})
    frozen = {name for name, p in cnn.model.named_parameters() if not p.requires_grad}
    assert frozen == {"fc2.base.weight", "fc2.base.bias"}
    assert info["trainable"] == info["total"] - (32 * 10 + 10)


def test_merge_restores_plain_linears_with_the_same_output(bert, bert_inputs):
    params = QV | {"rank": 4, "lora_alpha": 8}
    snapshot = copy.deepcopy(params)
    bert, _ = passes.lora(bert, params)
    assert params == snapshot
    perturb_adapters(bert)
    with torch.no_grad():
        adapted = bert.model(**bert_inputs).logits
    bert, info = passes.lora_merge(bert)
    assert len(info["merged"]) == 4 and not adapters(bert)
    query = bert.modules["bert.encoder.layer.0.attention.self.query"]
    assert type(query) is nn.Linear and query.bias is not None
    assert all(n.meta["mase"]["op"] == "linear" for n in bert.nodes if n.name in info["merged"])
    torch.testing.assert_close(bert.model(**bert_inputs).logits, adapted, rtol=1e-5, atol=1e-5)


def test_adapter_dropout_acts_in_train_mode_only(cnn, cnn_input):
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc2"], "rank": 4, "dropout": 0.5})
    perturb_adapters(cnn)
    cnn.model.eval()
    first, second = cnn.model(x=cnn_input), cnn.model(x=cnn_input)
    assert torch.equal(first, second)
    cnn.modules["fc2"].train()
    torch.manual_seed(0)
    assert not torch.equal(cnn.model(x=cnn_input), first)


def test_merge_of_nothing_warns_when_allowed(cnn, caplog):
    with pytest.raises(UserError, match="matches no node"):
        passes.lora_merge(cnn)
    _, info = passes.lora_merge(cnn, {"allow_empty": True})
    assert info == {"merged": []}


def trainable(mg):
    return {name for name, p in mg.model.named_parameters() if p.requires_grad}


def plain_names(names):
    """Parameter names with the LoRA wrapper's ``.base`` step removed."""
    return {name.replace(".base.", ".") for name in names}


def test_merge_after_freeze_all_makes_the_model_trainable_as_before(bert, bert_inputs):
    embeddings = bert.modules["bert.embeddings.word_embeddings"].weight
    embeddings.requires_grad_(False)  # frozen by the user, not by LoRA
    before = trainable(bert)
    bert, _ = passes.lora(bert, QV | {"rank": 2})
    bert, _ = passes.lora_merge(bert, {"by": "name", "targets": ["bert_encoder_layer_0_attention_self_query"]})
    layer = "bert.encoder.layer.{}.attention.self.{}.{}"
    assert trainable(bert) == {layer.format(0, "query", p) for p in ("weight", "bias")} | {
        layer.format(i, m, f"lora_{ab}") for i, m in ((0, "value"), (1, "query"), (1, "value")) for ab in "AB"}
    bert, _ = passes.lora_merge(bert)  # the last adapter of that lora call: the rest trains again too
    assert trainable(bert) == before and "bert.embeddings.word_embeddings.weight" not in before
    _, report = passes.report_trainable(bert)
    assert report["trainable"] == report["total"] - embeddings.numel()
    bert.model.train()
    bert.model(**bert_inputs).loss.backward()
    assert all(p.grad is not None for name, p in bert.model.named_parameters() if name in before)


def test_merge_after_freeze_adapted_restores_the_wrapped_linears(cnn):
    before = trainable(cnn)
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc2"], "rank": 2, "freeze": "adapted"})
    cnn, _ = passes.lora_merge(cnn)
    assert trainable(cnn) == before


def test_a_second_lora_on_a_linear_the_first_froze(cnn):
    before = trainable(cnn)
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc1"], "rank": 2})
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc2"], "rank": 2})
    assert plain_names(trainable(cnn)) == {f"fc{i}.lora_{ab}" for i in (1, 2) for ab in "AB"}
    cnn, _ = passes.lora_merge(cnn, {"by": "name", "targets": ["fc1"]})
    assert trainable(cnn) == {"fc1.weight", "fc1.bias", "fc2.lora_A", "fc2.lora_B"}
    cnn, _ = passes.lora_merge(cnn)
    assert trainable(cnn) == before


@pytest.mark.parametrize("merge_before_save", [True, False])
def test_saved_and_loaded_graphs_restore_what_lora_froze(bert, merge_before_save, tmp_path):
    before = trainable(bert)
    bert, _ = passes.lora(bert, QV | {"rank": 2})
    if merge_before_save:
        bert, _ = passes.lora_merge(bert)
    bert.save(tmp_path / "bert")
    loaded = load_graph(tmp_path / "bert")
    if not merge_before_save:
        assert plain_names(trainable(loaded)) == plain_names(trainable(bert))
        loaded, _ = passes.lora_merge(loaded)
    assert trainable(loaded) == before
