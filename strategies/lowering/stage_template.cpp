#include "strategies/lowering/stage_template.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "strategies/weight_split.hpp"

namespace stratasim::strategies {

std::vector<Use> parameter_uses(const std::vector<Segment>& steps,
                                const std::vector<GradUnit>& units, bool forward) {
  const int n = static_cast<int>(steps.size());
  int first_layer = -1, last_layer = -1;
  for (int i = 0; i < n; ++i) {
    if (steps[static_cast<std::size_t>(i)].layer_begin < 0) continue;
    if (first_layer < 0) first_layer = i;
    last_layer = i;
  }
  std::vector<Use> uses;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const GradUnit& unit = units[static_cast<std::size_t>(u)];
    const int layer = unit.layer;
    const bool embedding = unit.name == "embedding", head = unit.name == "head";
    auto touches = [&](int i) {
      const Segment& s = steps[static_cast<std::size_t>(i)];
      if (layer >= 0) return s.layer_begin <= layer && layer < s.layer_end;
      if (first_layer < 0) return true;
      if (embedding) return forward ? i <= first_layer : i >= last_layer;
      if (head) return forward ? i >= last_layer : i <= first_layer;
      return true;
    };
    Use use{u, -1, -1};
    int last_any = -1;
    for (int i = 0; i < n; ++i) {
      if (!touches(i)) continue;
      if (use.first < 0) use.first = i;
      last_any = i;
      if (steps[static_cast<std::size_t>(i)].compute) use.last = i;
    }
    if (use.first < 0) continue;
    if (use.last < 0) use.last = last_any;
    uses.push_back(use);
  }
  // Units come in backward order (head, last layer to first, embedding): ties between units
  // first touched by one merged op go in the order the pass runs them.
  std::sort(uses.begin(), uses.end(), [forward](const Use& a, const Use& b) {
    const int ua = forward ? -a.unit : a.unit, ub = forward ? -b.unit : b.unit;
    return std::tie(a.first, a.last, ua) < std::tie(b.first, b.last, ub);
  });
  return uses;
}

UnitBuckets bucket_units(const std::vector<GradUnit>& units, std::int64_t bytes_per_parameter,
                         std::int64_t limit) {
  UnitBuckets out;
  out.of_unit.assign(units.size(), 0);
  std::int64_t params = 0;
  int first = 0;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    params += units[static_cast<std::size_t>(u)].parameters;
    out.of_unit[static_cast<std::size_t>(u)] = static_cast<int>(out.buckets.size());
    if (params * bytes_per_parameter < limit && u + 1 < static_cast<int>(units.size())) continue;
    out.buckets.push_back({first, u, params, -1, -1});
    for (int v = first; v <= u; ++v) {
      const int layer = units[static_cast<std::size_t>(v)].layer;
      if (layer < 0) continue;
      UnitBucket& b = out.buckets.back();
      b.layer_begin = b.layer_begin < 0 ? layer : std::min(b.layer_begin, layer);
      b.layer_end = std::max(b.layer_end, layer + 1);
    }
    params = 0;
    first = u + 1;
  }
  return out;
}

namespace {

std::vector<TemplateStep> register_steps(Program& program, const std::vector<Segment>& segments) {
  std::vector<TemplateStep> steps;
  for (const auto& s : segments) {
    steps.push_back({s.compute, s.recompute, s.compute ? program.add_kernels(s.kernels) : 0,
                     s.collective, s.bytes, program.intern_label(s.label),
                     static_cast<std::int16_t>(s.layer_begin),
                     static_cast<std::int16_t>(s.layer_end), s.activation_delta, &s.grads_done,
                     s.checkpoint_delta, s.checkpoint_fetch});
    auto& step = steps.back();
    step.chain = s.chain;
    step.axis = s.axis;
    step.ring_step = !s.compute && s.ring_step;
    step.sms = s.sms;
    if (s.checkpoint_delta.count() > 0) {
      step.checkpoint_out = program.add_kernels({Kernel{
          Copy{s.checkpoint_delta, MemoryTier::device, MemoryTier::host}, "checkpoint.d2h"}});
    }
    if (s.checkpoint_fetch.count() > 0) {
      step.checkpoint_in = program.add_kernels({Kernel{
          Copy{s.checkpoint_fetch, MemoryTier::host, MemoryTier::device}, "checkpoint.h2d"}});
    }
  }
  return steps;
}

Schedule checked_schedule(const PipelineSpec& spec) {
  Schedule schedule =
      make_schedule(spec.schedule, spec.layout.pp, spec.microbatches, spec.schedule_options);
  const std::size_t count =
      static_cast<std::size_t>(schedule.parts) * static_cast<std::size_t>(schedule.slices);
  if (spec.stages.size() != count) {
    throw std::invalid_argument(
        "assemble_pipeline: " + std::to_string(spec.stages.size()) + " stage plans for " +
        std::to_string(schedule.parts) + " model parts" +
        (schedule.slices > 1 ? " of " + std::to_string(schedule.slices) + " slices" : ""));
  }
  return schedule;
}

}  // namespace

