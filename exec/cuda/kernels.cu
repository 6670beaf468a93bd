// The CUDA device's own kernels; see kernels.hpp for what each does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "exec/cuda/kernels.hpp"

namespace stratasim::exec::cuda::kernels {
namespace {

constexpr int kThreads = 256;

__host__ __device__ inline std::uint64_t mix(std::uint64_t x) {
  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A 16-bit half valid as bf16, fp16 and as two e4m3 bytes, never zero (see kernels.hpp).
__device__ inline std::uint32_t pattern16(std::uint32_t r) {
  return 0x3F00u | ((r & 1u) << 15) | ((r & 2u) << 6) | 0x38u | ((r >> 2) & 7u);
}

__global__ void fill_kernel(std::uint32_t* data, std::uint64_t words, std::uint64_t seed) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < words; i += stride) {
    const std::uint64_t h = mix(seed ^ (i * 0x2545F4914F6CDD1Dull));
    data[i] = pattern16(static_cast<std::uint32_t>(h)) |
              (pattern16(static_cast<std::uint32_t>(h >> 32)) << 16);
  }
}

__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  }
  return v;
}

// Block-wide reductions for blocks of kThreads threads; every thread gets the result.
__device__ inline float block_sum(float v, float* shared) {
  v = warp_sum(v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? shared[lane] : 0.0f;
  return warp_sum(v);
}

__device__ inline float block_max(float v, float* shared) {
  v = warp_max(v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? shared[lane] : -INFINITY;
  return warp_max(v);
}

__device__ inline float hash_unit(std::uint64_t a, std::uint32_t b) {
  return static_cast<float>(mix(a * 8 + b) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
}

// ---- Elementwise: 16-byte units as 8 bf16 values.

template <int Mode>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(const uint4* __restrict__ in, std::uint64_t in_units, std::uint64_t in_mask,
                       uint4* __restrict__ out, std::uint64_t out_units, std::uint64_t out_mask,
                       std::uint64_t total, std::uint32_t seed) {
  __shared__ float shared[kThreads / 32];
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  // The loop bound depends on the block only, so that every thread reaches the norm's barriers.
  for (std::uint64_t base = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x; base < total;
       base += stride) {
    const std::uint64_t i = base + threadIdx.x;
    float v[8];
    if (i < in_units) {
      const uint4 u = in[i & in_mask];
      const std::uint32_t words[4] = {u.x, u.y, u.z, u.w};
      for (int w = 0; w < 4; ++w) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
        v[2 * w] = f.x;
        v[2 * w + 1] = f.y;
      }
    } else {
      for (int j = 0; j < 8; ++j) v[j] = 0.5f + hash_unit(i, static_cast<std::uint32_t>(j));
    }
    if constexpr (Mode == static_cast<int>(ElementwiseMode::norm)) {
      float s = 0.0f, sq = 0.0f;
      if (i < total) {
        for (int j = 0; j < 8; ++j) {
          s += v[j];
          sq += v[j] * v[j];
        }
      }
      const float n = 8.0f * kThreads;
      const float mean = block_sum(s, shared) / n;
      const float var = fmaxf(block_sum(sq, shared) / n - mean * mean, 0.0f);
      const float inv = rsqrtf(var + 1e-5f);
      for (int j = 0; j < 8; ++j) v[j] = (v[j] - mean) * inv * 1.01f + 0.01f;
    } else if constexpr (Mode == static_cast<int>(ElementwiseMode::activation)) {
      for (int j = 0; j < 8; ++j) {
        const float x = v[j];
        v[j] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
      }
    } else if constexpr (Mode == static_cast<int>(ElementwiseMode::dropout)) {
      for (int j = 0; j < 8; ++j) {
        const bool keep = hash_unit(i ^ seed, static_cast<std::uint32_t>(j)) < 0.9f;
        v[j] = keep ? v[j] * (1.0f / 0.9f) : 0.0f;
      }
    } else if constexpr (Mode == static_cast<int>(ElementwiseMode::residual)) {
      float r[8];
      for (int j = 0; j < 8; ++j) r[j] = v[j] + v[7 - j];
      for (int j = 0; j < 8; ++j) v[j] = r[j];
    } else {
      for (int j = 0; j < 8; ++j) v[j] = v[j] * 0.999f + 0.001f;
    }
    if (i < out_units) {
      std::uint32_t words[4];
      for (int w = 0; w < 4; ++w) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * w], v[2 * w + 1]);
        words[w] = *reinterpret_cast<const std::uint32_t*>(&b);
      }
      out[i & out_mask] = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

// ---- Conversions.

template <typename T>
__device__ inline float to_float(T x);
template <>
__device__ inline float to_float<float>(float x) {
  return x;
}
template <>
__device__ inline float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ inline float to_float<__nv_fp8_e4m3>(__nv_fp8_e4m3 x) {
  return static_cast<float>(x);
}

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half(x);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ inline __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);
}

