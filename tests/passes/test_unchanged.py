"""A transform that changed nothing says so (PassResult(changed=False)): the manager recompiles nothing,
invalidates nothing and records nothing, so a bypassed quantize keeps the calibration a later quantize needs."""

import torch

import mase_lite as ml


class Batches:
    def loader(self, split, batch_size, shuffle=False):
        return ({"input": torch.randn(batch_size, 16)} for _ in range(8))


AUTO = {"by": "type", "rules": {"linear": {"data_in": {"name": "scaled_integer", "width": 8, "granularity": "tensor",
                                                       "scale": "auto"}}}}


def test_a_bypassed_quantize_keeps_calibration_and_records_nothing():
    torch.manual_seed(0)
    mg = ml.MaseGraph(torch.nn.Sequential(torch.nn.Linear(16, 8)), example_inputs={"input": torch.randn(2, 16)})
    mg, _ = ml.passes.calibrate(mg, {"num_batches": 2, "batch_size": 4}, data=Batches())
    assert "calibration" in mg.facts
    code = mg.model.code
    mg, info = ml.passes.quantize(mg, {**AUTO, "bypass": True})
    assert info["bypassed"] and "calibration" in mg.facts and mg.history == [] and mg.model.code == code
    mg, info = ml.passes.quantize(mg, AUTO)
    assert info["count"] == 1 and "calibration" not in mg.facts and [h["pass"] for h in mg.history] == ["quantize"]
