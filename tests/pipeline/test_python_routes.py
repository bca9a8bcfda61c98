"""The routes a user takes from Python rather than a spec (issue 49, item 6): ``data=`` a data section for a causal
LM built in Python, an export that writes the tokenizer, and a capture torch.export refuses without its graph dump."""

import logging
import sys

import pytest
import torch
import torch.nn as nn
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.infra.errors import UserError
from mase_lite.ir.capture import CaptureError
from mase_lite.ir.export import without_partial_graphs
from mase_lite.infra.trust import qualname, register_factory

SECTION = {"dataset": "synthetic-grammar", "n_train": 4, "n_test": 4, "block_size": 16}
DUMP_LINES = ("class GraphModule", "def forward(", "torch.ops.aten")


def llama(vocab_size: int = 128) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=32)
    return LlamaForCausalLM(config).eval()


def test_a_data_section_evaluates_a_causal_lm_built_in_python_in_both_modes():
    """The extend guide's ``data=<section>`` (docs/guides/extend.md): the task is the model's own (module mode used
    to read its backbone ``.model``), and a model without a tokenizer gets one trained on the data within its vocab_size."""
    model = llama()
    _, module_info = ml.passes.evaluate(model, {"progress": False}, data=SECTION)
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])
    _, graph_info = ml.passes.evaluate(mg, {"progress": False}, data=SECTION)
    metrics = module_info["metrics"]
    assert (metrics["n"], metrics["tokens"], metrics["split"]) == (4, 60, "test")
    assert metrics["loss"] == pytest.approx(graph_info["metrics"]["loss"], rel=1e-5)
    assert 0 < metrics["loss"] < 2 * torch.log(torch.tensor(128.0)).item()


def test_the_trained_tokenizer_fits_the_models_vocabulary():
    from mase_lite.workloads.batches import as_data

    data = as_data(SECTION, llama(vocab_size=64))
    assert data.vocab_size <= 64 and max(int(b["input_ids"].max()) for b in data.loader("train", 4)) < 64
    with pytest.raises(UserError, match=r"^data.vocab_size = 500 exceeds the model's vocab_size \(64\); give at most "
                                        r"64, or data.tokenizer$"):
        ml.passes.evaluate(llama(vocab_size=64), {}, data={**SECTION, "vocab_size": 500})


def test_an_export_from_python_writes_the_tokenizer_it_is_given(tmp_path):
    """tokenizer= (an object or its directory) or data= give the tokenizer; AutoTokenizer loads it back."""
    model = llama()
    _, info = ml.passes.export(model, {"format": "compressed-tensors", "path": str(tmp_path / "by_data")}, data=SECTION)
    assert info["tokenizer"] == "data" and (tmp_path / "by_data" / "tokenizer.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "by_data")
    text = "the cat sings"
    _, info = ml.passes.export(model, {"format": "compressed-tensors", "path": str(tmp_path / "given")},
                               tokenizer=tokenizer)
    assert info["tokenizer"] == "tokenizer="
    assert AutoTokenizer.from_pretrained(tmp_path / "given")(text)["input_ids"] == tokenizer(text)["input_ids"]
    _, info = ml.passes.export(model, {"format": "compressed-tensors", "path": str(tmp_path / "by_dir")},
                               tokenizer=str(tmp_path / "given"))
    assert info["tokenizer"] == "tokenizer=" and (tmp_path / "by_dir" / "tokenizer.json").is_file()


def test_an_export_finds_the_tokenizer_beside_the_model(tmp_path):
    ml.passes.export(llama(), {"format": "compressed-tensors", "path": str(tmp_path / "src")}, data=SECTION)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "src")
    _, info = ml.passes.export(loaded, {"format": "compressed-tensors", "path": str(tmp_path / "out")})
    assert info["tokenizer"] == str(tmp_path / "src") and (tmp_path / "out" / "tokenizer.json").is_file()


def test_an_export_without_a_tokenizer_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mase_lite.passes.analysis.export"):
        _, info = ml.passes.export(llama(), {"format": "compressed-tensors", "path": str(tmp_path / "hf")})
    assert info["tokenizer"] is None and not (tmp_path / "hf" / "tokenizer.json").exists()
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert caplog.messages == [
        f"export: no tokenizer to write with the model at {tmp_path / 'hf'}; give one (ml.passes.export(mg, {{...}}, "
        "tokenizer=<a tokenizer, its directory or hub name>), or data= a dataset), or set \"tokenizer\": false"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mase_lite.passes.analysis.export"):
        _, info = ml.passes.export(llama(), {"format": "compressed-tensors", "path": str(tmp_path / "no"), "tokenizer": False})
    assert info["tokenizer"] is None and caplog.messages == []


class Branchy(nn.Module):
    """A model torch.export refuses: it branches on a value."""

    def __init__(self):
        super().__init__()
        self.stem, self.head = nn.Linear(3 * 4 * 4, 8), nn.Linear(8, 10)

    def forward(self, pixel_values):
        h = self.stem(pixel_values.flatten(1))
        if h.mean() > 0:
            h = h.relu()
        return self.head(h)


@register_factory
def branchy() -> nn.Module:
    return Branchy()


def test_a_capture_export_refuses_prints_no_graph_dump(tmp_path, capfd, caplog):
    """``"capture": "auto"`` falls back to module mode with its two-line reason; torch's partial graph, which
    its export wrapper prints to stderr (twice per attempt), is not printed."""
    with pytest.raises(CaptureError, match=r"if h.mean\(\) > 0:"):
        ml.MaseGraph(Branchy(), example_inputs={"pixel_values": torch.randn(2, 3, 4, 4)})
    result = ml.run_pipeline({"model": {"task": "image-classification", "factory": qualname(branchy)},
                              "data": {"n_train": 8, "n_test": 8, "image_size": 4}, "capture": "auto",
                              "steps": [{"pass": "evaluate", "params": {"progress": False}}],
                              "output_dir": str(tmp_path / "run")})
    assert result.report["capture"]["mode"] == "modules" and result.report["metrics"]["evaluate"]["n"] == 8
    assert any(m.startswith("capture: auto: running Branchy in module mode") for m in caplog.messages)
    out, err = capfd.readouterr()
    dumped = [line for line in (out + err).splitlines() if any(d in line for d in DUMP_LINES)]
    assert dumped == [] and len((out + err).splitlines()) <= 6, out + err


def test_only_the_partial_graph_is_held_back(capfd):
    """What else reaches stderr while exporting passes through, in order, whether the export fails or not."""
    error = RuntimeError("data-dependent")
    error.partial_fx_graph = "def forward(self, x):\n    add = torch.ops.aten.add.Tensor(x, 1)"
    with pytest.raises(RuntimeError), without_partial_graphs():
        print("a warning", file=sys.stderr)
        print(error.partial_fx_graph, file=sys.stderr)
        print(error.partial_fx_graph, file=sys.stderr)
        print("another", file=sys.stderr)
        raise error
    with without_partial_graphs():
        print("kept when export succeeds", file=sys.stderr)
    assert capfd.readouterr().err == "a warning\nanother\nkept when export succeeds\n"
