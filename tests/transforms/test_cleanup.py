"""remove_dropout, fold_batchnorm, dead_code and report_trainable on BERT and the small CNN."""

import logging

import pytest
import torch
import torch.nn as nn

import mase_lite.passes as passes
from mase_lite.infra.errors import UserError
from mase_lite.ir.graph import MaseGraph


def ops(mg):
    return [n.meta["mase"]["op"] for n in mg.nodes]


def test_remove_dropout_on_bert_makes_train_mode_deterministic(bert, bert_inputs):
    bert.model.eval()
    reference = bert.model(**bert_inputs).logits
    assert ops(bert).count("dropout") == 8
    bert, info = passes.remove_dropout(bert)
    assert len(info["removed"]) == 8 and "dropout" not in ops(bert)
    bert.model.train()
    first, second = bert.model(**bert_inputs).logits, bert.model(**bert_inputs).logits
    assert torch.equal(first, second)
    torch.testing.assert_close(first, reference, rtol=0, atol=0)
    bert.model.graph.lint()


def test_remove_dropout_by_name_only_removes_that_node(bert):
    bert, info = passes.remove_dropout(bert, {"by": "name", "targets": ["bert_embeddings_dropout"]})
    assert info["removed"] == ["bert_embeddings_dropout"] and ops(bert).count("dropout") == 7


def test_remove_dropout_skips_selected_nodes_that_are_not_dropout(bert):
    bert, info = passes.remove_dropout(bert, {"by": "type", "targets": ["dropout", "linear"]})
    assert len(info["removed"]) == 8 and ops(bert).count("linear") == 14


def test_remove_dropout_without_dropout_warns(cnn, caplog):
    with caplog.at_level(logging.WARNING):
        cnn, info = passes.remove_dropout(cnn)
    assert info == {"removed": []} and "matches no node" in caplog.text
    with pytest.raises(UserError, match="matches no node"):
        passes.remove_dropout(cnn, {"allow_empty": False})


def test_fold_batchnorm_conv_and_linear(cnn, cnn_input):
    reference = cnn.model(x=cnn_input)
    conv, bn = cnn.modules["conv"], cnn.modules["bn"]
    cnn, info = passes.fold_batchnorm(cnn)
    assert info["folded"] == [{"into": "conv", "batch_norm": "bn"}, {"into": "fc1", "batch_norm": "bn1"}]
    assert "batch_norm" not in ops(cnn)
    folded = cnn.modules["conv"]
    assert type(folded) is nn.Conv2d and folded.bias is not None and conv.bias is None
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    torch.testing.assert_close(folded.weight, conv.weight * scale[:, None, None, None])
    torch.testing.assert_close(folded.bias, bn.bias - bn.running_mean * scale)
    torch.testing.assert_close(cnn.model(x=cnn_input), reference, rtol=1e-5, atol=1e-5)
    cnn.model.graph.lint()


def test_fold_batchnorm_leaves_batch_statistics_norms_alone(cnn_input):
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False), nn.ReLU()).eval()
    mg = MaseGraph(model, example_inputs={"input": cnn_input})
    mg, info = passes.fold_batchnorm(mg)
    assert info == {"folded": []} and "batch_norm" in ops(mg)


def test_fold_batchnorm_on_bert_finds_nothing(bert):
    bert, info = passes.fold_batchnorm(bert)
    assert info == {"folded": []}


def test_fold_batchnorm_keeps_dtype(cnn_input):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval().double()
    mg = MaseGraph(model, example_inputs={"input": cnn_input.double()})
    with torch.no_grad():
        model[1].running_var.fill_(4.0)
        model[1].running_mean.fill_(1.0)
    reference = mg.model(input=cnn_input.double())
    mg, _ = passes.fold_batchnorm(mg)
    assert mg.modules["0"].weight.dtype == torch.float64
    torch.testing.assert_close(mg.model(input=cnn_input.double()), reference, rtol=1e-12, atol=1e-12)


def test_dead_code_erases_unused_nodes_and_optionally_modules(cnn, cnn_input):
    reference = cnn.model(x=cnn_input)
    graph = cnn.model.graph
    x = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_after(x):
        unused = graph.call_function(torch.ops.aten.relu.default, (x,))
    cnn.recompile()
    cnn, info = passes.dead_code(cnn)
    assert info == {"removed_nodes": [unused.name], "deleted_modules": []}
    cnn, _ = passes.fold_batchnorm(cnn)
    assert "bn.running_mean" in cnn.model.state_dict()
    cnn, info = passes.dead_code(cnn, {"delete_unused_modules": True})
    assert info == {"removed_nodes": [], "deleted_modules": ["bn", "bn1"]}
    assert not any(k.startswith(("bn.", "bn1.")) for k in cnn.model.state_dict())
    torch.testing.assert_close(cnn.model(x=cnn_input), reference, rtol=1e-5, atol=1e-5)


def test_dead_code_on_bert_keeps_outputs(bert, bert_inputs):
    reference = bert.model(**bert_inputs).logits
    bert, info = passes.dead_code(bert)
    assert torch.equal(bert.model(**bert_inputs).logits, reference)
    assert all(name not in {n.name for n in bert.nodes} for name in info["removed_nodes"])


def test_report_trainable_counts_per_module_and_in_total(cnn):
    cnn.modules["conv"].weight.requires_grad_(False)
    cnn, info = passes.report_trainable(cnn)
    assert info["modules"]["conv"] == {"trainable": 0, "total": 8 * 3 * 9}
    assert info["modules"]["fc1"] == {"trainable": 128 * 32 + 32, "total": 128 * 32 + 32}
    total = sum(p.numel() for p in cnn.model.parameters())
    assert info["total"] == total and info["trainable"] == total - 216
    assert info["fraction"] == pytest.approx((total - 216) / total)
