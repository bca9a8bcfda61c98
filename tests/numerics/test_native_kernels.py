"""The native kernels: the same bits as the torch implementations of every format they serve (mxint,
mxfp, block_fp, block_minifloat, block_log, integer, minifloat_ieee, minifloat_denorm, log,
scaled_integer, nvfp4) where
they apply, and a clean fallback where they do not (no compiler, failed build, autograd, tracing,
other dtypes)."""

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mase_lite.numerics import mx, native, quantize
from mase_lite.numerics.native import block_kernel, element_kernel, launch, scaled_kernel

from .test_corpus_outputs import CONFIGS, INPUTS
from tests.conftest import PATIENCE

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
KERNEL_MODULES = (block_kernel, element_kernel, scaled_kernel)


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    """An empty native-library cache, and no library (or compiler) looked up before this test."""
    monkeypatch.setenv("MASE_LITE_CACHE", str(tmp_path))
    native.library.cache_clear()
    native._compiler.cache_clear()
    yield tmp_path
    native.library.cache_clear()
    native._compiler.cache_clear()


def torch_only(monkeypatch):
    for module in KERNEL_MODULES:
        monkeypatch.setattr(module, "applies", lambda x: False)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = (torch.where(t.isnan(), torch.full_like(t, float("nan")), t) for t in (a, b))
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def spy_calls(monkeypatch) -> list:
    """The row count of every native kernel call from now on."""
    calls = []
    for module in KERNEL_MODULES:
        def spy(kernel, x, arguments, run_rows=module.run_rows):
            return run_rows(lambda *a: (calls.append(a[2]), kernel(*a)), x, arguments)

        monkeypatch.setattr(module, "run_rows", spy)
    return calls


@needs_compiler
def test_the_kernels_build_where_a_compiler_exists():
    assert block_kernel._kernel() is not None and element_kernel._kernels() is not None
    assert scaled_kernel._kernels() is not None


@needs_compiler
@pytest.mark.parametrize("fmt", CONFIGS, ids=["-".join(str(v) for v in c.values()) for c in CONFIGS])
def test_native_equals_torch_on_the_corpus(monkeypatch, fmt):
    inputs = {k: x.float() for k, x in INPUTS.items()}
    calls = spy_calls(monkeypatch)
    native_out = {k: quantize(x, fmt) for k, x in inputs.items()}
    assert len(calls) == sum(x.numel() > 0 for x in inputs.values())  # every non-empty input went native
    torch_only(monkeypatch)
    for k, x in inputs.items():
        assert same_bits(native_out[k], quantize(x, fmt)), k


def random_bits(shape, seed):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    scales = torch.ldexp(torch.ones(shape[:-1] + (1,)), torch.randint(-140, 120, shape[:-1] + (1,), generator=g))
    return torch.where(torch.rand(shape, generator=g) < 0.5, x, torch.randn(shape, generator=g) * scales)


