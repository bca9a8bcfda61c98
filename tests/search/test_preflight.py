"""Everything a search can know before its first trial is checked then: a misspelt metric in an objective,
a constraint or a plot, a sampler that cannot run or would stay random, the base pipeline's own errors
(blamed on it, not on the space) and its plug-ins (imported for the check). Each refusal exits 2 before
the output directory exists; a search whose every trial failed exits 2 after writing its report."""

import copy
import json
import logging
import re
import sys

from mase_lite.cli import main
from mase_lite.search.engine import prepare_studies
from mase_lite.search.samplers import CmaEsSamplerSpec, NSGA2SamplerSpec, TPESamplerSpec
from mase_lite.search.spec import load_search_spec
from tests.search.conftest import TINY_PIPELINE, WIDTH, write_spec


def _refused(tmp_path, spec, capsys) -> str:
    assert main(["search", str(write_spec(tmp_path, spec))]) == 2
    assert not (tmp_path / "search").exists()
    err = capsys.readouterr().err
    assert err.startswith("mase-lite: error: ") and "Traceback" not in err
    return err


def test_misspelt_metrics_are_refused_before_the_first_trial(tmp_path, tiny_search, capsys):
    spec = tiny_search(
        objectives=[{"metric": "quantised.accuracy"}, {"metric": "ptq.acuracy"}],
        constraints=[{"metric": "avg_bit.weights", "max": 6}],
        plots=[{"x": "widht", "y": ["ptq.los"], "baseline": "count.macs", "file": "p.png"}],
    )
    err = _refused(tmp_path, spec, capsys)
    assert "objectives.0.metric: 'quantised.accuracy' is not a metric the pipeline reports (did you mean " \
           "'ptq.accuracy'?); it reports: " \
           "avg_bits.activations, avg_bits.weights, ptq.accuracy, ptq.loss, ptq.n, ptq.per_class.*, trial.seconds" in err
    assert "objectives.1.metric: 'ptq.acuracy' is not a metric the pipeline reports (did you mean 'ptq.accuracy'?)" in err
    assert "constraints.0.metric: 'avg_bit.weights' is not a metric the pipeline reports (did you mean 'avg_bits.weights'?)" in err
    assert "plots.0.x: 'widht' is not a metric the pipeline reports" in err and f"; parameters: {WIDTH}" in err
    assert "plots.0.y.0: 'ptq.los' is not a metric the pipeline reports (did you mean 'ptq.loss'?)" in err
    assert "plots.0.baseline: 'count.macs' is not a metric" in err


def test_metrics_of_every_kind_pass(tmp_path, tiny_search):
    spec = tiny_search(objectives=[{"metric": "ptq.per_class.0.correct"}, {"metric": "trial.seconds", "direction": "minimize"}],
                       plots=[{"x": WIDTH, "y": ["avg_bits.weights"], "file": "p.png"},
                              {"x": "avg_bits.weights", "y": ["ptq.accuracy"], "kind": "scatter", "file": "q.png"}])
    assert len(prepare_studies(load_search_spec(spec))) == 1


