"""Where an export may write: nothing that stands at its path is destroyed, unless it is a previous export of the
same kind and the user asked to replace it.

Refused, each in one message naming the field (``-o`` on the command line, ``path`` in a step):

- a path holding a NUL byte, a name longer than file systems take, a parent that is not a directory;
- a link, a device, a FIFO or a socket at the path (a link's target is not written through);
- the model's source (the checkpoint, a pretrained directory), a directory holding it, or a place inside it;
- anything else that exists there, unless the target recognises it as its own export (a marker each target
  writes and reads, its ``is_export``) and ``overwrite`` is given.

>>> import tempfile
>>> from pathlib import Path
>>> folder = Path(tempfile.mkdtemp())
>>> check_destination(folder / "new.gguf", "gguf", lambda p: False, overwrite=False, field="-o")   # new: fine
>>> check_destination(folder, "gguf", lambda p: False, overwrite=True, field="-o")
Traceback (most recent call last):
...
mase_lite.deploy.errors.ExportError: -o: ... exists and is not a gguf export of mase_lite, so it is not replaced; remove it yourself or choose another path
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from mase_lite.deploy.errors import ExportError

MAX_NAME = 255  # bytes in one name (ext4, xfs, btrfs, tmpfs)
MAX_PATH = 4095  # bytes in a whole path (PATH_MAX less its NUL)
KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
         stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a link"}


def check_destination(path: str | Path, target: str, is_export: Callable[[Path], bool], *, overwrite: bool,
                      field: str, sources: Iterable[str | Path] = ()) -> None:
    """Refuse writing ``target``'s export at ``path`` when that would destroy what stands there (see above)."""
    text = os.fspath(path)

    def refuse(why: str) -> ExportError:
        return ExportError(f"{text!r} {why}" if "\0" in text else f"{text} {why}", location=(field,))

    if "\0" in text:
        raise refuse("holds a NUL byte; a path cannot")
    path = Path(os.path.abspath(text))
    if len(os.fsencode(str(path))) > MAX_PATH or any(len(os.fsencode(part)) > MAX_NAME for part in path.parts):
        raise refuse(f"is too long: file systems take names of up to {MAX_NAME} bytes and paths of up to {MAX_PATH}")
    real = Path(os.path.realpath(path))
    for source in sources:
        source = Path(os.path.realpath(source))
        if real == source or real in source.parents or source in real.parents:
            where = "is" if real == source else "holds" if real in source.parents else "lies inside"
            raise refuse(f"{where} the model's source {source}; an export never writes over or into what it reads")
    ancestor = path.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise refuse(f"cannot be made: {ancestor} is not a directory")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise refuse(f"cannot be looked at ({err.strerror})") from None
    if stat.S_IFMT(mode) in KINDS:
        raise refuse(f"is {KINDS[stat.S_IFMT(mode)]}; an export writes only new files or its own previous export")
    if not is_export(path):
        raise refuse(f"exists and is not a {target} export of mase_lite, so it is not replaced; remove it yourself or "
                     "choose another path")
    if not overwrite:
        raise refuse(f"holds a previous {target} export; replace it with --overwrite (a step's \"overwrite\": true)")
