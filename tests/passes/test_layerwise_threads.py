"""Layer-by-layer passes (GPTQ, AWQ, SparseGPT, Wanda) run each block on the cores other processes leave: on a busy
machine a thread waiting at a join for a preempted one spins, so two threads there cost more CPU than one."""

import torch
from torch import nn

from mase_lite.numerics.native import threads
from mase_lite.passes.layerwise import each_block


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def counts_seen(monkeypatch, others: int) -> list[int]:
    """torch's thread count inside each handled block (then the head), with ``others`` threads running elsewhere."""
    monkeypatch.setattr(threads.cores, "running_elsewhere", lambda *a, **k: others)
    monkeypatch.setattr(threads.cores, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "ADAPTIVE", True)  # the suite turns it off elsewhere
    threads.forget()
    model = Blocks()
    layers = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    seen = []
    each_block(model, layers, [{"x": torch.randn(2, 8)}], lambda inside, run: seen.append(torch.get_num_threads()))
    threads.forget()
    return seen


def test_each_block_takes_the_cores_left(monkeypatch):
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert counts_seen(monkeypatch, others=2) == [1, 1, 1, 1]  # two busy processes on two cores: one thread
        assert torch.get_num_threads() == 2  # restored after
        assert counts_seen(monkeypatch, others=0) == [2, 2, 2, 2]  # a quiet machine: all of torch's threads
    finally:
        torch.set_num_threads(previous)
