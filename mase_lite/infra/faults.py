"""Failures of the tool's own I/O (a full disk, a failing device, an unreachable storage): not the
user's spec and not a trial's own failure. The CLI reports one line and exits 2; a search stops,
and the trial that was running runs again when the search is resumed.

>>> import errno
>>> fault = as_fault(OSError(errno.ENOSPC, "No space left on device", "/tmp/x/report.json"))
>>> str(fault).startswith("/tmp/x/report.json: No space left on device (")
True
>>> as_fault(ValueError("a trial's own error")) is None
True
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from mase_lite.infra.errors import UserError, show_paths_as

# errno values of I/O that failed for reasons outside the run: retrying later (after freeing space or raising a
# file-size limit) succeeds
FAULT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG}
# how libraries that do not raise OSError (safetensors, torch's writers) word the same failures
_FAULT_TEXTS = {
    "No space left on device": errno.ENOSPC, "os error 28": errno.ENOSPC, "StorageFull": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT, "Input/output error": errno.EIO, "Read-only file system": errno.EROFS,
    "File too large": errno.EFBIG, "os error 27": errno.EFBIG,
}


class ToolFault(UserError):
    """The tool's own I/O failed; rerun when the cause is fixed (a search resumes where it stopped)."""


def free_space(path: str | Path) -> str:
    """Free space on the file system holding ``path`` (its nearest existing ancestor), e.g. ``'12.0 MB free on /tmp'``."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    return f"{free / 1e6:.1f} MB free on {path}"


def as_fault(err: BaseException, where: str | Path | None = None) -> ToolFault | None:
    """A :class:`ToolFault` naming the path and the free space when ``err`` (or an error it came from)
    is a full disk, a failing device or a read-only file system; ``None`` otherwise. ``where`` is
    named when the error does not say which file."""
    raised, seen = err, set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, ToolFault):
            return _shown_as(err, raised)
        code = err.errno if isinstance(err, OSError) else None
        if code is None:
            code = next((c for text, c in _FAULT_TEXTS.items() if text in str(err)), None)
        if code in FAULT_ERRNOS:
            path = getattr(err, "filename", None) or where or "."
            return _shown_as(ToolFault(f"{path}: {os.strerror(code)} ({free_space(path)})"), raised)
        err = err.__cause__ or err.__context__
    return None


def _shown_as(fault: ToolFault, raised: BaseException) -> ToolFault:
    """``fault`` showing paths as the error it was found in does (a run's staging directory as its own)."""
    show_paths_as(fault, getattr(raised, "path_aliases", {}))
    return fault
