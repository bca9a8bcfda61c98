"""``--record``: a benchmark's figures become its own section of ``RESULTS.md``, the other sections untouched.

    record("decode", "| threads | ms |\\n|---:|---:|\\n| 1 | 16.4 |", command="python benchmarks/decode.py",
           threads=1, load=(0.8, 1.6))  # rewrites "## decode" (inserted in alphabetical place if missing)

A script runs under ``recording``, which prints as usual and, when ``--record`` is on its command line and the
run ends without error, records what it printed with the load average of its start and end:

    if __name__ == "__main__":
        with recording("decode"):
            main()
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from figures import cpu_model  # beside this script

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
HELP = "also write what this prints as this script's section of benchmarks/RESULTS.md"


def add_record_flag(parser) -> None:
    """The ``--record`` flag on ``parser`` (``recording`` acts on it)."""
    parser.add_argument("--record", action="store_true", help=HELP)


def header(command: str, threads: int | str, load: tuple[float, float]) -> str:
    """The line under a section's title: the command, the CPU, threads, load average and date (UTC)."""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Command: `{command}`. "
            f"CPU: {cpu_model()}; threads: {threads}; load: {load[0]:.2f} → {load[1]:.2f}; date: {date}.")


def record(name: str, body: str, *, command: str, threads: int | str, load: tuple[float, float] | None = None,
           path: Path = RESULTS) -> None:
    """Rewrite section ``## name`` of ``path`` (up to the next ``## ``) with a header and ``body``.

    ``load`` is the 1-minute load average at the run's start and end (default: now, twice). The body's ``#`` and
    ``##`` headings become ``###``. A missing section goes in alphabetical order among the others; the file is
    replaced atomically, the other sections byte for byte.
    """
    load = load or (os.getloadavg()[0],) * 2
    body = re.sub(r"^#{1,2} ", "### ", body.strip(), flags=re.M)  # the body's own headings stay inside the section
    section = f"## {name}\n\n{header(command, threads, load)}\n\n{body}\n"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")] + [len(lines)]
    titles = [lines[i][3:].strip() for i in starts[:-1]]
    if name in titles:
        at, end = starts[titles.index(name)], starts[titles.index(name) + 1]
    else:
        at = end = starts[sum(title < name for title in titles)]
    section += "\n" if end < len(lines) else ""  # a blank line before the next section
    before = "".join(lines[:at])
    if at == len(lines) and not before.endswith("\n\n"):
        before = before.rstrip("\n") + "\n\n"
    text = before + section + "".join(lines[end:])
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def command_line() -> str:
    """This process's command as one would type it from the repository root; a file outside the repository shows as
    ``.../name`` (where it lies is this machine's business): ``--model /home/me/small.gguf`` as ``--model
    .../small.gguf``."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *map(_shown, sys.argv[1:])])


def _shown(arg: str) -> str:
    path = Path(arg)
    if not path.is_absolute():
        return arg
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else f".../{path.name}"


class _Tee:
    """Writes to ``stream`` and keeps a copy; everything else is the stream's."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def recording(name: str, threads: int | str | None = None, path: Path = RESULTS) -> Iterator[None]:
    """With ``--record`` in ``sys.argv``, what the block prints becomes section ``name`` if it ends without error.

    ``threads`` defaults to torch's thread count at the end (where torch was imported), else the usable cores.
    """
    if "--record" not in sys.argv[1:]:
        yield
        return
    start, tee = os.getloadavg()[0], _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    except SystemExit as done:
        if done.code not in (None, 0):
            raise
    finally:
        sys.stdout = tee.stream
    torch = sys.modules.get("torch")
    threads = threads or (torch.get_num_threads() if torch else len(os.sched_getaffinity(0)))
    record(name, tee.copy.getvalue(), command=command_line(), threads=threads, load=(start, os.getloadavg()[0]),
           path=path)
