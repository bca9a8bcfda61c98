from collections import Counter

import networkx as nx
import pytest
import torch

from mase_lite import MaseGraph
from tests.draw.models import Looped, Squared
from tests.ir.models import TwiceMLP


def fx_edges(mg) -> Counter:
    """(input, user) once per use, read from each node's args and kwargs."""
    edges = Counter()
    for n in mg.nodes:
        torch.fx.node.map_arg((n.args, n.kwargs), lambda a: edges.update([(a.name, n.name)]) or a)
    return edges


@pytest.mark.parametrize("model", [TwiceMLP, Looped, Squared])
def test_nodes_and_edges_equal_the_fx_graph(model):
    torch.manual_seed(0)
    mg = MaseGraph(model(), example_inputs={"x": torch.randn(3, 16 if model is TwiceMLP else 8 if model is Looped else 4)})
    g = mg.to_networkx()
    assert list(g.nodes) == [n.name for n in mg.nodes]
    assert Counter(list(g.edges())) == fx_edges(mg)
    assert isinstance(g, nx.MultiDiGraph) == (model is Squared)


def test_squared_input_is_two_parallel_edges():
    mg = MaseGraph(Squared(), example_inputs={"x": torch.randn(3, 4)})
    g = mg.to_networkx()
    mul = next(n for n, a in g.nodes(data=True) if a["op"] == "mul")
    assert g.number_of_edges("fc", mul) == 2


def test_unrolled_loop_is_three_calls_of_one_module_in_a_chain():
    mg = MaseGraph(Looped(), example_inputs={"x": torch.randn(3, 8)})
    g = mg.to_networkx()
    linears = [n for n, a in g.nodes(data=True) if a["op"] == "linear"]
    assert len(linears) == 3 and {g.nodes[n]["module_path"] for n in linears} == {"block.0"}
    assert nx.has_path(g, linears[0], linears[2])
    assert [g.nodes[n]["scope"] for n in linears] == [[["block", "Sequential"]]] * 3


def test_attributes_carry_shapes_formats_sparsity_and_params(tiny_bert):
    import mase_lite as ml

    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"])
    q = "bert_encoder_layer_0_attention_self_query"
    fmt = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 6, "weight_frac_width": 3}
    mg, _ = ml.passes.quantize(mg, {"by": "name", "rules": {q: fmt}})
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.25, "method": "l1-norm"}, "by": "name",
                                 "targets": ["bert_encoder_layer_0_attention_self_key"]})
    g = mg.to_networkx()
    a = g.nodes[q]
    assert (a["op"], a["node_op"], a["module_type"], a["module_path"]) == (
        "linear", "call_module", "QuantizedLinear", "bert.encoder.layer.0.attention.self.query")
    assert a["shapes"] == [["batch", "seq", 128]] and a["dtypes"] == ["float32"]
    assert a["param_count"] == 128 * 128 + 128
    assert a["format"]["weight"] == {"name": "integer", "width": 6, "frac_width": 3, "signed": True, "floor": False}
    assert a["format"]["data_in"]["width"] == 8 and "bias" not in a["format"]
    assert a["scope"][-1] == ["bert.encoder.layer.0.attention.self", "BertSelfAttention"]
    assert "sparsity" not in a
    k = g.nodes["bert_encoder_layer_0_attention_self_key"]
    assert k["sparsity"] == 0.25 and "format" not in k
    assert g.nodes["input_ids"]["param_count"] == 0 and g.nodes["input_ids"]["module_path"] == ""