// ---- Softmax: one block per row.

template <typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_forward_kernel(T* scores, std::int64_t rows, std::int64_t cols, std::int64_t seq_q,
                           bool causal, float scale) {
  __shared__ float shared[kThreads / 32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* p = scores + row * cols;
    std::int64_t limit = cols;
    if (causal && row % seq_q + (cols - seq_q) + 1 < cols) limit = row % seq_q + (cols - seq_q) + 1;
    float mx = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < limit; j += blockDim.x) mx = fmaxf(mx, to_float(p[j]));
    mx = block_max(mx, shared);
    float sum = 0.0f;
    for (std::int64_t j = threadIdx.x; j < limit; j += blockDim.x) {
      sum += __expf((to_float(p[j]) - mx) * scale);
    }
    sum = block_sum(sum, shared);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      p[j] = from_float<T>(j < limit ? __expf((to_float(p[j]) - mx) * scale) * inv : 0.0f);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(const T* probs, T* grad, std::int64_t rows, std::int64_t cols,
                            float scale) {
  __shared__ float shared[kThreads / 32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = probs + row * cols;
    T* g = grad + row * cols;
    float dot = 0.0f;
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      dot += to_float(p[j]) * to_float(g[j]);
    }
    dot = block_sum(dot, shared);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float pj = to_float(p[j]);
      g[j] = from_float<T>(pj * (to_float(g[j]) - dot) * scale);
    }
  }
}

// ---- Optimizers.

template <typename W, typename G>
__global__ void adam_kernel(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                            const G* __restrict__ g, W* __restrict__ w, std::uint64_t n,
                            std::uint64_t mask, AdamParams a) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::uint64_t j = i & mask;
    const float gj = to_float(g[j]);
    const float mj = a.beta1 * m[j] + (1.0f - a.beta1) * gj;
    // |v|: the random initial data is a valid (non-negative) variance
    const float vj = a.beta2 * fabsf(v[j]) + (1.0f - a.beta2) * gj * gj;
    m[j] = mj;
    v[j] = vj;
    const float pj =
        p[j] - a.lr * ((mj / a.bias1) / (sqrtf(vj / a.bias2) + a.eps) + a.weight_decay * p[j]);
    p[j] = pj;
    w[j] = from_float<W>(pj);
  }
}

template <typename T>
__global__ void sgd_kernel(T* __restrict__ w, const T* __restrict__ g, std::uint64_t n,
                           std::uint64_t mask, float lr) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::uint64_t j = i & mask;
    w[j] = from_float<T>(to_float(w[j]) - lr * to_float(g[j]));
  }
}

// ---- Measured work and roofline work.

__device__ inline std::uint64_t global_timer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(std::uint64_t nanoseconds) {
  const std::uint64_t start = global_timer();
  while (global_timer() - start < nanoseconds) {
  }
}

__device__ float4 roofline_sink;

