#include <algorithm>
#include <array>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

namespace {
constexpr OpId kNoOp = 0xFFFFFFFFu;
}  // namespace

Zero3ParameterFetch::Zero3ParameterFetch(Assembly& assembly)
    : assembly_(assembly),
      fetching_(assembly.spec.layout.dp > 1 || assembly.spec.zero.offload_params),
      hpz_(assembly.spec.zero.hpz_partition_size > 1 && assembly.spec.layout.dp > 1 &&
           assembly.spec.layout.dp % assembly.spec.zero.hpz_partition_size == 0),
      ahead_(static_cast<std::size_t>(assembly.spec.zero.prefetch_layers)),
      offload_tier_(assembly.spec.zero.nvme ? MemoryTier::nvme : MemoryTier::host),
      units_(assembly.templates.size()) {
  Program& program = assembly.program;
  const ZeroSettings& zero = assembly.spec.zero;
  for (std::size_t s = 0; s < units_.size(); ++s) {
    const StageTemplate& st = assembly.templates[s];
    Units& u = units_[s];
    const auto& units = st.plan.grad_units;
    const auto b = st.plan.backward.begin();
    const auto b_begin = static_cast<std::ptrdiff_t>(st.b_begin);
    u.forward_uses = parameter_uses(st.plan.forward, units, true);
    u.recompute_uses = parameter_uses(std::vector<Segment>(b, b + b_begin), units, true);
    u.backward_uses =
        parameter_uses(std::vector<Segment>(b + b_begin, st.plan.backward.end()), units, false);
    const bool qwz = zero.quantized_weights;
    for (const auto& unit : units) {
      u.gather_label.push_back(program.intern_label(
          (qwz ? "param all-gather (int8) " : "param all-gather ") + unit.name));
      u.fetch_label.push_back(program.intern_label("param fetch " + unit.name));
      if (hpz_) {
        u.secondary_label.push_back(program.intern_label(
            (qwz ? "param all-gather (hpz int8) " : "param all-gather (hpz) ") + unit.name));
      }
      if (qwz) {
        u.quantize_label.push_back(program.intern_label("param quantize " + unit.name));
        u.dequantize_label.push_back(program.intern_label("param dequantize " + unit.name));
        u.quantize_kernels.push_back(program.add_kernels(
            {qwz_quantize_kernel(assembly.shard_of(unit.parameters), assembly.spec.dtype)}));
        const DType dtype = assembly.spec.dtype;
        u.dequantize_kernels.push_back(program.add_kernels(
            {qwz_dequantize_kernel(unit.parameters, assembly.spec.layout.dp, dtype)}));
        if (hpz_) {
          u.secondary_dequantize_kernels.push_back(program.add_kernels(
              {qwz_dequantize_kernel(unit.parameters, zero.hpz_partition_size, dtype)}));
        }
      }
      u.fetch_kernels.push_back(
          zero.offload_params
              ? assembly.copy_kernels(assembly.shard_of(unit.parameters) * assembly.element_size,
                                      offload_tier_, MemoryTier::device, "param fetch")
              : 0);
    }
    make_params_back(u, st.shard);
  }
}

// Where the updated weights go after the step, if they are not written in place.
void Zero3ParameterFetch::make_params_back(Units& u, std::int64_t shard) {
  const ZeroSettings& zero = assembly_.spec.zero;
  Program& program = assembly_.program;
  const std::int64_t bytes = shard * assembly_.element_size;
  if (!zero.offload_params && zero.offload_optimizer) {
    u.params_back =
        assembly_.copy_kernels(bytes, MemoryTier::host, MemoryTier::device, "params back");
    u.params_back_label = program.intern_label("params to device");
    u.params_back_needed = true;
  } else if (zero.offload_params && !zero.offload_optimizer) {
    u.params_back = assembly_.copy_kernels(bytes, MemoryTier::device, offload_tier_, "params back");
    u.params_back_label = program.intern_label(zero.nvme ? "params to nvme" : "params to host");
    u.params_back_needed = true;
  } else if (zero.offload_params && zero.nvme) {
    u.params_back =
        assembly_.copy_kernels(bytes, MemoryTier::host, MemoryTier::nvme, "params back");
    u.params_back_label = program.intern_label("params to nvme");
    u.params_back_needed = true;
  }
}

