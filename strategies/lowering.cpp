#include "strategies/lowering.hpp"

#include <array>
#include <optional>

#include "strategies/schedule.hpp"

namespace stratasim::strategies {

RankLayout layout_of(const Experiment& e) {
  return RankLayout{e.parallelism.tp, e.parallelism.dp, e.parallelism.pp};
}

std::pair<int, int> stage_layers(int layers, int stages, int stage) {
  const int base = layers / stages, extra = layers % stages;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

LayerSetting layer_setting(const Experiment& e) {
  LayerSetting s;
  s.tp = e.parallelism.tp;
  s.sequence_parallel = e.parallelism.sequence_parallel;
  s.micro_batch = e.parallelism.micro_batch;
  s.seq_len = e.training.seq_len;
  s.dtype = e.training.dtype;
  s.flash_attention = e.training.flash_attention;
  return s;
}

StateBytes state_bytes_per_parameter(DType dtype) {
  if (dtype == DType::fp32) return {4, 4, 8};
  return {size_of(dtype), size_of(dtype), 12};
}

namespace {

// A stage's plan with its kernel lists and labels registered in the program once.
struct StageTemplate {
  struct Step {
    bool compute;
    std::uint32_t kernels;  // compute
    CollectiveKind kind;    // collective
    Bytes bytes;
    std::uint32_t label;
    std::int16_t layer_begin, layer_end;
    Bytes activation_delta;
    const std::vector<int>* grads_done;
  };
  StagePlan plan;
  std::vector<Step> forward, backward;
  std::uint32_t recv_activation, send_activation, recv_gradient, send_gradient;
  std::uint32_t optimizer_kernels;
};

std::vector<StageTemplate::Step> register_steps(Program& program,
                                                const std::vector<Segment>& segments) {
  std::vector<StageTemplate::Step> steps;
  for (const auto& s : segments) {
    steps.push_back({s.compute, s.compute ? program.add_kernels(s.kernels) : 0, s.collective,
                     s.bytes, program.intern_label(s.label),
                     static_cast<std::int16_t>(s.layer_begin),
                     static_cast<std::int16_t>(s.layer_end), s.activation_delta, &s.grads_done});
  }
  return steps;
}

}  // namespace

PipelineSpec pipeline_spec(const Experiment& e) {
  PipelineSpec spec;
  spec.layout = layout_of(e);
  spec.schedule = e.parallelism.schedule;
  spec.microbatches = static_cast<int>(e.microbatches());
  spec.dtype = e.training.dtype;
  spec.dp_bucket_size = e.parallelism.dp_bucket_size;
  spec.dp_overlap = e.parallelism.dp_overlap;
  spec.shared_embedding = e.model.tied_embeddings && spec.layout.pp > 1;
  const std::int64_t rows = (std::int64_t{e.model.vocab} + spec.layout.tp - 1) / spec.layout.tp;
  spec.embedding_sync_bytes = Bytes(rows * e.model.hidden * size_of(e.training.dtype));
  const LayerSetting setting = layer_setting(e);
  for (int s = 0; s < spec.layout.pp; ++s) {
    auto [begin, end] = stage_layers(e.model.layers, spec.layout.pp, s);
    spec.stages.push_back(plan_transformer_stage(e.model, setting, s, spec.layout.pp, begin, end));
  }
  return spec;
}

Program lower(const Experiment& e) {
  return assemble_pipeline(pipeline_spec(e));
}

Program assemble_pipeline(const PipelineSpec& spec) {
  const RankLayout layout = spec.layout;
  const int world = layout.world_size();
  const int m = spec.microbatches;
  const DType dtype = spec.dtype;
  const StateBytes state = state_bytes_per_parameter(dtype);
  if (static_cast<int>(spec.stages.size()) != layout.pp) {
    throw std::invalid_argument("assemble_pipeline: " + std::to_string(spec.stages.size()) +
                                " stage plans for " + std::to_string(layout.pp) + " stages");
  }
  Program program(world);

  // Communicator groups.
  std::vector<std::uint32_t> tp_group(static_cast<std::size_t>(world), 0);
  std::vector<std::uint32_t> dp_group(static_cast<std::size_t>(world), 0);
  std::vector<std::uint32_t> embedding_group(static_cast<std::size_t>(world), 0);
  for (int stage = 0; stage < layout.pp; ++stage) {
    for (int d = 0; d < layout.dp && layout.tp > 1; ++d) {
      std::vector<std::int32_t> ranks;
      for (int t = 0; t < layout.tp; ++t) ranks.push_back(layout.rank(t, d, stage));
      auto id = program.add_group(ranks, "tp s" + std::to_string(stage) + " d" + std::to_string(d));
      for (int r : ranks) tp_group[static_cast<std::size_t>(r)] = id;
    }
    for (int t = 0; t < layout.tp && layout.dp > 1; ++t) {
      std::vector<std::int32_t> ranks;
      for (int d = 0; d < layout.dp; ++d) ranks.push_back(layout.rank(t, d, stage));
      auto id = program.add_group(ranks, "dp s" + std::to_string(stage) + " t" + std::to_string(t));
      for (int r : ranks) dp_group[static_cast<std::size_t>(r)] = id;
    }
  }
  const bool shared_embedding = spec.shared_embedding;
  if (shared_embedding) {
    for (int d = 0; d < layout.dp; ++d) {
      for (int t = 0; t < layout.tp; ++t) {
        std::vector<std::int32_t> ranks = {layout.rank(t, d, 0), layout.rank(t, d, layout.pp - 1)};
        auto id =
            program.add_group(ranks, "embedding d" + std::to_string(d) + " t" + std::to_string(t));
        for (int r : ranks) embedding_group[static_cast<std::size_t>(r)] = id;
      }
    }
  }

  // One template per stage: kernel lists and labels registered once.
  std::vector<StageTemplate> stages(static_cast<std::size_t>(layout.pp));
  for (int s = 0; s < layout.pp; ++s) {
    auto& st = stages[static_cast<std::size_t>(s)];
    st.plan = spec.stages[static_cast<std::size_t>(s)];
    st.forward = register_steps(program, st.plan.forward);
    st.backward = register_steps(program, st.plan.backward);
    st.recv_activation = program.intern_label("recv activation");
    st.send_activation = program.intern_label("send activation");
    st.recv_gradient = program.intern_label("recv gradient");
    st.send_gradient = program.intern_label("send gradient");
    st.optimizer_kernels = program.add_kernels(
        {Kernel{OptimizerStep{st.plan.parameters, OptimizerKind::adam, dtype, false}, "adam"}});
  }
  const auto schedule = pipeline_schedule(spec.schedule, layout.pp, m);
  {
    // Room for every op up front: programs reach tens of millions of ops.
    std::size_t ops = 0, effects = 0;
    for (const auto& st : stages) {
      std::size_t per_microbatch = st.forward.size() + st.backward.size() + 4;
      std::size_t with_effects = 0;
      for (const auto* steps : {&st.forward, &st.backward}) {
        for (const auto& step : *steps) with_effects += step.activation_delta.count() != 0 ? 1 : 0;
      }
      const auto replicas =
          static_cast<std::size_t>(layout.tp) * static_cast<std::size_t>(layout.dp);
      ops +=
          replicas * (static_cast<std::size_t>(m) * per_microbatch + st.plan.grad_units.size() + 2);
      effects += replicas * static_cast<std::size_t>(m) * with_effects;
    }
    program.reserve(ops, ops, effects);
  }
  const std::uint32_t optimizer_label = program.intern_label("optimizer step");
  const std::uint32_t embedding_sync_label = program.intern_label("embedding grad all-reduce");

  std::vector<OpId> unit_done;  // per gradient unit: the op of the last backward completing it
  std::vector<OpId> deps;
  for (int r = 0; r < world; ++r) {
    program.begin_rank(r);
    const int stage = layout.stage(r);
    const StageTemplate& st = stages[static_cast<std::size_t>(stage)];
    const int t = layout.tp_index(r), d = layout.dp_index(r);
    const std::int64_t params = st.plan.parameters;
    program.add_initial_memory(
        r, {MemoryCategory::parameters, MemoryTier::device, Bytes(params * state.parameters)});
    program.add_initial_memory(
        r, {MemoryCategory::gradients, MemoryTier::device, Bytes(params * state.gradients)});
    program.add_initial_memory(
        r, {MemoryCategory::optimizer_states, MemoryTier::device, Bytes(params * state.optimizer)});

    const auto& passes = schedule[static_cast<std::size_t>(stage)];
    unit_done.assign(st.plan.grad_units.size(), 0);
    OpId last_backward = 0;
    for (std::size_t p = 0; p < passes.size(); ++p) {
      const Pass pass = passes[p];
      const bool forward = pass.kind == PassKind::forward;
      const bool final_backward = p + 1 == passes.size();
      const Phase phase = forward ? Phase::forward : Phase::backward;
      const int peer_stage = forward ? stage - 1 : stage + 1;  // where the input comes from
      const int next_stage = forward ? stage + 1 : stage - 1;  // where the output goes
      std::optional<OpId> previous;
      if (peer_stage >= 0 && peer_stage < layout.pp) {
        OpInfo info{Stream::pp_recv, phase, pass.microbatch, -1, -1, {}};
        info.label_id = forward ? st.recv_activation : st.recv_gradient;
        previous = program.add(Recv{layout.rank(t, d, peer_stage), st.plan.boundary_bytes}, info);
      }
      for (const auto& step : forward ? st.forward : st.backward) {
        OpInfo info{step.compute ? Stream::compute : Stream::tp_comm,
                    phase,
                    pass.microbatch,
                    step.layer_begin,
                    step.layer_end,
                    {}};
        info.label_id = step.label;
        deps.clear();
        if (previous) deps.push_back(*previous);
        MemoryEffect effect{step.activation_delta, MemoryCategory::activations, MemoryTier::device,
                            true};
        std::span<const MemoryEffect> effects;
        if (step.activation_delta.count() != 0) effects = std::span<const MemoryEffect>(&effect, 1);
        Work work = step.compute
                        ? Work(Compute{step.kernels})
                        : Work(Collective{step.kind, dtype, tp_group[static_cast<std::size_t>(r)],
                                          step.bytes});
        previous = program.add(work, info, deps, effects);
        if (final_backward && step.compute) {
          for (int unit : *step.grads_done) unit_done[static_cast<std::size_t>(unit)] = *previous;
        }
      }
      if (!forward) last_backward = *previous;
      if (next_stage >= 0 && next_stage < layout.pp) {
        OpInfo info{Stream::pp_send, phase, pass.microbatch, -1, -1, {}};
        info.label_id = forward ? st.send_activation : st.send_gradient;
        std::array<OpId, 1> dep = {*previous};
        program.add(Send{layout.rank(t, d, next_stage), st.plan.boundary_bytes}, info, dep);
      }
    }

    // Data-parallel gradient all-reduce in buckets, each launched once the last microbatch's
    // backward has produced all of its gradients (DDP / Megatron overlap_grad_reduce).
    std::optional<OpId> last_sync;
    if (layout.dp > 1) {
      const std::int64_t bucket_target = spec.dp_bucket_size.count();
      std::int64_t bucket_params = 0;
      int bucket_index = 0;
      for (std::size_t u = 0; u < st.plan.grad_units.size(); ++u) {
        bucket_params += st.plan.grad_units[u].parameters;
        const bool last_unit = u + 1 == st.plan.grad_units.size();
        if (bucket_params * size_of(dtype) < bucket_target && !last_unit) continue;
        const std::string label = "dp grad all-reduce bucket " + std::to_string(bucket_index++);
        OpInfo info{Stream::dp_comm, Phase::other, -1, -1, -1, label};
        std::array<OpId, 1> dep = {spec.dp_overlap ? unit_done[u] : last_backward};
        last_sync = program.add(
            Collective{CollectiveKind::all_reduce, dtype, dp_group[static_cast<std::size_t>(r)],
                       Bytes(bucket_params * size_of(dtype))},
            info, dep);
        bucket_params = 0;
      }
    }
    if (shared_embedding && (stage == 0 || stage == layout.pp - 1)) {
      OpInfo info{Stream::dp_comm, Phase::other, -1, -1, -1, {}};
      info.label_id = embedding_sync_label;
      std::array<OpId, 1> dep = {last_backward};
      last_sync = program.add(
          Collective{CollectiveKind::all_reduce, dtype,
                     embedding_group[static_cast<std::size_t>(r)], spec.embedding_sync_bytes},
          info, dep);
    }
    OpInfo info{Stream::compute, Phase::optimizer, -1, -1, -1, {}};
    info.label_id = optimizer_label;
    // The step waits for the last gradient synchronisation (the dp-comm stream is in order).
    std::array<OpId, 1> sync = {last_sync.value_or(0)};
    program.add(Compute{st.optimizer_kernels}, info,
                last_sync ? std::span<const OpId>(sync) : std::span<const OpId>());
  }
  program.finish();
  return program;
}

}  // namespace stratasim::strategies
