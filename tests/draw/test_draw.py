import re
import shutil
import xml.etree.ElementTree as ET

import networkx as nx
import pytest
import torch

import mase_lite as ml
from mase_lite import MaseGraph, UserError
from mase_lite.viz.draw import DrawOptions, build
from mase_lite.viz.nx import scope
from tests.draw.models import Blocks
from tests.ir.models import TwiceMLP

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not installed")
XLINK = "{http://www.w3.org/1999/xlink}title"
MIXED = {
    "by": "regex",
    "rules": {
        ".*_(query|key)": {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8,
                           "weight_frac_width": 4},
        ".*_value": {"name": "minifloat_ieee", "data_in_width": 8, "data_in_exponent_width": 4, "weight_width": 8,
                     "weight_exponent_width": 4},
        ".*intermediate_dense": {"name": "log", "data_in_width": 6, "data_in_exponent_bias": 0, "weight_width": 6,
                                 "weight_exponent_bias": 0},
    },
}


@pytest.fixture(scope="module")
def bert_graph():
    from transformers import BertForSequenceClassification

    from tests.conftest import tiny_bert_config

    torch.manual_seed(0)
    return MaseGraph(BertForSequenceClassification(tiny_bert_config()).eval(), hf_input_names=["input_ids", "attention_mask"])


@pytest.fixture(scope="module")
def mixed_graph(bert_graph):
    import copy

    mg, _ = ml.passes.quantize(copy.deepcopy(bert_graph), MIXED)
    return mg


@pytest.fixture
def mlp_graph():
    torch.manual_seed(0)
    return MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(3, 16)})


def shown_names(mg):
    return [n.name for n in mg.nodes if n.op != "get_attr" and n.meta["mase"]["op"] not in ("sym_size", "assert")]


def test_full_drawing_has_a_box_per_shown_node_in_nested_module_clusters(bert_graph):
    d = build(bert_graph)
    assert d.boxes == len(shown_names(bert_graph)) and set(d.node_ids) == set(shown_names(bert_graph))
    assert "sym_size_int_10" not in d.node_ids and "bert_embeddings_position_ids" not in d.node_ids
    src = d.graph.source
    assert len(re.findall(r'subgraph "?cluster_', src)) == len({p for n in bert_graph.nodes for p, _ in scope(n, bert_graph.modules)})
    assert d.labels["cluster_bert.encoder.layer.1.attention.self"] == "self (BertSelfAttention)"
    query = d.labels[d.node_ids["bert_encoder_layer_0_attention_self_query"]]
    assert query == "bert_encoder_layer_0_attention_self_query\nlinear (Linear)\nbatch×seq×128 float32"


def test_two_layer_bert_folded_is_one_layer_box_times_two(bert_graph):
    d = build(bert_graph, DrawOptions(depth=3, fold_repeats=True))
    assert d.folded == {"bert.encoder.layer.0": 2}
    layer_ids = {d.node_ids[n.name] for n in bert_graph.nodes if "encoder_layer" in n.name}
    assert len(layer_ids) == 1
    label = d.labels[layer_ids.pop()]
    assert label.splitlines()[0] == "bert.encoder.layer.0–1 ×2 (BertLayer)"
    assert "params: 198.3k" in label and "in: batch×seq×128" in label
    assert not any("layer.1" in text for text in d.labels.values())
    box = d.node_ids["bert_encoder_layer_0_attention_self_query"]
    dashed = [line.strip() for line in d.graph.source.splitlines() if "style=dashed" in line and " -> " in line]
    assert dashed == [f"{box} -> {box} [constraint=false style=dashed tooltip=\"next repeat\"]"]
    unfolded = build(bert_graph, DrawOptions(depth=3))
    assert unfolded.boxes == d.boxes + 1 and not unfolded.folded


@pytest.mark.parametrize("gates, folded", [((False, False), {"blocks.0": 2}), ((False, True), {})])
def test_blocks_fold_only_when_their_structure_is_identical(gates, folded):
    mg = MaseGraph(Blocks(gates), example_inputs={"x": torch.randn(2, 8)})
    for depth in (None, 1):
        assert build(mg, DrawOptions(depth=depth, fold_repeats=True)).folded == folded


def test_depth_one_draws_fewer_boxes_and_keeps_every_edge_between_them(bert_graph):
    full, d = build(bert_graph), build(bert_graph, DrawOptions(depth=1))
    assert d.boxes < full.boxes
    assert {d.node_ids[n] for n in ("bert_embeddings_word_embeddings", "add_7")} == {d.node_ids["bert_pooler_dense"]}
    src = d.graph.source
    g = bert_graph.to_networkx()
    between = {(d.node_ids[u], d.node_ids[v]) for u, v in g.edges() if u in d.node_ids and v in d.node_ids}
    between = {(a, b) for a, b in between if a != b}
    assert between and all(f"\t{a} -> {b}" in src for a, b in between)
    assert src.count(" -> ") == len(between)