const std::vector<Use>& Zero3ParameterFetch::uses_of(const Pass& pass) const {
  if (!fetching_) return no_uses_;
  const Units& u = units_[assembly_.index_of(pass.chunk, pass.microbatch)];
  switch (pass.kind) {
    case PassKind::forward:
      return u.forward_uses;
    case PassKind::recompute:
      return u.recompute_uses;
    case PassKind::backward:
      return u.backward_uses;
    case PassKind::weight:
      break;
  }
  return no_uses_;
}

OpCount Zero3ParameterFetch::count_pass(const Pass& pass) const {
  const ZeroSettings& zero = assembly_.spec.zero;
  const std::size_t gather_ops = zero.quantized_weights ? 3 : 1;  // quantise, gather, dequantise
  const std::size_t fetch_ops =
      (zero.offload_params ? 1 : 0) + (assembly_.spec.layout.dp > 1 ? gather_ops : 0);
  const std::size_t uses = uses_of(pass).size();
  return {uses * fetch_ops, (2 + fetch_ops) * uses};
}

void Zero3ParameterFetch::chunk_held(RankEmitter& rank, int chunk) {
  if (!assembly_.spec.zero.offload_params) return;
  const std::int64_t shard = rank.chunk_template(chunk).shard;
  const StateBytes state = state_bytes_per_parameter(assembly_.spec.state_format());
  rank.program.add_initial_memory(
      rank.rank, {MemoryCategory::parameters, offload_tier_, Bytes(shard * state.parameters)});
}

// The rank's uses of parameters, pass after pass, each fetched in order `ahead_` uses early.
void Zero3ParameterFetch::rank_begins(RankEmitter& rank) {
  const auto& passes = *rank.passes;
  pass_offset_.assign(passes.size() + 1, 0);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    pass_offset_[p + 1] = pass_offset_[p] + uses_of(passes[p]).size();
  }
  fetched_.assign(pass_offset_.back(), kNoOp);
  released_.assign(pass_offset_.back(), kNoOp);
  std::vector<std::int64_t> parameters;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const StageTemplate& st = assembly_.of(passes[p]);
    for (const Use& use : uses_of(passes[p])) {
      parameters.push_back(st.plan.grad_units[static_cast<std::size_t>(use.unit)].parameters);
    }
  }
  plan_waits(parameters);
  next_fetch_ = 0;
  if (fetching_) try_prefetch(rank);
}

void Zero3ParameterFetch::plan_waits(const std::vector<std::int64_t>& parameters) {
  const ZeroSettings& zero = assembly_.spec.zero;
  const auto n = static_cast<std::ptrdiff_t>(parameters.size());
  wait_.assign(parameters.size(), -1);
  for (std::ptrdiff_t j = 0; j < n; ++j) {
    std::ptrdiff_t wait = j - static_cast<std::ptrdiff_t>(ahead_) - 1;
    if (zero.prefetch_bucket_size > 0) {
      // The first current use c whose prefetch window (uses c+1 .. j-1) is under the bucket.
      std::ptrdiff_t c = j - 1;
      std::int64_t between = 0;
      while (c > 0 &&
             between + parameters[static_cast<std::size_t>(c)] < zero.prefetch_bucket_size) {
        between += parameters[static_cast<std::size_t>(c)];
        --c;
      }
      wait = c - 1;
    }
    if (zero.max_live_parameters > 0) {
      // Released up to m: uses m+1 .. j live, within the limit (j itself at least).
      std::ptrdiff_t m = j - 1;
      std::int64_t live = parameters[static_cast<std::size_t>(j)];
      while (m >= 0 && live + parameters[static_cast<std::size_t>(m)] <= zero.max_live_parameters) {
        live += parameters[static_cast<std::size_t>(m)];
        --m;
      }
      wait = std::max(wait, m);
    }
    wait_[static_cast<std::size_t>(j)] = wait;
  }
}

