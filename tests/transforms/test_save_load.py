"""Save -> load keeps masks, activation pruning, adapters, fused attention and replaced modules."""

import json

import torch

import mase_lite.passes as passes
import mase_lite as ml
from mase_lite.ir.graph import MaseGraph
from mase_lite.layers.lora import LoRALinear
from mase_lite.layers.pruning import activation_pruner_of, weight_mask_of


def assert_same_state(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_bert_with_fused_attention_masks_and_adapters_round_trips(bert, bert_inputs, tmp_path):
    bert, _ = passes.fuse_sdpa(bert)
    bert, _ = passes.prune(bert, {"weight": {"sparsity": 0.5, "method": "random"}, "activation": {"sparsity": 0.1}})
    bert, _ = passes.lora(bert, {"by": "regex", "targets": [".*attention_self_(query|value)"], "r": 4, "lora_alpha": 8})
    with torch.no_grad():
        for module in bert.model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_()
    bert.model.eval()
    expected = bert.model(**bert_inputs).logits

    bert.save(tmp_path / "bert.v1")
    recipe = json.loads((tmp_path / "bert.v1" / "recipe.json").read_text())
    assert [step["pass"] for step in recipe["transforms"]] == ["fuse_sdpa", "prune", "lora"]
    loaded = ml.load(tmp_path / "bert.v1")

    assert_same_state(bert, loaded)
    query = loaded.modules["bert.encoder.layer.0.attention.self.query"]
    assert isinstance(query, LoRALinear) and weight_mask_of(query.base) is not None
    assert int((~weight_mask_of(query.base).mask).sum()) == 128 * 64
    assert activation_pruner_of(query.base).sparsity == 0.1
    assert {n for n, p in loaded.model.named_parameters() if p.requires_grad} == {
        n for n, p in bert.model.named_parameters() if p.requires_grad
    }
    assert sum(1 for n in loaded.nodes if n.meta["mase"]["op"] == "sdpa") == 2
    torch.testing.assert_close(loaded.model(**bert_inputs).logits, expected, rtol=0, atol=0)


def test_cnn_folded_pruned_and_replaced_round_trips(cnn, cnn_input, fresh_cnn, tmp_path):
    cnn, _ = passes.fold_batchnorm(cnn)
    cnn, _ = passes.prune(cnn, {"weight": {"sparsity": 0.5, "granularity": "channel"}})
    cnn, _ = passes.replace(cnn, {"by": "name", "targets": ["relu1"], "with": {"module": "activation", "params": {"name": "gelu"}}})
    cnn, _ = passes.dead_code(cnn, {"delete_unused_modules": True})
    expected = cnn.model(x=cnn_input)
    cnn.save(tmp_path / "cnn")
    loaded = ml.load(tmp_path / "cnn", model=fresh_cnn())
    assert_same_state(cnn, loaded)
    assert type(loaded.modules["relu1"]).__name__ == "GELU" and "bn" not in loaded.modules
    torch.testing.assert_close(loaded.model(x=cnn_input), expected, rtol=0, atol=0)


def test_finalized_and_merged_graph_round_trips_without_masks_or_adapters(cnn, cnn_input, fresh_cnn, tmp_path):
    cnn, _ = passes.prune(cnn, {"weight": {"sparsity": 0.7}, "activation": {"sparsity": 0.2}})
    cnn.model(x=cnn_input)
    cnn, _ = passes.prune_finalize(cnn, {"activations": "remove"})
    cnn, _ = passes.lora(cnn, {"by": "name", "targets": ["fc2"], "rank": 2})
    with torch.no_grad():
        cnn.modules["fc2"].lora_B.fill_(0.5)
    cnn, _ = passes.lora_merge(cnn)
    expected = cnn.model(x=cnn_input)
    cnn.save(tmp_path / "cnn")
    loaded = ml.load(tmp_path / "cnn", model=fresh_cnn())
    assert not any("mask" in k or "lora" in k for k in loaded.model.state_dict())
    assert all(activation_pruner_of(m) is None for m in loaded.model.modules())
    assert int((loaded.modules["fc1"].weight == 0).sum()) == round(0.7 * 128 * 32)
    torch.testing.assert_close(loaded.model(x=cnn_input), expected, rtol=0, atol=0)