__global__ void roofline_kernel(float4* buffer, std::uint64_t count, std::uint64_t mask,
                                std::uint32_t fmas) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    float4 x = buffer ? buffer[i & mask] : make_float4(1.0f, 0.5f, 0.25f, 0.125f);
    for (std::uint32_t k = 0; k < fmas; ++k) {
      x.x = fmaf(x.x, 0.9999f, 0.0001f);
      x.y = fmaf(x.y, 0.9999f, 0.0001f);
      x.z = fmaf(x.z, 0.9999f, 0.0001f);
      x.w = fmaf(x.w, 0.9999f, 0.0001f);
    }
    if (buffer) {
      buffer[i & mask] = x;
    } else if (x.x == 12345.0f) {
      roofline_sink = x;  // never true: keeps the arithmetic from being optimised away
    }
  }
}

unsigned grid_for(std::uint64_t work, int sms, int blocks_per_sm = 8) {
  const std::uint64_t blocks = (work + kThreads - 1) / kThreads;
  const std::uint64_t cap = static_cast<std::uint64_t>(std::max(sms, 1)) * blocks_per_sm;
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(blocks, cap)));
}

}  // namespace

cudaError_t fill(void* data, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream) {
  const std::uint64_t words = bytes / 4;
  if (words == 0) return cudaSuccess;
  fill_kernel<<<grid_for(words, 64, 16), kThreads, 0, stream>>>(static_cast<std::uint32_t*>(data),
                                                                words, mix(seed));
  return cudaGetLastError();
}

cudaError_t elementwise(ElementwiseMode mode, const void* in, std::uint64_t in_bytes,
                        std::uint64_t in_mask, void* out, std::uint64_t out_bytes,
                        std::uint64_t out_mask, std::uint32_t seed, int sms, cudaStream_t stream) {
  const std::uint64_t in_units = (in_bytes + 15) / 16, out_units = (out_bytes + 15) / 16;
  const std::uint64_t total = std::max(in_units, out_units);
  if (total == 0) return cudaSuccess;
  const auto* src = static_cast<const uint4*>(in);
  auto* dst = static_cast<uint4*>(out);
  const unsigned grid = grid_for(total, sms);
  switch (mode) {
    case ElementwiseMode::norm:
      elementwise_kernel<1><<<grid, kThreads, 0, stream>>>(src, in_units, in_mask, dst, out_units,
                                                           out_mask, total, seed);
      break;
    case ElementwiseMode::activation:
      elementwise_kernel<2><<<grid, kThreads, 0, stream>>>(src, in_units, in_mask, dst, out_units,
                                                           out_mask, total, seed);
      break;
    case ElementwiseMode::dropout:
      elementwise_kernel<3><<<grid, kThreads, 0, stream>>>(src, in_units, in_mask, dst, out_units,
                                                           out_mask, total, seed);
      break;
    case ElementwiseMode::residual:
      elementwise_kernel<4><<<grid, kThreads, 0, stream>>>(src, in_units, in_mask, dst, out_units,
                                                           out_mask, total, seed);
      break;
    case ElementwiseMode::generic:
      elementwise_kernel<0><<<grid, kThreads, 0, stream>>>(src, in_units, in_mask, dst, out_units,
                                                           out_mask, total, seed);
      break;
  }
  return cudaGetLastError();
}

namespace {
unsigned row_grid(std::int64_t rows) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(rows, 1 << 20)));
}
}  // namespace

cudaError_t softmax_forward(ElemType t, void* scores, std::int64_t rows, std::int64_t cols,
                            std::int64_t seq_q, bool causal, float scale, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const unsigned grid = row_grid(rows);
  seq_q = std::max<std::int64_t>(seq_q, 1);
  switch (t) {
    case ElemType::f32:
      softmax_forward_kernel<float><<<grid, kThreads, 0, stream>>>(
          static_cast<float*>(scores), rows, cols, seq_q, causal, scale);
      break;
    case ElemType::f16:
      softmax_forward_kernel<__half><<<grid, kThreads, 0, stream>>>(
          static_cast<__half*>(scores), rows, cols, seq_q, causal, scale);
      break;
    case ElemType::bf16:
    case ElemType::fp8:  // attention computes fp8 in bf16 (see cuda_device.cpp)
      softmax_forward_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(scores), rows, cols, seq_q, causal, scale);
      break;
  }
  return cudaGetLastError();
}

