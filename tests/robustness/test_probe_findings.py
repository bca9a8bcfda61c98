"""Defects the reliability probe (benchmarks/robustness.py) found, each reproduced."""

import json

import pytest

from mase_lite import UserError
from mase_lite.cli import main
from mase_lite.workloads.tokenizer import load_tokenizer, train_wordpiece


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


def test_a_size_torch_cannot_hold_gets_one_line_not_torchs_cpp_stack(tmp_path, capsys):
    spec = {"data": {"n_train": 8, "n_test": 8, "max_length": 8}, "steps": [], "output_dir": str(tmp_path / "out"),
            "model": {"hf_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                                    "intermediate_size": 10**30}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mase-lite: error: model.hf_config: the model cannot be built from these values (TypeError: ")
    assert "Overflow when unpacking long long" in err and len(err.strip().splitlines()) == 1, err
