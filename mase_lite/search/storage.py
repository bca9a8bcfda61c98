"""Study storage: a journal file several processes share (default), or any Optuna URL (PostgreSQL, ...).

Both record a heartbeat per running trial; a trial silent for ``grace_period`` seconds (its worker
was killed) is failed by the next worker that looks, and a copy of it is queued to run again.

Example::

    storage = open_storage(None, Path("runs/s"), heartbeat_interval=10)             # runs/s/study.journal
    storage = open_storage("postgresql+psycopg://u@host/db", Path("runs/s"), 10)
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import TrialState

from mase_lite.errors import UserError

JOURNAL = "study.journal"

# Writes a trial makes while it runs; the journal reaches the disk at the next other write (a trial's end).
_UNSYNCED = {
    JournalOperation.SET_TRIAL_PARAM,
    JournalOperation.SET_TRIAL_USER_ATTR,
    JournalOperation.SET_TRIAL_SYSTEM_ATTR,
    JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE,
}


class TrialSyncedJournalFileBackend(JournalFileBackend):
    """Optuna's journal file, forced to disk (fsync) when a study or trial is created or a trial ends,
    not after each of a running trial's writes (a sampled parameter, an attribute, a heartbeat).

    Every write is in the file, visible to every process, as soon as it returns; a machine crash can
    lose only running trials' last writes, and those trials run again.
    """

    def append_logs(self, logs: list[dict]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        self._lock.acquire()
        try:
            with open(self._file_path, "ab") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                if any(log.get("op_code") not in _UNSYNCED for log in logs):
                    os.fsync(f.fileno())
        finally:
            self._lock.release()


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


def open_storage(url: str | None, output_dir: Path, heartbeat_interval: int, grace_period: int | None = None):
    """The study storage for ``url`` (``None``: ``<output_dir>/study.journal``), heartbeat enabled."""
    grace = grace_period or 3 * heartbeat_interval
    warnings.filterwarnings("ignore", category=ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    if url is None:
        path = str(Path(output_dir) / JOURNAL)
        backend = TrialSyncedJournalFileBackend(path, lock_obj=JournalFileOpenLock(path))
        return HeartbeatJournalStorage(backend, heartbeat_interval, grace)
    try:
        return _rdb(url, heartbeat_interval, grace)
    except ImportError as err:
        raise UserError(f"storage: {url.split(':')[0]} needs a driver that is not installed ({err})") from None
    except Exception as err:  # sqlalchemy raises many kinds for a bad URL or an unreachable server
        raise UserError(f"storage: cannot open {url!r}: {type(err).__name__}: {str(err).splitlines()[0]}") from None


def _rdb(url: str, heartbeat_interval: int, grace: int, attempts: int = 5) -> RDBStorage:
    """An RDB storage; workers starting together race to create the schema, so a loser retries."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(attempts):
        try:
            return RDBStorage(
                url,
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
            )
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def heartbeat_thread(storage, trial_id: int):
    """A context manager that records ``trial_id``'s heartbeat while the block runs."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    return get_heartbeat_thread(trial_id, storage)


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's trials whose worker stopped beating (each is queued again)."""
    optuna.storages.fail_stale_trials(study)
