import shutil

import pytest
import torch

from mase_lite import MaseGraph, UserError
from mase_lite.ir.draw import to_dot
from tests.ir.models import TwiceMLP

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not installed")


@pytest.fixture
def mlp_graph():
    torch.manual_seed(0)
    return MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(3, 16)})


def test_dot_source_shows_ops_shapes_and_classes_without_shape_symbols(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"])
    src = to_dot(mg)
    assert "bert_encoder_layer_0_attention_self_query" in src
    assert "linear (Linear)" in src and "batch×seq×128 float32" in src
    assert "sym_size" not in src and "_assert_tensor_metadata" not in src
    shown = src.count("[label=")
    assert shown == sum(1 for n in mg.nodes if n.op != "get_attr" and n.meta["mase"]["op"] not in ("sym_size", "assert"))


@needs_dot
def test_draw_svg_and_png(mlp_graph, tmp_path):
    svg = mlp_graph.draw(tmp_path / "a.b" / "mlp.svg")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "hidden_1" in text and "gelu (GELU)" in text
    png = mlp_graph.draw(tmp_path / "mlp.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.b", "mlp.png"]


def test_draw_unknown_extension(mlp_graph, tmp_path):
    with pytest.raises(UserError, match=r"cannot tell the format of 'g.jpeg'; use one of: svg, png, pdf, dot"):
        mlp_graph.draw(tmp_path / "g.jpeg")


def test_draw_without_dot_says_how_to_install(mlp_graph, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UserError, match=r"`dot` program is not installed \(Debian/Ubuntu: apt-get install graphviz"):
        mlp_graph.draw(tmp_path / "g.svg")
    assert not list(tmp_path.iterdir())
