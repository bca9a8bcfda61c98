"""The study's journal file (``output_dir/study.journal``): Optuna's journal, kept whole.

* A write that fails (a full disk) is cut back off the file, so the next writer appends after a whole
  record, not after half of one.
* A record a killed writer left half-written, or garbage as the last line, is dropped when a worker
  opens the journal (the trial it belonged to runs again); anything wrong before the last line is
  real corruption, refused with a ``UserError`` naming the file and the line.
* A journal that is not a regular file (a directory, a FIFO) or that was emptied while the directory
  holds the search's results is refused naming the file, before anything opens it.
* Records are forced to disk (fsync) when a study or trial is created or a trial ends, not after
  each of a running trial's writes (a parameter, an attribute, a heartbeat): a machine crash can
  lose only running trials' last writes, and those trials run again.

Example::

    backend = open_journal(Path("runs/s/study.journal"))    # repaired, or a UserError
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileOpenLock

from mase_lite.infra.errors import UserError
from mase_lite.search.internals import UNSYNCED_OPERATIONS

logger = logging.getLogger(__name__)


class TrialSyncedJournalFileBackend(JournalFileBackend):
    """Optuna's journal file, synced when a study or trial is created or a trial ends; a failed
    write is cut back off, and a dead writer's half record is cut off before the next write."""

    def __init__(self, path: str, lock: JournalFileOpenLock):
        super().__init__(path, lock_obj=lock)
        self.path, self.lock = path, lock

    def append_logs(self, logs: list[dict]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        self.lock.acquire()
        try:
            with open(self.path, "r+b") as f:
                size = _whole_length(f)
                f.truncate(size)
                f.seek(size)
                try:
                    f.write(text.encode("utf-8"))
                    f.flush()
                    if any(log.get("op_code") not in UNSYNCED_OPERATIONS for log in logs):
                        os.fsync(f.fileno())
                except BaseException:
                    f.truncate(size)  # never leave half a record for the next writer to append to
                    raise
        finally:
            self.lock.release()


def _whole_length(f) -> int:
    """The length of the file's whole lines (what precedes a half-written last line)."""
    end = f.seek(0, os.SEEK_END)
    pos = end
    while pos > 0:
        step = min(pos, 1 << 16)
        f.seek(pos - step)
        chunk = f.read(step)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return pos - step + cut + 1
        pos -= step
    return 0


class _Records(BaseJournalBackend):
    """Records held in memory, replayed to check them (nothing is written)."""

    def __init__(self, records: list[dict[str, Any]]):
        self.records = records

    def read_logs(self, log_number_from: int):
        return iter(self.records[log_number_from:])

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise RuntimeError("a journal being checked is not written")


def _replays(records: list[dict[str, Any]]) -> bool:
    try:
        JournalStorage(_Records(records))
    except Exception:  # Optuna's replay raises KeyError, TypeError, AssertionError, ... on a bad record
        return False
    return True


def _first_bad(records: list[dict[str, Any]]) -> int:
    """The index of the first record the replay fails on (the records do not replay as a whole)."""
    good, bad = 0, len(records)  # records[:good] replay, records[:bad] do not
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if _replays(records[:middle]) else (good, middle)
    return bad - 1


def _parse(lines: list[bytes]) -> tuple[list[dict[str, Any]], int | None]:
    """The records, and the index of the first line that is not a JSON object (``None``: all are)."""
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            return records, i
        if not isinstance(record, dict):
            return records, i
        records.append(record)
    return records, None


def repair(path: Path) -> None:
    """Drop a half-written or bad last record of the journal at ``path`` (its trial runs again), or raise
    a ``UserError`` naming the line when a record before the last one is bad. Call under the journal's lock."""
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    lines = whole.splitlines(keepends=True)
    records, bad = _parse(lines)
    if bad is None and _replays(records):
        if len(whole) < len(data):
            _cut(path, len(whole), len(lines) + 1, "it was half written")
        return
    if bad is None:
        bad = _first_bad(records)
    if bad < len(lines) - 1:
        raise UserError(
            f"{path}: line {bad + 1} of {len(lines)} is not a journal record ({_shown(lines[bad])}); the study "
            "cannot be read. Move the file away to start the study over"
        )
    _cut(path, len(whole) - len(lines[-1]), len(lines), "it is not a journal record")


def _shown(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace").strip()
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def _cut(path: Path, size: int, line: int, why: str) -> None:
    logger.warning("%s: dropped the last record (line %d: %s); the trial it belonged to runs again", path, line, why)
    with open(path, "r+b") as f:
        f.truncate(size)
        os.fsync(f.fileno())


RESULTS = ("search_report.json", "trials.csv")  # what a search that ran leaves beside its journal


def _check_file(path: Path) -> None:
    """A UserError naming ``path`` when it is not a journal this search can open: not a regular file (a
    directory, a FIFO that would block the open, a device), or emptied beside the results of trials it held."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise UserError(f"{path}: cannot read the study journal ({err.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise UserError(f"{path}: the study journal is {kind}; move it away (the search keeps its trials in a file)")
    if os.path.getsize(path) == 0:
        left = [name for name in RESULTS if (path.parent / name).exists()]
        if left:
            raise UserError(f"{path}: the study journal is empty, but {path.parent} holds a search's results ({left[0]}): "
                            "it was emptied, and its trials would be lost. Restore it, or move the directory away to "
                            "start the study over")


def open_journal(path: Path) -> TrialSyncedJournalFileBackend:
    """The journal backend at ``path``, its last record repaired (see :func:`repair`) under its lock."""
    _check_file(path)
    lock = JournalFileOpenLock(str(path))
    backend = TrialSyncedJournalFileBackend(str(path), lock)
    lock.acquire()
    try:
        repair(path)
    finally:
        lock.release()
    return backend
