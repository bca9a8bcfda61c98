"""Every task from JSON alone, shrunk: train -> quantize -> evaluate -> save -> load in a pipeline, and a
two-trial search over the quantizer whose second trial restores the trained model from the prefix cache;
decoder and encoder-decoder classifiers; the errors a new user meets, each exit 2 naming the field."""

import copy
import json

import pytest
import torch

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.pipeline.spec import load_spec
from mase_lite.search.engine import flatten_metrics, run_search
from mase_lite.search.preflight import known, reported_metrics

TINY = {
    "causal-lm": {"hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64},
                  "data": {"n_train": 24, "n_test": 6, "block_size": 16}, "metric": "perplexity"},
    "seq2seq-lm": {"hf_config": {"model_type": "t5", "d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2},
                   "data": {"n_train": 32, "n_test": 8, "max_length": 16}, "metric": "perplexity"},
    "image-classification": {"hf_config": {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16],
                                           "depths": [1, 1], "layer_type": "basic"},
                             "data": {"n_train": 32, "n_test": 16, "image_size": 16}, "metric": "accuracy"},
    "sequence-classification": {"hf_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                              "intermediate_size": 64, "max_position_embeddings": 64},
                                "data": {"n_train": 32, "n_test": 16, "max_length": 16}, "metric": "accuracy"},
}
MX = {"name": "mxint", "element_width": 8}
RULES = {"image-classification": {"linear": MX, "conv2d": MX}}


def pipeline(task: str, out) -> dict:
    tiny = TINY[task]
    return {
        "name": task, "seed": 0, "device": "cpu",
        "model": {"task": task, "hf_config": tiny["hf_config"]},
        "data": tiny["data"],
        "steps": [
            {"pass": "train", "params": {"max_steps": 3, "batch_size": 8, "progress": False}},
            {"pass": "evaluate", "params": {"label": "fp32", "progress": False}},
            {"pass": "quantize", "params": {"by": "type", "rules": RULES.get(task, {"linear": MX}), "default": None}},
            {"pass": "evaluate", "params": {"label": "ptq", "progress": False}},
            {"pass": "save", "params": {"path": "ckpt"}},
            {"pass": "load", "params": {"path": "ckpt"}},
            {"pass": "evaluate", "params": {"label": "loaded", "progress": False}},
        ],
        "output_dir": str(out),
    }


@pytest.mark.parametrize("task", list(TINY))
def test_each_task_trains_quantizes_evaluates_saves_and_loads(task, tmp_path):
    result = ml.run_pipeline(pipeline(task, tmp_path / "run"))
    metrics = result.report["metrics"]
    metric = TINY[task]["metric"]
    assert set(metrics) == {"fp32", "ptq", "loaded"}
    assert metrics["ptq"]["loss"] == metrics["loaded"]["loss"]  # the checkpoint holds the quantized model
    assert metrics["fp32"]["loss"] != metrics["ptq"]["loss"] and metric in metrics["ptq"]
    formats = [p["format"] for n in result.mg.nodes for p in (n.meta["mase"].get("params") or {}).values()]
    assert MX | {"block_size": 32, "scale_rule": "floor"} in formats, "nothing was quantized"
    if task in ("causal-lm", "seq2seq-lm"):
        assert metrics["ptq"]["tokens"] > 0 and metrics["ptq"]["perplexity"] > 1
    if task == "causal-lm":
        assert 1 < metrics["ptq"]["perplexity_bound"] < metrics["ptq"]["perplexity"]
    if task == "image-classification":
        assert 0 <= metrics["ptq"]["accuracy"] <= metrics["ptq"]["top5"] <= 1
    declared = reported_metrics(load_spec(pipeline(task, tmp_path / "again")))  # what a search's pre-flight knows
    assert all(known(name, declared) for name in flatten_metrics(metrics)), sorted(flatten_metrics(metrics))
    # the checkpoint reloads outside the run, with the same outputs
    again = ml.load(tmp_path / "run" / "ckpt")
    batch = result.data.example_batch(2)
    inputs = {k: batch[k] for k in result.mg.input_names}
    with torch.no_grad():
        assert torch.equal(again.model(**inputs).logits, result.mg.model(**inputs).logits)


