"""Quantize and prune compose in either order: masks survive, pruned weights stay zero while training."""

import pytest
import torch

import mase_lite as ml
from mase_lite.layers.quantized import QuantizedLinear
from tests.ir.models import TwiceMLP

PRUNE = {"weight": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"}}
QUANT = {"by": "type", "rules": {"linear": {"name": "integer", "weight_width": 8, "weight_frac_width": 4}}}


def graph():
    torch.manual_seed(0)
    return ml.MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(2, 16)})


def train_step(mg):
    mg.model.train()
    opt = torch.optim.SGD([p for p in mg.model.parameters() if p.requires_grad], lr=0.5)
    mg.model(x=torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("order", [("prune", "quantize"), ("quantize", "prune")])
def test_masks_survive_quantization_and_training(order, tmp_path):
    mg = graph()
    for name in order:
        mg, _ = getattr(ml.passes, name)(mg, PRUNE if name == "prune" else QUANT)
    layer = mg.model.hidden
    assert isinstance(layer, QuantizedLinear)
    assert next(n for n in mg.nodes if n.target == "hidden").meta["mase"]["module"] == "QuantizedLinear"
    mask = layer.parametrizations.weight[0].mask
    assert mask.float().mean().item() == 0.5
    train_step(mg)
    assert torch.all(layer.weight[~mask] == 0)
    assert torch.all(layer.parametrizations.weight.original[mask] != 0)
    mg.save(tmp_path / "g")
    torch.manual_seed(1)
    loaded = ml.load(tmp_path / "g", model=TwiceMLP())
    x = torch.randn(3, 16)
    mg.model.eval()
    assert torch.equal(loaded.model(x=x), mg.model(x=x))
    assert torch.equal(loaded.model.hidden.parametrizations.weight[0].mask, mask)
