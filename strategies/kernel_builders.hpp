// Builders of the kernels the lowerings emit (strategies/program.hpp's Kernel), one place for
// each shape that several lowerings (transformer, MoE, RNN) build.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "strategies/program.hpp"

namespace stratasim::strategies {

/// C[m, n] = A[m, k] B[k, n], `batch` independent times, in `dtype` (tensor-scaled when FP8).
inline Kernel gemm(std::string name, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                   std::int64_t batch = 1) {
  return Kernel{Gemm{m, n, k, batch, dtype}, std::move(name)};
}

}  // namespace stratasim::strategies
