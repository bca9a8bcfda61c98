import copy
from types import SimpleNamespace

import pytest
import torch
from pydantic import Field

import mase_lite as ml
from mase_lite.passes import PassError, PassParams, PassResult, register_pass, registry
from tests.ir.models import TwiceMLP


class ScaleParams(PassParams):
    factor: float = Field(2.0, gt=0)
    targets: list[str] = Field(default_factory=lambda: ["linear"])


@register_pass("test_scale_weights", kind="transform", params=ScaleParams)
def scale_weights(mg, params):
    """Multiply the weights of the selected ops by a factor."""
    scaled = []
    for node in mg.nodes:
        if node.meta["mase"]["op"] in params.targets:
            with torch.no_grad():
                mg.modules[node.target].weight.mul_(params.factor)
            scaled.append(node.name)
    return PassResult({"scaled": scaled})


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return ml.MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(2, 16)})


def test_registered_pass_is_an_attribute_and_validates(mlp):
    info = ml.passes.test_scale_weights
    assert info.kind == "transform" and info.summary == "Multiply the weights of the selected ops by a factor."
    before = mlp.model.out.weight.detach().clone()
    mg, result = ml.passes.test_scale_weights(mlp, {"factor": 3.0})
    assert result == {"scaled": ["inp", "hidden", "hidden_1", "out"]}
    assert torch.equal(mg.model.out.weight, before * 3.0)
    assert mg.history == [
        {"pass": "test_scale_weights", "params": {"factor": 3.0, "targets": ["linear"]}, "module": "tests.passes.test_registry"}
    ]


def test_unknown_param_names_allowed_keys(mlp):
    with pytest.raises(PassError, match=r"pass 'test_scale_weights' params.fator: unknown key; allowed keys: factor, targets"):
        ml.passes.test_scale_weights(mlp, {"fator": 3.0})


def test_bad_value_names_field_and_constraint(mlp):
    with pytest.raises(PassError, match=r"params.factor: Input should be greater than 0 \(got -1\)"):
        ml.passes.test_scale_weights(mlp, {"factor": -1})


def test_params_dict_is_never_mutated_and_gives_the_same_result():
    params = {"factor": 1.5, "targets": ["linear"]}
    snapshot = copy.deepcopy(params)
    outputs = []
    for _ in range(3):
        torch.manual_seed(0)
        mg = ml.MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(2, 16)})
        mg, info = ml.passes.test_scale_weights(mg, params)
        outputs.append((info, mg.model.out.weight.detach().clone()))
    assert params == snapshot
    assert all(o[0] == outputs[0][0] and torch.equal(o[1], outputs[0][1]) for o in outputs)


def test_frozen_params_cannot_be_changed():
    p = ScaleParams(factor=2.0)
    with pytest.raises(Exception, match="frozen"):
        p.factor = 3.0


def test_unknown_pass_lists_registered():
    with pytest.raises(AttributeError, match=r"unknown pass 'no_such_pass'; registered passes: .*count"):
        ml.passes.no_such_pass


def test_duplicate_name_is_refused():
    with pytest.raises(PassError, match=r"a pass named 'count' is already registered"):
        register_pass("count", kind="analysis")(lambda mg, p: (mg, {}))


def test_bad_kind_is_refused():
    with pytest.raises(PassError, match=r"kind must be 'analysis' or 'transform', got 'rewrite'"):
        register_pass("x", kind="rewrite")


def test_broken_plugin_is_logged_not_fatal(monkeypatch, caplog):
    def load():
        raise ImportError("no module named broken")

    fake = SimpleNamespace(name="broken", value="broken:x", load=load)
    monkeypatch.setattr(registry, "entry_points", lambda group: [fake])
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    assert "count" in ml.passes.all_passes()
    assert "could not load pass plug-in broken" in caplog.text
