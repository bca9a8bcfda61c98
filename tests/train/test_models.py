import pytest
import torch
from pydantic import ValidationError

from mase_lite.infra.errors import UserError
from mase_lite.workloads.models import ModelSpec, build_model


def test_default_is_bert_tiny_shaped_sdpa_sequence_classifier_in_eval_mode():
    model = build_model(ModelSpec(), num_labels=2, vocab_size=321, seed=0)
    c = model.config
    assert type(model).__name__ == "BertForSequenceClassification"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (128, 2, 2, 512)
    assert (c.max_position_embeddings, c.vocab_size, c.num_labels) == (512, 321, 2)
    assert c._attn_implementation == "sdpa" and not model.training


def test_same_seed_same_weights_other_seed_other_weights(tiny_model_spec):
    a, b, c = (build_model(tiny_model_spec, vocab_size=50, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.classifier.weight, c.classifier.weight)


def test_config_fields_eager_attention_and_explicit_vocab(tiny_model_spec):
    spec = ModelSpec(hf_config={**tiny_model_spec.hf_config, "vocab_size": 99}, num_labels=3, attn_implementation="eager")
    model = build_model(spec, num_labels=3, vocab_size=50)
    assert (model.config.vocab_size, model.config.num_labels, model.config.hidden_size) == (99, 3, 16)
    assert model.config._attn_implementation == "eager"


def test_bad_hf_configs_are_named():
    with pytest.raises(UserError, match=r"unknown bert config key\(s\) hidden_sise; allowed: .*hidden_size"):
        build_model({"hf_config": {"hidden_sise": 64}})
    with pytest.raises(UserError, match=r"model.hf_config.model_type = 'bertx' is not a transformers model type"):
        build_model({"hf_config": {"model_type": "bertx"}})
    with pytest.raises(UserError, match=r"model.hf_config.vocab_size = 10 is smaller than the tokenizer's vocabulary \(50 tokens\)"):
        build_model({"hf_config": {"vocab_size": 10}}, vocab_size=50)
    with pytest.raises(UserError, match=r"give the number of classes as model.num_labels"):
        build_model({"hf_config": {"num_labels": 3}})


def test_spec_accepts_one_source_only():
    with pytest.raises(ValidationError, match="give one of hf_config, pretrained, factory; got hf_config, pretrained"):
        ModelSpec(hf_config={}, pretrained="x")
    with pytest.raises(ValidationError, match="'kwargs' is for 'factory' models only"):
        ModelSpec(kwargs={"a": 1})
    with pytest.raises(ValidationError, match="factory must look like 'package.module:function'"):
        ModelSpec(factory="torch.nn.Linear")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ModelSpec(hidden_size=3)


def test_factory_builds_any_module_and_gives_its_recipe():
    spec = ModelSpec(factory="torch.nn:Linear", kwargs={"in_features": 4, "out_features": 2})
    model = build_model(spec)
    assert isinstance(model, torch.nn.Linear) and model.weight.shape == (2, 4)
    assert spec.recipe() == {"factory": "torch.nn:Linear", "kwargs": {"in_features": 4, "out_features": 2}}
    assert ModelSpec().recipe() is None


def test_factory_errors():
    with pytest.raises(UserError, match=r"model.factory = 'no_such_pkg.nets:make': cannot import it"):
        build_model({"factory": "no_such_pkg.nets:make"})
    with pytest.raises(UserError, match=r"model.factory = 'collections:OrderedDict' returned OrderedDict, not an nn.Module"):
        build_model({"factory": "collections:OrderedDict"})
    with pytest.raises(UserError, match=r"bad model.kwargs \['bogus'\]"):
        build_model({"factory": "torch.nn:Linear", "kwargs": {"bogus": 1}})


def test_pretrained_from_a_local_directory_keeps_its_weights(tmp_path, tiny_model_spec):
    saved = build_model(tiny_model_spec, num_labels=2, vocab_size=60, seed=3)
    saved.save_pretrained(str(tmp_path))
    loaded = build_model({"pretrained": str(tmp_path)}, num_labels=2, seed=9)
    assert type(loaded) is type(saved)
    for (name, a), b in zip(saved.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_pretrained_hub_name_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"model.pretrained = 'prajjwal1/bert-tiny': could not load it .* local directory"):
        build_model({"pretrained": "prajjwal1/bert-tiny"})
