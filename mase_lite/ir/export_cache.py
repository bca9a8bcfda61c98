"""Exported programs kept on disk, so a new process does not export an architecture seen before.

The first ``torch.export`` of a process costs a second or more even for a small BERT (most of it
tracing with symbolic batch and sequence sizes); loading the saved program takes a fraction. An
entry is keyed like the in-process cache (:func:`mase_lite.ir.capture_cache.architecture_key`) plus
the versions of Python, torch, transformers and mase_lite's capture code, and holds the program
(``torch.export.save``) and the dropout probabilities recorded while exporting. A hit is checked
against the model exactly as a fresh export is; an entry that fails the check (its output differs, or it
does not run on the model), or does not load, is removed with a warning and the model exported again.

Loading an entry unpickles tensors (torch.export's format), so entries are this user's own files:
they live in ``$MASE_LITE_CACHE/export`` (default ``~/.cache/mase_lite/export``), are read only from a
directory and files this user owns and no one else may write, and never from a checkpoint or report
someone else made. Models of more than ``MAX_PARAMETER_BYTES`` are not stored (the program holds the
weights); the oldest entries go beyond ``MAX_ENTRIES``. ``MASE_LITE_EXPORT_CACHE=0`` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path

import torch

from mase_lite.ir.train_mode import DropoutRecorder
from mase_lite.infra.files import private
from mase_lite.numerics.native import cache_root

logger = logging.getLogger(__name__)

MAX_PARAMETER_BYTES = 256 << 20
MAX_ENTRIES = 64
RECORDS = "mase_lite_records.json"
_CODE = ("capture.py", "export.py", "leaves.py", "train_mode.py", "export_cache.py")  # what shapes an export


def enabled() -> bool:
    return os.environ.get("MASE_LITE_EXPORT_CACHE", "1") != "0"


def directory() -> Path:
    return cache_root() / "export"


def entry_key(architecture: tuple, model: torch.nn.Module) -> str | None:
    """The entry's file name for a model of ``architecture``, or None where none is kept (cache off,
    a model too large to store)."""
    if not enabled():
        return None
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size > MAX_PARAMETER_BYTES:
        return None
    code = _code_digest()
    if code is None:
        return None
    return hashlib.sha256("\0".join([repr(architecture), code]).encode()).hexdigest()[:32]


@functools.cache
def _code_digest() -> str | None:
    """A digest of what shapes an export besides the model: the versions of Python, torch and transformers
    and mase_lite's capture code (read once per process); None for an install without those sources."""
    import transformers

    here = Path(__file__).parent
    try:
        code = [(here / name).read_text() for name in _CODE]
    except OSError:
        return None
    parts = [platform.python_version(), torch.__version__, transformers.__version__, *code]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def load(key: str) -> tuple[torch.export.ExportedProgram, DropoutRecorder] | None:
    """The stored program and its recorded dropout probabilities, or None (no entry, or one that does
    not load: it is removed)."""
    place = _place()
    path = None if place is None else place / f"{key}.pt2"
    if path is None or not path.is_file() or not private(path):
        return None
    try:
        extra = {RECORDS: ""}
        program = torch.export.load(path, extra_files=extra)
        records = json.loads(extra[RECORDS])
        recorder = DropoutRecorder()
        recorder.dropout, recorder.sdpa = [float(p) for p in records["dropout"]], [float(p) for p in records["sdpa"]]
    except Exception as err:  # a damaged entry: capture as if there were none
        logger.warning("the stored export %s does not load (%s: %s); exporting again", path, type(err).__name__, err)
        discard(key)
        return None
    os.utime(path)  # recently used: kept longest
    return program, recorder


def store(key: str, program: torch.export.ExportedProgram, recorder: DropoutRecorder) -> None:
    """Write the entry whole (a temporary file renamed into place); a failure only costs the next process time."""
    place = _place(create=True)
    if place is None:
        return
    records = json.dumps({"dropout": recorder.dropout, "sdpa": recorder.sdpa})
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".pt2", dir=place)
    os.close(fd)
    try:
        torch.export.save(program, tmp, extra_files={RECORDS: records})
        os.replace(tmp, place / f"{key}.pt2")
    except Exception as err:
        logger.info("could not store the export in %s (%s: %s)", place, type(err).__name__, err)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _prune(place)


def discard(key: str) -> None:
    place = _place()
    if place is not None:
        (place / f"{key}.pt2").unlink(missing_ok=True)


def _place(create: bool = False) -> Path | None:
    """The cache directory when this user alone may write it (created so where asked), else None."""
    try:
        path = directory()
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.is_dir():
            return None
    except (OSError, RuntimeError):  # no home directory, a read-only one, a file in the way
        return None
    if not private(path):
        logger.info("not using the export cache %s: it is not this user's alone", path)
        return None
    return path


def _prune(place: Path) -> None:
    entries = sorted(place.glob("*.pt2"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[MAX_ENTRIES:]:
        old.unlink(missing_ok=True)
