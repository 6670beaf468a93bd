#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

namespace {

// The step waits for the last gradient synchronisation (the dp-comm and copy streams run in
// order) or, with neither, for the chunk's last gradient pass.
std::vector<OpId> step_deps(const RankEmitter& rank, std::size_t slot, bool after_copies) {
  std::vector<OpId> deps;
  if (rank.last_dp_comm) deps.push_back(*rank.last_dp_comm);
  if (after_copies && rank.last_copy) deps.push_back(*rank.last_copy);
  if (deps.empty() && rank.last_backward[slot] != 0) deps.push_back(rank.last_backward[slot]);
  if (rank.step_gate) deps.push_back(*rank.step_gate);
  return deps;
}

// The plan's once-per-iteration weight quantisation (StagePlan::weight_casts): of the whole
// weights, or with FP8 parameter gathering (LowPrecisionSpec::param_gather) of the rank's
// shard, which the optimizer writes quantised before the gathers (its share of the elements
// and bytes).
std::vector<Kernel> weight_casts(const StageTemplate& st, const ModelStateFormat& format) {
  std::vector<Kernel> casts = st.plan.weight_casts;
  if (!format.low_precision || !format.low_precision->param_gather || st.plan.parameters <= 0 ||
      st.shard >= st.plan.parameters) {
    return casts;
  }
  const auto share = [&](std::int64_t v) { return v * st.shard / st.plan.parameters; };
  for (Kernel& k : casts) {
    if (auto* w = std::get_if<Elementwise>(&k.work)) {
      w->elements = share(w->elements);
      w->bytes_read = Bytes(share(w->bytes_read.count()));
      w->bytes_written = Bytes(share(w->bytes_written.count()));
    }
  }
  return casts;
}

}  // namespace

DeviceOptimizerStep::DeviceOptimizerStep(Assembly& assembly)
    : label_(assembly.program.intern_label("optimizer step")) {
  const ModelStateFormat format = assembly.spec.state_format();
  for (const StageTemplate& st : assembly.templates) {
    std::vector<Kernel> kernels = {
        Kernel{OptimizerStep{st.shard, format.optimizer, format.dtype, false,
                             size_of(format.grad_dtype) == 4 || format.fp32_grad_copy},
               std::string(name_of(format.optimizer))}};
    for (Kernel& k : weight_casts(st, format)) kernels.push_back(std::move(k));
    kernels_.push_back(assembly.program.add_kernels(std::move(kernels)));
  }
}

std::optional<OpId> DeviceOptimizerStep::optimizer_step(RankEmitter& rank, std::size_t slot) {
  OpInfo info{Stream::compute, Phase::optimizer, -1, -1, -1, {}};
  info.label_id = label_;
  const std::uint32_t kernels = kernels_[rank.assembly.index_of(rank.held[slot], 0)];
  return rank.program.add(Compute{kernels}, info, step_deps(rank, slot, false));
}

OptimizerOffload::OptimizerOffload(Assembly& assembly)
    : assembly_(assembly), label_(assembly.program.intern_label("optimizer step (host)")) {
  const bool nvme = assembly.spec.zero.nvme;
  const ModelStateFormat format = assembly.spec.state_format();
  for (const StageTemplate& st : assembly.templates) {
    Kernels k;
    k.step = assembly.program.add_kernels(
        {Kernel{OptimizerStep{st.shard, format.optimizer, format.dtype, true},
                "cpu " + std::string(name_of(format.optimizer))}});
    if (nvme) {
      const std::int64_t bytes = optimizer_state_bytes(format, st.shard).count();
      k.states_in =
          assembly.copy_kernels(bytes, MemoryTier::nvme, MemoryTier::host, "optimizer states in");
      k.states_out =
          assembly.copy_kernels(bytes, MemoryTier::host, MemoryTier::nvme, "optimizer states out");
    }
    kernels_.push_back(k);
  }
  if (nvme) {
    states_in_label_ = assembly.program.intern_label("optimizer states from nvme");
    states_out_label_ = assembly.program.intern_label("optimizer states to nvme");
  }
}

void OptimizerOffload::chunk_held(RankEmitter& rank, int chunk) {
  // fp32 gradients on the host, where the reduced buckets accumulate for the step.
  const std::int64_t shard = rank.chunk_template(chunk).shard;
  rank.program.add_initial_memory(rank.rank,
                                  {MemoryCategory::gradients, MemoryTier::host, Bytes(shard * 4)});
  rank.program.add_initial_memory(rank.rank,
                                  {MemoryCategory::optimizer_states,
                                   assembly_.spec.zero.nvme ? MemoryTier::nvme : MemoryTier::host,
                                   optimizer_state_bytes(assembly_.spec.state_format(), shard)});
}

std::optional<OpId> OptimizerOffload::optimizer_step(RankEmitter& rank, std::size_t slot) {
  const Kernels& k = kernels_[assembly_.index_of(rank.held[slot], 0)];
  std::vector<OpId> deps = step_deps(rank, slot, true);
  OpInfo info{Stream::host, Phase::optimizer, -1, -1, -1, {}};
  info.label_id = label_;
  const bool nvme = assembly_.spec.zero.nvme;
  if (nvme) {
    OpInfo read = info;
    read.label_id = states_in_label_;
    rank.program.add(Compute{k.states_in}, read, deps);
    deps.clear();  // the host stream runs in order
  }
  const OpId step = rank.program.add(Compute{k.step}, info, deps);
  if (nvme) {
    OpInfo write = info;
    write.label_id = states_out_label_;
    rank.program.add(Compute{k.states_out}, write);
  }
  return step;
}

}  // namespace stratasim::strategies
