import pytest
import torch

from mase_lite import MaseGraph
from mase_lite.cli import main
from tests.draw.models import Blocks


def run(argv: list[str]) -> int:
    """``main``'s exit status, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("saved") / "blocks"
    MaseGraph(Blocks((False, False)), example_inputs={"x": torch.randn(2, 8)},
              recipe={"factory": "tests.draw.models:Blocks", "kwargs": {"gates": [False, False]}}).save(directory)
    return directory


def test_draw_a_saved_graph_directory_folded(saved, tmp_path, capsys):
    out = tmp_path / "blocks.dot"
    assert main(["--plugin", "tests.draw.models", "draw", str(saved), "--depth", "1", "--fold-repeats", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out} (4 boxes)\n"   # input, blocks.0–1 ×2, head, output
    assert "blocks.0–1 ×2 (Block)" in out.read_text()


def test_draw_a_saved_graph_as_graphml(saved, tmp_path, capsys):
    import networkx as nx

    out = tmp_path / "blocks.graphml"
    assert main(["--plugin", "tests.draw.models", "draw", str(saved), "-o", str(out)]) == 0
    assert "head" in nx.read_graphml(out).nodes


def test_color_by_without_data_is_said(saved, tmp_path, capsys):
    assert main(["--plugin", "tests.draw.models", "draw", str(saved), "--color-by", "format", "-o", str(tmp_path / "g.dot")]) == 0
    assert "color_by format: no node has a number format (run quantize first)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--color-by", "colour"], "draw.color_by: Input should be 'type', 'format', 'sparsity', 'data_out.min'"),
        (["--depth", "0"], "draw.depth: Input should be greater than or equal to 1 (got 0)"),
        (["--depth", "two"], "argument --depth: invalid int value: 'two'"),
        (["-o", "g.gif"], "cannot tell the format of 'g.gif'; use one of: svg, png, pdf, dot, graphml, json"),
        (["--model", "m.json"], "give a saved graph directory or --model, not both"),
    ],
)
def test_bad_options_exit_2_naming_the_option(saved, tmp_path, capsys, argv, message):
    assert run(["--plugin", "tests.draw.models", "draw", str(saved), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_missing_directory_exits_2(tmp_path, capsys):
    assert run(["draw", str(tmp_path / "nothing"), "-o", str(tmp_path / "g.svg")]) == 2
    assert "mase-lite: error:" in capsys.readouterr().err
