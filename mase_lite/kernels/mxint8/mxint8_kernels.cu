// MXINT8 (OCP Microscaling v1.0) CUDA kernels. Torch-free: the launchers below are extern "C"
// and called from mxint8_binding.cpp, so this file builds with plain nvcc (`nvcc -ptx` checks it).
//
// Layout (row-major, as produced by mase_lite.kernels.mxint8.quantize):
//   codes  int8  [rows, cols]              element q, value q * 2^-6 * X
//   scales uint8 [rows, ceil(cols / bs)]   E8M0 code E, X = 2^(E - 127); E = 0xFF is NaN
// Arithmetic is exact: every MXINT8 value, -128 included, is a float32 (a product of a <= 8-bit
// integer and a power of two >= 2^-133), built here from exponent bits. Each output is rounded
// once, from that exact float32, to float16/bfloat16 (round to nearest even). Do not build with
// --use_fast_math: flushing subnormals would zero the scales below 2^-126.

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

enum OutputDtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

constexpr int kThreads = 256;
constexpr int kCodesPerVector = 16;  // one 16-byte load of int8 codes
constexpr int kGemvBlock = 32;       // the GEMV kernel handles the spec's block size only
constexpr int kGemvMaxRows = 16;

// Value of element code 1 under E8M0 scale code e: 2^(e - 127 - 6), exact (subnormal below e = 7).
__device__ __forceinline__ float element_unit(uint32_t e) {
  if (e == 0xFFu) return __int_as_float(0x7FC00000);
  return e >= 7u ? __int_as_float(static_cast<int>((e - 6u) << 23))
                 : __int_as_float(1 << (e + 16u));
}

// Load/convert/store of 16 bytes of T as float lanes.
template <typename T> struct Lanes;

template <> struct Lanes<float> {
  static constexpr int kPerVector = 4;
  __device__ static void load(const float* p, float* v) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  }
  __device__ static void store(float* p, const float* v) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
  __device__ static float to_float(float v) { return v; }
  __device__ static float from_float(float v) { return v; }
};

template <> struct Lanes<__half> {
  static constexpr int kPerVector = 8;
  __device__ static void load(const __half* p, float* v) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      v[2 * i] = f.x; v[2 * i + 1] = f.y;
    }
  }
  __device__ static void store(__half* p, const float* v) {
    uint4 raw;
    __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};

template <> struct Lanes<__nv_bfloat16> {
  static constexpr int kPerVector = 8;
  __device__ static void load(const __nv_bfloat16* p, float* v) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x; v[2 * i + 1] = f.y;
    }
  }
  __device__ static void store(__nv_bfloat16* p, const float* v) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

// Sixteen int8 codes from one 16-byte vector, as floats.
__device__ __forceinline__ void unpack_codes(const int4 packed, float* q) {
  const int words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int b = 0; b < 4; ++b) q[4 * w + b] = static_cast<float>(static_cast<int8_t>(words[w] >> (8 * b)));
  }
}

// Dequantize, vectorised: each thread turns one 16-byte vector of codes (inside one block, since
// block_size % 16 == 0) into 16 outputs; one scale load per vector, shared by a warp's lanes in
// one 32-byte sector. Requires cols % 16 == 0 and 16-byte aligned codes and output.
template <typename T>
__global__ void __launch_bounds__(kThreads) dequantize_vectorised(
    const int4* __restrict__ codes, const uint8_t* __restrict__ scales, T* __restrict__ out,
    int64_t vectors, int64_t vectors_per_row, int64_t blocks_per_row, int64_t block_size) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / vectors_per_row;
    const int64_t col = (i - row * vectors_per_row) * kCodesPerVector;
    const int4 packed = __ldg(codes + i);
    const float unit = element_unit(__ldg(scales + row * blocks_per_row + col / block_size));
    float v[kCodesPerVector];
    unpack_codes(packed, v);
#pragma unroll
    for (int j = 0; j < kCodesPerVector; ++j) v[j] *= unit;
    T* dst = out + i * kCodesPerVector;
#pragma unroll
    for (int j = 0; j < kCodesPerVector; j += Lanes<T>::kPerVector) Lanes<T>::store(dst + j, v + j);
  }
}

// Dequantize, one element per thread: any row length, block size and alignment.
template <typename T>
__global__ void __launch_bounds__(kThreads) dequantize_elementwise(
    const int8_t* __restrict__ codes, const uint8_t* __restrict__ scales, T* __restrict__ out,
    int64_t elements, int64_t cols, int64_t blocks_per_row, int64_t block_size) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols;
    const int64_t col = i - row * cols;
    const float unit = element_unit(__ldg(scales + row * blocks_per_row + col / block_size));
    out[i] = Lanes<T>::from_float(static_cast<float>(__ldg(codes + i)) * unit);
  }
}

// y[m, n] = sum_k x[m, k] * W[n, k] + bias[n] for up to kGemvMaxRows rows of x, W never
// materialised. One warp per output feature n; each lane owns whole 32-element blocks of W's row
// (two 16-byte code loads, one scale byte), forms the block's partial dot products with every
// row of x in float32 and applies the block scale once per block. Requires cols % 32 == 0 and
// 16-byte aligned x and codes. Rows of x beyond `rows` are skipped (ROWS is a compile-time cap).
template <typename T, int ROWS>
__global__ void linear_gemv(
    const T* __restrict__ x, const int8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
    const T* __restrict__ bias, T* __restrict__ out, int rows, int64_t out_features, int64_t cols) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (n >= out_features) return;
  const int64_t blocks = cols / kGemvBlock;
  const int4* w_row = reinterpret_cast<const int4*>(codes + n * cols);
  const uint8_t* s_row = scales + n * blocks;

  float acc[ROWS];
