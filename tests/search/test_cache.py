"""The prefix cache: a run restored after its first steps (from memory or from disk) reports exactly
what a run without the cache reports, generators included; racing writers leave one complete copy."""

import copy
import random

import numpy
import pytest
import torch

from mase_lite.passes import PassResult, register_pass
from mase_lite.passes.manager import PassContext
from mase_lite.pipeline.runner import run_pipeline
from mase_lite.pipeline.spec import load_spec
from mase_lite.search.cache import PrefixCache, prefix_key, prefix_length
from mase_lite.search.space import Space
from mase_lite.search.spec import SearchSpec
from tests.search.conftest import TINY_PIPELINE, WIDTH


@register_pass("test_draw_random", kind="analysis")
def draw_random(mg, params):
    """Draws from the global generators, so a later step sees whether they were restored."""
    return PassResult(metrics={"torch": torch.rand(1).item(), "python": random.random(), "numpy": float(numpy.random.rand())})


# train (the shared prefix), a draw; then what trials vary: quantize, another draw, evaluate
PIPELINE = copy.deepcopy(TINY_PIPELINE)
PIPELINE["steps"][1:1] = [{"pass": "test_draw_random"}]
PIPELINE["steps"][-1:-1] = [{"pass": "test_draw_random", "label": "after"}]
PREFIX = 2


def space_of(entries: list[dict], pipeline: dict = PIPELINE) -> Space:
    spec = SearchSpec.model_validate({"pipeline": pipeline, "space": entries, "objectives": [{"metric": "ptq.loss"}]})
    return Space(pipeline, spec.space)


def test_prefix_length_and_key():
    assert [s["pass"] for s in PIPELINE["steps"]][:PREFIX + 1] == ["train", "test_draw_random", "quantize"]
    assert prefix_length(PIPELINE, space_of([{"path": WIDTH, "type": "choice", "values": [4, 8]}])) == PREFIX
    assert prefix_length(PIPELINE, space_of([{"path": "steps.train.params.lr", "type": "float", "low": 1e-4, "high": 1e-3}])) == 0
    varied_model = {"path": "model.hf_config.intermediate_size", "type": "choice", "values": [32, 64]}
    assert prefix_length(PIPELINE, space_of([varied_model])) is None
    same_model = {"path": "model.hf_config.intermediate_size", "type": "choice", "values": [64]}
    assert prefix_length(PIPELINE, space_of([same_model, {"path": "seed", "type": "int", "low": 3, "high": 3}])) == len(PIPELINE["steps"])
    assert prefix_length(PIPELINE, space_of([{"path": "name", "type": "choice", "values": ["a", "b"]}])) == len(PIPELINE["steps"])
    # a step whose facts a saved graph does not keep ends the prefix
    profiled = copy.deepcopy(PIPELINE)
    profiled["steps"].insert(1, {"pass": "profile", "params": {"num_batches": 1}})
    assert prefix_length(profiled, space_of([{"path": WIDTH, "type": "choice", "values": [4, 8]}], profiled)) == 1

    spec = load_spec(PIPELINE)
    changed_later, changed_prefix, renamed = (copy.deepcopy(PIPELINE) for _ in range(3))
    changed_later["steps"][2]["params"]["rules"]["linear"]["weight_width"] = 4
    changed_prefix["steps"][0]["params"]["lr"] = 2e-3
    renamed["name"], renamed["output_dir"] = "other", "elsewhere"
    assert prefix_key(load_spec(changed_later), PREFIX) == prefix_key(spec, PREFIX) == prefix_key(load_spec(renamed), PREFIX)
    assert prefix_key(load_spec(changed_prefix), PREFIX) != prefix_key(spec, PREFIX)
    assert prefix_key(load_spec(changed_later), PREFIX + 1) != prefix_key(spec, PREFIX + 1)


def test_restored_runs_equal_a_run_without_the_cache(tmp_path):
    plain = run_pipeline(PIPELINE, tmp_path / "plain")
    cache = PrefixCache(tmp_path / "cache", PREFIX)
    first = run_pipeline(PIPELINE, tmp_path / "first", cache=cache)
    from_memory = run_pipeline(PIPELINE, tmp_path / "memory", cache=cache)
    from_disk = run_pipeline(PIPELINE, tmp_path / "disk", cache=PrefixCache(tmp_path / "cache", PREFIX))
    assert set(plain.report["metrics"]) == {"test_draw_random", "after", "avg_bits", "ptq"}
    # the draw after the prefix continues the generators where the prefix left them
    assert plain.report["metrics"]["after"] != plain.report["metrics"]["test_draw_random"]
    for run in (first, from_memory, from_disk):
        assert run.report["metrics"] == plain.report["metrics"]
    assert [s.get("cached", False) for s in first.report["steps"]] == [False] * 6
    for run in (from_memory, from_disk):
        assert [s.get("cached", False) for s in run.report["steps"]] == [True, True, False, False, False, False]
        assert run.report["steps"][0]["info"]["steps"] == 2  # the train entry as the first run reported it
    # trained weights restored: the restored graph has the trained, not the initial, classifier
    for run in (first, from_memory, from_disk):
        for name, p in plain.mg.model.state_dict().items():
            assert torch.equal(run.mg.model.state_dict()[name], p), name

    (entry,) = (tmp_path / "cache").iterdir()
    assert entry.name == prefix_key(load_spec(PIPELINE), PREFIX)
    assert sorted(p.name for p in entry.iterdir()) == ["checksums.json", "graph", "rng.safetensors", "state.json"]
    assert sorted(p.name for p in (entry / "graph").iterdir()) == ["model.safetensors", "recipe.json"]


def test_racing_writers_keep_the_first_copy_and_trials_get_copies(tmp_path):
    cache = PrefixCache(tmp_path / "cache", 0)
    spec = load_spec(PIPELINE)
    run_pipeline(PIPELINE, tmp_path / "run", cache=cache)  # stores the captured graph (a prefix of 0 steps)
    (entry,) = (tmp_path / "cache").iterdir()
    before = {p.name: p.stat().st_mtime_ns for p in entry.rglob("*")}
    # a second worker that computed the same prefix at the same time loses the rename
    loser = PrefixCache(tmp_path / "cache", 0)
    state = cache._memory[prefix_key(spec, 0)]
    loser._write(entry.name, state.mg, state)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name]
    assert {p.name: p.stat().st_mtime_ns for p in entry.rglob("*")} == before
    # and uses the winner's; every restore is a graph of its own
    done, a, entries = loser.restore(spec, PassContext(output_dir=tmp_path / "a"))
    assert (done, entries) == (0, [])
    b = loser.restore(spec, PassContext(output_dir=tmp_path / "b"))[1]
    with torch.no_grad():
        a.model.classifier.weight.zero_()
    assert a.model is not b.model and b.model.classifier.weight.abs().sum() > 0
    # a damaged entry is a miss, not a failure
    (entry / "state.json").write_text("{not json")
    assert PrefixCache(tmp_path / "cache", 0).restore(spec, PassContext(output_dir=tmp_path / "c")) is None


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
