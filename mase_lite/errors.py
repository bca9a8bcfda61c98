"""Errors a user can cause. The CLI turns every ``UserError`` into a one-line message and exit code 2."""

from pathlib import Path


class UserError(ValueError):
    """A bad spec, an unknown name, an impossible parameter, a missing input: the user can fix it."""


def ensure_dir(directory: str | Path, field: str) -> Path:
    """Create ``directory`` (and its parents) or raise a ``UserError`` naming ``field`` and the reason."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{field}: cannot create directory {str(directory)!r} ({err.strerror})") from None
    return directory
