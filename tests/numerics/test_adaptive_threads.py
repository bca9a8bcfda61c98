"""The thread count of a native kernel call: no more than the cores the threads running elsewhere leave, then chosen
by timing: the first PROBE_CALLS calls of a kind run on the most threads and then on one, later calls on the count
with the lower mean, re-probed every PROBE_EVERY calls; results never depend on it."""

import time

import pytest
import torch

from mase_lite.infra import cores
from mase_lite.kernels.mxint8 import cpu_kernel, quantize
from mase_lite.numerics.native import threads


@pytest.fixture
def adaptive(monkeypatch):
    """The timing choice on a machine of many cores with nothing running elsewhere, whatever runs beside the test."""
    monkeypatch.setattr(threads, "ADAPTIVE", True)
    monkeypatch.setattr(cores, "running_elsewhere", lambda: 0)
    monkeypatch.setattr(cores, "usable_cores", lambda: 64)
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


def test_no_more_threads_than_the_cores_the_threads_running_elsewhere_leave(adaptive, monkeypatch):
    now, elsewhere, looks = [0.0], [2], []

    def look():
        looks.append(now[0])
        return elsewhere[0]

    monkeypatch.setattr(threads.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(cores, "running_elsewhere", look)
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    assert threads.begin(("doc",), 2) == (1, None)  # two cores, two threads busy elsewhere: one thread, not timed
    now[0] = threads.LOOK_EVERY / 2
    assert threads.begin(("doc",), 2) == (1, None) and looks == [0.0]  # no look before LOOK_EVERY
    elsewhere[0] = 0  # the load is gone: the median of the looks follows within a few
    counts = []
    for step in (1, 2, 3):
        now[0] = step * threads.LOOK_EVERY
        count, probe = threads.begin(("doc",), 2)
        threads.end(probe)
        counts.append((count, probe is not None))
    assert counts == [(1, False), (2, True), (2, True)]  # looks 2,0 (median 1); 2,0,0; 2,0,0,0: probing two again
    assert looks == [0.0] + [step * threads.LOOK_EVERY for step in (1, 2, 3)]
    assert threads.begin(("wide",), 4)[0] == 2  # torch's four threads, the two cores: a probe on two


def test_a_slow_look_waits_a_hundred_times_as_long_for_the_next(adaptive, monkeypatch):
    now, looks = [0.0], []

    def look():  # reading many threads' files: 20 ms
        looks.append(now[0])
        now[0] += 0.02
        return 0

    monkeypatch.setattr(threads.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(cores, "running_elsewhere", look)
    threads.begin(("doc",), 2)
    now[0] = 1.9
    threads.begin(("doc",), 2)
    now[0] = 2.0
    threads.begin(("doc",), 2)
    assert looks == [0.0, 2.0]


def test_the_threads_running_elsewhere_are_the_runnable_less_this_processs_own(tmp_path):
    (tmp_path / "loadavg").write_text("1.50 1.20 0.90 5/312 4242\n")
    tasks = tmp_path / "self" / "task"
    for tid, name, state in [(10, "python", "R"), (11, "a (thread) R", "S"), (12, "omp", "R")]:
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "stat").write_text(f"{tid} ({name}) {state} 1 10 10 0 -1\n")
    assert cores.running_elsewhere(str(tmp_path)) == 3  # 5 runnable, 2 of them this process's
    (tmp_path / "loadavg").write_text("garbled\n")
    assert cores.running_elsewhere(str(tmp_path)) is None
    assert cores.running_elsewhere(str(tmp_path / "absent")) is None
    assert 0 <= cores.running_elsewhere() < 100_000  # this machine's


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


def test_calls_of_other_formats_are_timed_apart(adaptive, monkeypatch):
    """Layers of one size in Q4_K and Q6_K, in MXINT8 and Q8_0, decoding steps of one model's shape with Q4_0 and
    MXINT8 weights: each a kind of call of its own, so that the timings of one never choose the threads of the other
    (a step of 8-bit weights gains less from a second thread than one of 4-bit weights)."""
    import transformers

    from mase_lite.kernels import kquants, mxint8, packed4, q8_0
    from mase_lite.kernels.int8_activations import cpu_kernel as int8_kernel
    from mase_lite.runtime.decoder import Decoder

    monkeypatch.setattr(int8_kernel, "PARALLEL_FROM_MACS", 0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    decoders = []
    for pack in (lambda m: packed4.pack_linears(m, "q4_0", activations="int8"),
                 lambda m: mxint8.pack_linears(m, activations="int8")):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        pack(model)
        decoders.append(Decoder.of(model, 8))
    layers = [kquants.KQuantLinear.from_linear(torch.nn.Linear(256, 4), {"name": kind}, activations="int8")
              for kind in ("q4_k", "q6_k")]
    for pack in (lambda m: mxint8.pack_linears(m, activations="int8"),
                 lambda m: q8_0.pack_linears(m, activations="int8")):
        coded = torch.nn.Sequential(torch.nn.Linear(256, 4))
        pack(coded)
        layers.append(coded[0])
    count = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            outs = [layer(torch.randn(1, 256)) for layer in layers]
            outs += [decoder(torch.tensor([[3]])) for decoder in decoders]
    finally:
        torch.set_num_threads(count)
    if any(decoder.step is None for decoder in decoders) or outs[0] is None:
        pytest.skip("no native kernel here")
    kinds = [key[0] for key in threads._kinds]
    assert kinds.count("int8_kquants") == 2 and kinds.count("int8_decoder") == 2 and kinds.count("int8_codes") == 2
