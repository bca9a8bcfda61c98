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


def test_the_factorisations_keep_the_steady_count_on_a_busy_machine(monkeypatch):
    """GPTQ's and AWQ's Cholesky factorisations (whose bits follow LAPACK's thread count) run on the steady count,
    two usable cores here, while their blocks run on the one core two busy processes leave: the bits of a quiet run."""
    import mase_lite as ml
    from mase_lite.infra import cores
    from tests.transforms.llms import TokenBatches, tiny_llama

    monkeypatch.setattr(threads.cores, "running_elsewhere", lambda *a, **k: 2)
    monkeypatch.setattr(threads.cores, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "ADAPTIVE", True)
    monkeypatch.setattr(cores, "_ASKED", [None])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    cholesky = torch.linalg.cholesky_ex

    def counted(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return cholesky(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", counted)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    threads.forget()
    try:
        rules = {"by": "type", "rules": {"head": None, "linear": {"weight": {"name": "integer", "width": 4, "frac_width": 2}}}}
        for method in ("gptq", "awq"):
            mg = ml.MaseGraph(tiny_llama(), hf_input_names=["input_ids", "attention_mask"])
            mg, _ = ml.passes.quantize(mg, rules)
            getattr(ml.passes, method)(mg, {"num_batches": 1}, data=TokenBatches(labels=False))
            assert seen and set(seen) == {2}, (method, seen)
            seen.clear()
        monkeypatch.setattr(cores, "_ASKED", [1])  # --threads 1: the count asked for
        mg, _ = ml.passes.quantize(ml.MaseGraph(tiny_llama(), hf_input_names=["input_ids", "attention_mask"]), rules)
        ml.passes.gptq(mg, {"num_batches": 1}, data=TokenBatches(labels=False))
        assert seen and set(seen) == {1}
    finally:
        threads.forget()
        torch.set_num_threads(previous)
