// The accuracy table today, held where it stands so that it cannot get worse unnoticed. The
// issue's bounds (study/accuracy.hpp: e2e mean 5%, every row 15%, every kernel case 10%) are the
// accuracy gate of tests/accuracy/, which is not met yet and stays disabled
// (-DSTRATASIM_ACCURACY_GATE=ON runs it); these are the figures docs/accuracy.md reports, each
// rounded up. Lower them when the model improves; never raise them to pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

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

TEST_CASE("accuracy today: end to end (158 runs: mean 4.9%, max 26.7%)") {
  // The mean is within the bound (study::kE2eMeanErrorBound, 5%); the max is not.
  // 158 = the 147 bf16 runs and the 11 FP8 runs that FP8 training made expressible (7 llm-foundry
  // amp_fp8, 3 NeMo 24.07, 1 Megatron-Bridge FP8-CS: mean 7.2%, docs/precision.md); the 147
  // alone keep their 4.76%.
  const auto s = all(study::AccuracyLevel::e2e);
  CHECK(s.rows >= 158);
  CHECK(s.mean_abs_error <= 0.0493);
  CHECK(s.mean_abs_error <= study::kE2eMeanErrorBound);
  CHECK(s.max_abs_error <= 0.267);
  CHECK(s.within_10 >= 135);
}

TEST_CASE("accuracy today: GEMM (32 cases: all within 10%, 22 within 5%, max 9.4%)") {
  const auto s = all(study::AccuracyLevel::gemm);
  CHECK(s.rows >= 32);
  CHECK(s.within_10 >= 32);
  CHECK(s.within_5 >= 22);
  CHECK(s.mean_abs_error <= 0.037);
  CHECK(s.max_abs_error <= 0.094);
}

TEST_CASE("accuracy today: fused attention (223 points: mean 2.7%, max 9.3%, all within 10%)") {
  const auto s = all(study::AccuracyLevel::attention);
  CHECK(s.rows >= 223);
  CHECK(s.mean_abs_error <= 0.027);
  CHECK(s.max_abs_error <= 0.094);
  CHECK(s.within_10 >= 223);
  CHECK(s.within_5 >= 188);
}

TEST_CASE("accuracy today: collectives (128 points: mean 3.3%, max 20.6%, none beyond the bound)") {
  // The collective sweeps through the NCCL model with the fitted fabrics
  // (configs/hardware/nccl/). The bound: 10% from 1 MiB, 25% below (study::collective_bound).
  // The largest error is A3 Mega's 64 KiB point (-20.6%, within its 25%).
  const auto r =
      study::accuracy(study::default_calibration_file(), {.e2e = false, .collectives = true});
  const auto s = study::summaries(r, study::AccuracyLevel::collective).front();
  CHECK(s.rows >= 128);
  CHECK(s.mean_abs_error <= 0.033);
  CHECK(s.max_abs_error <= 0.206);
  CHECK(s.within_5 >= 100);
  CHECK(s.within_10 >= 120);
  int beyond = 0;
  for (const auto& row : r.rows) {
    if (row.level == study::AccuracyLevel::collective &&
        std::abs(row.error) > study::collective_bound(row.bytes)) {
      ++beyond;
    }
  }
  CHECK(beyond == 0);
}
