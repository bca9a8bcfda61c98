"""Several workers on one study: one killed mid-trial and the study finished by two at once, on the
journal file and on a real PostgreSQL server."""

import copy
import os
import signal
import time
from pathlib import Path

import optuna
import pytest

import mase_lite as ml
from mase_lite.search.storage import open_storage
from tests.search.conftest import TINY_PIPELINE, WIDTH, start_worker, write_spec
from tests.conftest import PATIENCE

WIDTHS = [4, 6, 8]


def grid_spec(tiny_search, **overrides):
    overrides.setdefault("grace_period", 4)  # workers on a loaded machine beat late now and then
    return tiny_search(space=[{"path": WIDTH, "type": "choice", "values": WIDTHS}], n_trials=len(WIDTHS), **overrides)


def assert_each_width_once(report):
    trials = report["studies"][0]["trials"]
    complete = [t["params"][WIDTH] for t in trials if t["state"] == "COMPLETE"]
    assert sorted(complete) == WIDTHS, trials


def wait_for(condition, seconds=PATIENCE):
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("storage", ["journal", "postgresql"])
def test_killed_worker_is_resumed_by_two_workers(tmp_path, tiny_search, storage, request):
    flag = tmp_path / "hold"
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["plugins"] = [str(Path(__file__).with_name("hold_plugin.py"))]
    pipeline["steps"].append({"pass": "test_hold", "params": {"flag": str(flag), "call": 2}})
    url = request.getfixturevalue("postgres_url") if storage == "postgresql" else None
    spec = grid_spec(tiny_search, pipeline=pipeline, **({"storage": url} if url else {}))
    path = write_spec(tmp_path, spec)
    flag.touch()
    worker = start_worker(path)
    wait_for(lambda: (tmp_path / "holding").exists() or worker.poll() is not None)
    worker.send_signal(signal.SIGKILL)  # trial 0 is complete; trial 1 holds a grid point and never finishes
    worker.wait()
    trials_dir = Path(spec["output_dir"]) / "trials"
    assert sorted(p.name.split("-")[0] for p in trials_dir.glob(".*")) == [".1.lock", ".1.staging"]
    flag.unlink()
    # two workers at once share the storage: the killed trial is failed by heartbeat and rerun
    workers = [start_worker(path) for _ in range(2)]
    outputs = [w.communicate(timeout=PATIENCE)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    report = ml.run_search(spec).report  # a third run finds the study done
    assert_each_width_once(report)
    trials = report["studies"][0]["trials"]
    stale = [t for t in trials if t["state"] == "FAIL"]
    assert [t["number"] for t in stale] == [1] and stale[0]["error"] is None
    retry = [t for t in trials if t["retry_of"] == 1]
    assert len(retry) == 1 and retry[0]["state"] == "COMPLETE"
    states = dict(report["studies"][0]["states"])
    # a grid point handed to two workers asking at once is run by one; the other's trial is pruned unrun
    duplicates = [t for t in trials if t["state"] == "PRUNED"]
    assert states.pop("PRUNED", 0) == len(duplicates) and all(not t["metrics"] for t in duplicates)
    assert states == {"COMPLETE": 3, "FAIL": 1}
    assert not list(trials_dir.glob(".*"))  # the killed run's staging directory and lock file are gone
    if url:  # the study is in the database, not in a journal beside it
        study = optuna.load_study(study_name="search", storage=url)
        pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
        assert all(t.user_attrs == {"status": "duplicate grid point"} for t in pruned), pruned
        assert not (Path(spec["output_dir"]) / "study.journal").exists()


def test_journal_is_synced_when_trials_start_and_end(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    storage = open_storage(None, tmp_path, heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="s")
    synced.clear()
    trial = study.ask()
    assert len(synced) == 1  # the new trial
    for k in range(5):
        trial.suggest_int(f"x{k}", 0, 9)
    trial.set_user_attr("metrics", {"a": 1.0})
    assert len(synced) == 1  # a running trial's writes reach the file, not yet the disk
    other = optuna.load_study(study_name="s", storage=open_storage(None, tmp_path, heartbeat_interval=1))
    assert other.trials[0].params == trial.params and other.trials[0].user_attrs == {"metrics": {"a": 1.0}}
    study.tell(trial, 1.0)
    assert len(synced) == 2
