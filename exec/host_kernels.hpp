// Naive CPU kernels for the host device (exec/host_device.hpp): each does the real arithmetic of
// its strategies::Kernel on float data (one float per element whatever the training dtype), so
// that a host run costs what the work costs on a CPU and exercises every kernel kind. They are
// correct, not fast: the host device exists to test the interpreter, not to measure hardware.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::exec::host {

/// Work size of a kernel for the host limit (kHostKernelLimit): multiply-adds of GEMMs and
/// attention, elements of elementwise and optimizer work, bytes of copies, FLOPs / 2 of roofline
/// work; 0 for measured work.
std::int64_t work_size(const strategies::Kernel& kernel);
/// Floats of scratch memory the kernel needs.
std::int64_t scratch_floats(const strategies::Kernel& kernel);

/// A rank's scratch memory: inputs filled with values in [0.5, 1.5) (never zero), reused by
/// every kernel. Grows to the largest kernel's need.
class Scratch {
 public:
  explicit Scratch(std::uint64_t seed) : seed_(seed) {}
  /// At least `floats` floats, initialised.
  std::span<float> get(std::int64_t floats);

 private:
  std::uint64_t seed_;
  std::vector<float> data_;
};

/// Runs one kernel to completion on the calling thread.
void run_kernel(const strategies::Kernel& kernel, Scratch& scratch);

/// C[m, n] = A[m, k] B[k, n], `batch` times (row-major, i-k-j order).
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, const float* a,
          const float* b, float* c);
/// softmax(Q K^T / sqrt(d)) V for each (batch, head); causal masks keys after the query (with
/// seq_kv >= seq_q, query i sees keys up to i + seq_kv - seq_q). Q, O: [bh, seq_q, d]; K, V:
/// [bh, seq_kv, d]; probs: [seq_q, seq_kv] scratch.
void attention_forward(std::int64_t bh, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t d,
                       bool causal, const float* q, const float* k, const float* v, float* o,
                       float* probs);
/// One Adam step over n parameters (lr 1e-4, betas 0.9 / 0.999, eps 1e-8, step 1).
void adam(std::int64_t n, float* w, const float* g, float* m, float* v);

}  // namespace stratasim::exec::host
