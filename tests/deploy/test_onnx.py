"""ONNX export run by onnxruntime on CPU: DequantizeLinear gives the tool's weights bit for bit (INT4/UINT4 blocked,
INT8 per channel and per block), activation QuantizeLinear/DequantizeLinear pairs give the tool's activation
values bit for bit, the logits equal the tool's within float32 accumulation, the model is left as it was, and a
format ONNX has no operator for is refused naming the layer."""

import numpy as np
import pytest
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

W4 = {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}
RULES = {
    ".*q_proj": {"weight": W4},
    ".*k_proj": {"weight": {**W4, "symmetric": False}},
    ".*v_proj": {"weight": {"name": "mxint", "element_width": 8}},
    ".*o_proj": {"weight": {"name": "integer", "width": 8, "frac_width": 7}},
    ".*gate_proj": {"weight": {"name": "mxfp", "element_format": "e2m1"}},
    ".*up_proj": {"weight": {"name": "scaled_integer", "width": 8, "granularity": "channel", "scale_dtype": "float16"}},
    ".*down_proj": {"weight": {"name": "mxint", "element_width": 4}},
}


def session_with_outputs(path, names):
    """The model with ``names`` (intermediate tensors) made graph outputs too."""
    proto = onnx.load(path)
    for name in names:
        proto.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return ort.InferenceSession(proto.SerializeToString())


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask"])
    mg, _ = ml.passes.quantize(mg, {"by": "regex", "rules": RULES})
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    info = export(mg, "onnx", path)
    return mg, path, info


def test_dequantize_linear_gives_the_tools_weights_bit_for_bit(exported):
    mg, path, info = exported
    assert info["float_weights"] == ["model.layers.0.mlp.gate_proj"]  # MXFP4: exact float values
    assert len(info["dequantize_linear"]) == 6 and info["inputs"] == ["input_ids", "attention_mask"]
    proto = onnx.load(path)
    nodes = {n.output[0]: n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.output[0].endswith(".weight")}
    kinds = {i.name: i.data_type for i in proto.graph.initializer}
    q = "model.model.layers.0.self_attn.q_proj.weight"
    assert kinds[q + "_quantized"] == onnx.TensorProto.INT4
    assert kinds["model.model.layers.0.self_attn.k_proj.weight_quantized"] == onnx.TensorProto.UINT4
    assert kinds["model.model.layers.0.mlp.up_proj.weight_quantized"] == onnx.TensorProto.INT8
    attributes = {a.name: a.i for a in nodes[q].attribute}
    assert attributes == {"axis": 1, "block_size": 32}
    session = session_with_outputs(path, sorted(nodes))
    ids = torch.randint(0, 96, (2, 5))
    outputs = session.run(sorted(nodes), {"input_ids": ids.numpy(), "attention_mask": np.ones((2, 5), dtype=np.int64)})
    for name, value in zip(sorted(nodes), outputs):
        layer = mg.model.get_submodule(name.removeprefix("model.").removesuffix(".weight"))
        assert np.array_equal(value, layer.weight_quantizer(layer.weight).detach().numpy()), name


def test_logits_equal_the_tools_within_float32_accumulation(exported):
    """Batch and sequence length differ from the example's (dynamic): the same weights, onnxruntime's own order of
    float32 sums, so within 1e-5 of the largest logit. onnxruntime fuses an int8 per-tensor or per-channel
    DequantizeLinear -> MatMul into MatMulNBits computing with int8 activations (its accuracy level 4) unless told
    otherwise: at level 1 it computes in float32, as the tool does; at its default the int8 activations show."""
    mg, path, _ = exported
    ids, mask = torch.randint(0, 96, (3, 9)), torch.ones(3, 9, dtype=torch.long)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    with torch.no_grad():
        ours = mg.model(input_ids=ids, attention_mask=mask).logits.numpy()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    (logits,) = ort.InferenceSession(str(path), options).run(["logits"], feed)
    assert np.abs(logits - ours).max() <= 1e-5 * np.abs(ours).max()
    (default,) = ort.InferenceSession(str(path)).run(["logits"], feed)
    assert 1e-5 * np.abs(ours).max() < np.abs(default - ours).max() < 0.02 * np.abs(ours).max()


