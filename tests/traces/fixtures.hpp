// Small hand-made Programs and Timelines for the report and exporter tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <unistd.h>

#include <doctest/doctest.h>

#include "strategies/program.hpp"
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

/// A fresh, empty folder under the system's temporary folder, removed when it goes.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    path_ =
        std::filesystem::temp_directory_path() /
        ("stratasim-traces-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace stratasim::testing
