"""The thread count of a native kernel call is chosen by timing: the first PROBE_CALLS calls of a kind run on the
most threads and then on one, later calls on the count with the lower mean, re-probed every PROBE_EVERY
calls; results never depend on it."""

import time

import pytest
import torch

from mase_lite.kernels.mxint8 import cpu_kernel, quantize
from mase_lite.numerics.native import threads


@pytest.fixture
def adaptive(monkeypatch):
    monkeypatch.setattr(threads, "ADAPTIVE", True)
    threads.forget()
    yield
    threads.forget()


def test_the_faster_count_wins_and_is_probed_again(adaptive, monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(threads.time, "perf_counter", lambda: next(clock) * 1.0)
    seen = []

    def call(slow_threads):
        count, probe = threads.begin(("doc",), 4)
        if probe is not None:  # a timed call: the slow count takes 3 ticks, the fast one 1
            for _ in range(2 if count == slow_threads else 0):
                time.perf_counter()
        threads.end(probe)
        seen.append(count)

    probe = threads.PROBE_CALLS
    for _ in range(threads.PROBE_EVERY + probe + 2):
        call(slow_threads=4)  # the machine is busy: four threads are slower than one
    assert seen[:probe] == [4] * (probe // 2) + [1] * (probe // 2) and set(seen[probe:threads.PROBE_EVERY]) == {1}
    assert seen[threads.PROBE_EVERY:threads.PROBE_EVERY + probe] == [4] * (probe // 2) + [1] * (probe // 2)  # probed again
    for _ in range(threads.PROBE_EVERY):
        call(slow_threads=1)  # the load is gone: now four are faster
    assert seen[-1] == 4


def test_one_thread_most_means_one(adaptive):
    assert threads.begin(("doc",), 1) == (1, None)


def test_the_kernel_gives_the_same_bits_whatever_count_it_chose(adaptive, monkeypatch):
    monkeypatch.setattr(cpu_kernel, "PARALLEL_FROM_MACS", 0)
    codes, scales = quantize(torch.randn(67, 160))
    x = torch.randn(3, 160)
    count = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outs = [cpu_kernel.linear(x, codes, scales, None, 32) for _ in range(threads.PROBE_CALLS + 2)]
    finally:
        torch.set_num_threads(count)
    if outs[0] is None:
        pytest.skip("no native kernel here")
    assert all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.parametrize("kernel", ["mxint8", "packed4"])
def test_the_panel_path_runs_torchs_gemm_on_the_count_it_chose(adaptive, monkeypatch, kernel):
    """Above the fused kernel's rows, torch's GEMM runs the panels: on one thread when one was chosen (a busy
    machine), on the most otherwise, and the caller's thread count is restored either way."""
    from mase_lite.kernels import packed4
    from mase_lite.kernels.packed4 import cpu_kernel as packed4_kernel

    module = cpu_kernel if kernel == "mxint8" else packed4_kernel
    if kernel == "mxint8":
        codes, scales = quantize(torch.randn(40, 64))
        monkeypatch.setattr(module, "GEMM_FROM_ROWS", 1 << 30)  # not the kernel's own GEMM
        run = lambda x: module.linear(x, codes, scales, None, 32)  # noqa: E731
    else:
        layer = torch.nn.Sequential(torch.nn.Linear(64, 40))
        packed4.pack_linears(layer, "q4_0")
        run = layer[0]
    seen, panels = [], module._panels
    monkeypatch.setattr(module, "_panels", lambda *a: seen.append(torch.get_num_threads()) or panels(*a))
    chosen = iter([1, 2])
    monkeypatch.setattr(threads, "begin", lambda key, most: (next(chosen), None))
    count = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(module.FUSED_MAX_ROWS + 1, 64)
        with torch.no_grad():
            outs = [run(x), run(x)]
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(count)
    if outs[0] is None or not seen:
        pytest.skip("no native kernel here")
    assert seen == [1, 2] and after == 2
    torch.testing.assert_close(outs[0], outs[1])
