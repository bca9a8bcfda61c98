"""Each way capture used to be silently wrong, reproduced with a few-line net."""

import json
import logging

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import mase_lite as ml
from mase_lite import MaseGraph
from mase_lite.ir.capture import CaptureError, first_difference
from mase_lite.ir.inputs import hf_example_inputs
from tests.zoo.models import MaskedTokenNet, ResidualDropPathNet


def seeded(cls):
    torch.manual_seed(0)
    return cls().eval()


class LayerDrop(nn.Module):
    """Skips its layer at random in train mode: control flow on a random number."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        if not (self.training and torch.rand([]) < 0.5):
            x = self.layer(x)
        return self.out(x)


def test_drop_path_is_a_node_following_the_mode_and_lifted_constant_survives():
    model = seeded(ResidualDropPathNet)
    mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 5, 8)})
    assert [n.target for n in mg.nodes if n.op == "call_module"].count("drop_path") == 3
    assert [n.target for n in mg.nodes if n.op == "get_attr"] == ["head_lifted_tensor_0"]
    x = torch.randn(4, 6, 8)
    with torch.no_grad():
        assert torch.equal(mg.model(x=x), model(x)) and torch.equal(mg.model(x=x), mg.model(x=x))
    model.train()
    torch.manual_seed(3)
    expected = model(x)
    torch.manual_seed(3)
    got = mg.model(x=x)
    assert torch.equal(expected, got) and not torch.equal(got, mg.model(x=x))
    assert mg.model.train_limits == []


def test_leaf_subclass_with_own_forward_is_traced_through(caplog):
    model = seeded(MaskedTokenNet)
    with caplog.at_level(logging.INFO, logger="mase_lite.ir"):
        mg = MaseGraph(model, example_inputs={"input_ids": torch.randint(0, 99, (3, 13)), "attention_mask": torch.ones(3, 13, dtype=torch.long)})
    assert "pos (PositionEmbedding) subclasses a leaf class with its own forward: traced through" in caplog.text
    assert [n.target for n in mg.nodes if n.op == "call_module"] == ["tok", "drop", "fc"]
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 4:] = 0
    inputs = {"input_ids": torch.randint(0, 99, (2, 9)), "attention_mask": mask}
    with torch.no_grad():
        assert torch.equal(mg.model(**inputs), model(**inputs))


def test_example_inputs_get_dynamic_sequence_dims_like_hf_input_names():
    model = seeded(MaskedTokenNet)
    mg = MaseGraph(model, example_inputs={"input_ids": torch.randint(0, 99, (3, 13)), "attention_mask": torch.ones(3, 13, dtype=torch.long)})
    assert mg.dynamic_dims == {"input_ids": [0, 1], "attention_mask": [0, 1]}
    fc = next(n for n in mg.nodes if n.target == "fc")
    assert fc.meta["mase"]["results"][0]["shape"] == ["batch", "seq", 4]


def test_layerdrop_graph_is_eval_exact_and_refuses_train_mode_with_the_line():
    model = seeded(LayerDrop)
    mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 8)})
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert torch.equal(mg.model(x=x), model(x))
    mg.model.train()
    with pytest.raises(CaptureError) as err:
        mg.model(x=x)
    line = LayerDrop.forward.__code__.co_firstlineno + 1
    text = str(err.value)
    assert text.startswith("this graph follows the model in eval mode only; its train mode could not be captured:")
    assert f"test_capture_causes.py:{line} in LayerDrop (the model): if not (self.training and torch.rand([]) < 0.5):" in text
    assert "and capture again" in text


def test_labels_follow_the_head():
    import transformers as tf

    vit = tf.ViTForImageClassification(tf.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=16, num_labels=5))
    labels = hf_example_inputs(vit, ["pixel_values", "labels"])["labels"]
    assert labels.shape == (3,) and int(labels.max()) < 5
    tok = tf.BertForTokenClassification(tf.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                      num_attention_heads=2, intermediate_size=16, num_labels=4))
    labels = hf_example_inputs(tok, ["input_ids", "labels"])["labels"]
    assert labels.shape == (3, 13) and int(labels.max()) < 4


def test_use_cache_is_off_for_every_config_during_capture_and_restored():
    import transformers as tf

    torch.manual_seed(0)
    t5 = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=50, d_model=16, d_kv=8, d_ff=16, num_layers=1, num_heads=2)).eval()
    assert t5.config.use_cache and t5.decoder.config is not t5.config and t5.decoder.config.use_cache
    mg = MaseGraph(t5, hf_input_names=["input_ids", "decoder_input_ids"])
    assert t5.config.use_cache is True and t5.decoder.config.use_cache is True
    inputs = hf_example_inputs(t5, ["input_ids", "decoder_input_ids"], batch=2, seq=6)
    with torch.no_grad():
        assert first_difference(t5(**inputs, use_cache=False), mg.model(**inputs)) is None


def test_dynamic_dims_survive_save_and_load(tmp_path):
    model = seeded(MaskedTokenNet)
    example = {"input_ids": torch.randint(0, 99, (3, 13)), "attention_mask": torch.ones(3, 13, dtype=torch.long)}
    mg = MaseGraph(model, example_inputs=example, dynamic_shapes={"input_ids": {0: Dim.AUTO}, "attention_mask": {0: Dim.AUTO}})
    assert mg.dynamic_dims == {"input_ids": [0], "attention_mask": [0]}
    mg.save(tmp_path / "g")
    assert json.loads((tmp_path / "g" / "recipe.json").read_text())["dynamic_dims"] == mg.dynamic_dims
    loaded = MaseGraph.load(tmp_path / "g", model=seeded(MaskedTokenNet))
    assert loaded.dynamic_dims == mg.dynamic_dims
    fc = next(n for n in loaded.nodes if n.target == "fc")
    assert fc.meta["mase"]["results"][0]["shape"] == ["batch", 13, 4]


def test_verify_at_capture_and_graph_vs_model_in_the_verify_pass():
    model = seeded(ResidualDropPathNet)
    mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 5, 8)}, verify=True)
    _, info = ml.passes.verify(mg, {"against_model": True})
    assert info["ok"], info["problems"]
    torch.manual_seed(1)
    mg.replace_module("inp", nn.Linear(8, 16))  # one model behind the graph: the source model sees it too
    mg.recompile()
    _, info = ml.passes.verify(mg, {"against_model": True, "strict": False})
    assert info["ok"], info["problems"]
    setattr(mg.model, "inp", nn.Linear(8, 16))  # a layer set on the graph's module behind the graph's back
    mg.recompile()
    _, info = ml.passes.verify(mg, {"against_model": True, "strict": False})
    assert not info["ok"] and info["problems"][0].startswith("graph vs model in eval mode: output 0 differs")
