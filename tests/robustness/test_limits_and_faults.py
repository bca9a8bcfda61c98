"""Sizes a user types are checked against the machine's memory before allocation (the message names
the field and the estimate); the faults a probe found exit 2 with a message instead of a traceback."""

import json
import re

import pytest

from mase_lite.cli import main

BASE = {"data": {"n_train": 16, "n_test": 8, "max_length": 8},
        "model": {"hf_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}}}


def _run(tmp_path, capsys, **changes):
    spec = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        target = spec
        for part in parents:
            target = target.setdefault(part, {})
        target[key] = value
    spec.setdefault("output_dir", str(tmp_path / "out"))
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    code = main(["run", str(tmp_path / "spec.json")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("changes, message", [
    ({"data__max_length": 10**9}, r"data.max_length: 24 rows of 1000000000 tokens while tokenizing would need about 7680.0 GB"),
    ({"data__n_test": 10**12}, r"data.n_train \+ data.n_test: 1000000000016 synthetic rows would need about 400000.0 GB"),
    ({"model__num_labels": 10**9}, r"model.num_labels: the names of 1000000000 labels and their confusion matrix would "
                                   r"need about 8000000200.0 GB"),
    ({"model__hf_config__hidden_size": 10**7}, r"model.hf_config: a bert model of this config would need about \d+\.\d GB"),
    ({"steps": [{"pass": "lora", "params": {"rank": 10**9}}]}, r"steps.0.params.rank: 8 adapters of rank 1000000000 would need about 1096.0 GB"),
])
def test_sizes_beyond_the_machine_are_refused_before_allocation(tmp_path, capsys, changes, message):
    code, err = _run(tmp_path, capsys, **changes)
    assert code == 2
    assert re.search(message + r", more than the \d+\.\d GB of memory available", err), err


@pytest.mark.parametrize("changes, message", [
    ({"seed": 2**40}, "seed: Input should be less than 4294967296 (got 1099511627776)"),
    ({"model__hf_config__hidden_size": -8}, "model.hf_config.hidden_size = -8: must be at least 1 (bert's default is 768)"),
    ({"model__hf_config__num_attention_heads": 0}, "model.hf_config.num_attention_heads = 0: must be at least 1"),
    ({"model__hf_config__hidden_size": 16.5}, "model.hf_config: not a valid bert config"),
    ({"data__n_train": True}, "data.n_train: Input should be a valid integer (got True)"),
    ({"output_dir": ""}, "output_dir: String should have at least 1 character"),
    ({"output_dir": "x" * 5000}, "output_dir: cannot create directory"),
    ({"steps": [{"pass": "count", "params": {"dims": {"batch": 2, "zz": 3}}}]}, "unknown dim(s) zz; this graph's symbolic dims: batch, seq"),
    ({"steps": [{"pass": "count", "params": {"dims": {"batch": -2}}}]}, "dim values must be at least 1, got {'batch': -2}"),
])
def test_faults_exit_2_with_a_message(tmp_path, capsys, changes, message):
    code, err = _run(tmp_path, capsys, **changes)
    assert code == 2 and message in err, err


def test_a_spec_that_is_not_utf8_exits_2(tmp_path, capsys):
    (tmp_path / "spec.json").write_bytes(b'{"name": "\xff"}')
    assert main(["run", str(tmp_path / "spec.json")]) == 2
    assert "spec.json: not UTF-8 text (byte 10): a JSON file is UTF-8 text" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m mase_lite.cli schema pipeline | head -c 1", shell=True,
                          capture_output=True, text=True)
    assert proc.stdout == "{" and proc.stderr == ""
