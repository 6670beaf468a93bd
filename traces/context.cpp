#include "traces/context.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "strategies/dlrm.hpp"
#include "strategies/lowering.hpp"
#include "strategies/rnn.hpp"

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

namespace {

// ", adam", then the framework and the gradient buffers' dtype where they are not the defaults.
std::string training_extras(const strategies::Experiment& e) {
  const strategies::ModelStateFormat f = strategies::model_state_format(e);
  std::string text = ", " + std::string(strategies::name_of(f.optimizer));
  if (e.training.framework != strategies::Framework::generic) {
    text += ", " + std::string(strategies::name_of(e.training.framework));
  }
  if (f.grad_dtype != f.dtype) text += ", " + std::string(name_of(f.grad_dtype)) + " gradients";
  return text;
}

}  // namespace

namespace {

// The transport section and the fabric's load balancing, when either differs from the default.
std::string transport_line(const strategies::Experiment& e) {
  const auto& t = e.transport;
  std::string line;
  if (t.priority != strategies::PriorityPolicy::none) {
    line = "priority " + std::string(strategies::name_of(t.priority)) + " (" +
           std::to_string(t.classes) + " classes, " +
           std::string(strategies::name_of(t.scheduling)) +
           (t.within_class == strategies::ClassOrder::fifo ? ", fifo within a class" : "") + ")";
  }
  if (t.loss_bound > 0) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", t.loss_bound);
    line += (line.empty() ? "" : ", ") + std::string("gradient loss bound ") + bound;
  }
  if (e.cluster.load_balancing == hw::LoadBalancing::spray) {
    line += (line.empty() ? "" : ", ") + std::string("per-packet spraying");
  }
  return line;
}

}  // namespace

