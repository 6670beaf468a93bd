// The parallelism keys of the schedule library: reading, cross-checks at the key to change, and
// what lowering does with them.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/lowering.hpp"
#include "strategies/schedule.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using stratasim::testing::cli;
using stratasim::testing::configs_dir;
using stratasim::testing::experiment_error;

namespace {

const std::filesystem::path kSmall = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";

// GPT-3 1.7B (24 layers) on one DGX A100 node: tp 2 x pp 4 x dp 1.
std::vector<Override> pipeline(std::vector<Override> more = {}) {
  std::vector<Override> o = {cli("parallelism.tp", 2), cli("parallelism.pp", 4),
                             cli("parallelism.dp", 1), cli("training.global_batch", 16)};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

void check_error(const std::vector<Override>& o, const std::string& path, const std::string& text) {
  auto e = experiment_error(kSmall, o);
  CAPTURE(e.what());
  CHECK(std::string(e.what()).find(path) != std::string::npos);
  CHECK(std::string(e.what()).find(text) != std::string::npos);
}

}  // namespace

TEST_CASE("every schedule name reads back") {
  for (ScheduleKind kind : kAllSchedules) {
    const std::string name(name_of(kind));
    CHECK(schedule_from_name(name) == kind);
    std::vector<Override> o = pipeline({cli("parallelism.schedule", name)});
    if (kind == ScheduleKind::interleaved) o.push_back(cli("parallelism.virtual_stages", 2));
    if (kind == ScheduleKind::terapipe) o.push_back(cli("parallelism.sequence_slices", 4));
    CAPTURE(name);
    const Experiment e = load_experiment(kSmall, o);
    CHECK(e.parallelism.schedule == kind);
  }
  check_error(pipeline({cli("parallelism.schedule", "zb-h3")}), "parallelism.schedule", "zb-h1");
}

TEST_CASE("schedule options and constraints are errors at the key to change") {
  // virtual_stages belongs to the interleaved schedule.
  check_error(pipeline({cli("parallelism.virtual_stages", 2)}), "parallelism.virtual_stages",
              "interleaved");
  // Megatron's interleaving needs m % p == 0: 16 / (1 * 1) = 16 microbatches on 3 stages (tp 2
  // x pp 3 does not fill 8 devices, so use pp 4 and a global batch of 6).
  check_error(pipeline({cli("parallelism.schedule", "interleaved"),
                        cli("parallelism.virtual_stages", 2), cli("training.global_batch", 6)}),
              "parallelism.schedule", "multiple of the pipeline stages (4)");
  // 24 layers cannot make 4 x 8 = 32 chunks.
  check_error(
      pipeline({cli("parallelism.schedule", "interleaved"), cli("parallelism.virtual_stages", 8)}),
      "parallelism.virtual_stages", "32 parts");
  // Chimera: even stages and microbatches; no ZeRO-3.
  check_error(pipeline({cli("parallelism.schedule", "chimera"), cli("training.global_batch", 5)}),
              "parallelism.schedule", "even");
  check_error(pipeline({cli("parallelism.schedule", "chimera"), cli("parallelism.zero", 3)}),
              "parallelism.zero", "chimera");
  // TeraPipe slices must divide the sequence; slices need terapipe.
  check_error(
      pipeline({cli("parallelism.schedule", "terapipe"), cli("parallelism.sequence_slices", 3)}),
      "parallelism.sequence_slices", "divide training.seq_len (2048)");
  check_error(pipeline({cli("parallelism.sequence_slices", 2)}), "parallelism.sequence_slices",
              "terapipe");
  // PipeDream-2BW keeps the pipeline full: m >= p.
  check_error(
      pipeline({cli("parallelism.schedule", "pipedream-2bw"), cli("training.global_batch", 2)}),
      "parallelism.schedule", "at least as many microbatches (2)");
  // tp_overlap splits the micro batch.
  check_error(pipeline({cli("parallelism.tp_overlap", 2)}), "parallelism.tp_overlap",
              "must divide parallelism.micro_batch (1)");
  // tp_comm_overlap (Megatron's --tp-comm-overlap) needs sequence parallelism, as Megatron does.
  check_error(pipeline({cli("parallelism.tp_comm_overlap", true)}), "parallelism.tp_comm_overlap",
              "set parallelism.sequence_parallel");
  check_error(
      pipeline({cli("parallelism.tp_comm_overlap", true),
                cli("parallelism.sequence_parallel", true), cli("parallelism.schedule", "zb-h1")}),
      "parallelism.tp_comm_overlap", "zb-*");
  check_error(pipeline({cli("parallelism.tp_comm_overlap", "on")}), "parallelism.tp_comm_overlap",
              "");
  // With it, the stages' plans carry the chunks: each forward reduce-scatter becomes TE's
  // pipeline of 4 chunks (num_splits), whatever tp (here 2).
  const auto with = pipeline_spec(
      load_experiment(kSmall, pipeline({cli("parallelism.tp_comm_overlap", true),
                                        cli("parallelism.sequence_parallel", true)})));
  const auto without = pipeline_spec(
      load_experiment(kSmall, pipeline({cli("parallelism.sequence_parallel", true)})));
  auto reductions = [](const PipelineSpec& spec) {
    std::size_t n = 0;
    for (const auto& s : spec.stages[1].forward) {
      n += !s.compute && s.collective == CollectiveKind::reduce_scatter ? 1 : 0;
    }
    return n;
  };
  CHECK(reductions(without) > 0);
  CHECK(reductions(with) == 4 * reductions(without));
}

TEST_CASE("partition: even, balanced or an explicit list with one entry per part") {
  const Experiment listed =
      load_experiment(kSmall, pipeline({cli("parallelism.partition", nlohmann::json{9, 7, 5, 3})}));
  CHECK(listed.parallelism.partition.kind == PartitionKind::explicit_);
  CHECK(part_layer_counts(listed, 4) == std::vector<int>{9, 7, 5, 3});
  // The lowering follows it: stage 0 holds 9 layers (+ the embedding), stage 3 three (+ head).
  const PipelineSpec spec = pipeline_spec(listed);
  REQUIRE(spec.stages.size() == 4);
  CHECK(spec.stages[0].grad_units.size() == 9 + 1);
  CHECK(spec.stages[3].grad_units.size() == 3 + 1);
  // Interleaved with 2 chunks needs 8 entries; the sum must be the 24 layers.
  check_error(
      pipeline({cli("parallelism.partition", nlohmann::json{9, 7, 5, 3}),
                cli("parallelism.schedule", "interleaved"), cli("parallelism.virtual_stages", 2)}),
      "parallelism.partition", "expected 8 positive layer counts (one per model chunk)");
  check_error(pipeline({cli("parallelism.partition", nlohmann::json{9, 7, 5, 4})}),
              "parallelism.partition",
              "summing to the model's 24 layers, got 4 entries summing "
              "to 25");
  check_error(pipeline({cli("parallelism.partition", "balance")}), "parallelism.partition",
              "did you mean \"balanced\"");
  // A balanced split needs costs, which strategies/ does not have: sim/partition prices it.
  const Experiment balanced =
      load_experiment(kSmall, pipeline({cli("parallelism.partition", "balanced")}));
  CHECK_THROWS_AS(pipeline_spec(balanced), std::invalid_argument);
}

TEST_CASE("interleaved parts: chunk c on device c mod p, layers split over p * v parts") {
  const Experiment e = load_experiment(kSmall, pipeline({cli("parallelism.schedule", "interleaved"),
                                                         cli("parallelism.virtual_stages", 2)}));
  const PipelineSpec spec = pipeline_spec(e);
  // 24 layers over 8 parts: 3 each; part 0 also has the embedding, part 7 the head.
  REQUIRE(spec.stages.size() == 8);
  for (std::size_t k = 0; k < 8; ++k) {
    CHECK(spec.stages[k].grad_units.size() == 3 + (k == 0 || k == 7 ? 1 : 0));
  }
  for (int part = 0; part < 8; ++part)
    CHECK(part_device(ScheduleKind::interleaved, part, 4) == part % 4);
  // ZB-V: the V, device d holds parts d and 2p - 1 - d.
  CHECK(part_device(ScheduleKind::zb_v, 0, 4) == 0);
  CHECK(part_device(ScheduleKind::zb_v, 7, 4) == 0);
  CHECK(part_device(ScheduleKind::zb_v, 4, 4) == 3);
}

TEST_CASE("terapipe slices attend to their prefix") {
  const Experiment e = load_experiment(kSmall, pipeline({cli("parallelism.schedule", "terapipe"),
                                                         cli("parallelism.sequence_slices", 4),
                                                         cli("training.flash_attention", true)}));
  const PipelineSpec spec = pipeline_spec(e);
  REQUIRE(spec.stages.size() == 4 * 4);  // 4 parts x 4 slices
  // Part 1, slice j: queries are the j-th 512 tokens, keys the first 512 (j + 1).
  for (int j = 0; j < 4; ++j) {
    const StagePlan& plan = spec.stages[static_cast<std::size_t>(1 * 4 + j)];
    bool found = false;
    for (const Segment& s : plan.forward) {
      for (const Kernel& k : s.kernels) {
        if (const auto* a = std::get_if<Attention>(&k.work)) {
          CHECK(a->seq_q == 512);
          CHECK(a->seq_kv == 512 * (j + 1));
          found = true;
        }
      }
    }
    CHECK(found);
  }
}

TEST_CASE("layer-table experiments: tp 1, no recomputation, no terapipe") {
  const auto vgg = configs_dir() / "experiments/vgg16-bapipe-v100-16.json";
  const Experiment e = load_experiment(vgg);
  REQUIRE(e.layer_table.has_value());
  CHECK(e.model.layers == 16);
  auto error = [&](const std::vector<Override>& o, const std::string& path) {
    auto err = experiment_error(vgg, o);
    CAPTURE(err.what());
    CHECK(std::string(err.what()).find(path) != std::string::npos);
  };
  error({cli("parallelism.tp", 2), cli("parallelism.dp", 2)}, "parallelism.tp");
  error({cli("parallelism.recompute", "full")}, "parallelism.recompute");
  error({cli("parallelism.schedule", "terapipe")}, "parallelism.schedule");
  // An explicit split becomes one layer-table plan per stage with those layers.
  const Experiment listed =
      load_experiment(vgg, {cli("parallelism.partition", nlohmann::json{4, 4, 4, 4})});
  const PipelineSpec spec = pipeline_spec(listed);
  REQUIRE(spec.stages.size() == 4);
  for (const auto& plan : spec.stages) CHECK(plan.grad_units.size() == 4);
}
