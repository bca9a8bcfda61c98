"""What a run shows while it works: a progress bar on a terminal (tqdm's), and where the output is not a terminal
(a log file, CI), one line per pipeline step and per search trial when it starts and when it ends, and within a long
step a line about every :data:`EVERY` seconds (:class:`Ticker`: where it is, elapsed time, rate; also logged); ``--quiet``
or ``MASE_LITE_PROGRESS=0`` (:data:`QUIET`) shows neither. Lines are the command line's: a library call shows none unless :data:`LINES` is set.

>>> bars_disabled() if not QUIET else None   # shown on a terminal, hidden elsewhere (tqdm decides)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

logger = logging.getLogger("mase_lite.infra.progress")

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


EVERY = 10.0
"""Seconds between two progress lines of one long step."""


class Ticker:
    """Progress of one long loop as lines (``total`` units of ``unit``, named ``desc``): :meth:`tick` after each unit
    writes, at most every :data:`EVERY` seconds, where the loop is, the elapsed time and the rate, with ``status``
    (e.g. epoch and loss), to stderr where it is not a terminal (:func:`line`) and to the log (INFO).

    >>> ticker = Ticker("train", total=4, unit="step", clock=iter([0.0, 12.0, 13.0]).__next__)
    >>> ticker.tick(epoch=0, loss="2.3000")
    'train: step 1/4 (25 %), epoch 0, loss 2.3000; 12 s elapsed, 0.0833 step/s'
    >>> ticker.tick() is None  # a second later: nothing
    True
    """

    def __init__(self, desc: str, total: int | None, unit: str, clock=time.perf_counter):
        self.desc, self.total, self.unit, self.clock = desc, total, unit, clock
        self.start = self.last = clock()
        self.done = 0

    def tick(self, n: int = 1, **status) -> str | None:
        """Count ``n`` units; the line written, or None where it is not yet time for one."""
        self.done += n
        now = self.clock()
        if now - self.last < EVERY:
            return None
        self.last = now
        elapsed = now - self.start
        where = f"{self.unit} {self.done}" + (f"/{self.total} ({100 * self.done // self.total} %)" if self.total else "")
        shown = "".join(f", {key} {value}" for key, value in status.items())
        text = f"{self.desc}: {where}{shown}; {elapsed:.0f} s elapsed, {self.done / elapsed:.3g} {self.unit}/s"
        line(text)
        logger.info("%s", text)
        return text


@contextlib.contextmanager
def loggers_at(level: int, *names: str) -> Iterator[None]:
    """Others' loggers ``names`` show only records of ``level`` and above within; their levels restored after.

    >>> with loggers_at(logging.ERROR, "torch.onnx"):
    ...     logging.getLogger("torch.onnx").level == logging.ERROR
    True
    """
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, before in zip(loggers, levels):
            logger.setLevel(before)