@pytest.mark.parametrize("task", ["causal-lm", "image-classification", "seq2seq-lm"])
def test_two_trial_search_restores_the_trained_model_from_the_prefix_cache(task, tmp_path):
    base = pipeline(task, tmp_path / "unused")
    base["steps"] = base["steps"][:4]
    metric = TINY[task]["metric"]
    spec = {
        "pipeline": base,
        "space": [{"path": "steps.quantize.params.rules.linear.element_width", "type": "choice", "values": [4, 8]}],
        "objectives": [{"metric": f"ptq.{metric}", "direction": "minimize" if metric == "perplexity" else "maximize"}],
        "sampler": {"name": "grid", "seed": 0}, "n_trials": 2, "output_dir": str(tmp_path / "search"),
    }
    result = run_search(spec)
    assert result.report["studies"][0]["states"] == {"COMPLETE": 2}
    trials = result.report["studies"][0]["trials"]
    assert len(trials) == 2
    reports = [json.loads((tmp_path / "search" / "trials" / str(t["number"]) / "report.json").read_text()) for t in trials]
    assert sorted(sum(s.get("cached", False) for s in r["steps"]) for r in reports) == [0, 2]
    fp32 = {r["metrics"]["fp32"][metric] for r in reports}
    assert len(fp32) == 1  # the restored model is the trained one


DECODERS = {
    "gpt2": {"n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64},
    "llama": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64},
    "qwen2": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 64},
    "t5": {"d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2},
    "bart": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64},
}


@pytest.mark.parametrize("model_type", list(DECODERS))
def test_decoder_and_encoder_decoder_classifiers_take_their_tokens_from_the_run(model_type, tmp_path):
    spec = {"model": {"hf_config": {"model_type": model_type, **DECODERS[model_type]}},
            "data": {"n_train": 16, "n_test": 8, "max_length": 12},
            "steps": [{"pass": "train", "params": {"max_steps": 2, "batch_size": 4, "progress": False}},
                      {"pass": "evaluate", "params": {"progress": False}}],
            "output_dir": str(tmp_path / "run")}
    result = ml.run_pipeline(spec)
    config = result.mg.source_model.config
    tok = result.data.tokenizer
    assert (config.pad_token_id, config.eos_token_id) == (tok.pad_token_id, tok.eos_token_id) == (0, 3)
    assert result.report["metrics"]["evaluate"]["n"] == 8


def test_a_vit_and_a_factory_cnn_classify_images(tmp_path):
    vit = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 64, "patch_size": 4}
    spec = {"model": {"task": "image-classification", "hf_config": vit}, "data": {"n_train": 16, "n_test": 8, "image_size": 16},
            "steps": [{"pass": "evaluate", "params": {"progress": False}}], "output_dir": str(tmp_path / "vit")}
    result = ml.run_pipeline(spec)
    assert result.mg.source_model.config.image_size == 16 and result.report["metrics"]["evaluate"]["n"] == 8
    spec = {"model": {"task": "image-classification", "factory": "tests.pipeline.task_factories:small_cnn", "kwargs": {"classes": 10}},
            "data": {"n_train": 16, "n_test": 8, "image_size": 16},
            "steps": [{"pass": "train", "params": {"max_steps": 2, "batch_size": 8, "progress": False}},
                      {"pass": "evaluate", "params": {"progress": False}}],
            "output_dir": str(tmp_path / "cnn")}
    result = ml.run_pipeline(spec)
    assert result.mg.input_names == ("pixel_values",)
    assert result.report["metrics"]["evaluate"]["n"] == 8 and "top5" in result.report["metrics"]["evaluate"]


