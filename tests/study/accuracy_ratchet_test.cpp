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

TEST_CASE("accuracy today: end to end (190 runs: mean 11.3%, max 275.5%)") {
  // Neither of the bounds (study::kE2eMeanErrorBound 5%, every row 15%) is met by this
  // population. 190 = the 147 bf16 runs of issue 15 (mean 4.76% on their own, within 5%), the
  // 11 FP8 runs on H100 (7 llm-foundry amp_fp8, 4 NeMo 24.07 FP8: docs/precision.md), DGX
  // Cloud's Llama 3.1 8B bf16 and FP8 runs with context parallelism 2 (+7.7%, +8.3%),
  // Megatron-Bridge's Llama 3 8B FP8-CS runs on DGX H100 (-18.0%), DGX B200 (+21.8%), GB200
  // (+28.9%) and GB300 (+5.4%), and Megatron-Bridge's 26 Qwen3-30B-A3B MXFP8 pre-training runs
  // (EP 8) on DGX B200, DGX B300, GB200 and GB300 (releases 25.11 to 26.08).
  // The Qwen3 rows made the figures WORSE, honestly (before them: 164 rows, mean 5.2%, max
  // 28.9%, 139 within 10%): the same printed configuration measured 26-31k tokens/s per GPU up
  // to release 26.04.01 and 40-45k from 26.06 on (predicted +21% to +60% and -5% to -15%), and
  // DGX B200's two MBS-1 runs (9,299 and 9,691 tokens/s per GPU, a third of the same GPU at
  // MBS 4) are predicted +239% and +254%: host-bound MoE layers the cost model does not have
  // (docs/accuracy.md, "Today's figures"). Nothing is fitted to them. Since the experts' GEMMs
  // run in the recipe's FP8 class and the saved linear inputs are FP8 (as Transformer Engine
  // runs them), the Qwen3 rows of releases 26.06 and later are within -10% to +1.4%, and the
  // older releases' (and the MBS-1 runs) further off: mean 11.3% (was 10.5%), max 275.5%,
  // 146 within 10% (was 143). The bounds below are these figures rounded up; lower them as the
  // model improves.
  const auto s = all(study::AccuracyLevel::e2e);
  CHECK(s.rows >= 190);
  CHECK(s.mean_abs_error <= 0.1128);
  CHECK(s.max_abs_error <= 2.755);
  CHECK(s.within_10 >= 146);
}

TEST_CASE("accuracy today: GEMM (38 cases: all within 10%, 28 within 5%, max 9.4%)") {
  // 32 on A100, H100 and H200, and 6 on B200, B300 and GB200 (bf16 and fp8 best shapes, one
  // fitted peak fraction each: 0% by construction).
  const auto s = all(study::AccuracyLevel::gemm);
  CHECK(s.rows >= 38);
  CHECK(s.within_10 >= 38);
  CHECK(s.within_5 >= 28);
  CHECK(s.mean_abs_error <= 0.031);
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
