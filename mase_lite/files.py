"""Writing results whole or not at all.

Example::

    with staged_directory("runs/x/checkpoint") as tmp:
        (tmp / "recipe.json").write_text("{}")      # replaces runs/x/checkpoint only if this block succeeds
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """A fresh directory beside ``target`` to write into; it replaces ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
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
    try:
        yield staging
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
