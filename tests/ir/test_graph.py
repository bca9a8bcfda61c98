import pytest
import torch

from mase_lite import MaseGraph, UserError
from tests.ir.models import TwiceMLP


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(3, 16)})


def test_erasing_a_used_node_says_which_users_and_how_to_rewire(mlp):
    drop = next(n for n in mlp.nodes if n.target == "drop")
    with pytest.raises(UserError, match=r"cannot erase node 'drop': still used by out. .*node.replace_all_uses_with\(act_2\)"):
        mlp.erase_node(drop)


def test_bypass_then_erase_keeps_graph_valid(mlp):
    drop = next(n for n in mlp.nodes if n.target == "drop")
    drop.replace_all_uses_with(drop.args[0])
    mlp.erase_node(drop)
    mlp.recompile()
    mlp.model.train()
    x = torch.randn(4, 16)
    assert torch.equal(mlp.model(x=x), mlp.model(x=x))
    assert "drop" not in [n.target for n in mlp.nodes]


def test_replace_module_keeps_node_and_metadata_follows_on_recompile(mlp):
    mlp.replace_module("act", torch.nn.ReLU())
    assert [n.meta["mase"]["op"] for n in mlp.nodes if n.target == "act"] == ["gelu"] * 3  # refreshed once per pass
    mlp.recompile()
    ops = [n.meta["mase"]["op"] for n in mlp.nodes if n.target == "act"]
    assert ops == ["relu", "relu", "relu"]
    with pytest.raises(UserError, match=r"no submodule named 'nope' in the graph"):
        mlp.replace_module("nope", torch.nn.ReLU())