Assembly::Assembly(const PipelineSpec& pipeline)
    : spec(pipeline),
      schedule(checked_schedule(pipeline)),
      program(pipeline.layout.world_size() + pipeline.parameter_servers),
      groups(program, pipeline, schedule),
      templates(pipeline.stages.size()),
      slices(schedule.slices),
      element_size(size_of(pipeline.dtype)),
      grad_element_size(size_of(pipeline.grad_dtype.value_or(pipeline.dtype))),
      grad_dtype(pipeline.grad_dtype.value_or(pipeline.dtype)) {
  program.set_overlapping_iterations(schedule.overlapping_iterations);
  for (const auto& passes : schedule.passes) {
    for (const Pass& x : passes) separate_recompute |= x.kind == PassKind::recompute;
  }
  for (std::size_t s = 0; s < templates.size(); ++s) {
    auto& st = templates[s];
    st.plan = schedule.split_backward ? split_backward(spec.stages[s]) : spec.stages[s];
    st.forward = register_steps(program, st.plan.forward);
    st.backward = register_steps(program, st.plan.backward);
    st.weight = register_steps(program, st.plan.weight);
    while (st.recompute_prefix < st.plan.backward.size() &&
           st.plan.backward[st.recompute_prefix].recompute) {
      ++st.recompute_prefix;
    }
    st.b_begin = separate_recompute ? st.recompute_prefix : 0;
    st.grad_kind = st.plan.weight.empty() ? PassKind::backward : PassKind::weight;
    for (const Segment& f : st.plan.forward) st.stash += f.activation_delta + f.checkpoint_delta;
    st.recv_activation = program.intern_label("recv activation");
    st.send_activation = program.intern_label("send activation");
    st.recv_gradient = program.intern_label("recv gradient");
    st.send_gradient = program.intern_label("send gradient");
    for (const GradUnit& u : st.plan.grad_units) st.expert_parameters += u.expert_parameters;
    const std::int64_t dense = st.plan.parameters - st.expert_parameters;
    const std::int64_t edp = spec.expert_dp();
    st.shard = spec.zero.stage == 0 ? st.plan.parameters
                                    : shard_of(dense) + (st.expert_parameters + edp - 1) / edp;
  }
}

std::size_t Assembly::index_of(int chunk, int unit) const {
  const int part = schedule.part_of_chunk[static_cast<std::size_t>(chunk)];
  return static_cast<std::size_t>(part * slices + unit % slices);
}

SegmentRange Assembly::range_of(const Pass& pass) const {
  const StageTemplate& st = of(pass);
  switch (pass.kind) {
    case PassKind::forward:
      return {&st.forward, 0, st.forward.size()};
    case PassKind::recompute:
      return {&st.backward, 0, st.b_begin};
    case PassKind::backward:
      return {&st.backward, st.b_begin, st.backward.size()};
    case PassKind::weight:
      break;
  }
  return {&st.weight, 0, st.weight.size()};
}

Bytes Assembly::pipeline_message(Bytes boundary) const {
  if (!spec.pipeline_scatter_gather) return boundary;
  const std::int64_t tp = spec.layout.tp;
  return Bytes((boundary.count() + tp - 1) / tp);
}

std::int64_t Assembly::shard_of(std::int64_t parameters) const {
  const std::int64_t d = spec.zero.shard_degree(spec.state_dp());
  return d > 1 ? (parameters + d - 1) / d : parameters;
}

DeviceModelStates Assembly::model_states(const StageTemplate& st) const {
  const std::int64_t experts = st.expert_parameters;
  // The dense parameters, with the FP8 / FP4 linear weights among them (their quantised copies).
  const std::int64_t dense = st.plan.parameters - experts;
  DeviceModelStates states =
      device_model_states(spec.zero, spec.state_format(), dense, spec.state_dp(),
                          std::min(st.plan.low_precision_parameters, dense));
  if (experts > 0) {
    const DeviceModelStates e =
        device_model_states(spec.zero, spec.state_format(), experts, spec.expert_dp());
    states.parameters += e.parameters;
    states.gradients += e.gradients;
    states.optimizer += e.optimizer;
  }
  if (spec.parameter_servers > 0) states.optimizer = Bytes(0);  // the servers hold them
  return states;
}

std::vector<GradUnit> dense_units(const std::vector<GradUnit>& units) {
  std::vector<GradUnit> out = units;
  for (GradUnit& u : out) {
    u.parameters -= u.expert_parameters;
    u.expert_parameters = 0;
  }
  return out;
}

std::vector<GradUnit> expert_units(const std::vector<GradUnit>& units) {
  std::vector<GradUnit> out = units;
  for (GradUnit& u : out) u.parameters = u.expert_parameters;
  return out;
}

std::uint32_t Assembly::copy_kernels(std::int64_t bytes, MemoryTier from, MemoryTier to,
                                     std::string name) {
  return program.add_kernels({Kernel{Copy{Bytes(bytes), from, to}, std::move(name)}});
}

}  // namespace stratasim::strategies