def run_cli(tmp_path, capsys, spec: dict) -> tuple[int, str]:
    spec.setdefault("output_dir", str(tmp_path / "out"))
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    code = main(["run", str(tmp_path / "spec.json")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("spec,message", [
    ({"device": "cuda"}, "device = 'cuda': torch sees no CUDA device on this machine"),
    ({"device": "gpu"}, "device: String should match pattern"),
    ({"model": {"hf_config": {"model_type": "vit"}}},
     "model.hf_config.model_type = 'vit': transformers has no sequence-classification head for vit (model.task)"),
    ({"model": {"task": "causal-lm"}, "data": {"max_length": 16}}, "data.max_length: not used by causal-lm data"),
    ({"model": {"task": "causal-lm", "num_labels": 3}}, "num_labels is for classifiers; a causal-lm model predicts tokens"),
    ({"model": {"task": "image-classification"}, "data": {"dataset": "synthetic-grammar"}},
     "data.dataset = 'synthetic-grammar' is causal-lm data, not image-classification data"),
    ({"model": {"task": "image-classification", "hf_config": {"model_type": "resnet", "num_channels": 2}}},
     "model.hf_config.num_channels = 2: images have 1 (grey) or 3 (colour) channels"),
    ({"model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "attention_dropout": 1.5}}},
     "model.hf_config.attention_dropout = 1.5: a dropout probability is a number in [0, 1)"),
    ({"model": {"num_labels": 1000000}}, "model.num_labels: the names of 1000000 labels and their confusion matrix "
                                         "would need about"),
    ({"model": {"task": "translation"}}, "model.task: task must be one of sequence-classification, causal-lm, image-classification, seq2seq-lm; "
                                       "got 'translation'"),
])
def test_task_mistakes_exit_2_naming_the_field_before_anything_runs(tmp_path, capsys, spec, message):
    code, err = run_cli(tmp_path, capsys, spec)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out" / "report.json").exists()


def test_block_size_beyond_the_models_positions_is_named(tmp_path, capsys):
    model = copy.deepcopy(TINY["causal-lm"]["hf_config"])
    code, err = run_cli(tmp_path, capsys, {"model": {"task": "causal-lm", "hf_config": model}, "data": {"block_size": 128, "n_train": 2, "n_test": 2}})
    assert code == 2 and "data.block_size = 128 exceeds the model's max_position_embeddings (64)" in err


def test_pretrained_local_directories_bring_their_tokenizer_and_image_processor(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageClassification, ViTImageProcessor

    from mase_lite.workloads.tokenizer import train_wordpiece

    lm_dir = tmp_path / "lm"
    tok = train_wordpiece(["some text to learn from", "more text"], vocab_size=100)
    config = AutoConfig.for_model(vocab_size=len(tok), pad_token_id=None, **{k: v for k, v in TINY["causal-lm"]["hf_config"].items()})
    AutoModelForCausalLM.from_config(config).save_pretrained(lm_dir)
    tok.save_pretrained(lm_dir)
    result = ml.run_pipeline({"model": {"task": "causal-lm", "pretrained": str(lm_dir)}, "data": {"n_train": 2, "n_test": 2, "block_size": 16},
                              "steps": [{"pass": "evaluate", "params": {"progress": False}}], "output_dir": str(tmp_path / "lm_run")})
    assert result.data.tokenizer.get_vocab() == tok.get_vocab()  # the model's own tokenizer, not one trained in the run
    assert result.report["metrics"]["evaluate"]["perplexity"] > 1

    vit_dir = tmp_path / "vit"
    vit = {k: v for k, v in DECODERS_VIT.items()}
    AutoModelForImageClassification.from_config(AutoConfig.for_model(num_labels=10, **vit)).save_pretrained(vit_dir)
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5, 0.25, 0.125], image_std=[0.5, 0.5, 0.5]).save_pretrained(vit_dir)
    result = ml.run_pipeline({"model": {"task": "image-classification", "pretrained": str(vit_dir)}, "data": {"n_train": 8, "n_test": 4},
                              "steps": [{"pass": "evaluate", "params": {"progress": False}}], "output_dir": str(tmp_path / "vit_run")})
    data = result.data
    assert data.image_size == 16 and data.mean.flatten().tolist() == [0.5, 0.25, 0.125] and data.std.flatten().tolist() == [0.5] * 3


DECODERS_VIT = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                "patch_size": 8, "image_size": 16}


def test_a_plug_in_dataset_runs_in_a_search_with_the_prefix_cache(tmp_path, monkeypatch):
    from mase_lite.workloads import datasets as registry

    registry.get_dataset("synthetic-grammar")  # the built-in datasets are registered
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the plug-in's is forgotten after the test
    plugin = tmp_path / "my_data.py"
    plugin.write_text(
        "from mase_lite.data import register_dataset\n"
        "def corpus(spec, seed):\n"
        "    lines = [f'the {w} sat on the mat' for w in ('cat', 'dog', 'bird', 'fox') * 6]\n"
        "    return [{'text': line} for line in lines]\n"  # one table: the run keeps its tail for testing
        "register_dataset('mats', corpus, tasks=('causal-lm',))\n"
    )
    base = pipeline("causal-lm", tmp_path / "unused")
    base["plugins"] = [str(plugin)]
    base["data"] = {"dataset": "mats", "block_size": 8, "test_fraction": 0.25}
    base["steps"] = base["steps"][:4]
    spec = {"pipeline": base,
            "space": [{"path": "steps.quantize.params.rules.linear.element_width", "type": "choice", "values": [4, 8]}],
            "objectives": [{"metric": "ptq.perplexity", "direction": "minimize"}],
            "sampler": {"name": "grid", "seed": 0}, "n_trials": 2, "output_dir": str(tmp_path / "search")}
    result = run_search(spec)
    trials = result.report["studies"][0]["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE"]
    reports = [json.loads((tmp_path / "search" / "trials" / str(t["number"]) / "report.json").read_text()) for t in trials]
    assert sorted(sum(s.get("cached", False) for s in r["steps"]) for r in reports) == [0, 2]
    assert reports[0]["metrics"]["fp32"]["tokens"] == reports[1]["metrics"]["fp32"]["tokens"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cuda_runs_every_step_on_the_gpu(tmp_path):
    spec = pipeline("causal-lm", tmp_path / "run")
    spec["device"] = "cuda"
    result = ml.run_pipeline(spec)
    assert all(p.device.type == "cuda" for p in result.mg.model.parameters())
    assert result.report["metrics"]["ptq"]["loss"] == result.report["metrics"]["loaded"]["loss"]


def test_a_plug_in_task_is_one_registry_entry(tmp_path, monkeypatch, capsys):
    """A task added by a plug-in file (its head, default model, dataset and metrics) runs train and evaluate
    from JSON; a mistake in it is named like the built-in tasks'."""
    from mase_lite.workloads import datasets, tasks

    tasks.task_names(), datasets.get_dataset("synthetic-grammar")  # the built-in ones are registered
    monkeypatch.setattr(tasks, "_TASKS", dict(tasks._TASKS))  # the plug-in's entries are forgotten after the test
    monkeypatch.setattr(datasets, "_REGISTRY", dict(datasets._REGISTRY))
    plugin = tmp_path / "moods.py"
    plugin.write_text(
        "from mase_lite.data import Task, classification_data, register_dataset, register_task\n"
        "register_task(Task('mood-classification', 'AutoModelForSequenceClassification',\n"
        "    'MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES', ('input_ids', 'attention_mask', 'labels'),\n"
        "    per_token=False, default_dataset='moods',\n"
        "    default_hf_config={'model_type': 'distilbert', 'dim': 32, 'n_layers': 1, 'n_heads': 2, 'hidden_dim': 64},\n"
        "    build_data=classification_data, metrics=('accuracy', 'loss', 'n', 'per_class.*'),\n"
        "    data_fields=('text_column', 'label_column', 'max_length', 'vocab_size', 'tokenizer'), classification=True))\n"
        "def moods(spec, seed):\n"
        "    rows = [{'text': f'a {w} day', 'label': int(w in ('fine', 'bright'))} for w in ('fine', 'grey', 'bright', 'dull') * 8]\n"
        "    return {'train': rows[:24], 'test': rows[24:]}\n"
        "register_dataset('moods', moods, tasks=('mood-classification',))\n"
    )
    spec = {"plugins": [str(plugin)], "model": {"task": "mood-classification"}, "data": {"max_length": 8},
            "steps": [{"pass": "train", "params": {"epochs": 1, "batch_size": 8}},
                      {"pass": "evaluate", "params": {"progress": False}}],
            "output_dir": str(tmp_path / "run")}
    result = ml.run_pipeline(spec)
    assert type(result.mg.source_model).__name__ == "DistilBertForSequenceClassification"
    metrics = result.report["metrics"]["evaluate"]
    assert metrics["n"] == 8 and set(metrics["per_class"]) == {"0", "1"}
    code, err = run_cli(tmp_path, capsys, {**spec, "data": {"block_size": 8}, "output_dir": str(tmp_path / "bad")})
    assert code == 2 and "data.block_size: not used by mood-classification data (it is for causal-lm); remove it" in err


def test_a_gpt2_from_hf_config_has_no_token_ids_past_the_vocabulary(tmp_path):
    """GPT-2's default bos/eos ids (50256) lie past a run's trained vocabulary: they take the data's tokens, and
    transformers has nothing to warn about."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        result = ml.run_pipeline({"model": {"task": "causal-lm", "hf_config": {"model_type": "gpt2", "n_embd": 32,
                                                                                 "n_layer": 1, "n_head": 2}},
                                  "data": {"n_train": 16, "n_test": 8, "block_size": 16}, "steps": [],
                                  "output_dir": str(tmp_path / "gpt2")})
    finally:
        logger.removeHandler(handler)
    config = result.mg.source_model.config
    assert all(i is None or 0 <= i < config.vocab_size for i in (config.bos_token_id, config.eos_token_id))
    assert not [r for r in records if "within the vocabulary" in r.getMessage()]
