"""The accepted formats are the registry's when a config is validated: a format a plug-in registers after the
quantize pass was imported quantizes, shows in the JSON Schema, and a typo still names the known formats."""

import json

import pytest
import torch
from pydantic import Field

import mase_lite as ml
from mase_lite import UserError
from mase_lite.numerics import FormatParams, register_format, registry
from mase_lite.passes.registry import get_pass
from mase_lite.pipeline.spec import pipeline_schema


class HalfStepParams(FormatParams):
    step: float = Field(0.5, gt=0, description="the grid's step")


@pytest.fixture
def forgotten():
    """The test's format name, dropped from the registry afterwards (other tests list every registered format)."""
    name = "test_half_step"
    yield name
    registry._FORMATS.pop(name, None)


def test_a_format_registered_after_the_pass_is_imported_quantizes(forgotten):
    get_pass("quantize")  # the pass, its params model and the format union exist before the plug-in registers
    name = forgotten

    @register_format(name, params=HalfStepParams, bits=lambda p, shape: 8.0, bounds=lambda x, p: (-1e9, 1e9))
    def half_step(x, p):
        return torch.round(x / p.step) * p.step

    model, info = ml.passes.quantize(torch.nn.Sequential(torch.nn.Linear(4, 2)),
                                     {"by": "type", "rules": {"linear": {"weight": {"name": name, "step": 0.25}}}})
    assert info["count"] == 1 and model[0].quant_formats()["weight"] == {"name": name, "step": 0.25}
    weight = model[0].weight_quantizer(model[0].weight)
    assert torch.equal(weight, torch.round(model[0].weight / 0.25) * 0.25)
    assert f"{name}_format" in json.dumps(pipeline_schema())
    with pytest.raises(UserError, match=rf"unknown format 'test_half_stepp'; known formats: .*{name}"):
        ml.passes.quantize(torch.nn.Sequential(torch.nn.Linear(4, 2)),
                           {"by": "type", "rules": {"linear": {"weight": {"name": "test_half_stepp"}}}})
    with pytest.raises(UserError, match=r"rules.linear.weight.stepp: unknown key"):
        ml.passes.quantize(torch.nn.Sequential(torch.nn.Linear(4, 2)),
                           {"by": "type", "rules": {"linear": {"weight": {"name": name, "stepp": 1.0}}}})
