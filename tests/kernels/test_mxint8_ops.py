"""Custom ops mase_lite::mxint8_dequantize / mxint8_linear: CPU kernels, fallback, autograd, export, compile."""

import logging

import pytest
import torch
import torch.nn.functional as F

from mase_lite.infra.errors import UserError
from mase_lite.kernels.mxint8 import MXInt8Linear, dequantize, dequantize_reference, mxint8_linear, quantize
from mase_lite.kernels import cpu
from mase_lite.kernels.mxint8 import cuda_build, ops
from tests.kernels.mxint8_cases import assert_within_accumulation_error


@pytest.fixture
def packed():
    torch.manual_seed(0)
    codes, scales = quantize(torch.randn(24, 72))
    return codes, scales, torch.randn(24)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_dequantize_op_is_bit_exact(packed, dtype):
    codes, scales, _ = packed
    out = torch.ops.mase_lite.mxint8_dequantize(codes, scales, 32, dtype)
    assert torch.equal(out, dequantize_reference(codes, scales, dtype=dtype))


@pytest.mark.parametrize("shape", [(72,), (5, 72), (2, 3, 72)])
def test_cpu_linear_op_within_accumulation_error_of_the_reference(packed, shape):
    codes, scales, bias = packed
    x = torch.randn(shape)
    assert_within_accumulation_error(mxint8_linear(x, codes, scales, bias), x, codes, scales, bias)
    assert_within_accumulation_error(mxint8_linear(x, codes, scales), x, codes, scales)


@pytest.mark.parametrize("shape", [(72,), (5, 72), (2, 3, 72)])
def test_torch_path_equals_linear_on_reference_weight(packed, shape, monkeypatch):
    monkeypatch.setenv(cpu.LEVEL_ENV, "torch")
    codes, scales, bias = packed
    x = torch.randn(shape)
    weight = dequantize_reference(codes, scales)
    assert torch.equal(mxint8_linear(x, codes, scales, bias), F.linear(x, weight, bias))
    assert torch.equal(mxint8_linear(x, codes, scales), F.linear(x, weight))


def test_linear_in_bfloat16(packed):
    codes, scales, bias = packed
    x = torch.randn(3, 72, dtype=torch.bfloat16)
    out = mxint8_linear(x, codes, scales, bias.bfloat16())
    assert out.dtype == torch.bfloat16
    assert_within_accumulation_error(out, x, codes, scales, bias.bfloat16())


def test_linear_gradients_flow_to_input_and_bias(packed):
    codes, scales, bias = packed
    x = torch.randn(4, 72, requires_grad=True)
    b = bias.clone().requires_grad_(True)
    grad = torch.randn(4, 24)
    mxint8_linear(x, codes, scales, b).backward(grad)
    weight = dequantize_reference(codes, scales)
    torch.testing.assert_close(x.grad, grad @ weight, rtol=0, atol=0)
    torch.testing.assert_close(b.grad, grad.sum(0), rtol=0, atol=0)


def test_linear_user_errors(packed):
    codes, scales, bias = packed
    with pytest.raises(UserError, match=r"input of shape \(2, 70\).*in_features=72"):
        mxint8_linear(torch.randn(2, 70), codes, scales)
    with pytest.raises(UserError, match=r"bias must have shape \(24,\) and the input's dtype torch.float32, "
                                        r"got shape \(24,\) and dtype torch.float16"):
        mxint8_linear(torch.randn(2, 72), codes, scales, bias.half())
    with pytest.raises(UserError, match=r"needs 2-D codes"):
        mxint8_linear(torch.randn(2, 72), codes.flatten(), scales)


def test_cuda_kernels_fall_back_cleanly_without_cuda(packed, caplog, monkeypatch):
    monkeypatch.setenv(cuda_build.DISABLE_ENV, "1")
    cuda_build.cuda_extension.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=cuda_build.__name__):
            assert cuda_build.cuda_extension() is None
        assert "MASE_LITE_NO_CUDA_KERNELS is set" in caplog.text and "using the torch path" in caplog.text
        codes, scales, bias = packed
        x = torch.randn(3, 72)
        # the CUDA kernels' fallback branch is plain torch: run it on CPU tensors
        assert torch.equal(ops._dequantize_cuda(codes, scales, 32, torch.float16),
                           dequantize_reference(codes, scales, dtype=torch.float16))
        assert torch.equal(ops._linear_cuda(x, codes, scales, bias, 32),
                           F.linear(x, dequantize_reference(codes, scales), bias))
    finally:
        cuda_build.cuda_extension.cache_clear()


def test_unavailable_reason_on_this_machine():
    reason = cuda_build.unavailable_reason()
    if torch.version.cuda is None:
        assert reason == f"torch {torch.__version__} is not a CUDA build"
    elif not torch.cuda.is_available():
        assert reason == "no CUDA device is visible"


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = MXInt8Linear.from_linear(torch.nn.Linear(64, 48))
        self.second = MXInt8Linear.from_linear(torch.nn.Linear(48, 8, bias=False))

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_export_keeps_the_custom_op():
    model = TwoLayers()
    x = torch.randn(4, 64)
    batch = torch.export.Dim("batch")
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.mase_lite.mxint8_linear.default) == 2
    x7 = torch.randn(7, 64)
    assert torch.equal(exported.module()(x7), model(x7))


def test_compile_traces_the_custom_op_without_graph_breaks():
    torch._dynamo.reset()
    model = TwoLayers()
    x = torch.randn(5, 64, requires_grad=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    assert torch.equal(out, model(x))
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    assert torch.equal(grad, x.grad)


def test_dequantize_under_compile():
    torch._dynamo.reset()
    codes, scales = quantize(torch.randn(8, 40))
    compiled = torch.compile(lambda c, s: dequantize(c, s, dtype=torch.bfloat16), backend="eager", fullgraph=True)
    assert torch.equal(compiled(codes, scales), dequantize_reference(codes, scales, dtype=torch.bfloat16))
