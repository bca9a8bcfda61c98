"""What a run shows while it works: a progress bar on a terminal (tqdm's), and where the output is not a terminal
(a log file, CI), one line per pipeline step and per search trial when it starts and when it ends; ``--quiet``
or ``MASE_LITE_PROGRESS=0`` (:data:`QUIET`) shows neither. Lines are the command line's: a library call shows none unless :data:`LINES` is set.

>>> bars_disabled() if not QUIET else None   # shown on a terminal, hidden elsewhere (tqdm decides)
"""

from __future__ import annotations

import sys

QUIET = False
"""No progress at all (``mase-lite --quiet``)."""
LINES = False
"""One line per step or trial where the output is not a terminal (the command line sets it)."""


def bars_disabled() -> bool | None:
    """tqdm's ``disable``: True when quiet, else None (shown on a terminal only)."""
    return True if QUIET else None


def line(text: str) -> None:
    """``text`` on stderr, where progress lines are wanted and stderr is not a terminal (there the bars show)."""
    if LINES and not QUIET and not sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)
