"""This user's secret key and the signatures made with it (HMAC-SHA256): what tells files this user wrote from
files another user wrote or copied in, where checksums cannot (anyone can compute those).

The key is 32 random bytes in ``$XDG_STATE_HOME/mase_lite/signing.key`` (default ``~/.local/state/mase_lite``),
made the first time it is needed: written whole to a temporary file of mode 0600 beside it, then linked into
place, so that processes making one at once all use the first. A key file that is a link, not a regular file, not
this user's, open to others or not a key is replaced by a new key (what the old one signed is then not trusted).
Where no key can be kept (no home directory, a read-only one, a state directory others may write),
:func:`user_key` is ``None``. Workers on several machines trust each other's files only when they share the key:
point ``XDG_STATE_HOME`` of each at a copy of the same private directory.

Example::

    key = user_key()
    tag = sign(key, b"what was written")
    verify(key, b"what was written", tag)   # True; False for any other key or message
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
from pathlib import Path

from mase_lite.infra.files import private

logger = logging.getLogger(__name__)

KEY_BYTES = 32
KEY_FILE = "signing.key"


def state_dir() -> Path:
    """mase_lite's directory of this user's state: ``$XDG_STATE_HOME/mase_lite``, else ``~/.local/state/mase_lite``."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "mase_lite"


def user_key() -> bytes | None:
    """This user's key, made if missing or replaced if it may not be trusted; ``None`` where none can be kept."""
    try:
        directory = state_dir()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (OSError, RuntimeError) as err:  # no home directory, a read-only one, a file in the way
        logger.warning("no signing key: cannot make the state directory (%s)", err)
        return None
    if not private(directory):
        logger.warning("no signing key: %s is not this user's alone", directory)
        return None
    path = directory / KEY_FILE
    return _read(path) or _make(path, replace=os.path.lexists(path))


def _read(path: Path) -> bytes | None:
    """The key in ``path``; ``None`` where there is none, or one that may not be trusted (said once, here)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:  # a link (ELOOP), or unreadable
        logger.warning("the signing key %s is not used (%s): a new key replaces it", path, err.strerror)
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        key = file.read(KEY_BYTES + 1) if stat.S_ISREG(info.st_mode) else b""
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or len(key) != KEY_BYTES:
        logger.warning("the signing key %s is not this user's alone, or not a key: a new key replaces it", path)
        return None
    return key


def _make(path: Path, replace: bool) -> bytes | None:
    """A new key, put in ``path`` whole: in place of the file there (``replace``), else linked where none is (a key
    another process linked first is the one used)."""
    key = secrets.token_bytes(KEY_BYTES)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=path.parent)  # mode 0600
    except OSError as err:
        logger.warning("no signing key: cannot write %s (%s)", path, err.strerror)
        return None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(key)
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(tmp, path)
            return key
        try:
            os.link(tmp, path)
        except FileExistsError:
            return _read(path)
        return key
    except OSError as err:
        logger.warning("no signing key: cannot write %s (%s)", path, err.strerror)
        return None
    finally:
        Path(tmp).unlink(missing_ok=True)


def sign(key: bytes, message: bytes) -> str:
    """The HMAC-SHA256 of ``message`` under ``key``, in hex."""
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def verify(key: bytes, message: bytes, signature: object) -> bool:
    """Whether ``signature`` is :func:`sign`'s for ``message`` under ``key`` (compared in constant time)."""
    return isinstance(signature, str) and signature.isascii() and hmac.compare_digest(sign(key, message), signature)