@needs_compiler
@pytest.mark.parametrize("block_size", [1, 7, 32, 33])
@pytest.mark.parametrize("fmt", [
    *({"name": "mxint", "element_width": w, "scale_rule": r} for w in (4, 8) for r in ("floor", "ceil", "even", "rceil")),
    *({"name": "mxfp", "element_format": e, "scale_rule": r} for e in ("e5m2", "e2m1") for r in ("floor", "even", "rceil")),
    {"name": "block_fp", "width": 8}, {"name": "block_fp", "width": 32, "exponent_width": 3},
    {"name": "block_fp", "width": 5, "exponent_width": 2, "exponent_bias": -1},
    {"name": "block_minifloat", "width": 8, "exponent_width": 4},
    {"name": "block_minifloat", "width": 32, "exponent_width": 7, "exponent_bias_width": 3},
    {"name": "block_log", "width": 4}, {"name": "block_log", "width": 8, "exponent_bias_width": 2},
    {"name": "integer", "width": 8, "frac_width": 4}, {"name": "integer", "width": 32, "frac_width": 30},
    {"name": "integer", "width": 5, "frac_width": 5, "signed": False, "floor": True},
    {"name": "minifloat_ieee", "width": 8, "exponent_width": 4}, {"name": "minifloat_ieee", "width": 16, "exponent_width": 8},
    {"name": "minifloat_ieee", "width": 32, "exponent_width": 8, "exponent_bias": 100},
    {"name": "minifloat_denorm", "width": 8, "exponent_width": 5}, {"name": "log", "width": 9}, {"name": "log", "width": 3},
], ids=lambda f: "-".join(str(v) for v in f.values()))
def test_native_equals_torch_on_random_bit_patterns_and_scales(monkeypatch, block_size, fmt):
    if fmt["name"] in ("integer", "minifloat_ieee", "minifloat_denorm", "log"):
        shape = (block_size, 70)  # no blocks: vary the row count instead
    else:
        fmt, shape = {**fmt, "block_size": block_size}, (9, 70)
    x = random_bits(shape, seed=block_size)
    calls = spy_calls(monkeypatch)
    y = quantize(x, fmt)
    assert calls == [shape[0]]
    torch_only(monkeypatch)
    assert same_bits(y, quantize(x, fmt))


SCALED_FORMATS = [
    *({"name": "scaled_integer", "width": w, "symmetric": s, "granularity": g, "scale_dtype": d, "clip": c}
      for s in (True, False) for g in ("tensor", "channel", "group") for d in ("float32", "float16", "bfloat16", "pow2")
      for w, c in ((4, 1.0), (8, 0.9))),
    *({"name": "scaled_integer", "width": w, "granularity": "tensor", "scale": s, "scale_dtype": d}
      for d in ("float32", "float16", "bfloat16", "pow2") for w, s in ((3, 0.37), (16, 1e-30))),
    {"name": "scaled_integer", "width": 2, "symmetric": False, "granularity": "group", "group_size": 1},
    *({"name": "scaled_integer", "width": w, "granularity": g, "full_range": True, "scale_dtype": d, "clip": c}
      for g in ("tensor", "channel", "group") for d in ("float32", "float16", "pow2") for w, c in ((4, 1.0), (8, 0.9))),
    {"name": "scaled_integer", "width": 3, "granularity": "tensor", "full_range": True, "scale": 0.37},
    {"name": "nvfp4"}, {"name": "nvfp4", "tensor_amax": 3.0}, {"name": "nvfp4", "tensor_amax": 1e-40},
    {"name": "nvfp4", "tensor_amax": 1e38}, {"name": "nvfp4", "tensor_amax": 0.0},
]
EXTREMES = torch.tensor([[3e38, -3.4e38, 1.0, 5e-45], [float("inf"), 0.0, -0.0, -float("inf")],
                         [float("nan"), 2.5, -2.5, 0.0], [0.0, 0.0, -0.0, 0.0]])


