"""The Hessians GPTQ and SparseGPT collect: ``2 XᵀX / n`` per layer over every call, one accumulator for the
layers that saw the same inputs, updated in place where no other layer holds it."""

import torch
import torch.nn as nn

from mase_lite.passes.layerwise import collect


class Shared(nn.Module):
    """q, k, v read one tensor; o reads another; v alone reads a third on every other call; o runs twice."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(6, 3, bias=False) for _ in range(4))
        self.calls = 0

    def forward(self, x, y):
        self.q(x), self.k(x), self.v(x)
        self.o(y)
        self.o(y)  # twice on one tensor: counted twice
        self.calls += 1
        if self.calls % 2 == 0:
            self.v(y)


def reference(*xs):
    x = torch.cat([t.reshape(-1, t.shape[-1]) for t in xs]).double()
    return (2 * x.t() @ x / x.shape[0]).float()


def test_sums_follow_the_definition_and_shared_histories_share_one_tensor():
    torch.manual_seed(0)
    model = Shared()
    batches = [(torch.randn(2, 5, 6), torch.randn(4, 6)) for _ in range(3)]
    layers = {"q": model.q, "k": model.k, "v": model.v, "o": model.o}
    stats = collect(layers, lambda: [model(x, y) for x, y in batches], torch.float32)
    xs, ys = [b[0] for b in batches], [b[1] for b in batches]
    torch.testing.assert_close(stats.sums["q"], reference(*xs), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.sums["o"], reference(*[y for y in ys for _ in range(2)]), rtol=1e-5, atol=1e-6)
    assert stats.counts["o"] == 2 * 3 * 4 and stats.counts["q"] == 3 * 10
    assert stats.sums["q"] is stats.sums["k"]  # the same inputs: one tensor, the same bits
    # v saw y of the second batch too: its own accumulator, q's and k's untouched by it
    assert stats.sums["v"] is not stats.sums["q"] and stats.history["v"] != stats.history["q"]
    torch.testing.assert_close(stats.sums["v"], reference(xs[0], xs[1], ys[1], xs[2]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.sums["k"], reference(*xs), rtol=1e-5, atol=1e-6)


def test_the_diagonal_alone():
    torch.manual_seed(1)
    model = Shared()
    batches = [(torch.randn(3, 6), torch.randn(2, 6)) for _ in range(2)]
    stats = collect({"q": model.q, "o": model.o}, lambda: [model(x, y) for x, y in batches], torch.float64, diagonal=True)
    x = torch.cat([b[0] for b in batches]).double()
    torch.testing.assert_close(stats.sums["q"], 2 * x.square().sum(0) / x.shape[0])
