#include "study/partition.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "sim/cost.hpp"
#include "sim/network.hpp"
#include "strategies/recompute.hpp"
#include "strategies/schedule.hpp"

namespace stratasim::study {

using sim::AnalyticalNetwork;
using sim::DeviceCostModel;
using sim::GroupShape;
using sim::shape_of;

using namespace strategies;

namespace {

// One microbatch's forward and backward (and weight) compute time of a plan, collectives
// included, and what its forward leaves stored.
struct PlanCost {
  Time time;
  Bytes stored;
};

// Shapes of the tensor-parallel groups of tp rank 0 on each mesh axis (rows, columns and depth
// of 2D/2.5D/3D tensor parallelism are smaller groups than the whole tp group).
using AxisShapes = std::array<GroupShape, strategies::kTpAxisCount>;

// `cp_peer`: the next rank of rank 0's cp ring (a context-parallel ring step's message goes
// there).
PlanCost plan_cost(const StagePlan& plan, const DeviceCostModel& cost,
                   const AnalyticalNetwork& network, const AxisShapes& tp_shapes, int cp_peer) {
  PlanCost c;
  for (const auto* list : {&plan.forward, &plan.backward, &plan.weight}) {
    for (const Segment& s : *list) {
      if (s.compute) {
        c.time += cost.kernels_time(s.kernels);
      } else if (s.ring_step && s.axis == strategies::TpAxis::cp) {
        c.time += network.p2p_time(0, cp_peer, s.bytes);
      } else {
        c.time += network.collective_time(s.collective, tp_shapes[static_cast<std::size_t>(s.axis)],
                                          s.bytes);
      }
    }
  }
  for (const Segment& s : plan.forward) c.stored += s.activation_delta + s.checkpoint_delta;
  return c;
}

}  // namespace

PartitionProblem partition_problem(const Experiment& e) {
  const ParallelismSpec& par = e.parallelism;
  const ScheduleOptions options = schedule_options(e);
  const int p = par.pp;
  const int parts = schedule_parts(par.schedule, p, options);
  const int m = static_cast<int>(e.microbatches());
  const DeviceCostModel cost(e.cluster);
  const AnalyticalNetwork network(e.cluster);
  // Tensor-parallel ranks are consecutive (RankLayout): tp index t of the first group is rank t.
  AxisShapes tp_shape;
  const strategies::TpMesh mesh = layer_setting(e).mesh();
  for (int a = 0; a < strategies::kTpAxisCount; ++a) {
    const auto members = mesh.axis_members(static_cast<strategies::TpAxis>(a), 0);
    const std::vector<std::int32_t> ranks(members.begin(), members.end());
    tp_shape[static_cast<std::size_t>(a)] = shape_of(ranks, e.cluster);
  }
  // MoE: the ep and etp groups of stage 0's first rank (Communicators' layout: flat index
  // i = t + tp d, etp fastest, then ep).
  const auto expert_group = [&](int size, int stride) {
    std::vector<std::int32_t> ranks;
    for (int j = 0; j < size; ++j) {
      const int i = j * stride;
      ranks.push_back(layout_of(e).rank(i % par.tp, i / par.tp, 0));
    }
    return shape_of(ranks, e.cluster);
  };
  tp_shape[static_cast<std::size_t>(strategies::TpAxis::ep)] = expert_group(par.ep, par.etp);
  tp_shape[static_cast<std::size_t>(strategies::TpAxis::etp)] = expert_group(par.etp, 1);
  const int cp_peer = par.cp > 1 ? par.tp : 0;
  {  // the cp group of rank 0: cp indices are the fastest after tp (RankLayout)
    std::vector<std::int32_t> ranks;
    for (int c = 0; c < par.cp; ++c) ranks.push_back(c * par.tp);
    tp_shape[static_cast<std::size_t>(strategies::TpAxis::cp)] = shape_of(ranks, e.cluster);
  }
  {  // FP8's amax reduction group: stage 0's tp * cp * dp ranks (Communicators)
    std::vector<std::int32_t> ranks;
    for (int r = 0; r < par.tp * std::max(1, par.cp) * std::max(1, par.dp); ++r) {
      ranks.push_back(r);
    }
    tp_shape[static_cast<std::size_t>(strategies::TpAxis::amax)] = shape_of(ranks, e.cluster);
  }
  const ZeroSettings zero = zero_settings(e);
  const ModelStateFormat format = model_state_format(e);
  auto state = [&](std::int64_t parameters) {
    return device_model_states(zero, format, parameters, par.dp * par.cp).total();
  };

  PartitionProblem problem;
  problem.parts = parts;
  const int layers = e.model.layers;
  // Plans of single layers (a middle part: no embedding, no head), and of the ends alone.
  auto layer_plan = [&](int l) -> StagePlan {
    if (e.layer_table) {
      return plan_layer_table_stage(*e.layer_table, {par.micro_batch, e.training.dtype}, l, l + 1);
    }
    const std::vector<StageRecompute> recompute = recompute_plan(e);
    return context_parallel(
        plan_transformer_stage(e.model, layer_setting(e), 1, 3, l, l + 1, recompute.front()),
        context_parallel_of(e));
  };
  // A mixed cluster (or a straggler): each part's layers are priced on its own device, that of
  // tensor- and data-parallel rank 0 of the part's stage.
  const auto layout = layout_of(e);
  std::vector<DeviceCostModel> part_costs;
  if (!e.cluster.homogeneous()) {
    for (int part = 0; part < parts; ++part) {
      part_costs.emplace_back(e.cluster, layout.rank(0, 0, part_device(par.schedule, part, p)));
    }
    problem.compute_by_part.assign(static_cast<std::size_t>(parts), {});
  }
  for (int l = 0; l < layers; ++l) {
    const StagePlan plan = layer_plan(l);
    const PlanCost c = plan_cost(plan, cost, network, tp_shape, cp_peer);
    problem.layers.push_back({c.time, state(plan.parameters), c.stored, plan.boundary_bytes});
    for (std::size_t k = 0; k < part_costs.size(); ++k) {
      problem.compute_by_part[k].push_back(
          plan_cost(plan, part_costs[k], network, tp_shape, cp_peer).time);
    }
    if (!e.layer_table && !e.model.moe) {  // transformer layers are alike: price one, copy it
      for (int k = 1; k < layers; ++k) problem.layers.push_back(problem.layers.front());
      for (auto& times : problem.compute_by_part) times.assign(layers, times.front());
      break;
    }
  }
  if (!e.layer_table) {
    const LayerSetting setting = layer_setting(e);
    const StagePlan first = context_parallel(plan_transformer_stage(e.model, setting, 0, 2, 0, 0),
                                             context_parallel_of(e));
    const StagePlan last = context_parallel(
        plan_transformer_stage(e.model, setting, 1, 2, layers, layers), context_parallel_of(e));
    const PlanCost fc = plan_cost(first, part_costs.empty() ? cost : part_costs.front(), network,
                                  tp_shape, cp_peer);
    const PlanCost lc =
        plan_cost(last, part_costs.empty() ? cost : part_costs.back(), network, tp_shape, cp_peer);
    problem.first_extra = {fc.time, state(first.parameters), fc.stored, Bytes(0)};
    problem.last_extra = {lc.time, state(last.parameters), lc.stored, Bytes(0)};
  }
  // In flight per part, and the memory a part may use: the device's, shared by its parts.
  std::vector<int> parts_on_device(static_cast<std::size_t>(p), 0);
  for (int part = 0; part < parts; ++part) {
    ++parts_on_device[static_cast<std::size_t>(part_device(par.schedule, part, p))];
  }
  for (int part = 0; part < parts; ++part) {
    const int device = part_device(par.schedule, part, p);
    const Bytes capacity = e.cluster.device_of(layout.rank(0, 0, device)).memory_capacity;
    const double usable = (static_cast<double>(capacity.count()) -
                           static_cast<double>(held_back_estimate(e).count())) /
                          e.memory.fragmentation;
    problem.in_flight.push_back(microbatches_in_flight(par.schedule, p, device, m));
    problem.capacity.push_back(Bytes(static_cast<std::int64_t>(
        std::max(0.0, usable) / parts_on_device[static_cast<std::size_t>(device)])));
  }
  const bool across_nodes =
      p > 1 && e.cluster.node_of(layout.rank(0, 0, 0)) != e.cluster.node_of(layout.rank(0, 0, 1));
  const hw::LinkSpec& link = across_nodes ? e.cluster.inter_node : e.cluster.intra_node;
  problem.p2p = link.bandwidth;
  problem.p2p_latency = link.latency;
  return problem;
}

std::vector<int> partition_layers(const Experiment& e) {
  const int parts = schedule_parts(e.parallelism.schedule, e.parallelism.pp, schedule_options(e));
  if (e.parallelism.partition.kind != PartitionKind::balanced) return part_layer_counts(e, parts);
  return balanced_partition(partition_problem(e)).layers_per_part;
}

}  // namespace stratasim::study
