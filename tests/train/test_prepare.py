import json

import pytest
import torch

from mase_lite.infra.errors import UserError
from mase_lite.workloads import prepare


def test_trained_tokenizer_sets_the_vocabulary_and_is_saved_with_the_run(tmp_path, tiny_model_spec, tiny_data_spec):
    model, data = prepare(tiny_model_spec, tiny_data_spec, tmp_path, seed=0)
    assert model.config.vocab_size == len(data.tokenizer) == data.vocab_size
    assert model.config.num_labels == data.num_labels == 2
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
    assert len(list((tmp_path / "data_cache").glob("*.safetensors"))) == 1
    out = model(**data.example_batch())
    assert out.logits.shape == (2, 2) and torch.isfinite(out.loss)


def test_same_seed_same_model_and_data(tmp_path, tiny_model_spec, tiny_data_spec):
    m1, d1 = prepare(tiny_model_spec, tiny_data_spec, tmp_path / "a", seed=4)
    m2, d2 = prepare(tiny_model_spec, tiny_data_spec, tmp_path / "b", seed=4)
    assert d1.texts == d2.texts and d1.fingerprint == d2.fingerprint
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))


def test_no_data_builds_the_model_alone(tmp_path):
    model, data = prepare({}, None, tmp_path, seed=0)
    assert data is None and model.config.vocab_size == 30522 and model.config.num_labels == 2


def test_label_outside_num_labels_fails_before_anything_is_written(tmp_path, tiny_model_spec):
    rows = [{"text": "a b", "label": 0}, {"text": "c d", "label": 2}, {"text": "e", "label": 1}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    run_dir = tmp_path / "run"
    spec = tiny_model_spec.model_copy(update={"num_labels": 2})
    with pytest.raises(UserError, match=r"label 2 is outside num_labels = 2 \(allowed: 0..1\)"):
        prepare(spec, {"dataset": "json", "path": str(tmp_path / "rows.json"), "test_fraction": 0.34}, run_dir, 0)
    assert not run_dir.exists()


def test_data_longer_than_the_model_positions(tmp_path, tiny_model_spec):
    with pytest.raises(UserError, match=r"data.max_length = 100 exceeds the model's max_position_embeddings \(64\)"):
        prepare(tiny_model_spec, {"n_train": 10, "n_test": 4, "max_length": 100}, tmp_path / "run", 0)
    assert not (tmp_path / "run").exists()


def test_pretrained_directory_brings_its_tokenizer(tmp_path, tiny_model_spec, tiny_data_spec):
    model, data = prepare(tiny_model_spec, tiny_data_spec, tmp_path / "first", seed=0)
    model.save_pretrained(str(tmp_path / "pre"))
    data.tokenizer.save_pretrained(str(tmp_path / "pre"))
    other_data = tiny_data_spec.model_copy(update={"n_train": 20})
    model2, data2 = prepare({"pretrained": str(tmp_path / "pre")}, other_data, tmp_path / "second", seed=0)
    assert data2.tokenizer.get_vocab() == data.tokenizer.get_vocab()
    assert not data2.trained_tokenizer and not (tmp_path / "second" / "tokenizer").exists()
    assert torch.equal(model2.bert.embeddings.word_embeddings.weight, model.bert.embeddings.word_embeddings.weight)


def test_bad_sections_given_as_dicts_are_user_errors_naming_the_field(tmp_path):
    with pytest.raises(UserError, match=r"^model: give one of hf_config, pretrained, factory; got hf_config, pretrained$"):
        prepare({"hf_config": {}, "pretrained": "x"}, None, tmp_path, 0)
    with pytest.raises(UserError, match=r"data.max_length: Input should be greater than or equal to 4"):
        prepare({}, {"max_length": 2}, tmp_path, 0)
    with pytest.raises(UserError, match=r"data.rows: unknown key; allowed keys: block_size, cache_dir, config, dataset, .*vocab_size \(got 3\)"):
        prepare({}, {"rows": 3}, tmp_path, 0)