def test_an_encoder_decoder_exports_and_runs_at_other_sizes(tmp_path):
    """T5 (its attention output transposed, then reshaped), W8 per channel: onnxruntime's logits are the tool's at
    a batch and lengths other than the example's, encoder and decoder apart, within float32 accumulation."""
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                num_heads=4, decoder_start_token_id=0)).eval()
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "decoder_input_ids"])
    w8 = {"name": "scaled_integer", "width": 8, "granularity": "channel"}
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": w8}}})
    info = export(mg, "onnx", tmp_path / "t5.onnx")
    assert info["inputs"] == ["input_ids", "attention_mask", "decoder_input_ids"] and info["outputs"] == ["logits"]
    assert len(info["dequantize_linear"]) == 17  # every Linear: 6 in the encoder, 10 in the decoder, the head
    feed = {"input_ids": torch.randint(0, 100, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long),
            "decoder_input_ids": torch.randint(0, 100, (2, 4))}
    feed["attention_mask"][1, 5:] = 0
    with torch.no_grad():
        ours = mg.model(**feed).logits.numpy()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    (logits,) = ort.InferenceSession(str(tmp_path / "t5.onnx"), options).run(
        ["logits"], {k: v.numpy() for k, v in feed.items()})
    assert logits.shape == (2, 4, 100)
    assert np.abs(logits - ours).max() <= 1e-5 * np.abs(ours).max()


def test_the_model_is_left_as_it_was(exported):
    mg, _, _ = exported
    layer = mg.model.get_submodule("model.layers.0.self_attn.q_proj")
    assert layer.weight_quantizer is not None and layer.weight.requires_grad


class Identity(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(64))

    def forward(self, x):
        return self.proj(x)


@pytest.mark.parametrize("fmt", [
    {"name": "scaled_integer", "width": 8, "granularity": "tensor", "full_range": True, "scale": 0.013},
    {"name": "scaled_integer", "width": 8, "granularity": "tensor", "full_range": True, "scale": 0.013,
     "scale_dtype": "pow2"},
    {"name": "integer", "width": 8, "frac_width": 5},
    {"name": "integer", "width": 8, "frac_width": 3, "signed": False},
])
def test_activation_pairs_give_the_tools_values_bit_for_bit(fmt, tmp_path):
    """An identity layer shows the quantized input itself: ties, saturation at both ends, zeros."""
    model, _ = ml.passes.quantize(Identity(), {"by": "type", "rules": {"linear": {"data_in": fmt}}})
    step = fmt.get("scale", 2.0 ** -fmt.get("frac_width", 0))
    x = torch.cat([torch.randn(40, 64) * 2, ((torch.arange(64.0) - 32) * step / 2).reshape(1, 64),  # ties at half steps
                   torch.full((1, 64), 1e4) * torch.sign(torch.randn(1, 64))])  # saturation at both ends
    mm = ml.ir.module_model.ModuleModel(model, example_inputs={"x": x})
    export(mm, "onnx", tmp_path / "m.onnx")
    (out,) = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x.numpy()})
    with torch.no_grad():
        expected = ml.numerics.quantize(x, fmt).numpy()
    assert np.array_equal(out, expected)


def test_a_format_onnx_has_no_operator_for_is_refused_before_anything_is_written(tmp_path):
    model, _ = ml.passes.quantize(Identity(), {"by": "type", "rules": {"linear": {"data_in": {"name": "mxint"}}}})
    mm = ml.ir.module_model.ModuleModel(model, example_inputs={"x": torch.randn(2, 64)})
    with pytest.raises(UserError, match=r"onnx cannot hold layer 'proj': data_in format mxint .*; nearest onnx scheme: "
                                        r"8-bit scaled_integer per tensor with a static scale and full_range true"):
        export(mm, "onnx", tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_a_model_torch_onnx_cannot_convert_is_refused_in_one_line(exported, tmp_path, monkeypatch):
    """torch.onnx's many-line report (here a stand-in's) becomes one ExportError naming its cause; nothing is
    written."""
    def refuse(*args, **kwargs):
        raise RuntimeError("Failed to decompose the FX graph for ONNX compatibility.\n- Create an issue ...\n\n"
                           "## Exception summary\n\n<class 'ValueError'>: Cannot view a tensor with shape [2, 3]\n")
    monkeypatch.setattr(torch.onnx, "export", refuse)
    mg = exported[0]
    with pytest.raises(UserError) as refused:
        export(mg, "onnx", tmp_path / "m.onnx")
    assert str(refused.value) == ("onnx: torch.onnx cannot convert this model: "
                                  "ValueError: Cannot view a tensor with shape [2, 3]")
    assert list(tmp_path.iterdir()) == []
