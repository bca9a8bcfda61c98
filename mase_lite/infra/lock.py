"""One run at a time per output directory: a lock file held (``flock``) for the whole run.

The lock is ``.<name>.lock`` beside the directory (:func:`lock_path`), holding the owner's pid: it
guards the directory's name even while a new directory is swapped in. The kernel releases it when
its process exits, however it exits, so a lock left by a killed run is simply taken over.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> with DirectoryLock(d, "output_dir"):
...     DirectoryLock(d, "output_dir").acquire()
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: output_dir: ... is in use by another run (pid ...); wait for it to finish or choose another output_dir
>>> with DirectoryLock(d, "output_dir"):   # released on exit: the next run takes it
...     pass
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mase_lite.infra.errors import UserError


def lock_path(directory: str | Path) -> Path:
    """The lock file of ``directory``: hidden beside it, ``<parent>/.<name>.lock``."""
    directory = Path(directory)
    return directory.with_name(f".{directory.name}.lock")


class DirectoryLock:
    """An exclusive lock on ``directory`` (whose parent must exist); ``field`` names it in the refusal."""

    def __init__(self, directory: str | Path, field: str):
        self.directory = Path(directory)
        self.path = lock_path(directory)
        self.field = field
        self._fd: int | None = None

    def acquire(self) -> "DirectoryLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise UserError(
                    f"{self.directory} is in use by another run (pid {owner}); "
                    f"wait for it to finish or choose another {self.field}",
                    location=(self.field,),
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file its previous owner unlinked while we opened it
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and let go of the lock (idempotent)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:  # a run that raised before releasing still lets go when its lock is dropped
        if self._fd is not None:
            os.close(self._fd)

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
