"""The ONNX and pt2 exports are the model as a runtime calls it: a causal LM or a text classifier captured for
training (with ``labels``) takes ``input_ids`` and ``attention_mask``, an image classifier ``pixel_values``, and
each returns ``logits`` alone (no loss, no key/value cache), batch and sequence free. onnxruntime and a fresh
process (``torch.export.load``, called positionally) give the tool's logits on other shapes than the example's."""

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers as tf

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export
from mase_lite.deploy.tracing import inference_inputs
from mase_lite.ir.module_model import ModuleModel
from tests.conftest import PATIENCE

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

ATOL = 1e-4  # float32 logits across runtimes: their own orders of sums
A8 = {"name": "scaled_integer", "width": 8, "granularity": "tensor", "full_range": True, "scale": 0.013}
RULES = {  # fake-quantized weights and activations, and a packed layer
    ".*q_proj": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}},
    ".*o_proj": {"weight": {"name": "mxint", "element_width": 8}, "data_in": A8},
    ".*up_proj": {"name": "mxint", "element_width": 8, "storage": "packed"},
}
FRESH = """
import inspect, json, sys, torch, safetensors.torch
import mase_lite.deploy.pt2  # registers mase_lite's operators
program = torch.export.load(sys.argv[1])
data = safetensors.torch.load_file(sys.argv[2])
model = program.module()
names = list(inspect.signature(model.forward).parameters)
logits = model(*[data[n] for n in names])
print(json.dumps({"inputs": names, "close": torch.allclose(logits, data["logits"], atol=float(sys.argv[3]), rtol=0),
                  "loss": [str(n.target) for n in program.graph.nodes if "loss" in str(n.target)]}))
"""


def llama():
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=64)).eval()


def text(batch=4, length=9):
    ids, mask = torch.randint(0, 96, (batch, length)), torch.ones(batch, length, dtype=torch.long)
    mask[0, -3:] = 0  # a padded row
    return {"input_ids": ids, "attention_mask": mask}


def causal_lm():
    mg = ml.MaseGraph(llama(), hf_input_names=["input_ids", "attention_mask", "labels"])
    return ml.passes.quantize(mg, {"by": "regex", "rules": RULES})[0], text()


def causal_lm_module():
    ids = torch.randint(0, 96, (2, 6))
    mm = ModuleModel(llama(), example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return ml.passes.quantize(mm, {"by": "regex", "rules": {k: v for k, v in RULES.items() if "up" not in k}})[0], text()


def sequence_classifier():
    torch.manual_seed(0)
    bert = tf.BertForSequenceClassification(tf.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64, num_labels=3))
    mg = ml.MaseGraph(bert.eval(), hf_input_names=["input_ids", "attention_mask", "labels"])
    return ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": {"name": "mxint"}}}})[0], text()


def image_classifier():
    torch.manual_seed(0)
    vit = tf.ViTForImageClassification(tf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=64, image_size=16, patch_size=8, num_labels=3))
    mg = ml.MaseGraph(vit.eval(), hf_input_names=["pixel_values", "labels"])
    return mg, {"pixel_values": torch.randn(5, 3, 16, 16)}


KINDS = {"causal-lm": causal_lm, "causal-lm (module mode)": causal_lm_module,
         "sequence-classification": sequence_classifier, "image-classification": image_classifier}


@pytest.fixture(scope="module", params=list(KINDS))
def exported(request, tmp_path_factory):
    """(the inputs a runtime gives, the tool's logits on them, each export's info and path) of one kind of model."""
    mg, inputs = KINDS[request.param]()
    with torch.no_grad():
        logits = mg.model(**inputs).logits
    directory = tmp_path_factory.mktemp("signatures")
    infos = {fmt: export(mg, fmt, directory / f"model.{fmt}") for fmt in ("onnx", "pt2")}
    safetensors.torch.save_file({**inputs, "logits": logits}, directory / "data.safetensors")
    return inputs, logits, infos, directory


def test_onnxruntime_calls_the_inference_inputs_and_gets_the_tools_logits(exported):
    inputs, logits, infos, directory = exported
    assert infos["onnx"]["inputs"] == list(inputs) and infos["onnx"]["outputs"] == ["logits"]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")  # float32 activations
    session = ort.InferenceSession(str(directory / "model.onnx"), options)
    assert [i.name for i in session.get_inputs()] == list(inputs)
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert all(isinstance(d, str) for d in session.get_inputs()[0].shape[:2 if "input_ids" in inputs else 1])  # free
    assert not [n.op_type for n in onnx.load(directory / "model.onnx").graph.node if "Loss" in n.op_type]
    (got,) = session.run(["logits"], {k: v.numpy() for k, v in inputs.items()})
    np.testing.assert_allclose(got, logits.numpy(), atol=ATOL, rtol=0)


def test_a_fresh_process_calls_the_program_with_the_inference_inputs(exported):
    inputs, _, infos, directory = exported
    assert infos["pt2"]["inputs"] == list(inputs) and infos["pt2"]["outputs"] == ["logits"]
    done = subprocess.run([sys.executable, "-c", FRESH, str(directory / "model.pt2"), str(directory / "data.safetensors"),
                           str(ATOL)], capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"inputs": list(inputs), "close": True, "loss": []}


def test_mase_lites_loader_reads_a_program_of_several_inputs(tmp_path):
    """torch.export writes guards relating input_ids' and attention_mask's sizes: ``pt2.load`` reads them as data."""
    from mase_lite.deploy import pt2

    mg = ml.MaseGraph(llama(), hf_input_names=["input_ids", "attention_mask", "labels"])
    export(mg, "pt2", tmp_path / "m.pt2")
    inputs = text(2, 5)
    with torch.no_grad():
        assert torch.equal(pt2.load(tmp_path / "m.pt2")(*inputs.values()), mg.model(**inputs).logits)


def test_an_encoder_decoder_keeps_its_labels_the_targets_its_decoder_reads():
    inputs = {"input_ids": torch.zeros(2, 3), "labels": torch.zeros(2, 3)}
    seq2seq = SimpleNamespace(example_inputs=inputs, source_model=SimpleNamespace(config=tf.T5Config()))
    assert list(inference_inputs(seq2seq)) == ["input_ids", "labels"]
    decoder = SimpleNamespace(example_inputs=inputs, source_model=SimpleNamespace(config=tf.LlamaConfig()))
    assert list(inference_inputs(decoder)) == ["input_ids"]


def test_a_graph_that_cannot_leave_its_labels_out_is_refused_naming_them(tmp_path):
    ids = torch.randint(0, 96, (2, 6))
    mg = ml.MaseGraph(llama(), example_inputs={"input_ids": ids, "labels": ids})  # not hf_input_names: no defaults
    with pytest.raises(UserError, match=r"^onnx: the model is exported as a runtime calls it, with input_ids and no "
                                        r"labels: this graph was captured with inputs \(input_ids, labels\); missing: labels"):
        export(mg, "onnx", tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
