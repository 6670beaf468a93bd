// Shared by the foreign-input fuzz targets (fuzz_deepspeed, fuzz_megatron_args, fuzz_hf_config):
// a small experiment built in memory, so that what an input maps to is also applied and checked
// by read_experiment. Only a result or config::ConfigError may come out; anything else (another
// exception, a crash, a hang) is a bug.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/experiment.hpp"

namespace stratasim::fuzz {

inline nlohmann::json small_experiment(nlohmann::json model) {
  const nlohmann::json device = {
      {"name", "fuzz-gpu"},
      {"peak_flops", {{"fp32", "19.5 TFLOP/s"}, {"fp16", "312 TFLOP/s"}, {"bf16", "312 TFLOP/s"}}},
      {"memory", {{"capacity", "80 GiB"}, {"bandwidth", "2 TB/s"}}}};
  const nlohmann::json cluster = {{"name", "fuzz-8"},
                                  {"nodes", 1},
                                  {"devices_per_node", 8},
                                  {"device", device},
                                  {"intra_node", {{"bandwidth", "300 GB/s"}, {"latency", "2 us"}}},
                                  {"inter_node", {{"bandwidth", "200 Gb/s"}, {"latency", "5 us"}}},
                                  {"host",
                                   {{"memory", {{"capacity", "1 TiB"}, {"bandwidth", "400 GB/s"}}},
                                    {"cores", 128},
                                    {"pcie", {{"bandwidth", "32 GB/s"}, {"latency", "5 us"}}}}},
                                  {"nvme", {{"capacity", "15 TB"}, {"bandwidth", "25 GB/s"}}}};
  return {{"name", "fuzz"},
          {"model", std::move(model)},
          {"cluster", cluster},
          {"parallelism", {{"tp", 1}, {"pp", 1}, {"micro_batch", 1}}},
          {"training", {{"global_batch", 16}, {"seq_len", 64}}}};
}

inline nlohmann::json small_model() {
  return {{"type", "transformer"}, {"name", "fuzz-gpt"}, {"layers", 4},
          {"hidden", 64},          {"heads", 4},         {"ffn_hidden", 256},
          {"vocab", 1000},         {"max_seq_len", 128}};
}

/// Applies `overrides` to the small experiment (model: `model`); ConfigError is an answer.
inline void apply(const std::vector<strategies::Override>& overrides,
                  nlohmann::json model = small_model()) {
  try {
    auto doc = config::Document::from_json(small_experiment(std::move(model)), "fuzz experiment");
    (void)strategies::read_experiment(doc, overrides);
  } catch (const config::ConfigError&) {
  }
}

}  // namespace stratasim::fuzz
