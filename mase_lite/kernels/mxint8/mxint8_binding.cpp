// Python binding of the MXINT8 CUDA launchers. Includes only torch/extension.h: the kernels live
// in the torch-free mxint8_kernels.cu, and the caller passes the CUDA stream as an integer handle.

#include <torch/extension.h>

#include <cstdint>
#include <optional>

extern "C" {
int mxint8_dequantize_launch(const void* codes, const void* scales, void* out, int out_dtype, int64_t rows,
                             int64_t cols, int64_t block_size, void* stream);
int mxint8_linear_gemv_launch(const void* x, const void* codes, const void* scales, const void* bias, void* out,
                              int dtype, int64_t rows, int64_t out_features, int64_t cols, void* stream);
const char* mxint8_error_string(int error);
}

namespace {

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default: TORCH_CHECK(false, "mxint8 kernels support float32, float16 and bfloat16, got ", t.scalar_type());
  }
}

void check_cuda_contiguous(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
}

void check_launch(int error) { TORCH_CHECK(error == 0, "mxint8 CUDA kernel failed: ", mxint8_error_string(error)); }

void* as_stream(int64_t handle) { return reinterpret_cast<void*>(static_cast<intptr_t>(handle)); }

}  // namespace

// out[..., k] = codes[..., k] * 2^-6 * 2^(scales[..., k / block_size] - 127), written into `out`.
void dequantize(const at::Tensor& codes, const at::Tensor& scales, at::Tensor& out, int64_t block_size,
                int64_t stream) {
  check_cuda_contiguous(codes, "codes", at::kChar);
  check_cuda_contiguous(scales, "scales", at::kByte);
  check_cuda_contiguous(out, "out", out.scalar_type());
  TORCH_CHECK(out.sizes() == codes.sizes(), "out must have the shape of codes");
  const int64_t cols = codes.dim() ? codes.size(-1) : 1;
  const int64_t rows = cols ? codes.numel() / cols : 0;
  TORCH_CHECK(scales.numel() == rows * ((cols + block_size - 1) / block_size), "scales do not match codes");
  check_launch(mxint8_dequantize_launch(codes.data_ptr(), scales.data_ptr(), out.data_ptr(), dtype_code(out), rows,
                                        cols, block_size, as_stream(stream)));
}

// out[m, n] = x[m, :] . dequant(W)[n, :] + bias[n] for x of at most 16 rows, block size 32.
void linear_gemv(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                 const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t stream) {
  check_cuda_contiguous(x, "x", x.scalar_type());
  check_cuda_contiguous(codes, "codes", at::kChar);
  check_cuda_contiguous(scales, "scales", at::kByte);
  check_cuda_contiguous(out, "out", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 2 && x.size(1) == codes.size(1), "x must be [rows, in_features]");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == codes.size(0), "out must be [rows, out]");
  const void* bias_ptr = nullptr;
  if (bias.has_value()) {
    check_cuda_contiguous(*bias, "bias", x.scalar_type());
    TORCH_CHECK(bias->numel() == codes.size(0), "bias must have out_features elements");
    bias_ptr = bias->data_ptr();
  }
  check_launch(mxint8_linear_gemv_launch(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), bias_ptr, out.data_ptr(),
                                         dtype_code(x), x.size(0), codes.size(0), codes.size(1), as_stream(stream)));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dequantize", &dequantize, "MXINT8 dequantize into a preallocated tensor (CUDA)");
  m.def("linear_gemv", &linear_gemv, "MXINT8 small-batch linear into a preallocated tensor (CUDA)");
}
