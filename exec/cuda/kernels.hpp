// The CUDA device's own kernels (exec/cuda/kernels.cu), behind plain C++ launchers so that the
// rest of the device compiles with the host compiler and the project's full warning set. Every
// launcher enqueues on `stream` and returns cudaGetLastError() (the launch's status).
//
// Buffers hold the bit pattern of fill(): every 16-bit half is a bf16 and an fp16 in
// ±[0.5, 2), every byte an fp8 (e4m3) in ±[1, 2), every 32-bit word an fp32 in ±[0.5, 2): the
// data is random (from the seed), never zero and finite whatever dtype reads it.
//
// Streaming kernels take a buffer of `units` 16-byte units and an amount of work that may be
// larger: they wrap around the buffer (index & mask, with a power-of-two unit count), so that
// they move exactly the bytes asked for without needing a buffer that large (see wrap_mask).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stratasim::exec::cuda::kernels {

/// Element types of the kernels (fp8 is e4m3; tf32 data is fp32).
enum class ElemType : int { f32 = 0, f16 = 1, bf16 = 2, fp8 = 3 };

/// The arithmetic an elementwise kernel does on the values it streams: a layer norm (mean and
/// variance over rows of 2,048 values, then scale and shift), a GELU (tanh form), a dropout
/// (hash-based mask, keep 0.9, rescale), a residual add, or a scaled copy.
enum class ElementwiseMode : int { generic, norm, activation, dropout, residual };

/// The mask for wrapping `needed` units of work over a buffer of `buffer_units` units (a power
/// of two whenever it is smaller than `needed`): all ones when no wrap is needed.
constexpr std::uint64_t wrap_mask(std::uint64_t needed, std::uint64_t buffer_units) {
  return needed <= buffer_units ? ~std::uint64_t{0} : buffer_units - 1;
}

/// Fills `bytes` (a multiple of 4) with fill()'s pattern from `seed`.
cudaError_t fill(void* data, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream);

/// Reads `in_bytes` and writes `out_bytes` (each rounded up to 16 bytes), doing `mode`'s
/// arithmetic on the values (as bf16 pairs). `in_mask` / `out_mask`: wrap_mask of the buffers.
cudaError_t elementwise(ElementwiseMode mode, const void* in, std::uint64_t in_bytes,
                        std::uint64_t in_mask, void* out, std::uint64_t out_bytes,
                        std::uint64_t out_mask, std::uint32_t seed, int sms, cudaStream_t stream);

/// Row-wise softmax in place over `rows` rows of `cols` scores (type `t`: f32, f16 or bf16) with
/// scale `scale`; with `causal`, row r (its position r % seq_q in its sequence) sees keys
/// [0, r % seq_q + cols - seq_q] (bottom-right aligned, as FlashAttention) and the others get 0.
cudaError_t softmax_forward(ElemType t, void* scores, std::int64_t rows, std::int64_t cols,
                            std::int64_t seq_q, bool causal, float scale, cudaStream_t stream);

/// Softmax backward in place: grad (dP on entry) becomes dS = P * (dP - rowsum(P * dP)) * scale.
cudaError_t softmax_backward(ElemType t, const void* probs, void* grad, std::int64_t rows,
                             std::int64_t cols, float scale, cudaStream_t stream);

struct AdamParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float bias1 = 0.1f, bias2 = 0.05f;  // 1 - beta^step
};

/// Mixed-precision Adam over `n` parameters (wrapping over buffers of mask + 1 entries when mask
/// is not all ones): fp32 master weights `p`, momentum `m` and variance `v` updated in place
/// (the variance read as |v|, so that fill()'s signed data is a valid state),
/// gradients read in `weights` type (bf16 for fp8 weights), weights written in `weights` type.
cudaError_t adam(ElemType weights, float* p, float* m, float* v, const void* grads, void* w,
                 std::uint64_t n, std::uint64_t mask, const AdamParams& params, int sms,
                 cudaStream_t stream);

/// w -= lr * g over `n` values of type `t` (wrapping as adam()).
cudaError_t sgd(ElemType t, void* w, const void* g, std::uint64_t n, std::uint64_t mask, float lr,
                int sms, cudaStream_t stream);

/// One thread that busy-waits `nanoseconds` on the GPU's global timer.
cudaError_t spin(std::uint64_t nanoseconds, cudaStream_t stream);

/// `fmas` fused multiply-adds on each of `elements` fp32 values read from and written back to
/// `buffer` (wrapping over mask + 1 float4s); without a buffer, the values live in registers.
cudaError_t roofline_fma(float* buffer, std::uint64_t elements, std::uint64_t mask,
                         std::uint32_t fmas, int sms, cudaStream_t stream);

}  // namespace stratasim::exec::cuda::kernels
