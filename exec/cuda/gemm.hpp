// cuBLASLt matrix products with the exact shapes of the Program's kernels: column-major
// D = op(A) op(B), strided-batched through the matrix layouts' batch attributes, with
// descriptors and the heuristic's algorithm cached per shape and a workspace per rank.
//
// Types per training dtype: bf16 and fp16 multiply in their type and accumulate in fp32; fp32
// multiplies in fp32, tf32 in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32); fp8 multiplies e4m3 inputs
// with fp32 accumulation (fast accumulation, as Transformer Engine does) into a bf16 result —
// it needs compute capability 8.9 or newer, the TN layout and dimensions cuBLASLt accepts
// (multiples of 16); otherwise the call is a clear ExecError.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "exec/cuda/check.hpp"
#include "hw_models/dtype.hpp"

namespace stratasim::exec::cuda {

struct MatmulShape {
  bool trans_a = true, trans_b = false;  // TN: the layout every dtype supports (fp8 needs it)
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  DType dtype = DType::bf16;

  /// D[m, n] (column-major, ld m) = A^T B with A stored k x m and B k x n, `batch` times.
  static MatmulShape tn(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                        DType dtype);
  auto key() const {
    return std::tuple(trans_a, trans_b, m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c,
                      static_cast<int>(dtype));
  }
};

/// Bytes per element of the inputs and of the result of a product in `dtype`.
std::int64_t input_bytes(DType dtype);
std::int64_t output_bytes(DType dtype);

class Matmuls {
 public:
  /// `compute_capability`: major * 10 + minor of the rank's GPU.
  Matmuls(cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
          int compute_capability);
  ~Matmuls();
  Matmuls(const Matmuls&) = delete;
  Matmuls& operator=(const Matmuls&) = delete;

  /// Enqueues D = op(A) op(B) on `stream`. Throws ExecError (naming ctx) when cuBLASLt fails or
  /// has no algorithm for the shape.
  void run(const MatmulShape& shape, const void* a, const void* b, void* d, cudaStream_t stream,
           const CallContext& ctx);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(const MatmulShape& shape, const CallContext& ctx);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_;
  void* workspace_;
  std::size_t workspace_bytes_;
  int compute_capability_;
  std::map<decltype(MatmulShape{}.key()), Plan> plans_;
};

}  // namespace stratasim::exec::cuda
