"""The evaluate pass's perplexity protocols on a run's causal LM: the strided windows of transformers' guide with the
stride of the data's own windows score the same tokens and give the same perplexity as the data's windows; a smaller
stride scores every token but the first; llama.cpp's chunks score half of each whole chunk; wrong settings exit 2
naming the field."""

import json

import pytest

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.workloads.language import token_stream

LM = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64}


def spec(tmp_path, steps) -> dict:
    return {"name": "ppl", "seed": 0, "device": "cpu", "model": {"task": "causal-lm", "hf_config": LM},
            "data": {"dataset": "synthetic-grammar", "n_train": 4, "n_test": 6, "block_size": 16}, "steps": steps,
            "output_dir": str(tmp_path / "out")}


def evaluate(label, **params):
    return {"pass": "evaluate", "params": {"label": label, "progress": False, **params}}


def test_protocols_score_the_tokens_they_define(tmp_path):
    steps = [evaluate("windows"), evaluate("sliding", protocol="sliding", context=16, stride=16),
             evaluate("strided", protocol="sliding", context=16, stride=4),
             evaluate("chunks", protocol="chunks", context=16, bos=True)]
    result = ml.run_pipeline(spec(tmp_path, steps))
    metrics = result.report["metrics"]
    tokens = token_stream(result.data.tokenizer, result.data.documents["test"]).numel()
    assert result.data.tensors["test"]["input_ids"].shape[0] * 16 >= tokens  # the data's windows cover the stream
    assert metrics["sliding"]["tokens"] == metrics["windows"]["tokens"]
    assert metrics["sliding"]["perplexity"] == pytest.approx(metrics["windows"]["perplexity"], rel=1e-5)
    assert metrics["strided"]["tokens"] == tokens - 1
    assert metrics["chunks"]["tokens"] == tokens // 16 * 7 and metrics["chunks"]["protocol"] == "chunks"
    assert len({round(m["perplexity"], 3) for m in metrics.values()}) == 3  # strided and chunks differ


@pytest.mark.parametrize("params, message", [
    ({"protocol": "chunks"}, "context: the chunks protocol needs the tokens a window holds"),
    ({"protocol": "sliding", "context": 16}, "stride: the sliding protocol needs one of at most context (16)"),
    ({"protocol": "chunks", "context": 15}, "context: the chunks protocol needs an even context of at least 4"),
    ({"context": 16}, "context, stride and bos belong to the sliding and chunks protocols"),
    ({"protocol": "chunks", "context": 4096}, "evaluate.context: chunks: need an even context of at least 4 (4096) and "
                                              "one whole chunk"),
])
def test_wrong_protocol_settings_exit_2_naming_the_field(tmp_path, capsys, params, message):
    (tmp_path / "spec.json").write_text(json.dumps(spec(tmp_path, [evaluate("e", **params)])))
    code = main(["run", str(tmp_path / "spec.json")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
