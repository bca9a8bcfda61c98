"""Bad values and sizes in search specs, pipeline specs and checkpoints exit 2 naming the field, within
seconds and without allocating what they ask for; the smaller faults a probe found do the same."""

import json
import os
import re
import subprocess
import sys

import pytest

import mase_lite as ml
from mase_lite import MaseGraph, UserError
from mase_lite.cli import main
from tests.robustness.nets import tiny
from tests.search.conftest import WIDTH, search_spec
from tests.conftest import PATIENCE


def _search(tmp_path, capsys, text: str) -> str:
    (tmp_path / "spec.json").write_text(text)
    assert main(["search", str(tmp_path / "spec.json")]) == 2
    assert not (tmp_path / "search").exists()
    err = capsys.readouterr().err
    assert err.startswith("mase-lite: error: ") and "Traceback" not in err
    return err


def _with(tmp_path, **changes) -> str:
    return json.dumps(search_spec(tmp_path, **changes))


SEARCH_CASES = [
    ({"sampler": {"name": "tpe", "seed": 2**40}}, "sampler.seed: Input should be less than 4294967296"),
    ({"sampler": {"name": "tpe", "n_startup_trials": "3"}}, "sampler.n_startup_trials: Input should be a valid integer (got '3')"),
    ({"sampler": {"name": "nsga2", "population": 10}}, "sampler.population: unknown key; allowed keys: crossover_prob, "),
    ({"sampler": {"name": "nsga2", "population_size": 1}}, "sampler.population_size: Input should be greater than or equal to 2"),
    ({"sampler": {"name": "annealing"}}, "sampler.name: unknown sampler 'annealing'; samplers: grid, random, tpe, nsga2, qmc, cmaes"),
    ({"space": [{"path": "steps.quantize.params.rules.{node}.name", "nodes": {"regex": "(unclosed"}, "type": "const", "value": "integer"}]},
     "space.0.nodes: regex '(unclosed' is not a regular expression: missing ), unterminated subpattern at position 0"),
    ({"space": [{"path": WIDTH, "type": "choice", "values": [4], "also": [{"path": WIDTH, "scale": 1e300}]}]},
     "space.0.also.0.scale: Input should be less than or equal to 1000000"),
    ({"heartbeat_interval": 10**20}, "heartbeat_interval: Input should be less than or equal to 86400"),
    ({"heartbeat_interval": 1e20}, "heartbeat_interval: Input should be a valid integer (got 1e+20)"),
    ({"n_trials": "1"}, "n_trials: Input should be a valid integer (got '1')"),
    ({"cache": 1}, "cache: Input should be a valid boolean (got 1)"),
    ({"storage": "sqlite:///:memory:"}, "storage: an in-memory database ends with its worker and no other worker sees it"),
    ({"storage": "sqlite://"}, "storage: an in-memory database ends with its worker and no other worker sees it"),
    ({"space": [{"path": "seed", "type": "int", "low": 0, "high": 10**8}], "sampler": {"name": "grid"}},
     "space.0: the grid would have more than 1000000 points (100000001 values of this entry)"),
    ({"space": [{"path": WIDTH, "type": "choice", "values": list(range(10**6))}]}, "space.0.values: List should have at most 1000 items"),
    ({"space": [{"path": "seed", "type": "choice", "values": [2**40]}]}, "space.0.values.0 (seed = 1099511627776): invalid pipeline spec"),
    ({"study_name": "/" + "x" * 10000}, "study_name: String should match pattern '^[A-Za-z0-9_][\\w.-]*$' (got '/xxxxxxxx"),
    ({"pipeline": {"steps": [5]}}, "invalid pipeline spec pipeline:\nsteps.0: Input should be an object (got 5)"),
    ({"plots": [{"x": WIDTH, "y": ["ptq.loss"], "file": "p.png", "title": "\ud800"}]}, "plots.0.title: '\\ud800' holds a lone surrogate"),
]


@pytest.mark.parametrize("changes, message", SEARCH_CASES)
def test_bad_search_values_exit_2_naming_the_field(tmp_path, capsys, changes, message):
    err = _search(tmp_path, capsys, _with(tmp_path, **changes))
    assert message in err, err
    assert len(err) < 2000  # echoed values are cut short


def test_a_long_echoed_value_is_cut_short(tmp_path, capsys):
    err = _search(tmp_path, capsys, _with(tmp_path, study_name="/" + "x" * 10000))
    assert "... (10003 characters))" in err


@pytest.mark.parametrize("text, message", [
    ("[" * 5000 + "]" * 5000, "spec.json: nested deeper than 64 levels"),
    ('{"a": ' * 100 + "1" + "}" * 100, "spec.json: nested deeper than 64 levels at a.a.a."),
    ('{"n_trials": 1' + "0" * 5000 + "}", "spec.json: a number has more than 4300 digits"),
    ('{"n_trials": 2, "n_trials": 3}', "spec.json: the key 'n_trials' appears twice in one object"),
    ('{"timeout": NaN}', "spec.json: NaN is not a JSON number"),
    ('{"timeout": 1e999}', "spec.json: the number '1e999' is beyond the range of a float"),
    ('{"study_name": "\\udc80"}', "spec.json at study_name: '\\udc80' holds a lone surrogate"),
])
def test_json_that_is_not_plain_data_exits_2(tmp_path, capsys, text, message):
    assert message in _search(tmp_path, capsys, text)
    assert main(["run", str(tmp_path / "spec.json")]) == 2  # the same reader for pipeline specs
    assert message in capsys.readouterr().err


