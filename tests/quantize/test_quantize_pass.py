"""The quantize pass on a captured BERT, a small CNN and an MLP; summarize_quantization."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mase_lite.passes as passes
import mase_lite as ml
from mase_lite.ir.graph import MaseGraph
from mase_lite.layers.quant_functional import QuantizedMatmul
from mase_lite.layers.quantized import QuantizedConv2d, QuantizedLinear
from mase_lite.passes.registry import PassError

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


def integer(width, frac_width, operands=("data_in", "weight", "bias")):
    keys = {f"{o}_{k}": v for o in operands for k, v in (("width", width), ("frac_width", frac_width))}
    return {"name": "integer", **keys}


def q(x, width, frac_width):
    """Fixed point by its definition."""
    return (x * 2.0**frac_width).round().clamp(-(2 ** (width - 1)), 2 ** (width - 1) - 1) / 2.0**frac_width


INT16_MASE = {"by": "type", "default": {"config": {"name": None}}, "linear": {"config": integer(16, 8)}}


def _linears(mg):
    return [n for n in mg.nodes if n.meta["mase"]["op"] == "linear"]


def test_bert_every_linear_is_replaced_and_int16_stays_close_to_fp32(bert, bert_inputs):
    reference = bert.model(**bert_inputs).logits
    mg, info = passes.quantize(bert, INT16_MASE)
    linears = _linears(mg)
    assert len(linears) == 14 and info["count"] == 14
    assert all(isinstance(mg.modules[n.target], QuantizedLinear) for n in linears)
    assert {r["node"] for r in info["replaced"]} == {n.name for n in linears}
    out = mg.model(**bert_inputs).logits
    assert not torch.equal(out, reference)
    assert (out - reference).abs().max() < 2e-2
    mg.model.graph.lint()


def test_bert_ptq_output_of_a_layer_equals_manual_quantization(bert, bert_inputs):
    mg, _ = passes.quantize(bert, {"by": "type", "rules": {"linear": integer(8, 4)}})
    layer = mg.modules["bert.encoder.layer.0.attention.self.query"]
    seen = {}
    layer.register_forward_hook(lambda module, args, out: seen.update(x=args[0], y=out))
    mg.model(**bert_inputs)
    expected = F.linear(q(seen["x"], 8, 4), q(layer.weight, 8, 4), q(layer.bias, 8, 4))
    assert torch.equal(seen["y"], expected)


def test_bert_matmuls_become_quantized_module_nodes(bert, bert_inputs):
    reference = bert.model(**bert_inputs).logits
    mg, info = passes.quantize(bert, {"by": "type", "rules": {"matmul": integer(16, 8, ["data_in"])}})
    matmuls = [n for n in mg.nodes if n.meta["mase"]["op"] == "matmul"]
    assert len(matmuls) == 4 and info["count"] == 4
    assert all(n.op == "call_module" and isinstance(mg.modules[n.target], QuantizedMatmul) for n in matmuls)
    assert not any(isinstance(m, QuantizedLinear) for m in mg.modules.values())
    mg.model.graph.lint()
    fmt = {"name": "integer", "width": 16, "frac_width": 8, "signed": True, "floor": False}
    assert [a["format"] for a in matmuls[0].meta["mase"]["args"]] == [fmt, fmt]
    assert (mg.model(**bert_inputs).logits - reference).abs().max() < 2e-2


def test_mase_and_canonical_forms_give_the_same_graph(bert, bert_graph, bert_inputs):
    mase, _ = passes.quantize(bert, INT16_MASE)
    canonical, _ = passes.quantize(copy.deepcopy(bert_graph), {"by": "type", "rules": {"linear": integer(16, 8)}, "default": None})
    assert torch.equal(mase.model(**bert_inputs).logits, canonical.model(**bert_inputs).logits)


def test_node_metadata_records_formats_and_resets_them_on_requantization(mlp):
    fmt8 = {"name": "integer", "width": 8, "frac_width": 4, "signed": True, "floor": False}
    mg, _ = passes.quantize(mlp, {"rules": {"linear": integer(8, 4)}})
    meta = next(n for n in mg.nodes if n.name == "fc1").meta["mase"]
    assert meta["module"] == "QuantizedLinear" and meta["op"] == "linear"
    assert meta["args"][0]["format"] == fmt8 and meta["results"][0]["format"] == "float32"
    assert meta["params"]["weight"]["format"] == fmt8 and meta["params"]["bias"]["format"] == fmt8
    mg.refresh_metadata()
    assert next(n for n in mg.nodes if n.name == "fc1").meta["mase"]["params"]["weight"]["format"] == fmt8
    mg, _ = passes.quantize(mg, {"rules": {"linear": integer(6, 2, ["weight"])}})
    meta = next(n for n in mg.nodes if n.name == "fc1").meta["mase"]
    assert meta["args"][0]["format"] == "float32" and meta["params"]["bias"]["format"] == "float32"
    assert meta["params"]["weight"]["format"]["width"] == 6


def test_a_params_dict_reused_100_times_gives_the_same_result(mlp_graph):
    params = {"by": "type", "default": {"config": {"name": None}},
              "linear": {"config": integer(8, 4) | {"weight_ste": "clipped"}},
              "matmul": {"config": {"data_in": {"name": "block_fp", "width": 6, "block_size": [1, 4]}}}}
    frozen = copy.deepcopy(params)
    x = torch.randn(5, 16)
    outputs = []
    for _ in range(100):
        mg, info = passes.quantize(copy.deepcopy(mlp_graph), params)
        outputs.append(mg.model(x=x))
        assert info["count"] == 3
    assert params == frozen
    assert all(torch.equal(o, outputs[0]) for o in outputs)


def test_cnn_convs_and_linear_equal_a_manually_quantized_copy(cnn, cnn_graph):
    x = torch.randn(3, 3, 8, 8)
    mg, info = passes.quantize(cnn, {"by": "type", "default": {"weight": {"name": "integer", "width": 8, "frac_width": 5}}})
    assert [r["node"] for r in info["replaced"]] == ["conv1", "conv2", "fc"]
    assert isinstance(mg.modules["conv1"], QuantizedConv2d)
    manual = copy.deepcopy(cnn_graph.source_model)
    with torch.no_grad():
        for module in (manual.conv1, manual.conv2, manual.fc):
            module.weight.copy_(q(module.weight, 8, 5))
    assert torch.equal(mg.model(x=x), manual(x))


def test_selection_by_name_and_regex_with_null_skips(bert):
    query = "bert_encoder_layer_0_attention_self_query"
    mg, info = passes.quantize(copy.deepcopy(bert), {"by": "name", "rules": {query: integer(8, 4)}})
    assert [r["node"] for r in info["replaced"]] == [query]
    mg, info = passes.quantize(
        bert,
        {"by": "regex", "rules": {r".*layer_1.*": None, r".*attention_self_(query|key)": integer(8, 4)},
         "default": integer(16, 8)},
    )
    rules = {r["node"]: r["rule"] for r in info["replaced"]}
    assert rules["bert_encoder_layer_0_attention_self_query"] == r"rules..*attention_self_(query|key)"
    assert rules["bert_encoder_layer_0_attention_self_value"] == "default"
    assert "bert_encoder_layer_1_attention_self_query" not in rules
    assert len(info["skipped"]) == 6 and len(rules) == 8


def test_bypass_changes_nothing(mlp):
    mg, info = passes.quantize(mlp, {"bypass": True, "linear": {"config": integer(8, 4)}})
    assert info["bypassed"] and not any(isinstance(m, QuantizedLinear) for m in mg.modules.values())


@pytest.mark.parametrize(
    "params, match",
    [
        ({"linear": {"config": integer(8, 4)}, "matmul": {"config": {"name": "integer", "data_in_width": 4, "data_in_frac_width": 6}}},
         r"params\.rules\.matmul\.data_in: frac_width=6 must be <= width=4"),
        ({"linear": {"config": {"name": "minifloat_ieee", "weight_width": 4, "weight_exponent_width": 4}}},
         r"rules\.linear\.weight: .*exponent_width=4 must be < width=4"),
        ({"linear": {"config": {"name": "int8"}}}, r"unknown format 'int8'; known formats: binary"),
        ({"matmul": {"config": {"name": "binary_scaling"}}}, r"format 'binary_scaling' is usable for weight only, not data_in"),
        ({"rules": {"gelu": integer(8, 4)}}, r"rules\.gelu: matches only nodes that cannot be quantized \(act; ops gelu\)"),
        ({"rules": {"conv2d": integer(8, 4)}}, r"rules\.conv2d: matches no node \(by type\); quantizable nodes: add, fc1, fc2, matmul"),
        ({"by": "regex", "rules": {"fc(": integer(8, 4)}}, r"rules\.fc\(: not a valid regex"),
        ({"by": "nearest"}, r"by: Input should be 'type', 'name' or 'regex'"),
        ({"linear": integer(8, 4), "rules": {"linear": integer(8, 4)}}, r"rule 'linear' is given twice"),
    ],
)
def test_impossible_configs_fail_before_anything_changes(mlp, params, match):
    with pytest.raises(PassError, match=match):
        passes.quantize(mlp, params)
    assert not any(isinstance(m, (QuantizedLinear, QuantizedMatmul)) for m in mlp.modules.values())


def test_unmatched_rules_can_be_allowed(mlp):
    mg, info = passes.quantize(mlp, {"rules": {"conv2d": integer(8, 4), "linear": integer(8, 4)}, "allow_unmatched": True})
    assert info["count"] == 2


def test_one_module_called_twice_needs_one_config():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.fc(x))

    mg = MaseGraph(Twice(), example_inputs={"x": torch.randn(2, 4)})
    assert [n.name for n in mg.nodes if n.op == "call_module"] == ["fc", "fc_1"]
    with pytest.raises(PassError, match=r"module 'fc' is called by nodes 'fc' and 'fc_1' with different configs"):
        passes.quantize(mg, {"by": "name", "rules": {"fc_1": integer(6, 2), "fc": integer(8, 4)}})
    with pytest.raises(PassError, match=r"rules\.fc_1: every node it matches \(fc_1\) is taken by an earlier rule"):
        passes.quantize(mg, {"by": "name", "rules": {"fc": integer(8, 4), "fc_1": integer(6, 2)}})
    mg, info = passes.quantize(mg, {"rules": {"linear": integer(8, 4)}})
    assert info["count"] == 2 and isinstance(mg.modules["fc"], QuantizedLinear)


def test_float16_model_keeps_dtype_device_and_parameters(small_cnn):
    torch.manual_seed(0)
    model = small_cnn().half().eval()
    mg = MaseGraph(model, example_inputs={"x": torch.randn(2, 3, 8, 8, dtype=torch.float16)})
    weights = {name: p for name, p in model.named_parameters()}
    mg, _ = passes.quantize(mg, {"rules": {"conv2d": integer(8, 4), "linear": integer(8, 4)}})
    for name, p in mg.model.named_parameters():
        assert p.dtype == torch.float16 and p.device.type == "cpu"
        assert p is weights[name]
    x = torch.randn(2, 3, 8, 8, dtype=torch.float16)
    y = mg.model(x=x)
    assert y.dtype == torch.float16
    conv1 = mg.modules["conv1"]
    h = F.conv2d(q(x.float(), 8, 4).half(), q(conv1.weight.float(), 8, 4).half(), q(conv1.bias.float(), 8, 4).half(), padding=1)
    seen = {}
    conv1.register_forward_hook(lambda module, args, out: seen.update(y=out))
    mg.model(x=x)
    assert torch.equal(seen["y"], h)


def test_packed_mxint8_weights_through_the_pass(mlp):
    mxint8 = pytest.importorskip("mase_lite.kernels.mxint8")
    x = torch.randn(4, 16)
    reference = mlp.model(x=x)
    mg, info = passes.quantize(mlp, {"rules": {"linear": {"name": "mxint", "element_width": 8, "storage": "packed"}}})
    assert [r["module"] for r in info["replaced"]] == ["MXInt8Linear", "MXInt8Linear"]
    assert isinstance(mg.modules["fc1"], mxint8.MXInt8Linear)
    assert (mg.model(x=x) - reference).abs().max() < 0.05


def test_summarize_quantization_lists_formats_and_bits(mlp):
    mg, _ = passes.quantize(mlp, {"rules": {
        "linear": {"weight": {"name": "block_fp", "width": 8, "exponent_width": 8, "block_size": 16},
                   "data_in": {"name": "integer", "width": 8, "frac_width": 4}},
        "matmul": {"name": "ternary"},
    }})
    mg, summary = passes.summarize_quantization(mg)
    assert summary["count"] == 3 and summary["by_format"] == {"block_fp": 2, "integer": 2, "ternary": 1}
    fc1 = summary["nodes"]["fc1"]
    assert fc1["op"] == "linear" and fc1["module"] == "QuantizedLinear"
    assert set(fc1["formats"]) == {"data_in", "weight"}
    assert fc1["bits"] == {"data_in": 8.0, "weight": 8.5}
    assert summary["nodes"]["matmul"]["bits"] == {"data_in_0": 2.0, "data_in_1": 2.0}


def test_avg_bits_reads_the_formats_the_pass_wrote(mlp):
    mg, _ = passes.quantize(mlp, {"rules": {"linear": integer(8, 4, ["weight", "bias"])}})
    _, bits = passes.avg_bits(mg, {"ops": ["linear"]})
    assert bits["weights"] == 8.0 and bits["activations"] == 32.0


def test_save_and_load_replays_the_quantization(mlp, mlp_graph, tmp_path):
    mg, _ = passes.quantize(mlp, {"rules": {"linear": {"weight": {"name": "binary_residual_sign", "levels": 2}}, "matmul": integer(8, 4, ["data_in"])}})
    x = torch.randn(3, 16)
    expected = mg.model(x=x)
    mg.save(tmp_path)
    loaded = ml.load(tmp_path, model=copy.deepcopy(mlp_graph.source_model))  # a float model: the load quantizes it
    assert isinstance(loaded.modules["fc1"], QuantizedLinear)
    assert torch.equal(loaded.model(x=x), expected)
