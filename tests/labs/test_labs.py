"""Every shipped lab spec validates and runs, shrunk (tiny model, little data, few trials): the trials,
the values each trial's pipeline got, the metrics and the plots are those the lab asks for."""

import json
from pathlib import Path

import pytest

import mase_lite as ml
from tests.labs.conftest import LABS, SEARCH_SPECS, shrunk
from tests.schemas import validator

PNG = b"\x89PNG\r\n\x1a\n"
PIPELINES = sorted(set(LABS.glob("*.json")) - set(SEARCH_SPECS))


def assert_plots(out: Path, *names: str) -> None:
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name


def studies(result) -> dict[str, dict]:
    return {s["name"].split(".", 1)[1] if "." in s["name"] else s["name"]: s for s in result.report["studies"]}


def trial_spec(study: dict, trial: dict) -> dict:
    report = json.loads((Path(study["output_dir"]) / "trials" / str(trial["number"]) / "report.json").read_text())
    return report["spec"]


def step(spec: dict, name: str, index: int = 0) -> dict:
    return [s for s in spec["steps"] if s["pass"] == name][index]


def formats(rule: dict | None) -> dict[str, tuple]:
    """A canonical quantize rule as {operand: (format name, width, frac_width)} of its quantized inputs."""
    return {o: (f["name"], f.get("width"), f.get("frac_width")) for o, f in (rule or {}).items() if isinstance(f, dict)}


def test_shipped_specs_validate_against_the_schemas():
    assert {p.name for p in SEARCH_SPECS} == {
        "lab1_quantize.json", "lab1_quantize_calibrated.json", "lab1_prune_sweep.json", "lab2_nas.json",
        "lab2_compression_aware.json", "lab3_mixed_integer.json", "lab3_pareto.json", "lab3_formats.json",
    }
    for path in SEARCH_SPECS:
        validator("search").validate(json.loads(path.read_text()))
    for path in PIPELINES:
        validator("pipeline").validate(json.loads(path.read_text()))