cudaError_t softmax_backward(ElemType t, const void* probs, void* grad, std::int64_t rows,
                             std::int64_t cols, float scale, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const unsigned grid = row_grid(rows);
  switch (t) {
    case ElemType::f32:
      softmax_backward_kernel<float><<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(probs), static_cast<float*>(grad), rows, cols, scale);
      break;
    case ElemType::f16:
      softmax_backward_kernel<__half><<<grid, kThreads, 0, stream>>>(
          static_cast<const __half*>(probs), static_cast<__half*>(grad), rows, cols, scale);
      break;
    case ElemType::bf16:
    case ElemType::fp8:
      softmax_backward_kernel<__nv_bfloat16>
          <<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(probs),
                                          static_cast<__nv_bfloat16*>(grad), rows, cols, scale);
      break;
  }
  return cudaGetLastError();
}

cudaError_t adam(ElemType weights, float* p, float* m, float* v, const void* grads, void* w,
                 std::uint64_t n, std::uint64_t mask, const AdamParams& params, int sms,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, sms);
  switch (weights) {
    case ElemType::f32:
      adam_kernel<float, float><<<grid, kThreads, 0, stream>>>(
          p, m, v, static_cast<const float*>(grads), static_cast<float*>(w), n, mask, params);
      break;
    case ElemType::f16:
      adam_kernel<__half, __half><<<grid, kThreads, 0, stream>>>(
          p, m, v, static_cast<const __half*>(grads), static_cast<__half*>(w), n, mask, params);
      break;
    case ElemType::bf16:
      adam_kernel<__nv_bfloat16, __nv_bfloat16>
          <<<grid, kThreads, 0, stream>>>(p, m, v, static_cast<const __nv_bfloat16*>(grads),
                                          static_cast<__nv_bfloat16*>(w), n, mask, params);
      break;
    case ElemType::fp8:
      adam_kernel<__nv_fp8_e4m3, __nv_bfloat16>
          <<<grid, kThreads, 0, stream>>>(p, m, v, static_cast<const __nv_bfloat16*>(grads),
                                          static_cast<__nv_fp8_e4m3*>(w), n, mask, params);
      break;
  }
  return cudaGetLastError();
}

cudaError_t sgd(ElemType t, void* w, const void* g, std::uint64_t n, std::uint64_t mask, float lr,
                int sms, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, sms);
  switch (t) {
    case ElemType::f32:
      sgd_kernel<float><<<grid, kThreads, 0, stream>>>(static_cast<float*>(w),
                                                       static_cast<const float*>(g), n, mask, lr);
      break;
    case ElemType::f16:
      sgd_kernel<__half><<<grid, kThreads, 0, stream>>>(static_cast<__half*>(w),
                                                        static_cast<const __half*>(g), n, mask, lr);
      break;
    case ElemType::bf16:
      sgd_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(w), static_cast<const __nv_bfloat16*>(g), n, mask, lr);
      break;
    case ElemType::fp8:
      sgd_kernel<__nv_fp8_e4m3><<<grid, kThreads, 0, stream>>>(
          static_cast<__nv_fp8_e4m3*>(w), static_cast<const __nv_fp8_e4m3*>(g), n, mask, lr);
      break;
  }
  return cudaGetLastError();
}

cudaError_t spin(std::uint64_t nanoseconds, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t roofline_fma(float* buffer, std::uint64_t elements, std::uint64_t mask,
                         std::uint32_t fmas, int sms, cudaStream_t stream) {
  const std::uint64_t count = (elements + 3) / 4;
  if (count == 0) return cudaSuccess;
  roofline_kernel<<<grid_for(count, sms), kThreads, 0, stream>>>(reinterpret_cast<float4*>(buffer),
                                                                 count, mask, fmas);
  return cudaGetLastError();
}

}  // namespace stratasim::exec::cuda::kernels