def test_a_model_too_deep_is_refused_in_seconds(tmp_path, capsys):
    spec = {"data": {"n_train": 16, "n_test": 8, "block_size": 8}, "output_dir": str(tmp_path / "out"),
            "model": {"task": "causal-lm", "hf_config": {"model_type": "qwen3", "hidden_size": 16, "num_hidden_layers": 10**5,
                                                         "num_attention_heads": 2, "num_key_value_heads": 1,
                                                         "intermediate_size": 32, "head_dim": 8}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 2
    assert "model.hf_config: a qwen3 model of this config would need about" in capsys.readouterr().err


def test_a_recipe_too_deep_is_refused_before_building(tmp_path, tiny_bert):
    MaseGraph(tiny_bert, hf_input_names=["input_ids"]).save(tmp_path / "bert")
    recipe = json.loads((tmp_path / "bert" / "recipe.json").read_text())
    recipe["model"]["hf_config"]["num_hidden_layers"] = 10**5
    (tmp_path / "bert" / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UserError, match=r"model.hf_config: the model would need about \d+\.\d GB, more than"):
        ml.load(tmp_path / "bert")


def test_factory_kwargs_are_sized_before_the_model_is_built(tmp_path, capsys):
    spec = {"data": None, "model": {"factory": "tests.robustness.nets:tiny", "kwargs": {"width": 10**6}},
            "example_inputs": {"input": {"shape": [2, 4]}}, "output_dir": str(tmp_path / "out")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 2
    assert "model.kwargs: the model 'tests.robustness.nets:tiny' makes from these kwargs would need about 4000.0 GB" \
        in capsys.readouterr().err


def test_a_read_only_output_dir_is_named(tmp_path, tmpfs, capsys):
    disk = tmpfs("ro", read_only=True)
    spec = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}},
            "output_dir": str(disk)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 2
    assert capsys.readouterr().err == f"mase-lite: error: output_dir: {disk} is read-only for this process; " \
                                      "choose a directory you can write\n"
    search = search_spec(tmp_path, output_dir=str(disk / "search"))
    (tmp_path / "search.json").write_text(json.dumps(search))
    assert main(["search", str(tmp_path / "search.json")]) == 2
    assert f"output_dir: {disk} is read-only for this process" in capsys.readouterr().err


def _checkpoint(directory):
    return MaseGraph(tiny(), example_inputs={"input": __import__("torch").randn(2, 4)},
                     recipe={"factory": "tests.robustness.nets:tiny", "kwargs": {}}).save(directory)


def _run_steps(tmp_path, steps):
    spec = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}},
            "steps": steps, "output_dir": str(tmp_path / "out")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return main(["run", str(tmp_path / "spec.json")])


def test_save_onto_a_symlinked_checkpoint_is_refused(tmp_path, capsys):
    real = _checkpoint(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    assert _run_steps(tmp_path, [{"pass": "save", "params": {"path": str(tmp_path / "link")}}]) == 2
    assert f"steps.0.params.path: {tmp_path / 'link'} is a symbolic link; a checkpoint is replaced whole" \
        in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "out", "real", "spec.json"]


def test_a_fifo_in_a_checkpoint_is_refused_not_read(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    os.mkfifo(ckpt / "model.safetensors")
    proc = subprocess.run([sys.executable, "-m", "mase_lite.cli", "--plugin", "tests.robustness.nets", "draw", str(ckpt),
                           "-o", str(tmp_path / "g.svg")], capture_output=True, text=True, timeout=PATIENCE)
    assert proc.returncode == 2 and f"{ckpt / 'model.safetensors'}: not a regular file" in proc.stderr
    assert _run_steps(tmp_path, [{"pass": "load", "params": {"path": str(ckpt)}}]) == 2
    assert f"{ckpt / 'model.safetensors'}: not a regular file" in capsys.readouterr().err


def test_the_load_step_recovers_a_checkpoint_left_mid_save(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    ckpt.rename(tmp_path / ".ckpt.ready-999999999-abc123")  # killed between the renames: only the new version exists
    assert _run_steps(tmp_path, [{"pass": "load", "params": {"path": str(ckpt)}}]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "out", "spec.json"]


@pytest.mark.parametrize("text, message", [
    ('"model": "bert"', "model: expected an object with 'factory' or 'hf_class' (got 'bert')"),
    ('"model": {"hf_class": "BertModel", "hf_config": {"num_hidden_layers": NaN}}', "recipe.json: NaN is not a JSON number"),
    ('"leaf_modules": [' + "[" * 3000 + "]" * 3000 + "]", "recipe.json: nested deeper than 64 levels"),
    ('"format": 1' + "0" * 5000, "recipe.json: a number has more than 4300 digits"),
])
def test_a_malformed_recipe_is_named(tmp_path, text, message):
    ckpt = _checkpoint(tmp_path / "ckpt")
    recipe = json.loads((ckpt / "recipe.json").read_text())
    del recipe[json.loads("{" + text.split(":")[0] + ": 0}").popitem()[0]]
    (ckpt / "recipe.json").write_text("{" + text + ", " + json.dumps(recipe)[1:])
    with pytest.raises(UserError, match=re.escape(message)):
        ml.load(ckpt, trust_code=True)
