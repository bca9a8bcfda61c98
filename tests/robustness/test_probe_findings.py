"""Defects the reliability probe (benchmarks/robustness.py) found, each reproduced."""

import json

import pytest

from mase_lite import UserError
from mase_lite.train.tokenizer import load_tokenizer, train_wordpiece


@pytest.mark.parametrize("config, reason", [
    ({"model_max_length": "x", "tokenizer_class": 5}, "AttributeError: 'int' object has no attribute 'removesuffix'"),
    ([], "AttributeError: "),
])
def test_a_tokenizer_config_of_the_wrong_types_is_refused_naming_the_directory(tmp_path, config, reason):
    directory = tmp_path / "ckpt" / "tokenizer"
    train_wordpiece(["the movie was great", "the plot was dull"], vocab_size=60).save_pretrained(str(directory))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as err:
        load_tokenizer(tmp_path / "ckpt", field="path")
    assert str(err.value).startswith(f"path = '{tmp_path / 'ckpt'}': could not load its tokenizer ({reason}")
