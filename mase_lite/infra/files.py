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
import errno
import os
import re
import resource
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from mase_lite.infra.errors import UserError

RECIPE = "recipe.json"  # a checkpoint's manifest: what makes a directory a checkpoint

_STAGING, _READY, _OLD, _TEMP = "staging", "ready", "old", "tmp"


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


_LEFTOVER = re.compile(r"(\d+)-[A-Za-z0-9_]+")  # the <pid>-<random> tail of a staging name (mkdtemp's letters)


def _leftovers(target: Path, kind: str) -> list[Path]:
    """What dead writers left beside ``target``, newest first: ``.<name>.<kind>-<pid>-<random>`` for exactly
    ``target``'s name (compared as text, not a pattern: a name with ``*`` or ``[`` matches only itself)."""
    if not target.parent.is_dir():
        return []
    head = f".{target.name}.{kind}-"
    found = []
    for path in target.parent.iterdir():
        tail = _LEFTOVER.fullmatch(path.name[len(head):]) if path.name.startswith(head) else None
        if tail is not None and not _alive(int(tail.group(1))):
            found.append(path)
    return sorted(found, key=lambda p: p.lstat().st_mtime, reverse=True)


def _remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a directory tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def recover(target: str | Path) -> None:
    """Put a complete version back at ``target`` after a crash mid-replace, and clear dead writers' leftovers."""
    target = Path(target)
    ready, old = _leftovers(target, _READY), _leftovers(target, _OLD)
    if not (target.exists() or target.is_symlink()):
        if ready:
            os.replace(ready.pop(0), target)
        elif old:
            os.replace(old.pop(0), target)
    for leftover in ready + old + _leftovers(target, _STAGING):
        _remove(leftover)


