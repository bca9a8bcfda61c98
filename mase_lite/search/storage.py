"""Study storage: a journal file several processes share (default), or any Optuna URL (PostgreSQL, ...).

Both record a heartbeat per running trial; a trial silent for ``grace_period`` seconds (its worker
was killed) is failed by the next worker that looks, and a copy of it is queued to run again. A
database that goes away (a restart) is retried for ``retry`` seconds; then the worker stops with a
:class:`~mase_lite.infra.faults.ToolFault` naming the storage.

Example::

    storage = open_storage(None, Path("runs/s"), heartbeat_interval=10)             # runs/s/study.journal
    storage = open_storage("postgresql+psycopg://u@host/db", Path("runs/s"), 10)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

from mase_lite.infra.errors import UserError
from mase_lite.infra.faults import ToolFault
from mase_lite.search.internals import (HEARTBEAT_CALLS, BaseHeartbeat, HeartbeatJournalStorage, stale_trial_ids,
                                       use_stale_trial_ids)
from mase_lite.search.journal import open_journal

logger = logging.getLogger(__name__)

JOURNAL = "study.journal"


def _unreachable(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain saying the database cannot be reached (refused, closed, restarting), if
    any; ``None`` when ``err`` is of another kind (a query that is wrong)."""
    from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError

    while err is not None:
        if isinstance(err, (OperationalError, InterfaceError, DisconnectionError)):
            return err
        if isinstance(err, DBAPIError) and err.connection_invalidated:
            return err
        err = err.__cause__
    return None


def _reason(cause: BaseException) -> str:
    """The first line of what the database driver said."""
    return (str(getattr(cause, "orig", None) or cause).strip().splitlines() or [type(cause).__name__])[0]


def while_unreachable(call: Callable[[], Any], retry: float, shown: str,
                      give_up: Callable[[str, float], Exception]) -> Any:
    """``call()``, called again with growing waits (0.25 s doubling to 5 s) while the database it reaches is
    unreachable, for up to ``retry`` seconds; then ``give_up(reason, seconds waited)`` is raised."""
    start, wait = time.monotonic(), 0.25
    while True:
        try:
            return call()
        except Exception as err:
            cause = _unreachable(err)
            if cause is None:
                raise
            waited = time.monotonic() - start
            if waited >= retry:
                raise give_up(_reason(cause), waited) from None
            (logger.warning if wait == 0.25 else logger.debug)(
                "storage %s unreachable (%s); retrying for up to %.0f s", shown, type(cause).__name__, retry)
            time.sleep(min(wait, max(retry - waited, 0.01)))
            wait = min(wait * 2, 5.0)


class RetryingRDBStorage(RDBStorage):
    """Optuna's RDB storage whose every call is retried while the database is unreachable, for ``retry``
    seconds; then a :class:`ToolFault` names the storage (its password hidden)."""

    retry: float = 60.0
    shown: str = "the storage"

    def _retrying(self, call, *args, **kwargs):
        return while_unreachable(lambda: call(self, *args, **kwargs), self.retry, self.shown, lambda reason, waited: ToolFault(
            f"storage: {self.shown} is unreachable ({reason}); retried for {waited:.0f} s. Run the search "
            "again when it is back: finished trials are kept, the running one runs again"))

    def stale_trial_ids(self, study_id: int) -> list[int]:
        """Optuna's stale trials and those that never beat (:func:`~mase_lite.search.internals.stale_trial_ids`)."""
        return self._retrying(stale_trial_ids, study_id)


def _retried(name: str):
    method = getattr(RDBStorage, name)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return self._retrying(method, *args, **kwargs)

    return call


for _name in [n for n, v in vars(BaseStorage).items() if callable(v) and not n.startswith("_")] + list(HEARTBEAT_CALLS):
    setattr(RetryingRDBStorage, _name, _retried(_name))
use_stale_trial_ids(RetryingRDBStorage)


def open_storage(url: str | None, output_dir: Path, heartbeat_interval: int, grace_period: int | None = None,
                 retry: float = 60.0):
    """The study storage for ``url`` (``None``: ``<output_dir>/study.journal``, repaired), heartbeat enabled."""
    grace = grace_period or 3 * heartbeat_interval
    warnings.filterwarnings("ignore", category=ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    if url is None:
        return HeartbeatJournalStorage(open_journal(Path(output_dir) / JOURNAL), heartbeat_interval, grace)
    try:
        return _rdb(url, heartbeat_interval, grace, retry)
    except ImportError as err:
        raise UserError(f"storage: {url.split(':')[0]} needs a driver that is not installed ({err})") from None
    except UserError:
        raise
    except Exception as err:  # sqlalchemy raises many kinds for a bad URL or an unreachable server
        raise UserError(f"storage: cannot open {hidden_url(url)}: {type(err).__name__}: {str(err).splitlines()[0]}") from None


def hidden_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy reads: shown as typed up to the credentials
        return url.split("@")[-1]


def _rdb(url: str, heartbeat_interval: int, grace: int, retry: float, attempts: int = 5) -> RDBStorage:
    """An RDB storage; workers starting together race to create the schema, so a loser retries; a database
    that cannot be reached (restarting) is waited for up to ``retry`` seconds, as every later call is."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    def create() -> RetryingRDBStorage:
        return RetryingRDBStorage(
            url,
            engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
        )

    shown = hidden_url(url)
    for attempt in range(1, attempts + 1):
        try:
            if url.startswith("sqlite"):  # a file is there or not: nothing to wait for
                storage = create()
            else:
                storage = while_unreachable(create, retry, shown, lambda reason, waited: UserError(
                    f"storage: {shown} is unreachable ({reason}); retried for {waited:.0f} s (storage_retry)"))
            storage.retry, storage.shown = retry, shown
            return storage
        except (IntegrityError, ProgrammingError):
            if attempt == attempts:
                raise
            time.sleep(0.5 * attempt)


@contextlib.contextmanager
def heartbeat(storage, trial_id: int) -> Iterator[None]:
    """Record ``trial_id``'s heartbeat now and every heartbeat interval while the block runs. A beat that
    fails in the background is logged; the worker's next call to the storage reports the cause."""
    interval = storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None
    if not interval:
        yield
        return
    storage.record_heartbeat(trial_id)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                storage.record_heartbeat(trial_id)
            except Exception as err:  # the main thread meets the same storage and stops the search
                logger.warning("heartbeat of trial %d not recorded: %s", trial_id, err)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's trials whose worker stopped beating (each is queued again)."""
    optuna.storages.fail_stale_trials(study)
