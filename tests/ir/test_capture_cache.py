"""The capture cache: a model of an architecture captured before reuses its graph, bound to its own weights."""

import logging

import pytest
import torch
import torch.nn as nn
from transformers import BertForSequenceClassification

import mase_lite as ml
from mase_lite import MaseGraph
from mase_lite.ir.capture_cache import CACHE
from tests.conftest import tiny_bert_config
from tests.ir.models import TwiceMLP

NAMES = ["input_ids", "attention_mask", "labels"]


def bert(seed: int, **config) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_bert_config(**config)).eval()


def batch(b: int, s: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s // 2 + 1 :] = 0
    return {"input_ids": torch.randint(0, 1000, (b, s), generator=g), "attention_mask": mask, "labels": torch.randint(0, 2, (b,), generator=g)}


def same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a.keys() if isinstance(a[k], torch.Tensor))


def counts() -> tuple[int, int]:
    return CACHE.hits, CACHE.misses


def test_recapture_with_new_weights_is_a_hit_bit_exact_at_other_shapes_and_in_train_mode():
    first, second = bert(0), bert(1)
    mg1 = MaseGraph(first, hf_input_names=NAMES)
    before = counts()
    mg2 = MaseGraph(second, hf_input_names=NAMES)
    assert counts() == (before[0] + 1, before[1])
    assert mg2.model.bert.encoder.layer[1].output.dense.weight is second.bert.encoder.layer[1].output.dense.weight
    assert [(n.name, n.op, str(n.target)) for n in mg2.nodes] == [(n.name, n.op, str(n.target)) for n in mg1.nodes]
    for b, s in [(1, 1), (2, 7), (5, 64)]:
        inputs = batch(b, s)
        with torch.no_grad():
            got = mg2.model(**inputs)
            assert same(second(**inputs), got)
            assert not torch.equal(got.logits, mg1.model(**inputs).logits)  # the new weights, not the first model's
    second.train(), mg2.model.train()
    inputs = batch(4, 16)
    torch.manual_seed(7)
    expected = second(**inputs)
    torch.manual_seed(7)
    got = mg2.model(**inputs)
    assert same(expected, got)
    expected.loss.backward(), got.loss.backward()  # the graph's parameters are the model's: gradients doubled
    w = second.classifier.weight
    assert w.grad is not None and mg2.model.classifier.weight is w


def test_a_hit_with_other_example_sizes_is_bit_exact_and_keeps_metadata():
    torch.manual_seed(0)
    a, b = TwiceMLP().eval(), TwiceMLP().eval()
    mg1 = MaseGraph(a, example_inputs={"x": torch.randn(4, 16)})
    before = counts()
    mg2 = MaseGraph(b, example_inputs={"x": torch.randn(9, 16)})
    assert counts() == (before[0] + 1, before[1])
    assert mg2.input_specs == {"x": {"shape": [9, 16], "dtype": "float32"}}
    for n1, n2 in zip(mg1.nodes, mg2.nodes):
        assert n1.meta["mase"] == n2.meta["mase"]
    for rows in (1, 2, 33):
        x = torch.randn(rows, 16)
        with torch.no_grad():
            assert torch.equal(mg2.model(x=x), b(x))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(dict(config=dict(num_attention_heads=4)), id="heads: same parameter shapes"),
        pytest.param(dict(config=dict(layer_norm_eps=1e-5)), id="layer_norm_eps"),
        pytest.param(dict(names=["input_ids", "attention_mask"]), id="input names"),
        pytest.param(dict(dynamic={"input_ids": {0: torch.export.Dim.AUTO}, "attention_mask": None, "labels": None}), id="dynamic dims"),
    ],
)
def test_a_changed_config_input_set_or_dynamic_dims_is_a_miss(change):
    MaseGraph(bert(0), hf_input_names=NAMES)
    other = bert(1, **change.get("config", {}))
    names = change.get("names", NAMES)
    before = counts()
    mg = MaseGraph(other, hf_input_names=names, dynamic_shapes=change.get("dynamic"))
    assert counts() == (before[0], before[1] + 1)
    inputs = {k: v for k, v in batch(2, 13).items() if k in names}
    with torch.no_grad():
        assert same(other(**inputs), mg.model(**inputs))


def test_a_changed_module_attribute_is_a_miss():
    torch.manual_seed(0)
    a, b = TwiceMLP(), TwiceMLP()
    b.drop.p = 0.5
    MaseGraph(a, example_inputs={"x": torch.randn(4, 16)})
    before = counts()
    mg = MaseGraph(b, example_inputs={"x": torch.randn(4, 16)})
    assert counts() == (before[0], before[1] + 1)
    assert mg.modules["drop"].p == 0.5


