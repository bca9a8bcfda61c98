"""Where a pass writes or reads files: relative paths resolve against the run's directory.

Example::

    out = run_path(mg, "graph.svg")     # <output_dir>/graph.svg inside a pipeline, ./graph.svg outside
"""

from __future__ import annotations

from pathlib import Path


def run_path(mg, path: str | Path) -> Path:
    """``path`` resolved against ``mg.run_dir`` when it is relative and the graph runs in a pipeline."""
    path = Path(path)
    run_dir = getattr(mg, "run_dir", None)
    if path.is_absolute() or run_dir is None:
        return path
    return Path(run_dir) / path
