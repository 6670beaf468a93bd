#include "exec/cuda/gemm.hpp"

#include <limits>
#include <string>

namespace stratasim::exec::cuda {

namespace {

cudaDataType_t input_type(DType dtype) {
  switch (dtype) {
    case DType::fp32:
    case DType::tf32:
      return CUDA_R_32F;
    case DType::fp16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::fp8:
      return CUDA_R_8F_E4M3;
    case DType::fp4:  // refused in Matmuls::plan (NVFP4 GEMMs are not run)
      return CUDA_R_8F_E4M3;
  }
  return CUDA_R_32F;
}

cudaDataType_t output_type(DType dtype) {
  return dtype == DType::fp8 ? CUDA_R_16BF : input_type(dtype);
}

cublasComputeType_t compute_type(DType dtype) {
  return dtype == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

std::string shape_text(const MatmulShape& s) {
  return std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N") + " m " +
         std::to_string(s.m) + ", n " + std::to_string(s.n) + ", k " + std::to_string(s.k) +
         ", batch " + std::to_string(s.batch) + " in " + std::string(name_of(s.dtype));
}

}  // namespace

std::int64_t input_bytes(DType dtype) {
  return size_of(dtype);
}
std::int64_t output_bytes(DType dtype) {
  return dtype == DType::fp8 ? 2 : size_of(dtype);
}

MatmulShape MatmulShape::tn(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                            DType dtype) {
  MatmulShape s;
  s.trans_a = true;
  s.trans_b = false;
  s.m = m;
  s.n = n;
  s.k = k;
  s.batch = batch;
  s.lda = k;
  s.ldb = k;
  s.ldc = m;
  s.stride_a = m * k;
  s.stride_b = k * n;
  s.stride_c = m * n;
  s.dtype = dtype;
  return s;
}

Matmuls::Matmuls(cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
                 int compute_capability)
    : handle_(handle),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      compute_capability_(compute_capability) {}

Matmuls::~Matmuls() {
  for (auto& entry : plans_) destroy(entry.second);
}

void Matmuls::destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

const Matmuls::Plan& Matmuls::plan(const MatmulShape& s, const CallContext& ctx) {
  const auto key = s.key();
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;

  if (s.dtype == DType::fp4) {
    throw ExecError(ctx.where() + ": an fp4 (NVFP4) GEMM (" + shape_text(s) +
                    ") is simulated only; the CUDA device does not run it");
  }
  if (s.dtype == DType::fp8 && compute_capability_ < 89) {
    throw ExecError(ctx.where() + ": an fp8 GEMM (" + shape_text(s) +
                    ") needs a GPU of compute capability 8.9 or newer (Ada, Hopper); this one "
                    "is sm_" +
                    std::to_string(compute_capability_));
  }
  if (s.dtype == DType::fp8 && (!s.trans_a || s.trans_b)) {
    throw ExecError(ctx.where() + ": cuBLASLt runs fp8 GEMMs in the TN layout only (" +
                    shape_text(s) + ")");
  }
  if (s.batch > std::numeric_limits<std::int32_t>::max() || s.m <= 0 || s.n <= 0 || s.k <= 0 ||
      s.batch <= 0) {
    throw ExecError(ctx.where() + ": a GEMM of shape " + shape_text(s) +
                    " cannot be run (dimensions must be positive, batch below 2^31)");
  }

  // Built apart and stored once complete; a guard frees what was made if a step throws.
  Plan stored;
  struct Guard {
    Plan& plan;
    bool armed = true;
    ~Guard() {
      if (armed) destroy(plan);
    }
  } guard{stored};
  const cudaDataType_t in = input_type(s.dtype), out = output_type(s.dtype);
  STRATASIM_CUDA_CHECK(ctx,
                       cublasLtMatmulDescCreate(&stored.desc, compute_type(s.dtype), CUDA_R_32F));
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATASIM_CUDA_CHECK(ctx, cublasLtMatmulDescSetAttribute(stored.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &ta, sizeof(ta)));
  STRATASIM_CUDA_CHECK(ctx, cublasLtMatmulDescSetAttribute(stored.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                           &tb, sizeof(tb)));
  if (s.dtype == DType::fp8) {
    const std::int8_t fast = 1;
    STRATASIM_CUDA_CHECK(
        ctx, cublasLtMatmulDescSetAttribute(stored.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                            sizeof(fast)));
  }
  const auto rows = [](bool trans, std::int64_t r, std::int64_t c) { return trans ? c : r; };
  const auto cols = [](bool trans, std::int64_t r, std::int64_t c) { return trans ? r : c; };
  const auto u64 = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  STRATASIM_CUDA_CHECK(ctx,
                       cublasLtMatrixLayoutCreate(&stored.a, in, u64(rows(s.trans_a, s.m, s.k)),
                                                  u64(cols(s.trans_a, s.m, s.k)), s.lda));
  STRATASIM_CUDA_CHECK(ctx,
                       cublasLtMatrixLayoutCreate(&stored.b, in, u64(rows(s.trans_b, s.k, s.n)),
                                                  u64(cols(s.trans_b, s.k, s.n)), s.ldb));
  STRATASIM_CUDA_CHECK(ctx, cublasLtMatrixLayoutCreate(&stored.c, out, u64(s.m), u64(s.n), s.ldc));
  if (s.batch > 1) {
    const auto batch = static_cast<std::int32_t>(s.batch);
    const std::pair<cublasLtMatrixLayout_t, std::int64_t> layouts[] = {
        {stored.a, s.stride_a}, {stored.b, s.stride_b}, {stored.c, s.stride_c}};
    for (const auto& [layout, stride] : layouts) {
      STRATASIM_CUDA_CHECK(
          ctx, cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                sizeof(batch)));
      STRATASIM_CUDA_CHECK(
          ctx, cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)));
    }
  }

  cublasLtMatmulPreference_t preference = nullptr;
  STRATASIM_CUDA_CHECK(ctx, cublasLtMatmulPreferenceCreate(&preference));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = [&] {
    const std::uint64_t workspace = workspace_bytes_;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return cublasLtMatmulAlgoGetHeuristic(handle_, stored.desc, stored.a, stored.b, stored.c,
                                          stored.c, preference, 1, &result, &found);
  }();
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    std::string why = status != CUBLAS_STATUS_SUCCESS ? std::string(cublasLtGetStatusString(status))
                                                      : std::string("no algorithm found");
    if (s.dtype == DType::fp8) why += " (fp8 GEMMs need m, n and k multiples of 16)";
    throw ExecError(ctx.where() + ": cuBLASLt cannot run a GEMM of shape " + shape_text(s) +
                    ": cublasLtMatmulAlgoGetHeuristic: " + why);
  }
  stored.algo = result.algo;
  guard.armed = false;
  return plans_.emplace(key, stored).first->second;
}

void Matmuls::run(const MatmulShape& shape, const void* a, const void* b, void* d,
                  cudaStream_t stream, const CallContext& ctx) {
  const Plan& p = plan(shape, ctx);
  const float alpha = 1.0f, beta = 0.0f;
  STRATASIM_CUDA_CHECK(ctx, cublasLtMatmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.c,
                                           d, p.c, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace stratasim::exec::cuda
