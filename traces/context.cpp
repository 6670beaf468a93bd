#include "traces/context.hpp"

#include <sstream>

#include "strategies/lowering.hpp"

namespace stratasim::traces {

std::string with_commas(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string billions(std::int64_t params) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(params >= 10'000'000'000 ? 1 : 2);
  s << static_cast<double>(params) / 1e9 << " B";
  return s.str();
}

ReportContext report_context(const strategies::Experiment& experiment) {
  const auto& cluster = experiment.cluster;
  const auto layout = strategies::layout_of(experiment);
  ReportContext context;
  context.experiment = experiment.name;
  context.samples_per_iteration = experiment.training.global_batch;
  context.tokens_per_iteration = experiment.tokens_per_iteration();
  context.device_peak = cluster.device.peak(experiment.training.dtype);
  context.device_capacity = cluster.device.memory_capacity;
  for (int r = 0; r < layout.world_size(); ++r) context.stage_of_rank.push_back(layout.stage(r));
  const auto& m = experiment.model;
  const auto& p = experiment.parallelism;
  const std::string model_line =
      experiment.layer_table ? m.name + ": layer table, " + std::to_string(m.layers) + " layers, " +
                                   billions(experiment.layer_table->parameters()) + " parameters"
                             : m.name + ": " + std::to_string(m.layers) + " layers, hidden " +
                                   std::to_string(m.hidden) + ", " + std::to_string(m.heads) +
                                   " heads, " + billions(m.parameters()) + " parameters";
  std::string schedule_line = std::string(strategies::name_of(p.schedule));
  if (p.virtual_stages > 1) schedule_line += " (" + std::to_string(p.virtual_stages) + " chunks)";
  if (p.sequence_slices > 1) schedule_line += " (" + std::to_string(p.sequence_slices) + " slices)";
  if (p.tp_overlap > 1) schedule_line += ", tp overlap " + std::to_string(p.tp_overlap);
  context.setup = {
      {"model", model_line},
      {"cluster", cluster.name + ": " + std::to_string(cluster.nodes) + " x " +
                      std::to_string(cluster.devices_per_node) + " " + cluster.device.name + " (" +
                      with_commas(cluster.world_size()) + " devices)"},
      {"parallelism", "tp " + std::to_string(p.tp) + " x pp " + std::to_string(p.pp) + " x dp " +
                          std::to_string(p.dp) + ", " + schedule_line + ", micro batch " +
                          std::to_string(p.micro_batch) + ", " +
                          with_commas(experiment.microbatches()) + " microbatches per pipeline" +
                          (p.sequence_parallel ? ", sequence parallel" : "")},
      {"training", "global batch " + with_commas(experiment.training.global_batch) + " x " +
                       with_commas(experiment.training.seq_len) + " tokens, " +
                       std::string(name_of(experiment.training.dtype)) + ", adam" +
                       (experiment.training.flash_attention ? ", flash attention" : "")},
  };
  std::string memory_line = "ZeRO " + std::to_string(p.zero) + ", recompute " +
                            std::string(strategies::name_of(p.recompute));
  if (p.recompute == strategies::RecomputeKind::full) {
    memory_line +=
        std::string(p.recompute_method == strategies::RecomputeMethod::block ? " (block, "
                                                                             : " (uniform, ") +
        std::to_string(p.recompute_num_layers) + " layers)";
  }
  std::string offload;
  for (auto [on, name] :
       {std::pair{p.offload.optimizer, "optimizer"}, std::pair{p.offload.params, "params"},
        std::pair{p.offload.nvme, "nvme"}, std::pair{p.offload.activations, "activations"}}) {
    if (on) offload += (offload.empty() ? "" : "+") + std::string(name);
  }
  if (!offload.empty()) memory_line += ", offload " + offload;
  context.setup.emplace_back("memory", memory_line);
  return context;
}

}  // namespace stratasim::traces
