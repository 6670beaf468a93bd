// Checking CUDA, cuBLASLt and NCCL calls: every failure becomes an ExecError (OutOfMemoryError
// for cudaErrorMemoryAllocation) whose message names the rank, the op being issued when there is
// one (Program::describe), the call as written in the source and the library's error string.
//
//   STRATASIM_CUDA_CHECK(ctx, cudaMemcpyAsync(...));   // ctx: a CallContext
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <optional>
#include <string>

#include "exec/rank_device.hpp"
#include "strategies/program.hpp"

namespace stratasim::exec::cuda {

/// Where a call is made: the rank, and the op being issued (if any).
struct CallContext {
  int rank = -1;
  const strategies::Program* program = nullptr;
  std::optional<strategies::OpId> op;
  /// What the device's memory pools hold, for out-of-memory messages (may be empty).
  std::function<std::string()> held;

  std::string where() const {
    std::string text = rank >= 0 ? "rank " + std::to_string(rank) : std::string("CUDA device");
    if (op && program) text += ", " + program->describe(*op);
    return text;
  }
};

[[noreturn]] inline void fail_call(const CallContext& ctx, const char* call,
                                   const std::string& error, bool out_of_memory = false) {
  std::string message = ctx.where() + ": " + call + " failed: " + error;
  if (out_of_memory) {
    if (ctx.held) message += "; the memory pools hold " + ctx.held();
    throw OutOfMemoryError(message);
  }
  throw ExecError(message);
}

inline void check_call(cudaError_t status, const char* call, const CallContext& ctx) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls are not blamed
  fail_call(ctx, call,
            std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")",
            status == cudaErrorMemoryAllocation);
}

inline void check_call(cublasStatus_t status, const char* call, const CallContext& ctx) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail_call(ctx, call,
            std::string("cuBLASLt status ") + std::to_string(static_cast<int>(status)) + " (" +
                cublasLtGetStatusString(status) + ")",
            status == CUBLAS_STATUS_ALLOC_FAILED);
}

/// ncclInProgress is not a failure: nonblocking communicators return it while work proceeds
/// (the caller waits for the communicator's state).
inline void check_call(ncclResult_t status, const char* call, const CallContext& ctx) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  std::string error = ncclGetErrorString(status);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) error += ": " + std::string(last);
  fail_call(ctx, call, error);
}

}  // namespace stratasim::exec::cuda

#define STRATASIM_CUDA_CHECK(ctx, call) ::stratasim::exec::cuda::check_call((call), #call, (ctx))
