"""The shipped task specs (pipelines/tasks): each validates, each search runs shrunk (a tiny model of its
task, little data, two trials per study) and writes the plots it asks for, with the values it sweeps."""

import copy
import json
from pathlib import Path

import pytest

import mase_lite as ml
from mase_lite.pipeline.spec import check_pipeline, load_spec
from tests.schemas import validator

TASKS = Path(__file__).resolve().parents[2] / "pipelines" / "tasks"
SPECS = sorted(TASKS.glob("*.json"))
SEARCHES = [p for p in SPECS if "objectives" in json.loads(p.read_text())]
PNG = b"\x89PNG\r\n\x1a\n"

TINY = {
    "llama": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64},
    "resnet": {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic"},
    "vit": {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64, "patch_size": 8},
}
DATA = {"causal-lm": {"n_train": 16, "n_test": 4, "block_size": 16}, "image-classification": {"n_train": 48, "n_test": 24, "image_size": 16}}


def shrink_pipeline(name: str) -> dict:
    pipeline = json.loads((TASKS / name).read_text())
    model = pipeline["model"]
    model["hf_config"] = TINY[model["hf_config"]["model_type"]]
    pipeline["data"] = {**pipeline["data"], **DATA[model["task"]]}
    for step in pipeline["steps"]:
        params = step.setdefault("params", {})
        if step["pass"] == "train":
            params.update(max_steps=2, progress=False)
            params.pop("epochs", None)
        if step["pass"] == "evaluate":
            params["progress"] = False
        if step["pass"] in ("gptq", "calibrate"):
            params["num_batches"] = 2
    return pipeline


def shrunk(path: Path, tmp_path: Path) -> dict:
    spec = json.loads(path.read_text())
    spec["pipeline"] = shrink_pipeline(spec["pipeline"])
    spec["n_trials"] = 2
    spec["sampler"].pop("n_startup_trials", None)
    for study in spec.get("studies") or []:
        if isinstance(study.get("pipeline"), str):
            study["pipeline"] = shrink_pipeline(study["pipeline"])
        study.pop("n_trials", None)
    spec["output_dir"] = str(tmp_path / path.stem)
    return copy.deepcopy(spec)


def test_every_task_spec_validates_against_its_schema():
    assert {p.stem for p in SEARCHES} == {
        "llm_ptq_sweep", "llm_mixed_precision", "llm_gptq_sweep", "llm_smoothquant", "llm_methods_search", "llm_outliers_methods",
        "cnn_quantize_sweep", "cnn_prune_sweep", "vit_quantize_sweep", "vit_prune_sweep",
    }
    for path in SPECS:
        validator("search" if path in SEARCHES else "pipeline").validate(json.loads(path.read_text()))
        if path not in SEARCHES:
            check_pipeline(load_spec(path))


@pytest.mark.parametrize("path", SEARCHES, ids=[p.stem for p in SEARCHES])
def test_each_task_search_runs_shrunk_and_draws_its_plots(path, tmp_path):
    spec = shrunk(path, tmp_path)
    result = ml.run_search(spec)
    for study in result.report["studies"]:
        assert study["states"] == {"COMPLETE": 2}, study["states"]
        for trial in study["trials"]:
            metrics = trial["metrics"]
            assert all(metric in metrics for plot in spec["plots"] for metric in plot["y"])
            if path.stem.startswith("llm"):
                assert 1 < metrics["fp32.perplexity_bound"] < metrics["fp32.perplexity"]
            if "outliers.perplexity" in metrics:  # the outliers leave the float model's function as it was
                assert metrics["outliers.perplexity"] == metrics["fp32.perplexity"]
    for plot in spec["plots"]:
        data = (tmp_path / path.stem / plot["file"]).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
