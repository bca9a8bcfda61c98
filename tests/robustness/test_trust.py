"""A checkpoint or a report names code; nothing is imported or called unless the user registered,
named (--plugin) or trusted it (--trust-code). Marker files prove that nothing ran."""

import json
import sys

import pytest
import torch

import mase_lite as ml
from mase_lite import MaseGraph, UserError
from mase_lite.cli import main
from mase_lite.infra import trust
from mase_lite.infra.trust import register_factory, trusting
from tests.robustness.nets import tiny

X = torch.randn(2, 4)


@pytest.fixture(autouse=True)
def fresh_trust(monkeypatch):
    """Each test starts with nothing named or registered by the tests before it."""
    for name in ("_named", "_plugin_modules", "_factories", "_leaf_modules"):
        monkeypatch.setattr(trust, name, type(getattr(trust, name))())


@pytest.fixture
def marker(tmp_path, monkeypatch):
    path = tmp_path / "ran"
    monkeypatch.setenv("MASE_LITE_TEST_MARKER", str(path))
    return path


def _checkpoint(directory, **recipe_changes):
    """A saved tiny graph whose recipe.json then gets ``recipe_changes``."""
    mg = MaseGraph(tiny(), example_inputs={"input": X}, recipe={"factory": "tests.robustness.nets:tiny", "kwargs": {}})
    mg, _ = ml.passes.remove_dropout(mg)
    mg.save(directory)
    recipe = json.loads((directory / "recipe.json").read_text())
    recipe.update(recipe_changes)
    (directory / "recipe.json").write_text(json.dumps(recipe))
    return directory


def _run_spec(tmp_path, spec, *flags):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return main([*flags, "run", str(path)])


def _subprocess_recipe(marker):
    return {"factory": "subprocess:run", "kwargs": {"args": ["touch", str(marker)]}}


def test_a_checkpoint_naming_subprocess_run_runs_nothing(tmp_path, marker, capsys):
    ckpt = _checkpoint(tmp_path / "ckpt", model=_subprocess_recipe(marker))
    with pytest.raises(UserError, match=r"model.factory = 'subprocess:run' is not a registered model factory"):
        ml.load(ckpt)
    assert main(["draw", str(ckpt), "-o", str(tmp_path / "g.svg")]) == 2
    err = capsys.readouterr().err
    assert "'subprocess:run' is not a registered model factory" in err and "--trust-code" in err
    spec = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}},
            "steps": [{"pass": "load", "params": {"path": str(ckpt)}}], "output_dir": str(tmp_path / "out")}
    assert _run_spec(tmp_path, spec) == 2
    err = capsys.readouterr().err
    assert "steps.0 (load): checkpoint" in err and "'subprocess:run' is not a registered model factory" in err
    assert not marker.exists() and not (tmp_path / "g.svg").exists()


