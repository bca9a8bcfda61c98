import json
import shutil

import pytest
import torch

import mase_lite as ml
from mase_lite.passes import PassError, get_pass


def test_registered_with_their_kinds_and_needs():
    train, evaluate, save, load = (get_pass(n) for n in ("train", "evaluate", "save", "load"))
    assert (train.kind, train.replay, train.requires) == ("transform", False, ("data",))
    assert (evaluate.kind, evaluate.requires) == ("analysis", ("data",))
    assert (save.kind, load.kind, load.replay) == ("analysis", "transform", False)


@pytest.mark.parametrize("name", ["train", "evaluate"])
def test_passes_without_data_say_how_to_get_it(name, finetune_run):
    with pytest.raises(PassError, match=rf"pass '{name}' needs 'data', which this call lacks: give it data \(ml.passes.{name}\(mg, params, data=...\)\) or run it in a pipeline with a `data` section"):
        get_pass(name)(finetune_run.mg, {})


def test_params_are_checked():
    with pytest.raises(PassError, match=r"pass 'train' params.schedule: Input should be 'linear', 'cosine' or 'constant'"):
        get_pass("train").validate({"schedule": "step"})
    with pytest.raises(PassError, match=r"pass 'evaluate' params.split: Input should be 'train' or 'test'"):
        get_pass("evaluate").validate({"split": "validation"})


def test_default_finetune_reaches_85_percent_in_one_epoch(finetune_run):
    report = finetune_run.report
    assert report["status"] == "ok"
    metrics = report["metrics"]["finetune"]
    assert metrics["accuracy"] >= 0.85 and metrics["n"] == 1000
    assert sum(c["support"] for c in metrics["per_class"].values()) == 1000
    train_info = report["steps"][0]["info"]
    assert train_info["steps"] == 250 and train_info["epochs"] == 1 and train_info["loss"] < 0.6
    saved = report["steps"][2]["info"]
    assert saved["files"] == [
        "model.safetensors", "recipe.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
    ]
    assert (finetune_run.output_dir / "tokenizer" / "tokenizer.json").is_file()


def test_a_second_pipeline_starts_from_the_saved_model(finetune_run, tmp_path):
    checkpoint = finetune_run.output_dir / "checkpoint"
    spec = {
        "name": "reload",
        "seed": 7,
        "data": {"vocab_size": 150, "seed": 0},
        "steps": [
            {"pass": "load", "params": {"path": str(checkpoint)}},
            {"pass": "evaluate", "params": {"label": "reloaded"}},
        ],
    }
    result = ml.run_pipeline(spec, output_dir=tmp_path / "reload")
    assert result.report["steps"][0]["info"]["retokenized"] is True
    assert result.report["metrics"]["reloaded"] == finetune_run.report["metrics"]["finetune"]
    assert result.data is not None and result.data.tokenizer is not None


def test_checkpoint_with_mismatched_shapes_names_the_tensor(finetune_run, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(finetune_run.output_dir / "checkpoint", broken)
    recipe = json.loads((broken / "recipe.json").read_text())
    recipe["model"]["hf_config"]["id2label"] = {"0": "a", "1": "b", "2": "c"}
    (broken / "recipe.json").write_text(json.dumps(recipe))
    mg = finetune_run.mg
    with pytest.raises(PassError, match=r"pass 'load': checkpoint .*broken: .*tensor 'classifier.weight' has shape \[2, 128\] in the checkpoint but \[3, 128\] in the model"):
        ml.passes.load(mg, {"path": str(broken)}, data=finetune_run.data)


def test_load_of_a_missing_checkpoint_says_where_it_looked(finetune_run):
    with pytest.raises(PassError, match=r"pass 'load': no checkpoint at 'nowhere' \(looked for recipe.json in .*nowhere and nowhere\)"):
        ml.passes.load(finetune_run.mg, {"path": "nowhere"}, output_dir=finetune_run.output_dir)


def test_save_is_whole_or_nothing_and_never_replaces_other_directories(finetune_run, tmp_path, monkeypatch):
    mg = finetune_run.mg
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "mine.txt").write_text("do not delete")
    with pytest.raises(PassError, match=r"notes exists and is not a checkpoint; refusing to replace it"):
        ml.passes.save(mg, {"path": str(keep)})
    assert (keep / "mine.txt").read_text() == "do not delete"

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(finetune_run.data.tokenizer, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ml.passes.save(mg, {"path": str(tmp_path / "ckpt")}, data=finetune_run.data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def test_save_relative_path_lands_in_the_run_and_reloads_the_same_weights(finetune_run, tmp_path, monkeypatch):
    mg = finetune_run.mg
    ctx = ml.passes.PassContext(data=finetune_run.data, output_dir=tmp_path)
    ml.passes.save(mg, {"path": "again"}, context=ctx)
    _, info = ml.passes.save(mg, {"path": "again", "tokenizer": False}, context=ctx)
    assert info["path"] == str(tmp_path / "again") and info["files"] == ["model.safetensors", "recipe.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]
    loaded, info = ml.passes.load(mg, {"path": "again"}, context=ctx)
    assert info == {"path": str(tmp_path / "again"), "retokenized": False}
    assert ctx.data is finetune_run.data
    for (name, a), b in zip(mg.model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a, b), name
