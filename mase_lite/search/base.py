"""The pipeline a search (or one of its studies) names: read from its file (relative to the search spec)
or inline, admitted as data when it is recorded in a report, its plug-ins imported for the space check.

Example::

    base = base_pipeline("ptq.json", Path("specs"), "pipeline", recorded=False)
    base.spec["steps"], base.name        # the dict; 'pipeline (specs/ptq.json)' in messages
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from mase_lite.infra.errors import UserError
from mase_lite.infra.jsonio import read_json
from mase_lite.pipeline.spec import is_report
from mase_lite.pipeline.plugins import import_plugins
from mase_lite.infra.trust import admit_recorded


@dataclass
class BasePipeline:
    """A study's base pipeline: its dict, where its relative plug-in files are, its name in messages, and
    whether it is data recorded in a report (a search over a report's pipeline, or a search report)."""

    spec: dict
    base: Path
    name: str
    recorded: bool


def base_pipeline(source: str | dict, base_dir: Path, where: str, recorded: bool) -> BasePipeline:
    """The pipeline a search names (a path relative to the search spec, or inline), admitted when it is
    recorded data (:func:`mase_lite.infra.trust.admit_recorded`), its ``.py`` plug-ins named by absolute path
    (trials import them from any working directory)."""
    if isinstance(source, dict):
        data, base, name = copy.deepcopy(source), base_dir, where
    else:
        path = Path(source) if Path(source).is_absolute() else base_dir / source
        if not path.is_file():
            raise UserError(f"{where}: no such pipeline spec: {path}")
        data, base, name = read_json(path), path.parent, f"{where} ({path})"
    if is_report(data):
        data, recorded = data["spec"], True
    if not isinstance(data, dict):
        raise UserError(f"{name}: expected a pipeline spec (a JSON object), got {type(data).__name__}")
    if recorded:
        data = admit_recorded(data, name, base)
    plugins = data.get("plugins")
    if isinstance(plugins, list):
        import_plugins(plugins, base)
        data["plugins"] = [str((base / p).resolve()) if isinstance(p, str) and p.endswith(".py") else p for p in plugins]
    return BasePipeline(data, base, name, recorded)