def test_lab1_width_sweep_ptq_and_qat(tmp_path):
    result = ml.run_search(shrunk("lab1_quantize.json", tmp_path, n_trials=2))
    by_name = studies(result)
    assert set(by_name) == {"ptq", "qat"}
    for name, study in by_name.items():
        trials = study["trials"]
        widths = [t["params"]["width"] for t in trials]
        assert len(set(widths)) == 2 and set(widths) <= {4, 6, 8, 12, 16, 24, 32}
        for t in trials:
            width, rule = t["params"]["width"], step(trial_spec(study, t), "quantize")["params"]["rules"]["linear"]
            assert formats(rule) == {o: ("integer", width, width // 2) for o in ("data_in", "weight", "bias")}
            assert t["metrics"]["avg_bits.weights"] == width
            assert 0 <= t["metrics"]["quantized.accuracy"] <= 1 and "fp32.accuracy" in t["metrics"]
            assert len([s for s in trial_spec(study, t)["steps"] if s["pass"] == "train"]) == (2 if name == "qat" else 1)
    assert_plots(result.output_dir, "accuracy_vs_width.png", "best_quantized.accuracy.png")


def test_lab1_calibrated_width_sweep_chooses_each_fraction_width_by_mse(tmp_path):
    result = ml.run_search(shrunk("lab1_quantize_calibrated.json", tmp_path, n_trials=2))
    by_name = studies(result)
    assert set(by_name) == {"ptq", "qat"}
    for name, study in by_name.items():
        for t in study["trials"]:
            width = t["params"]["width"]
            report = json.loads((Path(study["output_dir"]) / "trials" / str(t["number"]) / "report.json").read_text())
            quantize = next(s for s in report["steps"] if s["pass"] == "quantize")
            assert [s["pass"] for s in report["steps"]][:4] == ["train", "evaluate", "calibrate", "quantize"]
            for replaced in quantize["info"]["replaced"]:  # the widths swept, each fraction width chosen per node
                chosen = {o: (f["width"], f["frac_width"]) for o, f in replaced["formats"].items()}
                assert {w for w, _ in chosen.values()} == {width} and all(0 <= f <= width for _, f in chosen.values())
            assert 0 <= t["metrics"]["quantized.accuracy"] <= 1
    assert_plots(result.output_dir, "accuracy_vs_width.png")


def test_lab1_pruning_sweep_random_and_l1(tmp_path):
    result = ml.run_search(shrunk("lab1_prune_sweep.json", tmp_path, n_trials=1))
    by_name = studies(result)
    assert set(by_name) == {"random", "l1-norm"}
    for method, study in by_name.items():
        assert study["states"] == {"COMPLETE": 1}
        for t in study["trials"]:
            params = step(trial_spec(study, t), "prune")["params"]
            sparsity = t["params"]["sparsity"]
            assert sparsity in (0.1, 0.3, 0.5, 0.7, 0.9) and "method" not in t["params"]
            assert params["weight"]["method"] == params["activation"]["method"] == method
            assert params["weight"]["sparsity"] == params["activation"]["sparsity"] == sparsity
            assert t["metrics"]["sparsity.weights"] == pytest.approx(sparsity, abs=0.01)
            assert t["metrics"]["sparsity.activations"] == pytest.approx(sparsity, abs=0.05)
            assert {"dense.accuracy", "pruned.accuracy", "finetuned.accuracy"} <= set(t["metrics"])
    assert_plots(result.output_dir, "accuracy_vs_sparsity.png")


def test_lab2_nas_three_samplers(tmp_path):
    result = ml.run_search(shrunk("lab2_nas.json", tmp_path, n_trials=1))
    by_name = studies(result)
    assert {n: s["sampler"]["name"] for n, s in by_name.items()} == {"grid": "grid", "random": "random", "tpe": "tpe"}
    for study in by_name.values():
        (t,) = study["trials"]
        if t["state"] == "FAIL":  # the only way a trial of this space fails: heads that do not divide hidden
            assert "is not a multiple of the number of attention heads" in t["error"]
            continue
        assert t["state"] == "COMPLETE" and "search.accuracy" in t["metrics"]
        config = trial_spec(study, t)["model"]["hf_config"]
        for field in ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size"):
            assert config[field] == t["params"][f"model.hf_config.{field}"]
        # one keep-or-Identity choice per square Linear of the trial's own model (q, k, v, out per layer; pooler)
        chosen = sorted(k.removeprefix("identity.") for k, v in t["params"].items() if k.startswith("identity.") and v)
        assert sorted(step(trial_spec(study, t), "replace")["params"]["targets"]) == chosen
        assert len([k for k in t["params"] if k.startswith("identity.")]) == 4 * config["num_hidden_layers"] + 1
    assert_plots(result.output_dir, "best_search.accuracy.png")


def test_lab2_impossible_head_count_fails_the_trial_with_its_reason(tmp_path):
    spec = shrunk("lab2_nas.json", tmp_path, n_trials=1)
    spec.pop("studies")
    spec["space"][1]["values"] = [3]  # num_attention_heads
    spec["space"][2]["values"] = [64]  # hidden_size
    with pytest.raises(ml.UserError, match=r"study 'lab2_nas': all 1 trials failed; trial 0: "):  # the search fails
        ml.run_search(spec)
    report = json.loads((Path(spec["output_dir"]) / "search_report.json").read_text())  # its report is written
    (trial,) = report["studies"][0]["trials"]
    assert trial["state"] == "FAIL" and trial["metrics"] == {}
    assert "The hidden size (64) is not a multiple of the number of attention heads (3)" in trial["error"]


def test_lab2_compression_aware_three_variants(tmp_path):
    result = ml.run_search(shrunk("lab2_compression_aware.json", tmp_path, n_trials=1))
    by_name = studies(result)
    passes = {n: [s["pass"] for s in trial_spec(st, st["trials"][0])["steps"]] for n, st in by_name.items()}
    assert passes == {
        "no_compression": ["replace", "train", "evaluate"],
        "compress": ["replace", "train", "evaluate", "prune", "quantize", "evaluate"],
        "compress_finetune": ["replace", "train", "evaluate", "prune", "quantize", "evaluate", "train", "evaluate"],
    }
    metrics = {n: st["trials"][0]["metrics"] for n, st in by_name.items()}
    assert {"trained.accuracy", "compressed.accuracy", "search.accuracy"} <= set(metrics["compress_finetune"])
    # the three studies sample the same first architecture (same sampler seed), trained the same way
    params = [st["trials"][0]["params"] for st in by_name.values()]
    assert params[0] == params[1] == params[2]
    assert metrics["compress"]["trained.accuracy"] == metrics["no_compression"]["search.accuracy"]
    assert_plots(result.output_dir, "best_search.accuracy.png")


def test_lab3_mixed_integer_per_linear(tmp_path):
    result = ml.run_search(shrunk("lab3_mixed_integer.json", tmp_path, n_trials=1))
    (study,) = result.report["studies"]
    for t in study["trials"]:
        rules = step(trial_spec(study, t), "quantize")["params"]["rules"]
        assert len(rules) == 8 and t["state"] == "COMPLETE"  # the tiny model's Linears
        for node, rule in rules.items():
            width, frac = t["params"][f"weight_width.{node}"], t["params"][f"weight_frac_width.{node}"]
            assert width in (8, 16, 32) and frac in (2, 4, 8)
            assert formats(rule) == {o: ("integer", width, frac) for o in ("data_in", "weight", "bias")}
    assert_plots(result.output_dir, "accuracy_vs_bits.png", "best_quantized.accuracy.png")


def test_lab3_pareto_accuracy_versus_bits(tmp_path):
    result = ml.run_search(shrunk("lab3_pareto.json", tmp_path, n_trials=2))
    (study,) = result.report["studies"]
    for t in study["trials"]:
        rules = step(trial_spec(study, t), "quantize")["params"]["rules"]
        assert {node: formats(rule) for node, rule in rules.items()} == {
            node: {o: ("integer", w, w // 2) for o in ("data_in", "weight", "bias")}
            for node, w in ((k.removeprefix("width."), v) for k, v in t["params"].items())
        }
    front = study["pareto_front"]
    assert front and {r["number"] for r in front} <= {t["number"] for t in study["trials"]}
    assert all(len(r["values"]) == 2 for r in front)
    assert_plots(result.output_dir, "pareto.png")


def test_lab3_one_study_per_format_family(tmp_path):
    result = ml.run_search(shrunk("lab3_formats.json", tmp_path, n_trials=1))
    by_name = studies(result)
    assert list(by_name) == [
        "integer", "minifloat_denorm", "minifloat_ieee", "log", "block_fp", "block_minifloat", "block_log",
        "binary", "binary_scaling", "binary_residual_sign", "ternary", "mxint", "mxfp",
    ]
    for family, study in by_name.items():
        (t,) = study["trials"]
        assert t["state"] == "COMPLETE", t["error"]
        rules = step(trial_spec(study, t), "quantize")["params"]["rules"]
        assert len(rules) == 8
        names = {f[0] for rule in rules.values() for f in formats(rule).values()}
        assert names == {family}
        operands = {o for rule in rules.values() for o in formats(rule)}
        assert operands == ({"weight"} if family == "binary_scaling" else {"inputs"})  # data_in, weight and bias
        searched = {k.split(".")[0] for k in t["params"]}
        assert searched and all(k.endswith(tuple(rules)) for k in t["params"])
    assert_plots(result.output_dir, "accuracy_vs_bits.png", "best_quantized.accuracy.png")
