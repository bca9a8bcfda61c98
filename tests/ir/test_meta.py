import torch
import torch.nn as nn

from mase_lite import MaseGraph
from mase_lite.ir.meta import node_meta
from tests.ir.models import small_cnn


def by_name(mg, name):
    return next(n for n in mg.nodes if n.name == name)


def test_bert_metadata_from_fake_tensors(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask", "labels"])
    query = by_name(mg, "bert_encoder_layer_0_attention_self_query")
    meta = query.meta["mase"]
    assert meta["op"] == "linear" and meta["type"] == "module" and meta["module"] == "Linear"
    assert meta["args"] == [{"shape": ["batch", "seq", 128], "dtype": "float32", "format": "float32"}]
    assert meta["results"] == [{"shape": ["batch", "seq", 128], "dtype": "float32", "format": "float32"}]
    assert meta["params"]["weight"] == {"shape": [128, 128], "dtype": "float32", "format": "float32", "trainable": True}
    assert meta["params"]["bias"]["shape"] == [128]
    ids = by_name(mg, "input_ids").meta["mase"]
    assert ids["op"] == "placeholder" and ids["results"][0] == {"shape": ["batch", "seq"], "dtype": "int64", "format": "int64"}
    classifier = by_name(mg, "classifier").meta["mase"]
    assert classifier["results"][0]["shape"] == ["batch", 2]
    ops = {n.meta["mase"]["op"] for n in mg.nodes}
    assert {"embedding", "layer_norm", "dropout", "gelu", "tanh", "sdpa", "view", "add", "cross_entropy", "output"} <= ops
    assert by_name(mg, "output").meta["mase"]["type"] == "output"


def test_buffers_are_marked_and_cnn_shapes():
    mg = MaseGraph(small_cnn(), example_inputs={"x": torch.randn(2, 3, 16, 16)})
    bn = by_name(mg, "bn1").meta["mase"]
    assert bn["op"] == "batch_norm"
    assert bn["params"]["running_mean"]["buffer"] is True and "trainable" not in bn["params"]["running_mean"]
    assert by_name(mg, "conv2").meta["mase"]["results"][0]["shape"] == ["batch", 16, 8, 8]


class Odd(nn.Module):
    def forward(self, x):
        return torch.special.erfinv(x.clamp(-0.5, 0.5)).cumprod(-1)


def test_unknown_op_is_named_not_raised():
    mg = MaseGraph(Odd(), example_inputs={"x": torch.randn(3, 5)})
    unknown = {n.meta["mase"].get("target") for n in mg.nodes if n.meta["mase"]["op"] == "unknown"}
    assert unknown == {"special_erfinv", "cumprod"}


def test_node_meta_never_raises_on_nodes_without_values():
    mg = MaseGraph(Odd(), example_inputs={"x": torch.randn(3, 5)})
    graph = mg.model.graph
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out):
        fresh = graph.call_function(torch.ops.aten.digamma.default, (out.args[0][0],))
    meta = node_meta(fresh, mg.modules, mg.symbol_names)
    assert meta["op"] == "unknown" and meta["target"] == "digamma" and meta["results"] == [None]
