"""The reliability probe (benchmarks/robustness.py) on a few cases: its mutations reach the CLI, and its
outcome classes are what a user sees (a refusal naming the field, a traceback counted as a defect)."""

import importlib.util
import json
import sys
from pathlib import Path

import mase_lite as ml
from mase_lite import MaseGraph
from mase_lite.cli import main  # noqa: F401  imported once here, not in each forked case
from tests.robustness.nets import tiny

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("robustness_probe", ROOT / "benchmarks" / "robustness.py")
probe = sys.modules["robustness_probe"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def test_a_duplicate_key_in_a_shipped_spec_is_refused_naming_it(tmp_path):
    spec = probe.shrink_pipeline(json.loads((ROOT / "pipelines" / "quickstart.json").read_text()))
    text = json.dumps({**spec, "output_dir": str(tmp_path / "out")}).replace('"seed": 0', '"seed": 0, "seed": 1')
    (tmp_path / "spec.json").write_text(text)
    case = probe.run_spec_case(probe.Case("pipeline", "quickstart.json", "seed twice", field_hint="'seed'"), tmp_path)
    assert (case.outcome, case.code, case.traceback, case.names_field) == ("refused", 2, False, True)
    assert case.message.startswith("mase-lite: error: ") and "the key 'seed' appears twice in one object" in case.message
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_naming_os_system_is_refused_and_runs_nothing(tmp_path):
    canary = tmp_path / "CANARY"
    ckpt = tmp_path / "checkpoint"
    MaseGraph(tiny(), example_inputs={"input": __import__("torch").randn(2, 4)},
              recipe={"factory": "tests.robustness.nets:tiny", "kwargs": {}}).save(ckpt)
    [corrupt] = [fn for name, fn in probe.corruptions(canary) if name == "recipe factory os:system"]
    corrupt(ckpt, None)
    assert json.loads((ckpt / "recipe.json").read_text())["model"] == {"factory": "os:system", "kwargs": {"command": f"touch {canary}"}}
    case = probe.classify(probe.Case("checkpoint", "os:system", "ml.load"), *probe.forked(probe.ml_load(ckpt), tmp_path))
    assert (case.outcome, case.code) == ("refused", 2)
    assert "model.factory = 'os:system' is not a registered model factory" in case.message
    assert not canary.exists()
    assert ml.load  # the loader the probe calls is the public one


def test_a_traceback_is_a_defect_whatever_the_exit_code(tmp_path):
    def fails() -> int:
        raise KeyError("boom")

    case = probe.classify(probe.Case("pipeline", "x", "y"), *probe.forked(fails, tmp_path))
    assert (case.outcome, case.why, case.code) == ("defect", "traceback", 1)
    assert "KeyError: 'boom'" in case.message