def test_a_sampler_that_cannot_run_is_refused(tmp_path, tiny_search, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.stats.qmc", None)  # as without scipy
    err = _refused(tmp_path, tiny_search(sampler={"name": "qmc"}), capsys)
    assert "sampler.name: sampler 'qmc' needs a package that is not installed (scipy.stats.qmc)" in err


def test_a_sampler_that_would_stay_random_is_warned(tiny_search, caplog):
    with caplog.at_level(logging.WARNING):
        prepare_studies(load_search_spec(tiny_search(sampler={"name": "nsga2"}, n_trials=20)))
    assert "sampler: nsga2's first generation (population_size = 50 trials) is random; with n_trials = 20" in caplog.text
    assert CmaEsSamplerSpec(name="cmaes").startup_warning(n_trials=5, n_params=8).startswith(
        "cmaes updates after each generation of popsize = 10")
    assert TPESamplerSpec(n_startup_trials=4).startup_warning(n_trials=10, n_params=1) is None
    assert "every trial is random" in TPESamplerSpec().startup_warning(n_trials=10, n_params=1)
    assert "never breeds a second one" in NSGA2SamplerSpec(name="nsga2").startup_warning(n_trials=50, n_params=1)
    assert NSGA2SamplerSpec(name="nsga2", population_size=8).startup_warning(n_trials=50, n_params=1) is None


def test_the_base_pipelines_plugins_are_imported_for_the_space_check(tmp_path, tiny_search):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "mine.py").write_text(
        "from mase_lite.passes import PassParams, PassResult, register_pass\n"
        "class P(PassParams):\n    k: int = 1\n"
        "@register_pass('test_preflight_mine', kind='analysis', params=P)\n"
        "def mine(mg, params):\n    return PassResult(metrics={'k': params.k})\n"
    )
    pipeline = {**copy.deepcopy(TINY_PIPELINE), "plugins": ["mine.py"]}
    pipeline["steps"].append({"pass": "test_preflight_mine"})
    (tmp_path / "base" / "pipeline.json").write_text(json.dumps(pipeline))
    spec = tiny_search(pipeline="base/pipeline.json", objectives=[{"metric": "test_preflight_mine.k"}],
                       space=[{"path": "steps.test_preflight_mine.params.k", "type": "choice", "values": [1, 2]}])
    spec = load_search_spec(write_spec(tmp_path, spec))
    (study,) = prepare_studies(spec)
    assert study.space.pipeline["plugins"] == [str(tmp_path / "base" / "mine.py")]  # trials import it from anywhere


def test_the_base_pipelines_own_errors_are_blamed_on_it(tmp_path, tiny_search, capsys):
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["steps"][3]["params"]["batch_size"] = 0
    (tmp_path / "base.json").write_text(json.dumps(pipeline))
    err = _refused(tmp_path, tiny_search(pipeline="base.json"), capsys)
    assert f"mase-lite: error: pipeline ({tmp_path / 'base.json'}): invalid pipeline spec pipeline ({tmp_path / 'base.json'}):\n" \
           "steps.3.params.batch_size: Input should be greater than or equal to 1 (got 0)" in err
    assert "space.0" not in err
    broken = {**copy.deepcopy(TINY_PIPELINE), "steps": 5}
    err = _refused(tmp_path, tiny_search(pipeline=broken), capsys)
    assert "invalid pipeline spec pipeline:\nsteps: Input should be a valid array (got 5)" in err and "space.0" not in err


def test_a_base_model_too_big_to_build_stops_the_search_before_its_first_trial(tmp_path, tiny_search, capsys):
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["model"]["hf_config"]["intermediate_size"] = 10**9  # the space (a quantize width) never builds it
    err = _refused(tmp_path, tiny_search(pipeline=pipeline), capsys)
    assert "mase-lite: error: pipeline: model.hf_config: a bert model of this config would need about 260.0 GB" in err, err
    assert "space.0" not in err


def test_a_search_whose_every_trial_failed_exits_2(tmp_path, tiny_search, capsys):
    spec = tiny_search(space=[{"path": "model.hf_config.num_attention_heads", "type": "choice", "values": [3]}], n_trials=1)
    assert main(["search", str(write_spec(tmp_path, spec))]) == 2
    err = capsys.readouterr().err
    assert "mase-lite: error: study 'search': all 1 trials failed; trial 0: " in err
    assert "is not a multiple of the number of attention heads (3)" in err
    assert json.loads((tmp_path / "search" / "search_report.json").read_text())["studies"][0]["states"] == {"FAIL": 1}


def test_each_command_names_the_other_for_the_other_kind_of_spec(tmp_path, tiny_search, capsys):
    search = write_spec(tmp_path, tiny_search())
    assert main(["run", str(search)]) == 2
    assert f"{search} is a search spec (it has objectives); run it with `mase-lite search {search}`" in capsys.readouterr().err
    pipeline = write_spec(tmp_path, TINY_PIPELINE, "pipeline.json")
    assert main(["search", str(pipeline)]) == 2
    assert f"{pipeline} is a pipeline spec (it has steps); run it with `mase-lite run {pipeline}`" in capsys.readouterr().err


