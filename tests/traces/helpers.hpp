// Small hand-made Programs and Timelines for the report and exporter tests.
#pragma once

#include <cstdint>
#include <string>

#include <doctest/doctest.h>

#include "strategies/program.hpp"
#include "temp_dir.hpp"
#include "traces/timeline.hpp"

namespace stratasim::testing {

/// Relative comparison (doctest's default Approx adds an absolute slack of about 1e-5, which
/// would hide errors in microsecond figures given in seconds).
inline doctest::Approx approx(double v) {
  return doctest::Approx(v).scale(0).epsilon(1e-9);
}

inline traces::Span span_us(int rank, strategies::Stream stream, strategies::OpId op,
                            std::int64_t start_us, std::int64_t end_us) {
  return traces::Span{rank, stream, op, Time::us(start_us), Time::us(end_us)};
}

inline strategies::Kernel gemm(std::int64_t m, std::int64_t n, std::int64_t k,
                               std::int64_t batch = 1) {
  return strategies::Kernel{strategies::Gemm{m, n, k, batch, DType::bf16}, "gemm"};
}

inline strategies::OpInfo info(strategies::Stream stream, strategies::Phase phase,
                               std::string_view label = {}, std::int32_t microbatch = -1) {
  strategies::OpInfo i;
  i.stream = stream;
  i.phase = phase;
  i.label = label;
  i.microbatch = microbatch;
  return i;
}

}  // namespace stratasim::testing
