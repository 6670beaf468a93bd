// The checks over all of a rank's gradients before its optimizer steps (fp16 loss scaling,
// gradient clipping) and the framework's host overheads: see strategies/lowering/techniques.hpp.
#include <array>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

std::vector<std::int64_t> step_gradients_per_device(const Assembly& assembly) {
  std::vector<std::int64_t> elements;
  for (int d = 0; d < assembly.spec.layout.pp; ++d) {
    std::int64_t sum = 0;
    for (int chunk : assembly.schedule.chunks_of(d)) sum += assembly.at(chunk, 0).shard;
    elements.push_back(sum);
  }
  return elements;
}

namespace {

// Bytes of one gradient element as the optimizer reads it.
std::int64_t gradient_bytes(const Assembly& assembly) {
  return state_bytes_per_parameter(assembly.spec.state_format()).gradients;
}

// An fp32 scalar all-reduced over the rank's grad-stats group, if it has one; returns the op to
// wait for next (the collective, or `after`).
OpId reduce_scalar(RankEmitter& rank, std::uint32_t label, OpId after) {
  const auto group = rank.assembly.groups.grad_stats(rank.rank);
  if (!group) return after;
  OpInfo info{Stream::dp_comm, Phase::optimizer, -1, -1, -1, {}};
  info.label_id = label;
  const std::array<OpId, 1> dep = {after};
  const OpId op = rank.program.add(
      Collective{CollectiveKind::all_reduce, DType::fp32, *group, Bytes(4)}, info, dep);
  rank.last_dp_comm = op;
  return op;
}

}  // namespace

// ---- fp16 loss scaling

LossScaleCheck::LossScaleCheck(Assembly& assembly)
    : label_(assembly.program.intern_label("loss scale unscale and check")),
      reduce_label_(assembly.program.intern_label("loss scale inf all-reduce")) {
  const std::int64_t g = gradient_bytes(assembly);
  for (std::int64_t n : step_gradients_per_device(assembly)) {
    kernels_.push_back(assembly.program.add_kernels(
        {Kernel{Elementwise{n, Bytes(n * g), Bytes(n * g + 4)}, "unscale_check"}}));
  }
}

void LossScaleCheck::before_optimizer_steps(RankEmitter& rank) {
  std::vector<OpId> deps = rank.gradients_synchronised();
  if (rank.step_gate) deps.push_back(*rank.step_gate);
  OpInfo info{Stream::compute, Phase::optimizer, -1, -1, -1, {}};
  info.label_id = label_;
  const OpId check =
      rank.program.add(Compute{kernels_[static_cast<std::size_t>(rank.device)]}, info, deps);
  rank.step_gate = reduce_scalar(rank, reduce_label_, check);
}

// ---- gradient clipping

GradientClipping::GradientClipping(Assembly& assembly)
    : norm_label_(assembly.program.intern_label("grad norm")),
      reduce_label_(assembly.program.intern_label("grad norm all-reduce")),
      scale_label_(assembly.program.intern_label("clip scale")) {
  const std::int64_t g = gradient_bytes(assembly);
  for (std::int64_t n : step_gradients_per_device(assembly)) {
    norm_.push_back(assembly.program.add_kernels(
        {Kernel{Elementwise{n, Bytes(n * g), Bytes(4)}, "grad_norm"}}));
    scale_.push_back(assembly.program.add_kernels(
        {Kernel{Elementwise{n, Bytes(n * g), Bytes(n * g)}, "clip_scale"}}));
  }
}

void GradientClipping::before_optimizer_steps(RankEmitter& rank) {
  std::vector<OpId> deps = rank.gradients_synchronised();
  if (rank.step_gate) deps.push_back(*rank.step_gate);
  const auto device = static_cast<std::size_t>(rank.device);
  OpInfo info{Stream::compute, Phase::optimizer, -1, -1, -1, {}};
  info.label_id = norm_label_;
  const OpId norm = rank.program.add(Compute{norm_[device]}, info, deps);
  const std::array<OpId, 1> reduced = {reduce_scalar(rank, reduce_label_, norm)};
  info.label_id = scale_label_;
  rank.step_gate = rank.program.add(Compute{scale_[device]}, info, reduced);
}

// ---- host overheads

HostOverhead::HostOverhead(Assembly& assembly) {
  Program& program = assembly.program;
  if (assembly.spec.step_overhead > Time::zero()) {
    step_ = program.add_kernels({Kernel{Measured{assembly.spec.step_overhead}, "step_overhead"}});
    step_label_ = program.intern_label("step overhead (host)");
  }
  if (assembly.spec.microbatch_overhead > Time::zero()) {
    microbatch_ = program.add_kernels(
        {Kernel{Measured{assembly.spec.microbatch_overhead}, "microbatch_overhead"}});
    microbatch_label_ = program.intern_label("microbatch overhead (host)");
  }
}

OpCount HostOverhead::count_pass(const Pass&) const {
  return {microbatch_ ? std::size_t{1} : 0, 0};
}

OpCount HostOverhead::count_chunk(int) const {
  return {step_ ? std::size_t{1} : 0, 0};
}

void HostOverhead::rank_begins(RankEmitter& rank) {
  pending_.reset();
  if (!step_) return;
  OpInfo info{Stream::host, Phase::other, -1, -1, -1, {}};
  info.label_id = step_label_;
  pending_ = rank.program.add(Compute{*step_}, info);
}

void HostOverhead::pass_begins(RankEmitter& rank, const PassState& ps) {
  if (!microbatch_) return;
  if (ps.pass.kind != PassKind::forward && ps.pass.kind != PassKind::backward) return;
  OpInfo info{Stream::host, Phase::other, ps.microbatch, -1, -1, {}};
  info.label_id = microbatch_label_;
  pending_ = rank.program.add(Compute{*microbatch_}, info);  // the host stream runs in order
}

void HostOverhead::before_segment(RankEmitter&, const PassState&, SegmentState& seg) {
  if (!pending_) return;
  seg.deps.push_back(*pending_);
  pending_.reset();
}

}  // namespace stratasim::strategies
