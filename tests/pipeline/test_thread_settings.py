"""The CLI's thread settings: --threads, else MASE_LITE_THREADS, else torch's; what the run used is in its report."""

import json

import pytest
import torch

from mase_lite.cli import main

SPEC = {"model": {"task": "image-classification", "hf_config": {"model_type": "resnet", "embedding_size": 8,
                                                                "hidden_sizes": [8, 16], "depths": [1, 1]}},
        "data": {"n_train": 8, "n_test": 8, "image_size": 8}, "steps": [{"pass": "count"}]}


@pytest.fixture(autouse=True)
def _restore_threads():
    count = torch.get_num_threads()
    yield
    torch.set_num_threads(count)


def run(tmp_path, *flags, env=None, monkeypatch=None):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**SPEC, "output_dir": str(tmp_path / "run")}))
    code = main([*flags, "run", str(path)])
    report = json.loads((tmp_path / "run" / "report.json").read_text()) if code == 0 else None
    return code, report


def test_threads_from_the_flag_then_the_environment(tmp_path, monkeypatch):
    code, report = run(tmp_path, "--threads", "1")
    assert code == 0 and report["threads"]["torch"] == 1 and report["threads"]["adaptive"] is False  # tests pin it
    assert report["threads"]["cores"] >= 1
    monkeypatch.setenv("MASE_LITE_THREADS", "2")
    code, report = run(tmp_path)
    assert code == 0 and report["threads"]["torch"] == 2
    code, report = run(tmp_path, "--threads", "1")
    assert code == 0 and report["threads"]["torch"] == 1  # the flag wins


def test_a_count_below_one_is_refused(tmp_path, capsys):
    code, _ = run(tmp_path, "--threads", "0")
    assert code == 2 and "--threads 0: give a positive number of threads" in capsys.readouterr().err
