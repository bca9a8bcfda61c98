"""Capture records functional dropout through a torch-function mode of its own thread: other threads are untouched."""

import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

from mase_lite import MaseGraph

ORIGINAL_DROPOUT = F.dropout
PROBES: list[tuple[bool, int]] = []  # (F.dropout unchanged, elements dropped) per forward, seen from another thread


def probe() -> None:
    out = F.dropout(torch.ones(10_000), 0.5, True)
    PROBES.append((F.dropout is ORIGINAL_DROPOUT, int((out == 0).sum())))


class ProbesAnotherThread(nn.Module):
    """Functional dropout in its forward; each forward also runs dropout in another thread and notes what it saw."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.probing = True

    def forward(self, x):
        if self.probing:  # the probe draws from the global generator: off when graph and model are compared
            thread = threading.Thread(target=probe)
            thread.start()
            thread.join()
        return F.dropout(self.fc(x), 0.25, self.training)


def test_capture_leaves_functional_dropout_of_other_threads_alone():
    torch.manual_seed(0)
    PROBES.clear()
    model = ProbesAnotherThread().eval()
    mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 8)})
    assert len(PROBES) >= 2  # export, then the check of the graph against the model
    assert all(same for same, _ in PROBES)  # F.dropout was never reassigned
    assert all(4_000 < zeros < 6_000 for _, zeros in PROBES)  # the other thread's dropout dropped
    assert F.dropout is ORIGINAL_DROPOUT
    model.probing = False
    dropout = [n for n in mg.nodes if n.op == "call_module" and isinstance(mg.modules[n.target], nn.Dropout)]
    assert [mg.modules[n.target].p for n in dropout] == [0.25]  # recorded in the capturing thread
    x = torch.randn(5, 8)
    model.train(), mg.model.train()
    torch.manual_seed(3)
    expected = model(x)
    torch.manual_seed(3)
    assert torch.equal(mg.model(x=x), expected)
    model.eval(), mg.model.eval()
    with torch.no_grad():
        assert torch.equal(mg.model(x=x), model(x))
