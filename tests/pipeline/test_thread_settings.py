"""The CLI's thread settings: --threads, else MASE_LITE_THREADS, else (without OMP_NUM_THREADS) the cores less the
processes running on them; what the run used, and what chose it, is in its report."""

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
    assert report["threads"]["cores"] >= 1 and report["threads"]["chosen_by"] == "--threads"
    monkeypatch.setenv("MASE_LITE_THREADS", "2")
    code, report = run(tmp_path)
    assert code == 0 and report["threads"]["torch"] == 2 and report["threads"]["chosen_by"] == "MASE_LITE_THREADS"
    code, report = run(tmp_path, "--threads", "1")
    assert code == 0 and report["threads"]["torch"] == 1  # the flag wins


@pytest.mark.parametrize("others, expected", [(2, 1), (1, 1), (0, 2), (5, 1)])
def test_without_a_setting_the_cores_less_the_running_processes(tmp_path, monkeypatch, others, expected):
    """Two cores that two other processes keep busy: one thread (two waited on each other: 2.9x slower)."""
    from mase_lite.infra import cores

    monkeypatch.delenv("MASE_LITE_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cores, "running_others", lambda: others)
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    code, report = run(tmp_path)
    assert code == 0 and report["threads"]["torch"] == expected
    assert report["threads"]["chosen_by"] == f"the load: {others} other running process{'es' * (others != 1)} on 2 cores"


def test_omp_num_threads_leaves_torchs_count(tmp_path, monkeypatch):
    monkeypatch.delenv("MASE_LITE_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    code, report = run(tmp_path)
    assert code == 0 and report["threads"]["torch"] == 1 and report["threads"]["chosen_by"] == "OMP_NUM_THREADS"


def test_the_running_processes_are_read_from_the_system():
    from mase_lite.infra import cores

    others = cores.running_others()
    assert others is None or 0 <= others < 10_000


def test_a_count_below_one_is_refused(tmp_path, capsys):
    code, _ = run(tmp_path, "--threads", "0")
    assert code == 2 and "--threads 0: give a positive number of threads" in capsys.readouterr().err