def test_trusted_or_registered_factories_load(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    with pytest.raises(UserError, match="not a registered model factory"):
        ml.load(ckpt)
    assert ml.load(ckpt, trust_code=True).history[0]["pass"] == "remove_dropout"
    with trusting():
        ml.load(ckpt)

    reference = ml.load(ckpt, trust_code=True)
    register_factory(tiny)  # what a package does at import, or its entry point in mase_lite.models
    assert torch.equal(ml.load(ckpt).model(input=X), reference.model(input=X))


def test_an_entry_point_registers_a_factory_without_importing_it(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    ckpt = _checkpoint(tmp_path / "ckpt")
    point = EntryPoint(name="tiny", value="tests.robustness.nets:tiny", group=trust.FACTORY_GROUP)
    monkeypatch.setattr(trust, "entry_points", lambda group: [point] if group == trust.FACTORY_GROUP else [])
    assert ml.load(ckpt).history[0]["pass"] == "remove_dropout"


def test_a_plugin_named_on_the_command_line_vouches_for_its_module(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "g.json"
    assert main(["--plugin", "tests.robustness.nets", "draw", str(ckpt), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["nodes"]


def test_leaf_modules_the_model_lacks_are_not_imported(tmp_path, marker):
    sys.modules.pop("tests.robustness.side_effect", None)
    ckpt = _checkpoint(tmp_path / "ckpt", leaf_modules=["tests.robustness.side_effect:Thing"])
    loaded = ml.load(ckpt, model=tiny())
    assert loaded.leaf_modules == ()
    assert not marker.exists() and "tests.robustness.side_effect" not in sys.modules
    bad = _checkpoint(tmp_path / "bad", leaf_modules=["os:system()"])
    with pytest.raises(UserError, match=r"leaf_modules.0: expected 'package.module:attribute', got 'os:system\(\)'"):
        ml.load(bad, model=tiny())


def test_replay_refuses_analysis_passes_so_a_saved_draw_writes_nothing(tmp_path):
    target = tmp_path / "elsewhere" / "pwned.svg"
    ckpt = _checkpoint(tmp_path / "ckpt", transforms=[{"pass": "draw", "params": {"path": str(target)}, "module": "x"}])
    with pytest.raises(UserError, match=r"transforms.0: pass 'draw' is not a structural transform and is never replayed"):
        ml.load(ckpt, model=tiny())
    for name in ("train", "load", "save", "report"):
        ckpt = _checkpoint(tmp_path / name, transforms=[{"pass": name, "params": {}}])
        with pytest.raises(UserError, match=rf"pass '{name}' is not a structural transform"):
            ml.load(ckpt, model=tiny())
    assert not target.parent.exists()


def test_transformers_classes_come_from_the_auto_registry_only(tmp_path, tiny_bert):
    MaseGraph(tiny_bert, hf_input_names=["input_ids"]).save(tmp_path / "bert")
    recipe = json.loads((tmp_path / "bert" / "recipe.json").read_text())
    recipe["model"]["hf_class"] = "BertTokenizer"
    (tmp_path / "bert" / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UserError, match=r"'BertTokenizer' is not a bert model class in transformers' auto registry.*--trust-code"):
        MaseGraph.load(tmp_path / "bert")
    with trusting(), pytest.raises(UserError, match=r"transformers has no model class 'BertTokenizer'"):
        MaseGraph.load(tmp_path / "bert")
    recipe["model"].update(hf_class="BertModel", hf_config={**recipe["model"]["hf_config"], "model_type": "no-such-type"})
    (tmp_path / "bert" / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UserError, match=r"model.hf_config.model_type = 'no-such-type' is not a model type transformers knows"):
        MaseGraph.load(tmp_path / "bert")


def _report(tmp_path, spec):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"spec": spec, "versions": {}, "metrics": {}}))
    return path


def test_a_report_naming_code_reproduces_only_with_the_users_word(tmp_path, marker, capsys):
    sys.modules.pop("tests.robustness.side_effect", None)
    base = {"data": None, "example_inputs": {"input": {"shape": [2, 4]}}, "output_dir": str(tmp_path / "out")}
    evil = _report(tmp_path, {**base, "model": _subprocess_recipe(marker)})
    assert main(["run", str(evil)]) == 2
    assert "model.factory = 'subprocess:run' is not a registered model factory" in capsys.readouterr().err
    plugin = _report(tmp_path, {**base, "plugins": ["tests.robustness.side_effect"]})
    assert main(["run", str(plugin)]) == 2
    err = capsys.readouterr().err
    assert "plugins.0 = 'tests.robustness.side_effect' is recorded in the report, so it is not imported" in err
    assert not marker.exists() and "tests.robustness.side_effect" not in sys.modules
    assert not (tmp_path / "out").exists() and not (tmp_path / "reproduced").exists()
    fine = _report(tmp_path, {**base, "model": {"factory": "tests.robustness.nets:tiny", "kwargs": {"width": 4}}})
    assert main(["--plugin", "tests.robustness.nets", "run", str(fine)]) == 0
    # written beside the report, never to the directory it records
    assert json.loads((tmp_path / "reproduced" / "report.json").read_text())["status"] == "ok"
    assert not (tmp_path / "out").exists()


MALFORMED = [
    ([], "expected a JSON object, got list"),
    ({"format": "1"}, "unsupported format '1'"),
    ({"hf_input_names": 5}, "hf_input_names: Input should be a valid list"),
    ({"input_specs": {"input": {"shape": "4"}}}, "input_specs.input.shape: Input should be a valid list"),
    ({"input_specs": {"input": {"shape": [-2, 4], "dtype": "float32"}}}, "input_specs.input.shape.0: Input should be greater than or equal to 0"),
    ({"leaf_modules": [3]}, "leaf_modules.0: Input should be a valid string"),
    ({"transforms": "remove_dropout"}, "transforms: Input should be a valid list"),
    ({"transforms": [{"pass": 1}]}, "transforms.0.pass: Input should be a valid string"),
    ({"model": {"hf_class": 5, "hf_config": {}}}, "model.hf.hf_class: Input should be a valid string"),
    ({"model": {"factory": "tests.robustness.nets:tiny", "kwargs": []}}, "model.factory.kwargs: Input should be a valid dictionary"),
    ({"extra": 1}, "extra: unknown key"),
    ({"input_specs": None}, "input_specs: Input should be a valid dictionary"),
]


@pytest.mark.parametrize("change, message", MALFORMED)
def test_malformed_recipes_get_a_clear_error(tmp_path, change, message, capsys):
    ckpt = _checkpoint(tmp_path / "ckpt")
    if isinstance(change, list):
        (ckpt / "recipe.json").write_text(json.dumps(change))
    else:
        recipe = json.loads((ckpt / "recipe.json").read_text())
        recipe.update(change)
        (ckpt / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UserError) as err:
        ml.load(ckpt, trust_code=True)
    assert message in str(err.value)
    spec = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}},
            "steps": [{"pass": "load", "params": {"path": str(ckpt), "trust_code": True}}], "output_dir": str(tmp_path / "out")}
    assert _run_spec(tmp_path, spec) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_missing_recipe_key_is_named(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    recipe = json.loads((ckpt / "recipe.json").read_text())
    del recipe["input_specs"]
    (ckpt / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UserError, match=r"malformed recipe:\ninput_specs: Field required"):
        ml.load(ckpt, trust_code=True)


def test_weights_of_the_wrong_dtype_or_all_nan_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = _checkpoint(tmp_path / "ckpt")
    state = load_file(str(ckpt / "model.safetensors"))
    save_file({**state, "0.weight": state["0.weight"].double()}, str(ckpt / "model.safetensors"))
    with pytest.raises(UserError, match=r"tensor '0.weight' is torch.float64 in the checkpoint but torch.float32 in the model"):
        ml.load(ckpt, model=tiny())
    save_file({**state, "0.bias": torch.full((4,), float("nan"))}, str(ckpt / "model.safetensors"))
    with pytest.raises(UserError, match=r"tensor '0.bias' holds no finite value \(all NaN or infinite\)"):
        ml.load(ckpt, model=tiny())


def test_a_recorded_load_step_trusts_nothing_without_the_users_word(tmp_path, marker, capsys, caplog):
    ckpt = _checkpoint(tmp_path / "ckpt", model=_subprocess_recipe(marker))
    spec = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}},
            "steps": [{"pass": "load", "params": {"path": str(ckpt), "trust_code": True}}], "output_dir": str(tmp_path / "out")}
    report = _report(tmp_path, spec)
    assert main(["--plugin", "tests.robustness.nets", "run", str(report)]) == 2
    err = capsys.readouterr().err
    assert "steps.0.params.trust_code is recorded in the report and ignored" in caplog.text
    assert "model.factory = 'subprocess:run' is not a registered model factory" in err and not marker.exists()
    assert main(["--trust-code", "run", str(report)]) == 2  # the user's own word: the checkpoint's code runs
    assert "'subprocess:run' returned CompletedProcess, not an nn.Module" in capsys.readouterr().err and marker.exists()


