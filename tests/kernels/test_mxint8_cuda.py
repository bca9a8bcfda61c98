"""CUDA kernels: an nvcc compile check wherever nvcc exists, bit-exactness wherever a GPU exists.

On a machine without CUDA these tests skip with the reason; the kernels were written and
PTX-checked on a CPU-only machine (see benchmarks/RESULTS.md, section mxint8).
"""

import math
import subprocess

import pytest
import torch
import torch.nn.functional as F

from mase_lite.kernels.mxint8 import GEMV_MAX_ROWS, dequantize, dequantize_reference, mxint8_linear, quantize
from mase_lite.kernels.mxint8 import cuda_build
from tests.kernels.mxint8_cases import all_code_pairs, assert_bitwise_equal

NVCC = cuda_build.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible)")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@needs_nvcc
def test_kernel_source_compiles_for_hopper(tmp_path):
    ptx, obj = tmp_path / "mxint8.ptx", tmp_path / "mxint8.o"
    for flag, output in (("-ptx", ptx), ("-c", obj)):
        result = subprocess.run([NVCC, flag, "-arch=sm_90", str(cuda_build.KERNEL_SOURCE), "-o", str(output)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    entries = [line for line in ptx.read_text().splitlines() if line.startswith(".entry")]
    for kernel in ("dequantize_vectorised", "dequantize_elementwise", "linear_gemv"):
        assert sum(kernel in line for line in entries) >= 3, kernel  # float32, float16, bfloat16
    symbols = obj.read_bytes()
    for launcher in (b"mxint8_dequantize_launch", b"mxint8_linear_gemv_launch", b"mxint8_error_string"):
        assert launcher in symbols


@pytest.fixture(scope="module")
def extension():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (none visible)")
    if NVCC is None:
        pytest.skip("nvcc not found: the kernels cannot be built here")
    cuda_build.cuda_extension.cache_clear()
    module = cuda_build.build_cuda_extension()  # a broken build fails here instead of falling back
    assert cuda_build.cuda_extension() is not None
    return module


def edge_weights() -> torch.Tensor:
    w = torch.randn(8, 96) * torch.logspace(-40, 38, 8).unsqueeze(1)
    w[0, :32] = 0
    w[1, 5] = math.nan
    w[2, 40] = -math.inf
    w[3, :4] = torch.tensor([2.0 ** -130, 2.0 ** -149, 15.999999, -1.999])
    return w


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["all_codes", "edges", "random", "odd_rows", "block_16", "three_d"])
def test_dequantize_kernel_is_bit_exact(extension, dtype, case):
    torch.manual_seed(0)
    if case == "all_codes":
        codes, scales, block = *all_code_pairs(), 32
    else:
        w, block = {"edges": (edge_weights(), 32), "random": (torch.randn(64, 4096), 32),
                    "odd_rows": (torch.randn(7, 33), 32), "block_16": (torch.randn(5, 48), 16),
                    "three_d": (torch.randn(2, 3, 64), 32)}[case]
        codes, scales = quantize(w, block_size=block)
    expected = dequantize_reference(codes, scales, block, dtype)
    actual = dequantize(codes.cuda(), scales.cuda(), block, dtype)
    assert actual.device.type == "cuda" and actual.dtype == dtype
    assert_bitwise_equal(actual.cpu(), expected)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 8, GEMV_MAX_ROWS])
def test_gemv_kernel_exact_on_integer_data(extension, dtype, rows):
    # weights and inputs are small integers: every float32 sum is exact, whatever the order
    torch.manual_seed(0)
    codes = torch.randint(-127, 128, (256, 2048), dtype=torch.int8)
    scales = torch.full((256, 64), 127 + 6, dtype=torch.uint8)  # X = 64: value = code
    x = torch.randint(-4, 5, (rows, 2048)).to(dtype)
    bias = torch.randint(-8, 9, (256,)).to(dtype)
    expected = (x.double() @ codes.double().T + bias.double()).to(dtype)
    actual = mxint8_linear(x.cuda(), codes.cuda(), scales.cuda(), bias.cuda())
    assert torch.equal(actual.cpu(), expected)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_batch_is_bit_exact_to_linear_on_reference_weight(extension, dtype):
    torch.manual_seed(0)
    codes, scales = quantize(torch.randn(384, 1024))
    x = torch.randn(300, 1024).to(dtype).cuda()
    bias = torch.randn(384).to(dtype).cuda()
    expected = F.linear(x, dequantize_reference(codes, scales, dtype=dtype).cuda(), bias)
    assert torch.equal(mxint8_linear(x, codes.cuda(), scales.cuda(), bias), expected)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (5, 4096), (16, 1024), (3, 5, 1024), (300, 1024), (4, 1000)])
def test_linear_within_dot_product_error_bound(extension, dtype, shape):
    torch.manual_seed(0)
    codes, scales = quantize(torch.randn(512, shape[-1]))
    x = torch.randn(shape).to(dtype)
    bias = torch.randn(512).to(dtype)
    weight = dequantize_reference(codes, scales, dtype=torch.float64)
    expected = F.linear(x.double(), weight, bias.double())
    magnitude = F.linear(x.double().abs(), weight.abs(), bias.double().abs())
    unit = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[dtype]
    bound = (shape[-1] * 2.0 ** -24 + 2 * unit) * magnitude
    actual = mxint8_linear(x.cuda(), codes.cuda(), scales.cuda(), bias.cuda()).cpu().double()
    assert actual.shape == expected.shape
    assert ((actual - expected).abs() <= bound).all()


@needs_gpu
def test_linear_nan_scale_poisons_its_output_only(extension):
    codes, scales = quantize(torch.randn(4, 128))
    scales[2, 1] = 255
    out = mxint8_linear(torch.randn(2, 128).cuda(), codes.cuda(), scales.cuda()).cpu()
    assert out[:, 2].isnan().all() and not out[:, [0, 1, 3]].isnan().any()
