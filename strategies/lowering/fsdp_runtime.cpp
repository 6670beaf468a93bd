// FsdpRuntime: PyTorch FSDP's hooks as ops (techniques.hpp says what is issued when).
#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

namespace {

// The uses of FSDP units: the gradient units' uses merged by FSDP unit, in order of first
// segment, the root first among ties (its pre-hook runs first).
std::vector<Use> merged_uses(const std::vector<Use>& grad_uses, const std::vector<int>& unit_of,
                             int root) {
  std::map<int, Use> by_unit;
  for (const Use& u : grad_uses) {
    const int f = unit_of[static_cast<std::size_t>(u.unit)];
    auto [it, fresh] = by_unit.try_emplace(f, Use{f, u.first, u.last});
    if (!fresh) {
      it->second.first = std::min(it->second.first, u.first);
      it->second.last = std::max(it->second.last, u.last);
    }
  }
  std::vector<Use> out;
  for (const auto& [unit, use] : by_unit) out.push_back(use);
  std::stable_sort(out.begin(), out.end(), [root](const Use& a, const Use& b) {
    if (a.first != b.first) return a.first < b.first;
    return a.unit == root && b.unit != root;
  });
  return out;
}

}  // namespace

FsdpRuntime::FsdpRuntime(Assembly& assembly)
    : assembly_(assembly),
      fsdp_(*assembly.spec.fsdp),
      collectives_(assembly.spec.layout.dp > 1),
      units_(assembly.templates.size()) {
  Program& program = assembly.program;
  if (assembly.separate_recompute) {
    throw std::invalid_argument("FSDP's runtime runs recomputation inside each unit's backward");
  }
  const Time half = Time::ps(fsdp_.unit_host_time.picoseconds() / 2);
  hook_kernels_ = program.add_kernels({Kernel{Measured{half}, "fsdp_hook"}});
  pre_forward_label_ = program.intern_label("fsdp pre-forward hook");
  post_forward_label_ = program.intern_label("fsdp post-forward hook");
  pre_backward_label_ = program.intern_label("fsdp pre-backward hook");
  post_backward_label_ = program.intern_label("fsdp post-backward hook");
  for (std::size_t s = 0; s < units_.size(); ++s) {
    const StageTemplate& st = assembly.templates[s];
    if (st.grad_kind != PassKind::backward) {
      throw std::invalid_argument("FSDP's runtime needs a schedule without split backward passes");
    }
    Units& u = units_[s];
    // FSDP units: the root (index 0), then one per layer in order.
    u.units.push_back(Unit{0, -1, true});
    std::map<int, int> of_layer;
    std::vector<int> unit_of;
    for (const GradUnit& g : st.plan.grad_units) {
      int f = 0;
      if (fsdp_.wrap == FsdpWrap::block && g.layer >= 0) {
        auto [it, fresh] = of_layer.try_emplace(g.layer, static_cast<int>(u.units.size()));
        if (fresh) u.units.push_back(Unit{0, static_cast<std::int16_t>(g.layer), false});
        f = it->second;
      }
      u.units[static_cast<std::size_t>(f)].parameters += g.parameters;
      u.units[static_cast<std::size_t>(f)].low_precision_parameters += g.low_precision_parameters;
      unit_of.push_back(f);
    }
    for (Unit& unit : u.units) {
      const std::string name = unit.root ? "root" : "layer " + std::to_string(unit.layer);
      unit.gather_label = program.intern_label("fsdp all-gather " + name);
      unit.reduce_label = program.intern_label(
          (fsdp_.sharding == FsdpSharding::no_shard ? "fsdp all-reduce " : "fsdp reduce-scatter ") +
          name);
      unit.replica_label = program.intern_label("fsdp replica all-reduce " + name);
      unit.cast_label = program.intern_label("fsdp gradient cast " + name);
      const std::int64_t in = size_of(fsdp_.precision.param), out = size_of(fsdp_.precision.reduce);
      unit.cast_kernels = program.add_kernels({Kernel{
          Elementwise{unit.parameters, Bytes(unit.parameters * in), Bytes(unit.parameters * out)},
          "fsdp_grad_cast"}});
    }
    const auto b = st.plan.backward.begin();
    u.forward_uses =
        merged_uses(parameter_uses(st.plan.forward, st.plan.grad_units, true), unit_of, 0);
    u.backward_uses =
        merged_uses(parameter_uses(std::vector<Segment>(b + static_cast<std::ptrdiff_t>(st.b_begin),
                                                        st.plan.backward.end()),
                                   st.plan.grad_units, false),
                    unit_of, 0);
  }
}

const std::vector<Use>& FsdpRuntime::uses_of(const Pass& pass) const {
  static const std::vector<Use> none;
  const Units& u = units_[assembly_.index_of(pass.chunk, pass.microbatch)];
  switch (pass.kind) {
    case PassKind::forward:
      return u.forward_uses;
    case PassKind::backward:
      return u.backward_uses;
    default:
      return none;
  }
}

OpCount FsdpRuntime::count_pass(const Pass& pass) const {
  const std::size_t n = uses_of(pass).size();
  return {6 * n, 4 * n};
}

