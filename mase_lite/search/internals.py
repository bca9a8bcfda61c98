"""The one place that touches Optuna's private API (what its public API does not offer); nothing else
in mase_lite imports ``optuna.*._*`` or reads an underscored attribute of an Optuna object."""

from __future__ import annotations

import optuna
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal._storage import JournalOperation

__all__ = ["BaseHeartbeat", "UNSYNCED_OPERATIONS", "grid_size", "grid_id", "storage_of"]

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