def native_and_torch(monkeypatch, x, fmt):
    """The native result (asserting one kernel call over all of ``x``'s rows) and the torch one."""
    with monkeypatch.context() as patch:
        calls = spy_calls(patch)
        y = quantize(x, fmt)
        assert calls == ([x.numel() // (x.shape[-1] if x.dim() else 1)] if x.numel() else [])
        torch_only(patch)
        return y, quantize(x, fmt)


@needs_compiler
@pytest.mark.parametrize("fmt", SCALED_FORMATS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_scaled_formats_native_equal_torch_on_the_corpus_and_extremes(monkeypatch, fmt):
    inputs = {**{k: x.float() for k, x in INPUTS.items()}, "extremes": EXTREMES}
    for k, x in inputs.items():
        for shape in (x.shape, (-1,)):  # a per-tensor scale over rows, and one row
            y, expected = native_and_torch(monkeypatch, x.reshape(shape), fmt)
            assert same_bits(y, expected), (k, shape)


@needs_compiler
@pytest.mark.parametrize("group_size", [1, 7, 16, 70, 128])
@pytest.mark.parametrize("fmt", [f for f in SCALED_FORMATS if f.get("granularity") == "group"] + [{"name": "nvfp4"}],
                         ids=lambda f: "-".join(str(v) for v in f.values()))
def test_scaled_formats_native_equal_torch_on_random_bit_patterns_and_scales(monkeypatch, group_size, fmt):
    fmt = {**fmt, "group_size": group_size} if fmt["name"] == "scaled_integer" else fmt
    for seed, shape in enumerate([(9, 70), (group_size, 33), (3, 2, 129)]):
        x = random_bits(shape, seed=seed + group_size)
        y, expected = native_and_torch(monkeypatch, x, fmt)
        assert same_bits(y, expected), shape


@needs_compiler
def test_scaled_formats_by_hand_on_the_native_path(monkeypatch):
    calls = spy_calls(monkeypatch)
    x = torch.tensor([[3.5, -7.0, 1.2, 0.0, float("nan")], [0.0, -0.0, 0.0, 0.0, float("inf")]])
    # row 0: scale 7 / 7 = 1, 3.5 ties to 4, NaN stays; row 1: Inf ignored by the amax, a zero scale gives zeros
    y = quantize(x, {"name": "scaled_integer", "width": 4})
    assert y[0, :4].tolist() == [4.0, -7.0, 1.0, 0.0] and y[0, 4].isnan() and y[1].tolist() == [0.0] * 5
    # asymmetric, 2 bits over [-1, 2]: scale 1, zero point 1, codes 0..3 (0.5 ties to code 1, 1.5 to 3)
    assert quantize(torch.tensor([[-1.0, 2.0, 0.5, 1.5]]), {"name": "scaled_integer", "width": 2, "symmetric": False}
                    ).tolist() == [[-1.0, 2.0, 0.0, 2.0]]
    # nvfp4: tensor scale 2688 / (448 * 6) = 1, block scale 448; elements 6, 1.5625 -> 1.5, -0.446 -> -0.5
    y = quantize(torch.tensor([[2688.0, 700.0, -200.0]]), {"name": "nvfp4"})
    assert y.tolist() == [[2688.0, 672.0, -224.0]]
    # the full grid, 4 bits: scale 7.5 / 7.5 = 1, codes -8..7: -7.5 ties to -8, 7.5 to 8 saturates at 7, 6.5 to 6
    assert quantize(torch.tensor([[-7.5, 7.5, 6.5, -3.0]]), {"name": "scaled_integer", "width": 4, "full_range": True,
                                                                "granularity": "channel"}).tolist() == [[-8.0, 7.0, 6.0, -3.0]]
    assert len(calls) == 4


@needs_compiler
@pytest.mark.parametrize("fmt", [
    {"name": "mxfp", "element_format": "e4m3"}, {"name": "nvfp4"},
    {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group", "group_size": 7},
    {"name": "scaled_integer", "width": 8, "granularity": "tensor", "scale_dtype": "bfloat16"},
], ids=lambda f: f["name"])
def test_rows_split_over_threads_give_the_same_bits(monkeypatch, fmt):
    x = random_bits((301, 97), seed=3)
    single = quantize(x, fmt)
    monkeypatch.setattr(launch, "PARALLEL_FROM_ELEMENTS", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        calls = spy_calls(monkeypatch)
        split = quantize(x, fmt)
    finally:
        torch.set_num_threads(threads)
    assert sorted(calls) == [100, 100, 101]
    assert same_bits(single, split)


@needs_compiler
def test_native_reads_non_contiguous_inputs_and_edge_shapes():
    x = torch.randn(40, 65).t()
    assert same_bits(mx.mxint(x), mx.mxint(x.contiguous()))
    assert str(mx.mxint(torch.tensor([-0.01, 8.0]))[0].item()) == "0.0"  # code 0 carries no sign
    assert str(mx.mxfp(torch.tensor([-1e-30, 1.0]), element_format="e2m1")[0].item()) == "-0.0"
    assert mx.mxint(torch.zeros(0, 3)).shape == (0, 3)
    assert mx.mxint(torch.tensor([[1.0, float("inf")], [2.0, 3.0]]), block_size=2).isnan().tolist() == [
        [True, True], [False, False]]


def test_the_kernel_stands_aside_where_it_cannot_apply():
    x = torch.randn(4, 32)
    mxint8 = block_kernel.BlockGrid(integer_grid=True, rule="floor", mbits=6, emax=0, max_value=127 / 64)
    assert block_kernel.fake_quantize(x.double(), mxint8, 32) is None
    assert scaled_kernel.nvfp4(x.half(), 1.0) is None
    assert not launch.applies(x.clone().requires_grad_())
    assert not launch.applies(torch.nn.Parameter(x))

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Recording():
        assert not launch.applies(x)
        assert torch.equal(mx.mxint(x), quantize(x, "mxint", element_width=8))


def test_without_a_compiler_the_torch_implementation_runs(monkeypatch, fresh_cache, caplog):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="mase_lite.numerics.native"):
        assert native.library("blocks") is None and native.library("elements") is None
    compiler = os.environ.get("CC", "cc")
    assert [r.getMessage() for r in caplog.records] == [
        f"no C compiler ({compiler}) found: quantizers and packed MXINT8 layers run as slower torch operations; install one or set CC"]
    assert not list(fresh_cache.rglob("*.so"))


def test_a_failed_build_is_logged_and_leaves_nothing(monkeypatch, fresh_cache, caplog):
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="mase_lite.numerics.native"):
        assert native.library("blocks") is None
    assert "building the native blocks kernel failed" in caplog.text and "exited 1" in caplog.text
    assert not [p for p in fresh_cache.rglob("*") if p.is_file()]


@needs_compiler
def test_the_library_is_built_once_into_the_cache(fresh_cache):
    assert native.library("blocks") is not None
    built, record = sorted((fresh_cache / "native").iterdir())  # the library, and the digest recorded beside it
    assert built.name.startswith("blocks-") and built.suffix == ".so" and record.name == built.name + ".sha256"
    stamps = [p.stat().st_mtime_ns for p in (built, record)]
    native.library.cache_clear()
    assert native.library("blocks") is not None
    assert [p.stat().st_mtime_ns for p in sorted((fresh_cache / "native").iterdir())] == stamps


def test_native_kernels_can_be_switched_off(monkeypatch, fresh_cache):
    monkeypatch.setenv("MASE_LITE_NATIVE", "0")
    assert native.library("blocks") is None


@needs_compiler
def test_a_damaged_library_in_the_cache_is_built_again(fresh_cache):
    assert native.library("blocks") is not None
    (built,) = (p for p in (fresh_cache / "native").iterdir() if p.suffix == ".so")
    damaged = built.with_name("damaged")
    damaged.write_bytes(b"not a shared library")
    os.replace(damaged, built)  # a new file: writing into the one this process has mapped would crash it
    # a new process: this one holds the library open under that path already
    check = "from mase_lite.numerics.native import library; print(library('blocks') is not None)"
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=PATIENCE)
    assert run.stdout.strip() == "True", run.stderr
    assert built.read_bytes() != b"not a shared library"


@needs_compiler
def test_a_forked_child_gets_its_own_worker_threads(monkeypatch):
    monkeypatch.setattr(launch, "PARALLEL_FROM_ELEMENTS", 1)
    x = random_bits((64, 96), seed=5)
    fmt = {"name": "mxint", "element_width": 8}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = quantize(x, fmt)
        parents = launch._pool(2)  # its threads are not copied by a fork
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a pool of its own, and the same bits from it
            try:
                fresh = launch._pool(2) is not parents
                os.write(write, b"1" if fresh and same_bits(quantize(x, fmt), expected) else b"0")
            finally:
                os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.waitpid(pid, 0)
    finally:
        torch.set_num_threads(threads)
    assert answer == b"1"