def _search(tmp_path, pipeline, name="search.json"):
    spec = {"pipeline": pipeline, "space": [{"path": "seed", "type": "choice", "values": [0, 1]}],
            "objectives": [{"metric": "trial.seconds", "direction": "minimize"}], "sampler": {"name": "grid"},
            "n_trials": 2, "output_dir": str(tmp_path / "search")}
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("named", ["plugins", "factory"])
def test_a_search_over_a_report_runs_none_of_its_code(tmp_path, marker, capsys, named):
    sys.modules.pop("tests.robustness.side_effect", None)
    base = {"data": None, "example_inputs": {"input": {"shape": [2, 4]}}, "output_dir": str(tmp_path / "out")}
    code = {"plugins": ["tests.robustness.side_effect"]} if named == "plugins" else {"model": _subprocess_recipe(marker)}
    report = _report(tmp_path, {**base, "model": {"factory": "tests.robustness.nets:tiny"}, **code})
    assert main(["search", str(_search(tmp_path, "report.json"))]) == 2
    expected = ("plugins.0 = 'tests.robustness.side_effect' is recorded in the report, so it is not imported"
                if named == "plugins" else "model.factory = 'subprocess:run' is not a registered model factory")
    assert expected in capsys.readouterr().err
    # a search report recording an inline pipeline that names code is data too
    search_report = tmp_path / "search_report.json"
    spec = json.loads(_search(tmp_path, json.loads(report.read_text())["spec"], "inline.json").read_text())
    search_report.write_text(json.dumps({"spec": spec, "versions": {}, "studies": []}))
    assert main(["search", str(search_report)]) == 2
    assert expected in capsys.readouterr().err
    assert not marker.exists() and "tests.robustness.side_effect" not in sys.modules
    assert not (tmp_path / "search").exists()