void Zero3ParameterFetch::emit_fetch(RankEmitter& rank) {
  const ZeroSettings& zero = assembly_.spec.zero;
  const int dp = assembly_.spec.layout.dp;
  const std::int64_t e = assembly_.element_size;
  const std::size_t j = next_fetch_++;
  const auto p = static_cast<std::size_t>(
      std::upper_bound(pass_offset_.begin(), pass_offset_.end(), j) - pass_offset_.begin() - 1);
  const Pass pass = (*rank.passes)[p];
  const StageTemplate& st = assembly_.of(pass);
  const Units& units = units_[assembly_.index_of(pass.chunk, pass.microbatch)];
  const bool forward = pass.kind == PassKind::forward || pass.kind == PassKind::recompute;
  // hpZ: recompute and backward passes gather from the secondary partition (the forward pass
  // made it), within the rank's hpZ group.
  const bool secondary = hpz_ && pass.kind != PassKind::forward;
  const Use& use = uses_of(pass)[j - pass_offset_[p]];
  const auto u = static_cast<std::size_t>(use.unit);
  const GradUnit& unit = st.plan.grad_units[u];
  // With FP8 parameter gathering the linear weights are gathered (and held) quantised.
  const Bytes full = gathered_weight_bytes(assembly_.spec.low_precision, unit.parameters,
                                           unit.low_precision_parameters, e);
  const Bytes shard(assembly_.shard_of(unit.parameters) * e);
  const auto layer = static_cast<std::int16_t>(unit.layer);
  OpInfo info{Stream::copy,
              forward ? Phase::forward : Phase::backward,
              pass.microbatch / assembly_.slices,
              layer,
              static_cast<std::int16_t>(layer < 0 ? -1 : layer + 1),
              {}};
  fetch_deps_.clear();
  if (const std::ptrdiff_t w = wait_[j];
      w >= 0 && released_[static_cast<std::size_t>(w)] != kNoOp) {
    fetch_deps_.push_back(released_[static_cast<std::size_t>(w)]);
  }
  OpId ready = 0;
  if (zero.offload_params) {
    info.label_id = units.fetch_label[u];
    const MemoryEffect alloc{dp > 1 ? shard : full, MemoryCategory::parameters, MemoryTier::device,
                             false};
    ready = rank.program.add(Compute{units.fetch_kernels[u]}, info, fetch_deps_,
                             std::span<const MemoryEffect>(&alloc, 1));
    rank.last_copy = ready;
    fetch_deps_.assign(1, ready);
  }
  if (dp > 1 && zero.quantized_weights) {
    ready = emit_quantized_gather(rank, info, units, u, unit.parameters, secondary);
  } else if (dp > 1) {
    info.stream = Stream::dp_comm;
    info.label_id = secondary ? units.secondary_label[u] : units.gather_label[u];
    const std::array<MemoryEffect, 2> fx = {
        MemoryEffect{full, MemoryCategory::parameters, MemoryTier::device, false},
        MemoryEffect{-shard, MemoryCategory::parameters, MemoryTier::device, true}};
    ready = rank.program.add(
        Collective{CollectiveKind::all_gather, assembly_.spec.dtype,
                   secondary ? assembly_.groups.hpz(rank.rank) : assembly_.groups.dp(rank.rank),
                   full},
        info, fetch_deps_, std::span<const MemoryEffect>(fx.data(), zero.offload_params ? 2 : 1));
    rank.last_dp_comm = ready;
  }
  fetched_[j] = ready;
}

