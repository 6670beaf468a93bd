// Context parallelism through the simulator (docs/context-parallelism.md): every mode runs to
// the end beside tensor (and sequence) parallelism, pipelines, ZeRO and recomputation; mirroring
// the data-parallel replicas (which keeps one replica's cp ranks) gives the report of the exact
// run; and splitting a long sequence over cp ranks lets a model fit that does not fit without.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "study/study.hpp"

using namespace stratasim;
using stratasim::testing::cli;

namespace {

// gpt3-1.7b (24 layers, 24 heads, 2048 tokens) on one 8-GPU DGX A100: tp 2 x cp 2 x pp 2 x dp 1.
study::Result run(const std::string& mode, std::vector<strategies::Override> extra,
                  bool exact = false) {
  std::vector<strategies::Override> o = {cli("parallelism.tp", 2),
                                         cli("parallelism.pp", 2),
                                         cli("parallelism.dp", 1),
                                         cli("parallelism.cp", 2),
                                         cli("parallelism.cp_mode", mode),
                                         cli("training.global_batch", 8),
                                         cli("training.flash_attention", true)};
  o.insert(o.end(), extra.begin(), extra.end());
  auto e =
      strategies::load_experiment(testing::configs_dir() / "experiments/gpt3-1.7b-a100-8.json", o);
  study::Options options;
  options.exact = exact;
  return study::simulate(std::move(e), options);
}

}  // namespace

TEST_CASE("context parallelism: every mode runs with tp, sp, pp, ZeRO and recomputation") {
  const std::vector<std::vector<strategies::Override>> combos = {
      {},
      {cli("parallelism.sequence_parallel", true)},
      {cli("parallelism.sequence_parallel", true), cli("parallelism.tp_comm_overlap", true)},
      {cli("parallelism.zero", 1)},
      {cli("parallelism.zero", 3)},
      {cli("parallelism.recompute", "full")},
      {cli("parallelism.schedule", "interleaved"), cli("parallelism.virtual_stages", 2)},
      {cli("parallelism.schedule", "zb-h1")},
      {cli("parallelism.tp_overlap", 2), cli("parallelism.micro_batch", 2)},
  };
  for (const char* mode : {"ring", "ulysses", "allgather"}) {
    for (std::size_t i = 0; i < combos.size(); ++i) {
      CAPTURE(mode);
      CAPTURE(i);
      const auto r = run(mode, combos[i]);
      CHECK(r.report.completed);
      CHECK(r.report.iteration_time_s > 0);
    }
  }
}

TEST_CASE("context parallelism: mirroring the replicas gives the exact run's report") {
  // tp 2 x cp 2 x pp 1 x dp 2: replica 1's cp ranks mirror replica 0's (analytical network).
  for (const char* mode : {"ring", "ulysses"}) {
    CAPTURE(mode);
    const std::vector<strategies::Override> o = {cli("parallelism.pp", 1),
                                                 cli("parallelism.dp", 2)};
    const auto mirrored = run(mode, o);
    const auto exact = run(mode, o, true);
    REQUIRE(mirrored.report.completed);
    REQUIRE(exact.report.completed);
    CHECK(mirrored.program.mirrored());
    CHECK(mirrored.report.iteration_time_s == exact.report.iteration_time_s);
    CHECK(mirrored.report.peak_memory == exact.report.peak_memory);
  }
}

TEST_CASE("context parallelism: a sequence too long for one device fits over cp ranks") {
  // Llama 3 70B at 65,536 tokens (configs/experiments/llama3-70b-h100-cp4-64k.json): tp 8,
  // pp 4, sequence parallelism; each layer stores about 34 s b h / t bytes (Korthikanti et al.,
  // with sequence parallelism, no dropout: a little less) = 34 x 65,536 x 8,192 / 8 = 2.3 GB,
  // 20 layers per stage and up to 4 microbatches in flight on stage 0: far above 80 GB without
  // cp; cp 4 stores a quarter.
  const auto path = testing::configs_dir() / "experiments/llama3-70b-h100-cp4-64k.json";
  study::Options options;
  options.stop_on_oom = true;
  const auto with_cp = study::simulate(strategies::load_experiment(path), options);
  const auto without = study::simulate(
      strategies::load_experiment(path, {cli("parallelism.cp", 1), cli("parallelism.dp", 8),
                                         cli("training.global_batch", 128)}),
      options);
  CHECK(with_cp.report.completed);
  CHECK(with_cp.report.fits);
  CHECK_FALSE(without.report.fits);
}