// Which uses gather and which free, following what is unsharded pass after pass.
void FsdpRuntime::rank_begins(RankEmitter& rank) {
  const auto& passes = *rank.passes;
  pass_offset_.assign(passes.size() + 1, 0);
  uses_.clear();
  frees_.clear();
  std::vector<std::vector<std::uint8_t>> unsharded(units_.size());
  for (std::size_t s = 0; s < units_.size(); ++s) unsharded[s].assign(units_[s].units.size(), 0);
  const bool sharded = fsdp_.sharding != FsdpSharding::no_shard && collectives_;
  const bool reshard_after_forward =
      fsdp_.sharding == FsdpSharding::full_shard || fsdp_.sharding == FsdpSharding::hybrid_shard;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const std::size_t s = assembly_.index_of(passes[p].chunk, passes[p].microbatch);
    const bool backward = passes[p].kind == PassKind::backward;
    for (const Use& use : uses_of(passes[p])) {
      RankUse r{s, use.unit, backward, false, false, std::nullopt};
      auto& state = unsharded[s][static_cast<std::size_t>(use.unit)];
      if (sharded) {
        r.gathers = state == 0;
        const bool root = units_[s].units[static_cast<std::size_t>(use.unit)].root;
        r.frees = backward || (reshard_after_forward && !root);
        state = r.frees ? 0 : 1;
      }
      uses_.push_back(r);
    }
    pass_offset_[p + 1] = uses_.size();
  }
}

// A host op issuing the gathers `gathers` (uses): with the rate limiter, each takes the oldest
// queued free once kFsdpInflightAllGathers are queued, and the host op waits for it.
OpId FsdpRuntime::host_op(RankEmitter& rank, std::uint32_t label, std::vector<std::size_t>& gathers,
                          const Pass& pass, int layer) {
  std::vector<OpId> deps;
  for (std::size_t j : gathers) {
    (void)j;
    if (fsdp_.limit_all_gathers && frees_.size() >= kFsdpInflightAllGathers) {
      deps.push_back(frees_.front());
      frees_.pop_front();
    }
  }
  const bool forward = pass.kind == PassKind::forward;
  OpInfo info{Stream::host,
              forward ? Phase::forward : Phase::backward,
              pass.microbatch / assembly_.slices,
              static_cast<std::int16_t>(layer),
              static_cast<std::int16_t>(layer < 0 ? -1 : layer + 1),
              {}};
  info.label_id = label;
  return rank.program.add(Compute{hook_kernels_}, info, deps);
}

void FsdpRuntime::gather_if_needed(RankEmitter& rank, std::size_t j, OpId host, const Pass& pass) {
  RankUse& use = uses_[j];
  if (!use.gathers || use.gather) return;
  const Unit& unit = units_[use.tmpl].units[static_cast<std::size_t>(use.unit)];
  const DType dtype = fsdp_.precision.param;
  // FSDP2's float8 all-gather (LowPrecisionSpec::param_gather): linear weights in FP8.
  const Bytes full = gathered_weight_bytes(assembly_.spec.low_precision, unit.parameters,
                                           unit.low_precision_parameters, size_of(dtype));
  OpInfo info{Stream::dp_comm,
              use.backward ? Phase::backward : Phase::forward,
              pass.microbatch / assembly_.slices,
              unit.layer,
              static_cast<std::int16_t>(unit.layer < 0 ? -1 : unit.layer + 1),
              {}};
  info.label_id = unit.gather_label;
  const MemoryEffect alloc{full, MemoryCategory::parameters, MemoryTier::device, false};
  const std::array<OpId, 1> deps = {host};
  use.gather = rank.program.add(
      Collective{CollectiveKind::all_gather, dtype, assembly_.groups.shard(rank.rank), full}, info,
      deps, std::span<const MemoryEffect>(&alloc, 1));
  rank.last_dp_comm = use.gather;
}

void FsdpRuntime::pre_hook(RankEmitter& rank, const PassState& ps, std::size_t j,
                           SegmentState& seg) {
  const std::size_t end = pass_offset_[ps.index + 1];
  const RankUse& use = uses_[j];
  const Unit& unit = units_[use.tmpl].units[static_cast<std::size_t>(use.unit)];
  pending_.clear();
  if (use.gathers && !use.gather) pending_.push_back(j);
  const bool prefetch = use.backward ? fsdp_.backward_prefetch == FsdpBackwardPrefetch::backward_pre
                                     : fsdp_.forward_prefetch;
  if (prefetch && j + 1 < end && uses_[j + 1].gathers && !uses_[j + 1].gather) {
    pending_.push_back(j + 1);
  }
  const OpId host = host_op(rank, use.backward ? pre_backward_label_ : pre_forward_label_, pending_,
                            ps.pass, unit.layer);
  for (std::size_t g : pending_) gather_if_needed(rank, g, host, ps.pass);
  seg.deps.push_back(host);
  if (use.gather) seg.deps.push_back(*use.gather);
  if (use.backward && use.frees) {  // the unsharded gradient, pre-allocated
    seg.effects.push_back({Bytes(unit.parameters * size_of(fsdp_.precision.param)),
                           MemoryCategory::comm_buffers, MemoryTier::device, false});
  }
}

