"""Leaf modules that return a tuple (MaxPool2d with indices) are raised to one call_module node too."""

import torch

import mase_lite as ml


class PoolWithIndices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2, return_indices=True)

    def forward(self, x):
        values, indices = self.pool(self.conv(x))
        return values * 2 + indices.float()


def test_maxpool_with_indices_is_one_module_call_and_exact():
    torch.manual_seed(0)
    net = PoolWithIndices().eval()
    x = torch.randn(2, 3, 8, 8)
    mg = ml.MaseGraph(net, example_inputs={"x": x})
    pool = [n for n in mg.nodes if n.op == "call_module" and n.target == "pool"]
    assert len(pool) == 1 and pool[0].meta["mase"]["op"] == "max_pool2d"
    assert sorted(u.args[1] for u in pool[0].users) == [0, 1]
    for shape in [(2, 3, 8, 8), (5, 3, 6, 10)]:
        x = torch.randn(*shape)
        assert torch.equal(mg.model(x=x), net(x=x))


def test_a_leaf_module_captured_alone_is_its_own_ops():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    mg = ml.MaseGraph(linear, example_inputs={"input": x})
    assert [n.meta["mase"]["op"] for n in mg.nodes if n.op == "call_function"] == ["linear"]
    assert torch.equal(mg.model(input=x), linear(x))
