// The accuracy table today, held where it stands so that it cannot get worse unnoticed. The
// issue's bounds (study/accuracy.hpp: e2e mean 5%, every row 15%, every kernel case 10%) are the
// accuracy gate of tests/accuracy/, which is not met yet and stays disabled
// (-DSTRATASIM_ACCURACY_GATE=ON runs it); these are the figures docs/accuracy.md reports, each
// rounded up. Lower them when the model improves; never raise them to pass.
#include <doctest/doctest.h>

#include <algorithm>

#include "study/accuracy.hpp"
#include "study/catalog.hpp"

using namespace stratasim;

namespace {

const study::AccuracyReport& report() {
  static const study::AccuracyReport r =
      study::accuracy(study::default_calibration_file(), {.e2e = true, .kernels = true});
  return r;
}

study::ErrorSummary all(study::AccuracyLevel level) {
  return study::summaries(report(), level).front();
}

}  // namespace

TEST_CASE("accuracy today: end to end (147 runs: mean 6.0%, max 30.7%)") {
  const auto s = all(study::AccuracyLevel::e2e);
  CHECK(s.rows >= 147);
  CHECK(s.mean_abs_error <= 0.0605);
  CHECK(s.max_abs_error <= 0.308);
  CHECK(s.within_10 >= 119);
}

TEST_CASE("accuracy today: GEMM (32 cases: 26 within 10%, 17 within 5%)") {
  const auto s = all(study::AccuracyLevel::gemm);
  CHECK(s.rows >= 32);
  CHECK(s.within_10 >= 26);
  CHECK(s.within_5 >= 17);
  CHECK(s.mean_abs_error <= 0.067);
}

TEST_CASE("accuracy today: fused attention (223 points: mean 3.0%, max 14.0%)") {
  const auto s = all(study::AccuracyLevel::attention);
  CHECK(s.rows >= 223);
  CHECK(s.mean_abs_error <= 0.030);
  CHECK(s.max_abs_error <= 0.141);
  CHECK(s.within_10 >= 220);
}
