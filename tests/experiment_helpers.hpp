// Shared helpers for strategies tests: experiments built in code from shipped model files.
#pragma once

#include <fstream>

#include <nlohmann/json.hpp>

#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "test_paths.hpp"

namespace stratasim::testing {

inline hw::ClusterSpec test_cluster(int nodes, int devices_per_node) {
  hw::ClusterSpec c;
  c.name = "test";
  c.nodes = nodes;
  c.devices_per_node = devices_per_node;
  c.device = hw::load_device(configs_dir() / "hardware/devices/a100-sxm4-80gb.json");
  c.intra_node = {Bandwidth(300e9), Time::us(2)};
  c.inter_node = {Bandwidth(25e9), Time::us(5)};
  return c;
}

inline strategies::TransformerModel load_model(const std::filesystem::path& file) {
  auto doc = config::Document::load(file);
  return strategies::read_model(doc, "");
}

/// An experiment with the given strategy on a cluster of exactly tp * pp * dp devices.
inline strategies::Experiment make_experiment(const strategies::TransformerModel& model, int tp,
                                              int pp, int dp, std::int64_t global_batch,
                                              int micro_batch, int seq_len,
                                              bool sequence_parallel = false) {
  strategies::Experiment e;
  e.name = "test";
  e.model = model;
  e.cluster = test_cluster(1, tp * pp * dp);
  e.parallelism.tp = tp;
  e.parallelism.pp = pp;
  e.parallelism.dp = dp;
  e.parallelism.micro_batch = micro_batch;
  e.parallelism.sequence_parallel = sequence_parallel;
  e.training.global_batch = global_batch;
  e.training.seq_len = seq_len;
  e.training.dtype = DType::bf16;
  return e;
}

/// A GPT of Megatron-LM's family: ffn 4h, vocabulary 51200, tied embeddings, GELU, and
/// Megatron's dropout 0.1 on hidden states and attention probabilities, which Korthikanti et
/// al.'s activation formulas (sbh(34 + 5as/h)) assume.
inline strategies::TransformerModel gpt(int heads, int hidden, int layers) {
  strategies::TransformerModel m;
  m.name = "gpt";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn_hidden = 4 * hidden;
  m.vocab = 51200;
  m.tied_embeddings = true;
  m.hidden_dropout = 0.1;
  m.attention_dropout = 0.1;
  return m;
}

/// An override as the command line gives it.
inline strategies::Override cli(std::string path, nlohmann::json value) {
  return strategies::Override{path, value, "command line (" + path + ")"};
}

/// The ConfigError that loading `file` with `overrides` raises (a test failure if none).
inline config::ConfigError experiment_error(const std::filesystem::path& file,
                                            const std::vector<strategies::Override>& overrides) {
  try {
    strategies::load_experiment(file, overrides);
  } catch (const config::ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return config::ConfigError("", "", "");
}

/// The ConfigError of the default example (GPT-3 175B on 1,024 A100s) with `overrides`.
inline config::ConfigError default_experiment_error(
    const std::vector<strategies::Override>& overrides) {
  return experiment_error(configs_dir() / "experiments/gpt3-175b-a100-1024.json", overrides);
}

/// Activation bytes the forward passes of `rank` allocate on the device.
inline double forward_activations(const strategies::Program& p, int rank = 0) {
  double allocated = 0;
  for (const auto& op : p.ops_of(rank)) {
    if (op.phase != strategies::Phase::forward) continue;
    for (const auto& effect : p.effects_of(op)) {
      if (effect.category == strategies::MemoryCategory::activations &&
          effect.tier == strategies::MemoryTier::device) {
        allocated += static_cast<double>(effect.delta.count());
      }
    }
  }
  return allocated;
}

inline nlohmann::json reference_case(const std::string& id) {
  std::ifstream in(reference_file());
  REQUIRE_MESSAGE(in.good(), "cannot read " << reference_file());
  auto all = nlohmann::json::parse(in);
  for (const auto& c : all["cases"]) {
    if (c["id"] == id) return c;
  }
  FAIL("no reference case " << id);
  return {};
}

}  // namespace stratasim::testing