def temp_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory in ``parent`` with the mode the umask gives (not mkdtemp's 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


def follow_umask(path: str | Path) -> None:
    """Give a file that a library created with a fixed mode (safetensors: 0600) the mode the umask gives."""
    os.chmod(path, 0o666 & ~_umask())


@contextlib.contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """A fresh directory beside ``target`` to write into; it replaces ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    head = f".{target.name}.{_STAGING}-"
    staging = temp_dir(target.parent, f"{head}{os.getpid()}-")
    tail = staging.name[len(head):]
    try:
        yield staging
        ready = staging.with_name(f".{target.name}.{_READY}-{tail}")
        os.replace(staging, ready)
        old = None
        if target.exists():
            old = staging.with_name(f".{target.name}.{_OLD}-{tail}")
            os.replace(target, old)
        os.replace(ready, target)
        if old is not None:
            _remove(old)
    except Exception as err:
        raise _as_written(err, staging, target) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_file(target: str | Path) -> Iterator[Path]:
    """A temporary path beside ``target`` to write; it replaces ``target`` when the block succeeds (a killed
    writer's temporary file is removed by the next write)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in _leftovers(target, _TEMP):  # a killed writer's
        _remove(leftover)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.{_TEMP}-{os.getpid()}-", dir=target.parent)
    os.close(fd)
    staging = Path(name)
    os.chmod(staging, 0o666 & ~_umask())
    try:
        yield staging
        os.replace(staging, target)
    except Exception as err:
        raise _as_written(err, staging, target) from None
    finally:
        staging.unlink(missing_ok=True)


def _as_written(err: BaseException, staging: Path, target: Path) -> BaseException:
    """A failed write into ``staging`` as the user sees it: naming ``target`` (not the staging name), with its cause
    where a library lost the errno (numpy's ``tofile`` says "N requested and 0 written") or worded it its own way
    (safetensors' "os error 28")."""
    from mase_lite.infra.faults import as_fault

    if not isinstance(err, OSError):
        return as_fault(err, target) or err
    name = str(err.filename) if err.filename is not None else str(staging)
    if not name.startswith(str(staging)):
        return err
    name = str(target) + name[len(str(staging)):]
    code = err.errno if err.errno is not None else _lost_errno(staging, target)
    if code is None:
        return err
    return OSError(code, err.strerror if err.errno is not None else os.strerror(code), name)


def _lost_errno(staging: Path, target: Path) -> int | None:
    """Why a write into ``staging`` failed when the library did not say: a full file system, or a file that reached
    this process's file-size limit; ``None`` when neither is so."""
    try:
        if os.statvfs(target.parent).f_bavail == 0:
            return errno.ENOSPC
    except OSError:
        pass
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    files = [staging] if staging.is_file() else [p for p in staging.rglob("*") if p.is_file()]
    if limit != resource.RLIM_INFINITY and any(p.stat().st_size >= limit for p in files):
        return errno.EFBIG
    return None


def check_regular(directory: str | Path, what: str) -> None:
    """Refuse a ``directory`` holding anything but regular files and directories: a reader would hang
    on a FIFO or a device, and a link to one is the same."""
    for path in Path(directory).rglob("*"):
        if not (path.is_file() or path.is_dir()):
            raise UserError(f"{path}: not a regular file; {what} holds only files and directories")


def open_regular(path: str | Path) -> BinaryIO | None:
    """``path`` opened for reading when it is a regular file, else None (a FIFO, a device, a directory: opened
    without blocking and closed again, so a swap of the name after a check cannot make the reader hang); the
    ``OSError`` of a path that cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, what: str, per_byte: float = 1.0) -> bytes:
    """The bytes of the regular file ``path``; a FIFO, a device or a directory is refused (a ``UserError`` naming
    ``path`` and ``what`` it should be) without blocking, and a file whose reader would take more than the memory
    available (``per_byte`` bytes per byte of the file, at its peak) is not read.

    >>> read_regular("/", "a model file")
    Traceback (most recent call last):
    ...
    mase_lite.infra.errors.UserError: /: not a regular file; a model file is one
    """
    from mase_lite.infra.limits import check_fits

    try:
        file = open_regular(path)
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror})") from None
    if file is None:
        raise UserError(f"{path}: not a regular file; {what} is one")
    with file:
        size = os.fstat(file.fileno()).st_size
        check_fits(str(path), size * per_byte, f"reading {what} of {size} bytes")
        try:
            return file.read()
        except OSError as err:
            raise UserError(f"{path}: cannot read it ({err.strerror})") from None


def head_of(path: str | Path, size: int) -> bytes | None:
    """The first ``size`` bytes of ``path`` when it is a regular file (read without blocking on a FIFO), else None."""
    try:
        file = open_regular(path)
    except OSError:
        return None
    if file is None:
        return None
    with file:
        return file.read(size)


def check_inside(path: str | Path, root: str | Path, field: str) -> None:
    """Refuse a ``path`` under the directory ``root`` a user named that is, through a symbolic link, somewhere
    else: what a directory's reader reads is the directory, not what its links point to.

    >>> check_inside("/tmp/a/b.csv", "/tmp/a", "data.path")
    """
    real, base = Path(path).resolve(), Path(root).resolve()
    if real != base and base not in real.parents:
        raise UserError(f"{path} is a link to {real}, outside {root}: copy the file into the directory instead",
                        location=(field,))


def check_writable(directory: str | Path, field: str) -> None:
    """Refuse a ``directory`` (or, while it does not exist, its nearest existing ancestor) that this
    process cannot write: a ``UserError`` naming ``field``."""
    path = Path(os.path.abspath(directory))
    while not path.exists() and path != path.parent:
        path = path.parent
    if path.is_dir() and (not os.access(path, os.W_OK | os.X_OK) or os.statvfs(path).f_flag & os.ST_RDONLY):
        raise UserError(f"{path} is read-only for this process; choose a directory you can write", location=(field,))


def private(path: str | Path) -> bool:
    """Whether ``path`` belongs to this user and no one else may write it (not through a symbolic link): what
    a cache may load or run."""
    try:
        info = Path(path).lstat()
    except OSError:
        return False
    return (not stat.S_ISLNK(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
