"""Where ``mase-lite export`` finds the model: a checkpoint directory, or the checkpoint a run saved.

A run's report is data: only a ``save`` step's recorded path that lies inside the run's own directory is
followed.

>>> import json, tempfile
>>> from pathlib import Path
>>> run = Path(tempfile.mkdtemp())
>>> (run / "ckpt").mkdir()
>>> _ = (run / "ckpt" / "recipe.json").write_text("{}")
>>> _ = (run / "report.json").write_text(json.dumps({"steps": [{"pass": "save", "info": {"path": str(run / "ckpt")}}]}))
>>> checkpoint_of(run) == run / "ckpt"
True

A relative path is read from the directory the run started in, as the run recorded it (``runs/x/ckpt`` for
``"output_dir": "runs/x"``), and followed only when it lies inside the run.
"""

from __future__ import annotations

import os
from pathlib import Path

from mase_lite.infra.errors import UserError
from mase_lite.infra.files import RECIPE
from mase_lite.infra.jsonio import read_json

REPORT = "report.json"


def checkpoint_of(source: str | Path) -> Path:
    """The checkpoint directory ``source`` names: itself, or the last checkpoint its run (a run directory, or its
    ``report.json``) saved inside that run's directory."""
    source = Path(source)
    if source.is_dir() and (source / RECIPE).is_file():
        return source
    report_path = source if source.name == REPORT and source.is_file() else source / REPORT
    if not report_path.is_file():
        raise UserError(f"source: {str(source)!r} is neither a checkpoint (no {RECIPE}) nor a run directory (no {REPORT})")
    report = read_json(report_path, "report")
    steps = report.get("steps") if isinstance(report, dict) else None
    run = report_path.parent.resolve()
    saved = [step.get("info", {}).get("path") for step in steps or [] if isinstance(step, dict) and step.get("pass") == "save"]
    for path in reversed([p for p in saved if isinstance(p, str)]):
        # a relative path was recorded from the directory the run started in, or (an older report) from the run
        for candidate in [Path(path)] if Path(path).is_absolute() else [Path(path), run / path]:
            inside = Path(os.path.realpath(candidate)).is_relative_to(run)
            if inside and (candidate / RECIPE).is_file():
                return candidate
    raise UserError(f"source: the run {str(report_path.parent)!r} saved no checkpoint inside its directory "
                    "(add a save step to its pipeline)")
