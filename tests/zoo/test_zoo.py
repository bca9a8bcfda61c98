"""Every zoo model, captured as a user would, against the model itself.

The reference is the model's forward with its key/value caches off (``caches_off``): that is what
the graph captures, and a cache's concatenated keys change the memory layout a matmul sees, which
rounds differently on some CPUs. Per model: eval bit-exact at two shapes (the second padded) and deterministic; train mode
with the same seed gives the model's loss and gradients (or the graph refuses train mode,
naming the cause); one ``call_module`` node per Linear call; save/load at a third shape; the codegen'd
package with the model's state-dict keys and the graph's outputs.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys

import pytest
import torch
import torch.nn as nn

from mase_lite import MaseGraph
from mase_lite.ir.capture import CaptureError, caches_off, first_difference
from mase_lite.ir.inputs import hf_example_inputs
from mase_lite.passes import codegen
from tests.zoo.models import ZOO, Entry

SHAPES = [(2, 7, False), (5, 12, True)]  # (batch, seq, padded)
LOAD_SHAPE = (4, 9, True)


def batch(entry: Entry, model: nn.Module, size: int, seq: int, pad: bool) -> dict[str, torch.Tensor]:
    if entry.make is not None:
        return entry.make(size, seq)
    names = [n for n in entry.inputs]
    return hf_example_inputs(model, names, seed=size * 100 + seq, batch=size, seq=seq, pad=pad)


def eager(model: nn.Module, inputs: dict):
    """The model's own forward, as captured: without key/value caches."""
    with caches_off(model):
        return model(**inputs)


def loss_of(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output.float().square().mean()
    return output.loss


def linear_calls(model: nn.Module, inputs: dict) -> int:
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules() if type(m) is nn.Linear]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
    return len(calls)


@pytest.fixture(scope="module", params=ZOO, ids=[e.name for e in ZOO])
def captured(request):
    entry: Entry = request.param
    model = entry.build()
    if entry.make is not None:
        mg = MaseGraph(model, example_inputs=entry.make(3, 13))
    else:
        mg = MaseGraph(model, hf_input_names=entry.inputs)
    return entry, model, mg


def test_eval_bit_exact_and_deterministic(captured):
    entry, model, mg = captured
    model.eval()
    mg.model.eval()
    for size, seq, pad in SHAPES:
        inputs = batch(entry, model, size, seq, pad)
        with torch.no_grad():
            expected, got, again = eager(model, inputs), mg.model(**inputs), mg.model(**inputs)
        assert type(got) is type(expected)
        assert first_difference(expected, got) is None, (size, seq)
        assert first_difference(got, again) is None


def test_train_mode_loss_and_gradients(captured):
    entry, model, mg = captured
    inputs = batch(entry, model, 4, 10, True)
    limits = mg.model.train_limits
    model.train()
    mg.model.train()
    try:
        if limits:
            with pytest.raises(CaptureError, match="follows the model in eval mode only") as err:
                mg.model(**inputs)
            assert f"train mode of {type(model).__name__}: " in str(err.value) and "capture again" in str(err.value)
            return
        state = {k: v.clone() for k, v in model.state_dict().items()}
        torch.manual_seed(1)
        expected = loss_of(eager(model, inputs))
        expected.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        model.load_state_dict(state)
        torch.manual_seed(1)
        got = loss_of(mg.model(**inputs))
        got.backward()
        assert torch.equal(expected, got)
        assert grads and set(grads) == {n for n, p in model.named_parameters() if p.grad is not None}
        for name, grad in grads.items():  # tied weights may sum their two gradients in another order
            assert torch.allclose(grad, dict(model.named_parameters())[name].grad, rtol=1e-5, atol=1e-7), name
    finally:
        model.zero_grad()
        model.eval()
        mg.model.eval()


def test_one_node_per_linear_call(captured):
    entry, model, mg = captured
    inputs = batch(entry, model, 2, 7, False)
    nodes = [n for n in mg.nodes if n.op == "call_module" and type(mg.modules[n.target]) is nn.Linear]
    assert len(nodes) == linear_calls(model, inputs)


def test_save_load_at_a_third_shape(captured, tmp_path):
    entry, model, mg = captured
    mg.save(tmp_path / "g")
    loaded = MaseGraph.load(tmp_path / "g", model=None if entry.make is None else entry.build())
    assert loaded.dynamic_dims == mg.dynamic_dims
    inputs = batch(entry, model, *LOAD_SHAPE)
    model.eval()
    with torch.no_grad():
        assert first_difference(eager(model, inputs), loaded.model(**inputs)) is None


def test_codegen_package(captured, tmp_path):
    """The emitted package: the model's state-dict keys, readable code, outputs bit-exact with the graph's."""
    entry, model, mg = captured
    name = f"zoo_{entry.name.lower()}"
    info = codegen(mg, {"path": str(tmp_path / name)})[1]
    source = (tmp_path / name / "model.py").read_text()
    ast.parse(source)
    assert not re.search(r";\s*\w+(, \w+)* = None$", source, flags=re.M) and "torch.ops.aten" not in source
    assert "9223372036854775807" not in source
    sys.path.insert(0, str(tmp_path))
    try:
        emitted = importlib.import_module(name).load("cpu")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        sys.modules.pop(f"{name}.model", None)
    assert list(emitted.state_dict()) == list(model.state_dict()) and info["class_name"] == type(model).__name__
    mg.model.eval()
    for size, seq, pad in SHAPES:
        inputs = batch(entry, model, size, seq, pad)
        with torch.no_grad():
            assert first_difference(mg.model(**inputs), emitted(**inputs)) is None, (size, seq)
