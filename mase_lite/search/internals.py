"""The one place that touches Optuna's private API (what its public API does not offer); nothing else
in mase_lite imports ``optuna.*._*`` or reads an underscored attribute of an Optuna object."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import TrialState

__all__ = ["BaseHeartbeat", "HEARTBEAT_CALLS", "HeartbeatJournalStorage", "UNSYNCED_OPERATIONS", "grid_id",
           "grid_size", "stale_trial_ids", "storage_of", "trial_id", "use_stale_trial_ids"]

# the calls a heartbeat storage gets besides BaseStorage's (an RDB storage retries them like the others)
HEARTBEAT_CALLS = ("record_heartbeat",)

# journal records a running trial writes; they reach the disk with the next other record (a trial's end)
UNSYNCED_OPERATIONS = frozenset({
    JournalOperation.SET_TRIAL_PARAM,
    JournalOperation.SET_TRIAL_USER_ATTR,
    JournalOperation.SET_TRIAL_SYSTEM_ATTR,
    JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE,
})


def storage_of(study: optuna.Study):
    """The storage a study reads and writes."""
    return study._storage


def grid_size(sampler: optuna.samplers.GridSampler) -> int:
    """The number of points of a grid sampler's grid."""
    return len(sampler._all_grids)


def grid_id(study: optuna.Study, trial: optuna.Trial) -> int | None:
    """The grid point a grid sampler gave ``trial`` (read fresh from the storage)."""
    return study._storage.get_trial_system_attrs(trial._trial_id).get("grid_id")


def trial_id(trial: optuna.Trial) -> int:
    """The storage's id of a running trial."""
    return trial._trial_id


def stale_trial_ids(storage: optuna.storages.RDBStorage, study_id: int) -> list[int]:
    """The running trials of an RDB storage to fail: Optuna's stale ones (silent past the grace period) and those
    that never beat and started more than the grace period ago, whose worker was killed between ``ask`` and the
    first heartbeat (Optuna's check skips a trial without a heartbeat row, so it would run for ever)."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    stale = optuna.storages.RDBStorage._get_stale_trial_ids(storage, study_id)
    grace = storage.grace_period or 2 * storage.heartbeat_interval  # Optuna's own default
    cutoff = datetime.now() - timedelta(seconds=grace)  # datetime_start is the asking worker's clock
    with _create_scoped_session(storage.scoped_session) as session:
        running = (session.query(models.TrialModel)
                   .filter(models.TrialModel.study_id == study_id, models.TrialModel.state == TrialState.RUNNING)
                   .all())
        silent = [t.trial_id for t in running if not t.heartbeats and t.datetime_start is not None
                  and t.datetime_start < cutoff and t.trial_id not in stale]
    return stale + silent


def use_stale_trial_ids(cls: type) -> None:
    """Make Optuna's stale-trial check of the RDB storage class ``cls`` call its ``stale_trial_ids``."""
    cls._get_stale_trial_ids = lambda self, study_id: self.stale_trial_ids(study_id)


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """Optuna's journal storage plus the heartbeat its RDB storage has: a running trial's heartbeat
    is a system attribute refreshed every ``heartbeat_interval`` seconds."""

    def __init__(self, backend, heartbeat_interval: int, grace_period: int):
        super().__init__(backend)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, "heartbeat", time.time())
        except UpdateFinishedTrialError:
            pass  # another worker already failed this trial as stale

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            start = t.datetime_start.timestamp() if t.datetime_start else now
            if now - t.system_attrs.get("heartbeat", start) > self.grace_period:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self):
        return RetryHeartbeatStaleTrialCallback()