class Scaled(nn.Module):
    """Its forward reads a private float the cache key does not see; export bakes it into the graph."""

    def __init__(self, scale: float):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self._scale = scale

    def forward(self, x):
        return self.fc(x) * self._scale


def test_a_hit_whose_check_fails_is_captured_afresh(caplog):
    MaseGraph(Scaled(2.0), example_inputs={"x": torch.randn(3, 4)})
    model = Scaled(3.0)
    before = counts()
    with caplog.at_level(logging.INFO, logger="mase_lite.ir"):
        mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 4)})
    assert counts() == (before[0], before[1] + 1)
    assert "the stored graph of Scaled does not fit this model (output 0 differs" in caplog.text
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(mg.model(x=x), model(x))


def test_transforming_the_first_graph_leaves_the_stored_one_intact():
    first, second = bert(0), bert(1)
    mg1 = MaseGraph(first, hf_input_names=NAMES)
    fresh = [(n.name, n.op, str(n.target)) for n in mg1.nodes]
    sdpa = next(n.target for n in mg1.nodes if n.meta["mase"]["op"] == "sdpa")
    mg1.modules[sdpa].dropout_p = 0.5  # a module capture made, not the model's
    mg1, info = ml.passes.remove_dropout(mg1)
    mg1, _ = ml.passes.quantize(mg1, {"default": {"name": "integer", "width": 8, "frac_width": 4}})
    assert info["removed"] and len(mg1.nodes) < len(fresh)
    before = counts()
    mg2 = MaseGraph(second, hf_input_names=NAMES)
    assert counts() == (before[0] + 1, before[1])
    assert [(n.name, n.op, str(n.target)) for n in mg2.nodes] == fresh
    assert mg2.modules[sdpa].dropout_p == pytest.approx(0.1)
    assert type(mg2.modules["bert.encoder.layer.0.attention.self.query"]) is nn.Linear
    with torch.no_grad():
        assert same(second(**batch(3, 11)), mg2.model(**batch(3, 11)))
    second.train(), mg2.model.train()
    torch.manual_seed(1)
    expected = second(**batch(3, 11))
    torch.manual_seed(1)
    assert same(expected, mg2.model(**batch(3, 11)))


def test_cache_false_captures_afresh():
    MaseGraph(bert(0), hf_input_names=NAMES)
    from mase_lite.ir.capture import capture
    from mase_lite.ir.export import default_dynamic_shapes
    from mase_lite.ir.inputs import hf_example_inputs

    model = bert(1)
    inputs = hf_example_inputs(model, NAMES)
    before = counts()
    gm = capture(model, inputs, default_dynamic_shapes(inputs), cache=False)
    assert counts() == before
    with torch.no_grad():
        assert same(model(**batch(2, 5)), gm(**batch(2, 5)))


def test_a_hit_on_an_eval_only_graph_refuses_train_mode_and_warns_as_the_first_capture(caplog):
    from tests.ir.test_capture_causes import LayerDrop

    from mase_lite.ir.capture import CaptureError

    torch.manual_seed(0)
    first, second = LayerDrop().eval(), LayerDrop().eval()
    with caplog.at_level(logging.WARNING, logger="mase_lite.ir"):
        mg1 = MaseGraph(first, example_inputs={"x": torch.randn(3, 8)})
        before = counts()
        mg2 = MaseGraph(second, example_inputs={"x": torch.randn(3, 8)})
    assert counts() == (before[0] + 1, before[1])
    assert caplog.text.count("LayerDrop: capturing its eval mode only") == 2
    assert mg2.model.train_limits == mg1.model.train_limits and len(mg2.model.train_limits) == 1
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert torch.equal(mg2.model(x=x), second(x))
    mg2.model.train()
    with pytest.raises(CaptureError, match="this graph follows the model in eval mode only"):
        mg2.model(x=x)


def test_a_hit_keeps_the_node_names_of_the_first_capture():
    """``nn.Sequential``'s children are named ``0``, ``1``: a copy of the graph by fx would rename them ``_0``."""
    graphs = []
    for _ in range(2):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        graphs.append(MaseGraph(model, example_inputs={"input": torch.randn(4, 8)}))
    assert counts() == (1, 1)  # the second capture reused the first
    assert [n.name for n in graphs[1].nodes] == [n.name for n in graphs[0].nodes] == ["input_1", "0", "1", "2", "output"]