ReportContext report_context(const strategies::Experiment& experiment) {
  const auto& cluster = experiment.cluster;
  const auto layout = strategies::layout_of(experiment);
  ReportContext context;
  context.experiment = experiment.name;
  context.samples_per_iteration = experiment.training.global_batch;
  context.tokens_per_iteration = experiment.tokens_per_iteration();
  context.iterations_to_accuracy = experiment.training.iterations_to_accuracy;
  context.device_capacity = cluster.device.memory_capacity;
  context.framework_compute = cluster.device.efficiency.framework_compute;
  context.framework_memory_traffic = cluster.device.efficiency.framework_memory_traffic;
  context.framework_attention = cluster.device.efficiency.framework_attention;
  std::string devices = std::to_string(cluster.nodes) + " x " +
                        std::to_string(cluster.devices_per_node) + " " + cluster.device.name;
  if (cluster.homogeneous()) {
    context.device_peak = cluster.device.peak(experiment.training.dtype);
  } else {
    // Mixed devices: MFU against the sum of the peaks; the setup line counts each type.
    double sum = 0;
    std::vector<std::pair<std::string, int>> counts;
    for (int r = 0; r < cluster.world_size(); ++r) {
      const auto& d = cluster.device_of(r);
      sum += d.peak(experiment.training.dtype).flops_per_second();
      auto it = std::find_if(counts.begin(), counts.end(),
                             [&](const auto& c) { return c.first == d.name; });
      if (it == counts.end()) {
        counts.emplace_back(d.name, 1);
      } else {
        ++it->second;
      }
    }
    context.device_peak = FlopRate(sum / cluster.world_size());
    devices = std::to_string(cluster.nodes) + (cluster.nodes == 1 ? " node of" : " nodes of");
    for (std::size_t i = 0; i < counts.size(); ++i) {
      devices += (i ? " +" : "") + (" " + std::to_string(counts[i].second) + " ") + counts[i].first;
    }
    int stragglers = 0;
    for (int r = 0; r < cluster.world_size(); ++r) stragglers += cluster.slowdown_of(r) != 1.0;
    if (stragglers > 0) devices += ", " + std::to_string(stragglers) + " slowed down";
  }
  for (int r = 0; r < layout.world_size(); ++r) context.stage_of_rank.push_back(layout.stage(r));
  // Parameter servers are ranks after the workers (strategies/lowering/techniques.hpp
  // ParameterServer), outside any pipeline: stage 0, so that every rank has its entry.
  context.stage_of_rank.resize(
      context.stage_of_rank.size() + static_cast<std::size_t>(experiment.parallelism.servers), 0);
  const auto& m = experiment.model;
  const auto& p = experiment.parallelism;
  // A DLRM's or an RNN's model line is its own (below); its `model` has no transformer shape.
  const std::string model_line =
      experiment.dlrm || experiment.rnn ? std::string()
      : experiment.layer_table
          ? m.name + ": layer table, " + std::to_string(m.layers) + " layers, " +
                billions(experiment.layer_table->parameters()) + " parameters"
          : m.name + ": " + std::to_string(m.layers) + " layers, hidden " +
                std::to_string(m.hidden) + ", " + std::to_string(m.heads) + " heads, " +
                billions(m.parameters()) + " parameters" +
                (m.moe ? " (" + billions(m.active_parameters()) + " active; " +
                             std::to_string(m.moe->num_experts) + " experts, top-" +
                             std::to_string(m.moe->top_k) + ")"
                       : std::string());
  std::string schedule_line = std::string(strategies::name_of(p.schedule));
  if (p.virtual_stages > 1) schedule_line += " (" + std::to_string(p.virtual_stages) + " chunks)";
  if (p.sequence_slices > 1) schedule_line += " (" + std::to_string(p.sequence_slices) + " slices)";
  if (p.tp_overlap > 1) schedule_line += ", tp overlap " + std::to_string(p.tp_overlap);
  std::string tp_text = "tp " + std::to_string(p.tp);
  const std::string ep_text =
      p.ep > 1 || p.etp > 1
          ? ", ep " + std::to_string(p.ep) + (p.etp > 1 ? " etp " + std::to_string(p.etp) : "")
          : std::string();
  if (p.tp_mode != strategies::TpMode::one_d) {
    tp_text +=
        " (" + std::string(strategies::name_of(p.tp_mode)) +
        (p.tp_mode == strategies::TpMode::two_half_d ? ", depth " + std::to_string(p.tp_depth)
                                                     : std::string()) +
        ")";
  }
  context.setup = {
      {"model", model_line},
      {"cluster",
       cluster.name + ": " + devices + " (" + with_commas(cluster.world_size()) + " devices, " +
           std::string(hw::name_of(cluster.network_model)) + " network" +
           (cluster.topology ? ", " + std::string(hw::name_of(cluster.topology->kind)) + " topology"
                             : std::string()) +
           ")"},
      {"parallelism", tp_text +
                          (p.cp > 1 ? " x cp " + std::to_string(p.cp) + " (" +
                                          std::string(strategies::name_of(p.cp_mode)) + ")"
                                    : std::string()) +
                          " x pp " + std::to_string(p.pp) + " x dp " + std::to_string(p.dp) + ", " +
                          schedule_line + ", micro batch " + std::to_string(p.micro_batch) + ", " +
                          with_commas(experiment.microbatches()) + " microbatches per pipeline" +
                          (p.sequence_parallel ? ", sequence parallel" : "") + ep_text},
      {"training",
       "global batch " + with_commas(experiment.training.global_batch) + " x " +
           with_commas(experiment.training.seq_len) + " tokens, " +
           std::string(name_of(experiment.training.dtype)) +
           (experiment.training.low_precision
                ? " with " + std::string(name_of(experiment.training.low_precision->dtype)) +
                      " linear layers (" +
                      std::string(strategies::name_of(experiment.training.low_precision->recipe)) +
                      " scaling)"
                : std::string()) +
           training_extras(experiment) +
           (experiment.training.flash_attention ? ", flash attention" : "")},
  };
  std::string memory_line =
      "ZeRO " + std::to_string(strategies::effective_zero_stage(experiment)) +
      (p.zero == 0 && strategies::distributed_optimizer(experiment) ? " (distributed optimizer)"
                                                                    : "") +
      ", recompute " + std::string(strategies::name_of(p.recompute));
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
  if (p.grad_compression.enabled()) {
    const auto kind = p.grad_compression.kind;
    memory_line += ", gradients compressed (" + std::string(strategies::name_of(kind));
    if (kind == strategies::GradCompressionKind::topk ||
        kind == strategies::GradCompressionKind::s2_reducer) {
      char density[32];
      std::snprintf(density, sizeof density, "%g", p.grad_compression.density * 100);
      memory_line += std::string(", density ") + density + "%";
    }
    memory_line += ")";
  }
  context.setup.emplace_back("memory", memory_line);
  if (const auto line = transport_line(experiment); !line.empty()) {
    context.setup.emplace_back("transport", line);
  }
  if (experiment.dlrm || experiment.rnn) {
    // Their own lines (model, parallelism, training, ...), the cluster's second.
    auto lines =
        experiment.dlrm ? strategies::dlrm_setup(experiment) : strategies::rnn_setup(experiment);
    auto cluster_line = context.setup[1];
    lines.insert(lines.begin() + (lines.empty() ? 0 : 1), std::move(cluster_line));
    context.setup = std::move(lines);
  }
  if (const auto cache = strategies::embedding_cache_figures(experiment)) {
    context.figures = {{"embedding_cache_hit_rate", cache->hit_rate},
                       {"pcie_host_to_device_bytes", static_cast<double>(cache->to_device.count())},
                       {"pcie_device_to_host_bytes", static_cast<double>(cache->to_host.count())}};
  }
  return context;
}

}  // namespace stratasim::traces