#pragma unroll
  for (int m = 0; m < ROWS; ++m) acc[m] = 0.f;

  for (int64_t b = lane; b < blocks; b += 32) {
    float w[kGemvBlock];
    unpack_codes(__ldg(w_row + 2 * b), w);
    unpack_codes(__ldg(w_row + 2 * b + 1), w + kCodesPerVector);
    const float unit = element_unit(__ldg(s_row + b));
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      if (m < rows) {
        const T* xp = x + m * cols + b * kGemvBlock;
        float partial = 0.f;
#pragma unroll
        for (int j = 0; j < kGemvBlock; j += Lanes<T>::kPerVector) {
          float xv[Lanes<T>::kPerVector];
          Lanes<T>::load(xp + j, xv);
#pragma unroll
          for (int t = 0; t < Lanes<T>::kPerVector; ++t) partial = fmaf(xv[t], w[j + t], partial);
        }
        acc[m] = fmaf(partial, unit, acc[m]);
      }
    }
  }

#pragma unroll
  for (int m = 0; m < ROWS; ++m) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
  }
  if (lane == 0) {
    const float b = bias ? Lanes<T>::to_float(bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      if (m < rows) out[m * out_features + n] = Lanes<T>::from_float(acc[m] + b);
    }
  }
}

unsigned grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
void launch_dequantize(const int8_t* codes, const uint8_t* scales, T* out, int64_t rows, int64_t cols,
                       int64_t block_size, cudaStream_t stream) {
  const int64_t elements = rows * cols;
  const int64_t blocks_per_row = (cols + block_size - 1) / block_size;
  if (cols % kCodesPerVector == 0 && block_size % kCodesPerVector == 0 && aligned16(codes) && aligned16(out)) {
    const int64_t vectors = elements / kCodesPerVector;
    dequantize_vectorised<T><<<grid_for(vectors), kThreads, 0, stream>>>(
        reinterpret_cast<const int4*>(codes), scales, out, vectors, cols / kCodesPerVector, blocks_per_row, block_size);
  } else {
    dequantize_elementwise<T><<<grid_for(elements), kThreads, 0, stream>>>(
        codes, scales, out, elements, cols, blocks_per_row, block_size);
  }
}

template <typename T>
void launch_gemv(const T* x, const int8_t* codes, const uint8_t* scales, const T* bias, T* out, int rows,
                 int64_t out_features, int64_t cols, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>((out_features + kThreads / 32 - 1) / (kThreads / 32));
  if (rows <= 1) {
    linear_gemv<T, 1><<<grid, kThreads, 0, stream>>>(x, codes, scales, bias, out, rows, out_features, cols);
  } else if (rows <= 2) {
    linear_gemv<T, 2><<<grid, kThreads, 0, stream>>>(x, codes, scales, bias, out, rows, out_features, cols);
  } else if (rows <= 4) {
    linear_gemv<T, 4><<<grid, kThreads, 0, stream>>>(x, codes, scales, bias, out, rows, out_features, cols);
  } else if (rows <= 8) {
    linear_gemv<T, 8><<<grid, kThreads, 0, stream>>>(x, codes, scales, bias, out, rows, out_features, cols);
  } else {
    linear_gemv<T, kGemvMaxRows><<<grid, kThreads, 0, stream>>>(x, codes, scales, bias, out, rows, out_features, cols);
  }
}

}  // namespace

extern "C" {

// Returns a cudaError_t value: 0 on success.
int mxint8_dequantize_launch(const void* codes, const void* scales, void* out, int out_dtype, int64_t rows,
                             int64_t cols, int64_t block_size, void* stream) {
  if (block_size < 1 || rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  const auto* c = static_cast<const int8_t*>(codes);
  const auto* s = static_cast<const uint8_t*>(scales);
  const auto st = static_cast<cudaStream_t>(stream);
  switch (out_dtype) {
    case kFloat32: launch_dequantize(c, s, static_cast<float*>(out), rows, cols, block_size, st); break;
    case kFloat16: launch_dequantize(c, s, static_cast<__half*>(out), rows, cols, block_size, st); break;
    case kBFloat16: launch_dequantize(c, s, static_cast<__nv_bfloat16*>(out), rows, cols, block_size, st); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// Small-batch linear (rows <= 16, block size 32, cols % 32 == 0, x and codes 16-byte aligned).
int mxint8_linear_gemv_launch(const void* x, const void* codes, const void* scales, const void* bias, void* out,
                              int dtype, int64_t rows, int64_t out_features, int64_t cols, void* stream) {
  if (rows < 0 || rows > kGemvMaxRows || cols % kGemvBlock != 0 || !aligned16(x) || !aligned16(codes)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || out_features == 0) return cudaSuccess;
  const auto* c = static_cast<const int8_t*>(codes);
  const auto* s = static_cast<const uint8_t*>(scales);
  const auto st = static_cast<cudaStream_t>(stream);
  const int r = static_cast<int>(rows);
  switch (dtype) {
    case kFloat32:
      launch_gemv(static_cast<const float*>(x), c, s, static_cast<const float*>(bias), static_cast<float*>(out), r,
                  out_features, cols, st);
      break;
    case kFloat16:
      launch_gemv(static_cast<const __half*>(x), c, s, static_cast<const __half*>(bias), static_cast<__half*>(out), r,
                  out_features, cols, st);
      break;
    case kBFloat16:
      launch_gemv(static_cast<const __nv_bfloat16*>(x), c, s, static_cast<const __nv_bfloat16*>(bias),
                  static_cast<__nv_bfloat16*>(out), r, out_features, cols, st);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

const char* mxint8_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
