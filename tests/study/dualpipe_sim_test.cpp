// DualPipe through the simulator (docs/schedules.md): its forward-backward pairs are lowered
// interleaved, so one pass's communication is in flight while the other computes; without the
// overlap (parallelism.dualpipe_overlap false) the same passes run one after the other. Bad
// settings are errors at their keys.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "study/study.hpp"

using namespace stratasim;
using stratasim::testing::cli;

namespace {

const auto kExample = testing::configs_dir() / "experiments/gpt3-1.7b-a100-8.json";

// gpt3-1.7b on one DGX A100: tp 2 x pp 2 x dp 2, 4 microbatches per replica (m = 2p).
std::vector<strategies::Override> dualpipe(std::vector<strategies::Override> extra = {}) {
  std::vector<strategies::Override> o = {cli("parallelism.tp", 2),
                                         cli("parallelism.pp", 2),
                                         cli("parallelism.dp", 2),
                                         cli("parallelism.schedule", "dualpipe"),
                                         cli("training.global_batch", 8),
                                         cli("training.flash_attention", true),
                                         cli("parallelism.sequence_parallel", true)};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

study::Result run(std::vector<strategies::Override> o) {
  return study::simulate(strategies::load_experiment(kExample, o));
}

}  // namespace

TEST_CASE("dualpipe: a pair's ops alternate at its communication steps, and the overlap pays") {
  const auto e = strategies::load_experiment(kExample, dualpipe());
  const strategies::Program p = study::lower(e);
  // Rank 0 (stage 0): somewhere a forward's ops are followed by another microbatch's backward
  // ops and then by the same forward's ops again: the pair is interleaved.
  bool interleaved = false;
  int forward_mb = -1, backward_mb = -1;
  for (const strategies::Op& op : p.ops_of(0)) {
    if (op.stream != strategies::Stream::compute) continue;
    if (op.phase == strategies::Phase::forward) {
      if (backward_mb >= 0 && op.microbatch == forward_mb) interleaved = true;
      if (op.microbatch != forward_mb) backward_mb = -1;
      forward_mb = op.microbatch;
    } else if (op.phase == strategies::Phase::backward && forward_mb >= 0) {
      backward_mb = op.microbatch;
    }
  }
  CHECK(interleaved);
  // The serial lowering has the same passes with no such alternation, and is slower: the
  // tensor-parallel collectives of one pass no longer hide under the other's GEMMs.
  const auto overlapped = run(dualpipe());
  const auto serial = run(dualpipe({cli("parallelism.dualpipe_overlap", false)}));
  REQUIRE(overlapped.report.completed);
  REQUIRE(serial.report.completed);
  CHECK(overlapped.report.iteration_time_s < serial.report.iteration_time_s);
  // Same work either way: the FLOPs the report counts agree.
  CHECK(overlapped.report.model_flops_per_iteration == serial.report.model_flops_per_iteration);
  // With ZeRO-1 and -2 it runs to the end too, with the states sharded over both copies.
  for (int zero : {1, 2}) {
    CAPTURE(zero);
    CHECK(run(dualpipe({cli("parallelism.zero", zero)})).report.completed);
  }
}

TEST_CASE("dualpipe: bad settings are errors at their keys") {
  using testing::experiment_error;
  // m = 2 < 2p = 4.
  CHECK(experiment_error(kExample, dualpipe({cli("training.global_batch", 4)})).path() ==
        "parallelism.schedule");
  CHECK(experiment_error(kExample, dualpipe({cli("parallelism.zero", 3)})).path() ==
        "parallelism.zero");
  CHECK(experiment_error(kExample, {cli("parallelism.dualpipe_overlap", false)}).path() ==
        "parallelism.dualpipe_overlap");
}
