"""Shrinking a shipped lab spec for the test suite: every pipeline inlined with little data and a few
training steps, fewer trials, output under tmp_path. The spec's space, studies and plots stay as shipped."""

import copy
import json
from pathlib import Path

from tests.search.conftest import TINY_MODEL  # the default model cut to one narrow layer

LABS = Path(__file__).resolve().parents[2] / "pipelines" / "labs"
SEARCH_SPECS = sorted(p for p in LABS.glob("*.json") if "objectives" in json.loads(p.read_text()))


def shrink_pipeline(name: str, n_train: int, n_test: int) -> dict:
    pipeline = json.loads((LABS / name).read_text())
    pipeline.setdefault("model", TINY_MODEL)
    pipeline["data"] = {**pipeline["data"], "n_train": n_train, "n_test": n_test, "max_length": 16}
    for step in pipeline["steps"]:
        params = step.setdefault("params", {})
        if step["pass"] == "train":
            params.update(max_steps=min(params.get("max_steps") or 4, 4), progress=False)
        if step["pass"] == "evaluate":
            params["progress"] = False
    return pipeline


def shrunk(name: str, tmp_path: Path, n_trials: int = 2, n_train: int = 64, n_test: int = 48) -> dict:
    """The shipped search spec ``name`` at a test's size."""
    spec = json.loads((LABS / name).read_text())
    spec["pipeline"] = shrink_pipeline(spec["pipeline"], n_train, n_test)
    spec["n_trials"] = n_trials
    for study in spec.get("studies") or []:
        if isinstance(study.get("pipeline"), str):
            study["pipeline"] = shrink_pipeline(study["pipeline"], n_train, n_test)
        study.pop("n_trials", None)
    spec["output_dir"] = str(tmp_path / Path(name).stem)
    return copy.deepcopy(spec)