// qwZ: the rank's int8 piece (its shard quantised now, or its hpZ secondary slice, kept
// quantised) all-gathered, then dequantised into the unit's parameters; all on the dp-comm
// stream (DeepSpeed quantises and dequantises on its all-gather stream).
OpId Zero3ParameterFetch::emit_quantized_gather(RankEmitter& rank, OpInfo info, const Units& units,
                                                std::size_t u, std::int64_t parameters,
                                                bool secondary) {
  const ZeroSettings& zero = assembly_.spec.zero;
  const int ranks = secondary ? zero.hpz_partition_size : assembly_.spec.layout.dp;
  const Bytes piece(zeropp_quantized_bytes((parameters + ranks - 1) / ranks, 8));
  const Bytes gathered(qwz_gathered_bytes(parameters, ranks));
  info.stream = Stream::dp_comm;
  if (!secondary) {
    info.label_id = units.quantize_label[u];
    const MemoryEffect buffer{piece, MemoryCategory::comm_buffers, MemoryTier::device, false};
    const OpId quantized = rank.program.add(Compute{units.quantize_kernels[u]}, info, fetch_deps_,
                                            std::span<const MemoryEffect>(&buffer, 1));
    fetch_deps_.assign(1, quantized);
  }
  info.label_id = secondary ? units.secondary_label[u] : units.gather_label[u];
  std::array<MemoryEffect, 3> fx{};
  std::size_t n = 0;
  fx[n++] = {gathered, MemoryCategory::comm_buffers, MemoryTier::device, false};
  if (!secondary) fx[n++] = {-piece, MemoryCategory::comm_buffers, MemoryTier::device, true};
  if (zero.offload_params) {
    fx[n++] = {-Bytes(assembly_.shard_of(parameters) * assembly_.element_size),
               MemoryCategory::parameters, MemoryTier::device, true};
  }
  const OpId gather = rank.program.add(
      Collective{CollectiveKind::all_gather, DType::fp8,
                 secondary ? assembly_.groups.hpz(rank.rank) : assembly_.groups.dp(rank.rank),
                 gathered},
      info, fetch_deps_, std::span<const MemoryEffect>(fx.data(), n));
  rank.last_dp_comm = gather;
  info.label_id = units.dequantize_label[u];
  const std::array<MemoryEffect, 2> out = {
      MemoryEffect{Bytes(parameters * assembly_.element_size), MemoryCategory::parameters,
                   MemoryTier::device, false},
      MemoryEffect{-gathered, MemoryCategory::comm_buffers, MemoryTier::device, true}};
  const std::array<OpId, 1> after = {gather};
  return rank.program.add(
      Compute{secondary ? units.secondary_dequantize_kernels[u] : units.dequantize_kernels[u]},
      info, after, out);
}

void Zero3ParameterFetch::try_prefetch(RankEmitter& rank) {
  while (next_fetch_ < fetched_.size() &&
         (wait_[next_fetch_] < 0 ||
          released_[static_cast<std::size_t>(wait_[next_fetch_])] != kNoOp)) {
    emit_fetch(rank);
  }
}

void Zero3ParameterFetch::before_segment(RankEmitter& rank, const PassState& ps,
                                         SegmentState& seg) {
  const auto& uses = uses_of(ps.pass);
  const std::size_t offset = pass_offset_[ps.index];
  for (std::size_t k = 0; k < uses.size(); ++k) {
    if (uses[k].first == seg.index) {
      while (next_fetch_ <= offset + k) emit_fetch(rank);
      seg.deps.push_back(fetched_[offset + k]);
    }
    if (uses[k].last == seg.index) {
      const auto u = static_cast<std::size_t>(uses[k].unit);
      const GradUnit& unit = ps.st->plan.grad_units[u];
      seg.effects.push_back(
          {-gathered_weight_bytes(assembly_.spec.low_precision, unit.parameters,
                                  unit.low_precision_parameters, assembly_.element_size),
           MemoryCategory::parameters, MemoryTier::device, true});
    }
  }
}

void Zero3ParameterFetch::after_segment(RankEmitter& rank, const PassState& ps,
                                        const SegmentState& seg, OpId op) {
  if (!fetching_) return;
  const auto& uses = uses_of(ps.pass);
  const std::size_t offset = pass_offset_[ps.index];
  for (std::size_t k = 0; k < uses.size(); ++k) {
    if (uses[k].last == seg.index) released_[offset + k] = op;
  }
  try_prefetch(rank);
}

void Zero3ParameterFetch::after_optimizer_step(RankEmitter& rank, std::size_t slot, OpId step) {
  const Units& u = units_[assembly_.index_of(rank.held[slot], 0)];
  if (!u.params_back_needed) return;
  // The updated shard to where the parameters live (the host writes in place).
  const ZeroSettings& zero = assembly_.spec.zero;
  OpInfo copy{Stream::copy, Phase::optimizer, -1, -1, -1, {}};
  if (zero.offload_optimizer && zero.offload_params) copy.stream = Stream::host;
  copy.label_id = u.params_back_label;
  const std::array<OpId, 1> after_step = {step};
  rank.program.add(Compute{u.params_back}, copy, after_step);
}

}  // namespace stratasim::strategies