def test_built_in_passes_declare_the_metrics_they_report():
    from pathlib import Path

    from mase_lite.passes.registry import all_passes, builtin_passes

    passes = all_passes()
    reports = re.compile(r"(?:^\s*\}|PassResult\(.*), metrics=", re.M)  # PassResult(..., metrics=...)
    for name, module in builtin_passes().items():
        source = Path(sys.modules[module].__file__).read_text()
        assert bool(reports.search(source)) == (passes[name].metrics is not None), name


def test_a_path_typo_is_said_once_with_the_spelling_it_meant(tmp_path, tiny_search, capsys):
    """Every value of a misspelt path fails alike: one line for the entry, not one per value."""
    spec = tiny_search(space=[{"path": WIDTH.replace("weight_width", "weight_widht"), "type": "choice",
                               "values": [2, 3, 4, 5, 6, 7, 8]}])
    err = _refused(tmp_path, spec, capsys)
    assert err.count("weight_widht: unknown key for format") == 1
    assert "space.0 (steps.quantize.params.rules.linear.weight_widht, every value)" in err
    assert "did you mean 'weight_width'?" in err


def test_a_space_value_its_export_step_cannot_hold_is_refused_before_the_first_trial(tmp_path, capsys):
    """A group size the model's rows do not tile, for a compressed-tensors export: named with the space entry, the
    layer, its shape and what fits, before any trial runs."""
    pipeline = {"model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 64,
                                                              "num_hidden_layers": 1, "num_attention_heads": 2,
                                                              "num_key_value_heads": 1, "intermediate_size": 172}},
                "data": {"block_size": 16, "n_train": 16, "n_test": 8},
                "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": {
                    "name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 4}}}}},
                          {"pass": "evaluate", "params": {"label": "ptq"}},
                          {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}}]}
    spec = {"pipeline": pipeline, "output_dir": str(tmp_path / "search"), "objectives": [{"metric": "ptq.perplexity"}],
            "space": [{"path": "steps.quantize.params.rules.linear.weight.group_size", "type": "choice",
                       "values": [4, 128]}]}
    err = _refused(tmp_path, spec, capsys)
    assert "space.0.values.1" in err and ("compressed-tensors cannot hold layer 'model.layers.0.mlp.down_proj' "
                                          "[64, 172] in scaled_integer: groups of 128 over 172 columns") in err
    assert "values.0" not in err


def test_a_space_value_its_packed_layer_cannot_hold_is_refused_before_the_first_trial(tmp_path, capsys):
    """A K-quant packed over 160 inputs (no whole super-block of 256): named with the space entry and the layer before
    any trial runs; Q8_0's blocks of 32 fit, so that value passes."""
    pipeline = {"model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 256,
                                                              "num_hidden_layers": 1, "num_attention_heads": 2,
                                                              "num_key_value_heads": 1, "intermediate_size": 160}},
                "data": {"block_size": 16, "n_train": 16, "n_test": 8},
                "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {
                    "weight": {"name": "q8_0"}, "storage": "packed", "activations": "int8"}}}},
                          {"pass": "evaluate", "params": {"label": "ptq"}}]}
    spec = {"pipeline": pipeline, "output_dir": str(tmp_path / "search"), "objectives": [{"metric": "ptq.perplexity"}],
            "space": [{"path": "steps.quantize.params.rules.linear.weight.name", "type": "choice",
                       "values": ["q8_0", "q6_k"]}]}
    err = _refused(tmp_path, spec, capsys)
    assert "space.0.values.1" in err and ("storage 'packed' cannot hold layer 'model.layers.0.mlp.down_proj' "
                                          "[256, 160] in q6_k: a packed K-quant weight takes") in err
    assert "values.0" not in err