def test_color_by_format_names_every_format_with_its_widths(mixed_graph):
    d = build(mixed_graph, DrawOptions(color_by="format", depth=3, fold_repeats=True))
    src = d.graph.source
    for text in ("integer(width=8, frac_width=4)", "minifloat_ieee(width=8, exponent_width=4)",
                 "log(width=6, exponent_bias=0)", "not quantized"):
        assert text in src.split('label=<<table border="0" cellborder="1"')[1]  # the legend
    layer = d.labels[d.node_ids["bert_encoder_layer_0_attention_self_query"]]
    assert "integer(width=8, frac_width=4): 2 nodes" in layer and "log(width=6, exponent_bias=0): 1 nodes" in layer
    assert d.note is None


def test_color_by_without_data_says_so(bert_graph):
    for by, hint in (("format", "run quantize first"), ("sparsity", "run prune first"), ("weight.max", "run profile first")):
        d = build(bert_graph, DrawOptions(color_by=by))
        assert d.note.endswith(f"({hint})") and d.note in d.graph.source


def test_color_by_sparsity_is_a_scale(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"])
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5}, "by": "name", "targets": ["classifier"]})
    d = build(mg, DrawOptions(color_by="sparsity"))
    src = d.graph.source
    assert "sparsity 50%" in d.labels[d.node_ids["classifier"]]
    half_red = "#" + "".join(f"{round(255 + (c - 255) * 0.5):02x}" for c in (215, 48, 31))  # white -> #d7301f
    line = next(line for line in src.splitlines() if line.startswith(f'\t{d.node_ids["classifier"]} [label='))
    assert f'fillcolor="{half_red}"' in line
    assert "sparsity 0%" in src and "sparsity 100%" in src and "not pruned" in src


@needs_dot
def test_svg_tooltips_carry_shapes_and_formats(mixed_graph, tmp_path):
    path = mixed_graph.draw(tmp_path / "q.svg", color_by="format")
    titles = [a.get(XLINK) for a in ET.parse(path).getroot().iter("{http://www.w3.org/2000/svg}a")]
    query = next(t for t in titles if t and t.startswith("bert_encoder_layer_0_attention_self_query\n"))
    assert "out 0: batch×seq×128 float32 float32" in query
    assert "weight: integer(width=8, frac_width=4)" in query and "data_in: integer(width=8, frac_width=4)" in query
    assert "params: 16,512" in query
    cluster = next(t for t in titles if t and t.startswith("bert.encoder.layer.1\n"))
    assert "BertLayer" in cluster and "in: batch×seq×128" in cluster


def test_graphml_and_json_read_back_to_the_same_graph(mixed_graph, tmp_path):
    g = mixed_graph.to_networkx()
    back = nx.read_graphml(ml.passes.draw(mixed_graph, {"path": str(tmp_path / "g.graphml")})[1]["path"])
    assert list(back.nodes) == list(g.nodes) and sorted(back.edges()) == sorted(g.edges())
    assert back.nodes["bert_encoder_layer_0_attention_self_value"]["module_type"] == "QuantizedLinear"
    import json

    data = json.loads(mixed_graph.draw(tmp_path / "g.json").read_text())
    assert nx.node_link_graph(data, edges="edges").edges == g.edges


def test_pass_reports_boxes_and_folds(bert_graph, tmp_path):
    _, info = ml.passes.draw(bert_graph, {"path": str(tmp_path / "g.dot"), "depth": 3, "fold_repeats": True})
    assert info["folded"] == {"bert.encoder.layer.0": 2} and info["note"] is None
    assert info["boxes"] == build(bert_graph, DrawOptions(depth=3, fold_repeats=True)).boxes
    assert (tmp_path / "g.dot").read_text().startswith("digraph mase {")


def test_bad_options_name_the_field_and_allowed_values(mlp_graph, tmp_path):
    with pytest.raises(UserError, match=r"color_by: Input should be 'type', 'format', 'sparsity', 'data_out.min'"):
        mlp_graph.draw(tmp_path / "g.svg", color_by="colour")
    with pytest.raises(UserError, match=r"depth: Input should be greater than or equal to 1 \(got 0\)"):
        ml.passes.draw(mlp_graph, {"path": str(tmp_path / "g.svg"), "depth": 0})
    with pytest.raises(UserError, match=r"cannot tell the format of 'g.jpeg'; use one of: svg, png, pdf, dot, graphml, json"):
        mlp_graph.draw(tmp_path / "g.jpeg")
    assert not list(tmp_path.iterdir())


@needs_dot
def test_draw_svg_and_png(mlp_graph, tmp_path):
    svg = mlp_graph.draw(tmp_path / "a.b" / "mlp.svg")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "hidden_1" in text and "gelu (GELU)" in text
    png = mlp_graph.draw(tmp_path / "mlp.png", depth=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.b", "mlp.png"]


def test_draw_without_dot_says_how_to_install(mlp_graph, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UserError, match=r"`dot` program is not installed \(Debian/Ubuntu: apt-get install graphviz"):
        mlp_graph.draw(tmp_path / "g.svg")
    assert not list(tmp_path.iterdir())
