"""Calibration: 'auto' format parameters chosen from values as a hand computation says, the calibrate pass's
records equal the statistics computed by hand, and quantize uses them per node and operand."""

import math

import pytest
import torch
import torch.nn as nn

import mase_lite as ml
from mase_lite.numerics import quantize
from mase_lite.numerics.calibration import choose
from mase_lite.passes.registry import PassError


def test_fraction_width_from_the_largest_magnitude_by_hand():
    # the largest code 127 times 2**-frac must reach the magnitude: 127 / 2**5 = 3.97 >= 3.2 > 127 / 2**6
    assert choose("integer", {"width": 8, "frac_width": "auto"}, torch.tensor([3.2, -1.0])) == 5
    assert choose("integer", {"width": 8, "frac_width": "auto"}, torch.tensor([-4.0])) == 4  # 127/32 < 4
    assert choose("integer", {"width": 8, "frac_width": "auto", "signed": False}, torch.tensor([3.2])) == 6  # 255/64
    assert choose("integer", {"width": 6, "frac_width": "auto"}, torch.tensor([1e-9])) == 6  # at most the width
    assert choose("integer", {"width": 6, "frac_width": "auto"}, torch.zeros(4)) == 6


def test_percentile_ignores_the_outliers_and_mse_is_the_least_squared_error():
    values = torch.cat([torch.linspace(-1, 1, 9999), torch.tensor([100.0])])
    fmt = {"width": 8, "frac_width": "auto"}
    assert choose("integer", fmt, values, method="minmax") == 0
    assert choose("integer", fmt, values, method="percentile", percentile=99.9) == 6  # |x| <= 1: 127/64 >= 1
    values = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    errors = {f: float((quantize(values, "integer", width=6, frac_width=f) - values).double().square().mean()) for f in range(7)}
    assert choose("integer", {"width": 6, "frac_width": "auto"}, values, method="mse") == min(errors, key=errors.get)


def test_static_scale_and_tensor_amax():
    values = torch.tensor([0.5, -2.54, 1.0])
    scale = choose("scaled_integer", {"width": 8, "granularity": "tensor", "scale": "auto"}, values)
    assert scale == pytest.approx(2.54 / 127, rel=1e-6)
    assert choose("nvfp4", {"tensor_amax": "auto"}, values) == pytest.approx(2.54, rel=1e-6)
    best = choose("scaled_integer", {"width": 4, "granularity": "tensor", "scale": "auto"}, values, method="mse", grid=10)
    assert any(best == pytest.approx(r / 10 * 2.54 / 7) for r in range(1, 11))


class Data:
    """Three batches whose inputs have known ranges."""

    seed = 0

    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.batches = [{"input": torch.randn(4, 8, generator=g) * (i + 1)} for i in range(3)]

    def loader(self, split, batch_size, shuffle=False, seed=0):
        return self.batches


def graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)}), model


def test_calibrate_records_ranges_samples_and_channel_magnitudes_by_hand():
    mg, model = graph()
    data = Data()
    mg, info = ml.passes.calibrate(mg, {"num_batches": 3, "max_samples": 1000}, data=data)
    inputs = torch.cat([b["input"] for b in data.batches])
    hidden = torch.relu(model[0](inputs))
    record = mg.analyses["calibration"]["0"]["data_in"]
    assert (record["min"], record["max"]) == (inputs.min().item(), inputs.max().item())
    assert torch.equal(record["channel_absmax"], inputs.abs().amax(0))
    assert sorted(record["samples"].tolist()) == sorted(inputs.flatten().tolist())  # 96 values: all kept
    assert mg.analyses["calibration"]["2"]["data_in"]["max"] == pytest.approx(hidden.max().item())
    assert info["nodes"]["0"]["data_out"]["absmax"] == pytest.approx(model[0](inputs).abs().max().item())
    assert mg.nodes[1].meta["mase"]["calibration"]["data_in"]["absmax"] == inputs.abs().max().item()


def test_non_finite_values_count_for_nothing_and_samples_are_drawn_per_batch():
    from mase_lite.passes.analysis.calibrate import TensorRecord

    record = TensorRecord(per_batch=5, generator=torch.Generator().manual_seed(0))
    record.update(torch.tensor([[1.0, -2.0, 0.5], [float("nan"), float("inf"), float("-inf")]]))
    record.update(torch.tensor([[0.25, 3.0, -0.75]]))
    record.update(torch.tensor([[float("nan")] * 3]))  # nothing finite: the range stays
    result = record.result()
    assert (result["min"], result["max"], result["absmax"]) == (-2.0, 3.0, 3.0)
    assert result["channel_absmax"].tolist() == [1.0, 3.0, 0.75]
    assert result["samples"].numel() == 5 + 3 + 3  # a batch larger than its share gives exactly that share
    batch = torch.arange(30.0).reshape(10, 3)
    record.update(batch)
    drawn = record.result()["samples"][-5:]
    assert all(v in batch for v in drawn)


def test_quantize_fills_auto_from_weights_and_calibrated_activations():
    mg, model = graph()
    data = Data()
    mg, _ = ml.passes.calibrate(mg, {"num_batches": 3}, data=data)
    absmax = mg.analyses["calibration"]["0"]["data_in"]["absmax"]
    weight = model[0].weight.detach().clone()
    rule = {"data_in": {"name": "integer", "width": 8, "frac_width": "auto"},
            "weight": {"name": "integer", "width": 8, "frac_width": "auto"}}
    mg, info = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": rule}})
    formats = {r["node"]: r["formats"] for r in info["replaced"]}
    assert formats["0"]["data_in"]["frac_width"] == math.floor(math.log2(127 / absmax))
    assert formats["0"]["weight"]["frac_width"] == min(8, math.floor(math.log2(127 / weight.abs().max().item())))
    assert "calibration" not in mg.analyses  # the quantized graph's activations are not those calibrated
    x = data.batches[0]["input"]
    layer = mg.modules["0"]
    expected = nn.functional.linear(quantize(x, "integer", width=8, frac_width=formats["0"]["data_in"]["frac_width"]),
                                    quantize(weight, "integer", width=8, frac_width=formats["0"]["weight"]["frac_width"]),
                                    model[0].bias)
    assert torch.equal(layer(x), expected)


def test_auto_activation_without_calibration_names_the_node():
    mg, _ = graph()
    with pytest.raises(PassError, match=r"rules.linear.data_in: 'auto' for node '0' needs the calibrate pass's statistics"):
        ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"data_in": {"name": "integer", "width": 8, "frac_width": "auto"}}}})
    with pytest.raises(PassError, match=r"a static scale is one per tensor"):
        ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"data_in": {"name": "scaled_integer", "scale": "auto"}}}})