void FsdpRuntime::reduce(RankEmitter& rank, const RankUse& use, OpId done, OpId host,
                         int microbatch) {
  if (!collectives_) return;
  const Unit& unit = units_[use.tmpl].units[static_cast<std::size_t>(use.unit)];
  const DType dtype = fsdp_.precision.reduce;
  const Bytes bytes(unit.parameters * size_of(dtype));
  OpInfo info{Stream::dp_comm,
              Phase::backward,
              microbatch,
              unit.layer,
              static_cast<std::int16_t>(unit.layer < 0 ? -1 : unit.layer + 1),
              {}};
  info.label_id = unit.reduce_label;
  const std::array<OpId, 2> deps = {done, host};
  if (fsdp_.sharding == FsdpSharding::no_shard) {
    rank.last_dp_comm = rank.program.add(
        Collective{CollectiveKind::all_reduce, dtype, assembly_.groups.dp(rank.rank), bytes}, info,
        deps);
    return;
  }
  // The unsharded gradient (param dtype) and its cast to the reduce dtype (a kernel on the
  // post-backward stream, which the reduce-scatter follows), both freed after it.
  const Bytes grad(unit.parameters * size_of(fsdp_.precision.param));
  const bool cast = dtype != fsdp_.precision.param;
  std::array<OpId, 2> rs_deps = deps;
  if (cast) {
    OpInfo c = info;
    c.label_id = unit.cast_label;
    const MemoryEffect copy{bytes, MemoryCategory::comm_buffers, MemoryTier::device, false};
    rs_deps[0] = rank.program.add(Compute{unit.cast_kernels}, c, deps,
                                  std::span<const MemoryEffect>(&copy, 1));
  }
  const MemoryEffect release{-(grad + (cast ? bytes : Bytes(0))), MemoryCategory::comm_buffers,
                             MemoryTier::device, true};
  const OpId rs = rank.program.add(
      Collective{CollectiveKind::reduce_scatter, dtype, assembly_.groups.shard(rank.rank), bytes},
      info, std::span<const OpId>(rs_deps.data(), cast ? 1 : 2),
      std::span<const MemoryEffect>(&release, 1));
  rank.last_dp_comm = rs;
  if (const auto replicate = assembly_.groups.replicate(rank.rank)) {
    info.label_id = unit.replica_label;
    const std::array<OpId, 1> after = {rs};
    rank.last_dp_comm =
        rank.program.add(Collective{CollectiveKind::all_reduce, dtype, *replicate,
                                    Bytes(assembly_.shard_of(unit.parameters) * size_of(dtype))},
                         info, after);
  }
}

void FsdpRuntime::post_hook(RankEmitter& rank, const PassState& ps, std::size_t j, OpId op) {
  const std::size_t end = pass_offset_[ps.index + 1];
  const RankUse& use = uses_[j];
  const Unit& unit = units_[use.tmpl].units[static_cast<std::size_t>(use.unit)];
  if (use.frees && fsdp_.limit_all_gathers) frees_.push_back(op);
  pending_.clear();
  if (use.backward && fsdp_.backward_prefetch == FsdpBackwardPrefetch::backward_post &&
      j + 1 < end && uses_[j + 1].gathers && !uses_[j + 1].gather) {
    pending_.push_back(j + 1);
  }
  const OpId host = host_op(rank, use.backward ? post_backward_label_ : post_forward_label_,
                            pending_, ps.pass, unit.layer);
  for (std::size_t g : pending_) gather_if_needed(rank, g, host, ps.pass);
  if (use.backward) reduce(rank, use, op, host, ps.microbatch);
}

void FsdpRuntime::before_segment(RankEmitter& rank, const PassState& ps, SegmentState& seg) {
  const auto& uses = uses_of(ps.pass);
  const std::size_t offset = pass_offset_[ps.index];
  for (std::size_t k = 0; k < uses.size(); ++k) {
    if (uses[k].first == seg.index) pre_hook(rank, ps, offset + k, seg);
  }
  for (std::size_t k = 0; k < uses.size(); ++k) {
    if (uses[k].last != seg.index || !uses_[offset + k].frees) continue;
    const Unit& unit = units_[uses_[offset + k].tmpl].units[static_cast<std::size_t>(uses[k].unit)];
    seg.effects.push_back({Bytes(-unit.parameters * size_of(fsdp_.precision.param)),
                           MemoryCategory::parameters, MemoryTier::device, true});
  }
}

void FsdpRuntime::after_segment(RankEmitter& rank, const PassState& ps, const SegmentState& seg,
                                OpId op) {
  const auto& uses = uses_of(ps.pass);
  const std::size_t offset = pass_offset_[ps.index];
  // Inner units' post-hooks before the outer ones' (the root's last).
  for (std::size_t k = uses.size(); k-- > 0;) {
    if (uses[k].last == seg.index) post_hook(rank, ps, offset + k, op);
  }
}

}  // namespace stratasim::strategies