def test_a_search_over_a_report_runs_with_the_plugin_named(tmp_path, capsys):
    _report(tmp_path, {"data": None, "example_inputs": {"input": {"shape": [2, 4]}}, "output_dir": "out",
                                "model": {"factory": "tests.robustness.nets:tiny"}})
    assert main(["--plugin", "tests.robustness.nets", "search", str(_search(tmp_path, "report.json"))]) == 0
    assert sorted(p.name for p in (tmp_path / "search" / "trials").iterdir()) == ["0", "1"]


def test_a_tokenizer_naming_custom_code_is_not_run(tmp_path, marker, capsys):
    from mase_lite.workloads.tokenizer import load_tokenizer, train_wordpiece

    directory = tmp_path / "ckpt" / "tokenizer"
    train_wordpiece(["the movie was great", "the plot was dull"], vocab_size=60).save_pretrained(str(directory))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]})
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(UserError, match=r"it names custom code, which is not run\); trust the file's code with --trust-code"):
        load_tokenizer(directory)  # transformers would otherwise ask "run the custom code? [y/N]" on the terminal
    assert not marker.exists()


def test_a_reproduced_search_writes_beside_its_report_with_its_own_journal(tmp_path):
    """A foreign search_report.json records the user's own search directory and a storage file there: the
    reproduction writes a new directory beside the report, with a journal of its own, and the user's files stay."""
    mine = tmp_path / "my_search"
    mine.mkdir()
    (mine / "trials.csv").write_text("my trials")
    pipeline = {"data": None, "example_inputs": {"input": {"shape": [2, 4]}}, "output_dir": "out",
                "model": {"factory": "tests.robustness.nets:tiny"}}
    spec = json.loads(_search(tmp_path, pipeline).read_text())
    spec.update(output_dir=str(mine), storage=f"sqlite:///{mine / 'study.db'}")
    (tmp_path / "foreign").mkdir()
    report = tmp_path / "foreign" / "search_report.json"
    report.write_text(json.dumps({"spec": spec, "versions": {}, "studies": []}))
    assert main(["--plugin", "tests.robustness.nets", "search", str(report)]) == 0
    assert sorted(p.name for p in mine.iterdir()) == ["trials.csv"] and (mine / "trials.csv").read_text() == "my trials"
    out = tmp_path / "foreign" / "reproduced"
    assert (out / "search_report.json").is_file() and sorted(p.name for p in (out / "trials").iterdir()) == ["0", "1"]
    assert main(["--plugin", "tests.robustness.nets", "search", str(report), "--output-dir", str(tmp_path / "mine2")]) == 0
    assert (tmp_path / "mine2" / "search_report.json").is_file()
