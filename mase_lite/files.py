"""Writing results whole or not at all, with the modes any other file gets (the umask decides).

A directory is written into a staging directory beside it, renamed ``.ready`` when complete, and
only then swapped in: the old one is renamed aside, the new one renamed in, the old one removed.
At every moment a complete version exists, and :func:`recover` (run before every write and read
of a staged directory) puts it back at its place after a crash, and clears what crashed writers left.

>>> import pathlib, tempfile
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with staged_directory(root / "checkpoint") as tmp:
...     _ = (tmp / "recipe.json").write_text("{}")
>>> sorted(p.name for p in root.iterdir()), sorted(p.name for p in (root / "checkpoint").iterdir())
(['checkpoint'], ['recipe.json'])
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

_STAGING, _READY, _OLD = "staging", "ready", "old"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _siblings(target: Path, kind: str) -> list[Path]:
    """Leftovers of ``kind`` beside ``target``, newest first (``.<name>.<kind>-<pid>-<random>``)."""
    if not target.parent.is_dir():
        return []
    found = [p for p in target.parent.glob(f".{target.name}.{kind}-*") if p.is_dir()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _pid_of(path: Path) -> int:
    try:
        return int(path.name.rsplit(".", 1)[-1].split("-")[1])
    except (IndexError, ValueError):
        return -1


def recover(target: str | Path) -> None:
    """Put a complete version back at ``target`` after a crash mid-replace, and clear dead writers' leftovers."""
    target = Path(target)

    def dead(kind: str) -> list[Path]:
        return [p for p in _siblings(target, kind) if not _alive(_pid_of(p))]

    ready, old = dead(_READY), dead(_OLD)
    if not target.exists():
        if ready:
            os.replace(ready.pop(0), target)
        elif old:
            os.replace(old.pop(0), target)
    for leftover in ready + old + dead(_STAGING):
        shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """A fresh directory beside ``target`` to write into; it replaces ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.{_STAGING}-{os.getpid()}-", dir=target.parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
        ready = staging.with_name(staging.name.replace(f".{_STAGING}-", f".{_READY}-", 1))
        os.replace(staging, ready)
        old = None
        if target.exists():
            old = ready.with_name(ready.name.replace(f".{_READY}-", f".{_OLD}-", 1))
            os.replace(target, old)
        os.replace(ready, target)
        if old is not None:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_file(target: str | Path) -> Iterator[Path]:
    """A temporary path beside ``target`` to write; it replaces ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    staging = Path(name)
    os.chmod(staging, 0o666 & ~_umask())
    try:
        yield staging
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
