"""The contract between mase_lite and Optuna's private API, all of it in mase_lite.search.internals.

Each test states one thing the search relies on that Optuna's public API does not promise; an Optuna
release that changes it fails here, naming what to adapt, before any search misbehaves.
"""

import time

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import TrialState

from mase_lite.search import internals

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning", "ignore:Heartbeat of storage")
from mase_lite.search.internals import HEARTBEAT_CALLS, UNSYNCED_OPERATIONS, HeartbeatJournalStorage


class Recording(BaseJournalBackend):
    """A journal backend that keeps its records in a list."""

    def __init__(self):
        self.records = []

    def read_logs(self, log_number_from):
        return iter(self.records[log_number_from:])

    def append_logs(self, logs):
        self.records.extend(logs)


def _study(storage=None, sampler=None):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.create_study(storage=storage or optuna.storages.InMemoryStorage(), sampler=sampler)


def test_storage_of_is_the_storage_the_study_writes():
    storage = optuna.storages.InMemoryStorage()
    study = _study(storage)
    assert internals.storage_of(study) is storage


def test_trial_id_names_the_running_trial_in_its_storage():
    study = _study()
    study.ask()
    trial = study.ask()
    frozen = internals.storage_of(study).get_trial(internals.trial_id(trial))
    assert (frozen.number, frozen.state) == (1, TrialState.RUNNING)


def test_grid_size_counts_every_point_and_grid_id_names_the_point_of_a_trial():
    sampler = optuna.samplers.GridSampler({"x": [1, 2, 3], "y": ["a", "b"]}, seed=0)
    assert internals.grid_size(sampler) == 6
    study = _study(sampler=sampler)
    seen = set()
    for i in range(6):
        trial = study.ask()
        x, y = trial.suggest_categorical("x", [1, 2, 3]), trial.suggest_categorical("y", ["a", "b"])
        point = internals.grid_id(study, trial)
        assert point == study.trials[-1].system_attrs["grid_id"]
        seen.add((point, x, y))
        if i < 5:  # telling the last point stops the study, which only an optimize loop may do
            study.tell(trial, 0.0)
    assert sorted(p for p, _, _ in seen) == list(range(6)) and len({(x, y) for _, x, y in seen}) == 6


def test_an_rdb_storage_has_the_heartbeat_calls_the_retrying_storage_wraps():
    for name in HEARTBEAT_CALLS:
        assert callable(getattr(RDBStorage, name)), name


def test_a_silent_trial_is_failed_as_stale_and_queued_again():
    """Optuna's fail_stale_trials asks a heartbeat storage for its stale trials (a private call)."""
    storage = HeartbeatJournalStorage(Recording(), heartbeat_interval=1, grace_period=1)
    assert isinstance(storage, internals.BaseHeartbeat) and storage.get_heartbeat_interval() == 1
    study = _study(storage)
    beating, silent = study.ask(), study.ask()
    storage.record_heartbeat(internals.trial_id(silent))
    storage.set_trial_system_attr(internals.trial_id(silent), "heartbeat", time.time() - 60)
    storage.record_heartbeat(internals.trial_id(beating))
    optuna.storages.fail_stale_trials(study)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [TrialState.RUNNING, TrialState.FAIL, TrialState.WAITING]  # the silent one retried
    assert study.trials[2].system_attrs["failed_trial"] == silent.number


def test_the_records_a_running_trial_writes_are_the_unsynced_ones():
    backend = Recording()
    study = _study(optuna.storages.JournalStorage(backend))
    trial = study.ask()
    start = len(backend.records)
    trial.suggest_float("x", 0.0, 1.0)
    trial.set_user_attr("u", 1)
    internals.storage_of(study).set_trial_system_attr(internals.trial_id(trial), "heartbeat", 1.0)
    trial.report(0.5, step=0)
    running = backend.records[start:]
    assert len(running) == 4 and all(r["op_code"] in UNSYNCED_OPERATIONS for r in running)
    study.tell(trial, 1.0)
    assert backend.records[-1]["op_code"] not in UNSYNCED_OPERATIONS  # a trial's end is synced


@pytest.mark.parametrize("name", internals.__all__)
def test_every_name_the_adapter_offers_exists(name):
    assert getattr(internals, name) is not None
