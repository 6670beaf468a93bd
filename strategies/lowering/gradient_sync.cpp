#include <algorithm>
#include <array>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

namespace {

// A gradient bucket's collective on the dp-comm stream, with the bucket's layer range, after
// the op that completes its last unit in the last gradient pass (with dp_overlap: DDP's and
// Megatron's overlap_grad_reduce) or else after the last backward op.
OpId add_bucket_collective(RankEmitter& rank, std::size_t slot, const UnitBucket& b,
                           const std::string& label, const Collective& collective) {
  OpInfo info{Stream::dp_comm,
              Phase::other,
              -1,
              static_cast<std::int16_t>(b.layer_begin),
              static_cast<std::int16_t>(b.layer_end),
              label};
  const std::array<OpId, 1> dep = {rank.assembly.spec.dp_overlap
                                       ? rank.unit_done[slot][static_cast<std::size_t>(b.last_unit)]
                                       : rank.last_backward[slot]};
  return rank.program.add(collective, info, dep);
}

}  // namespace

// ---- ZeRO stage 0: the dense all-reduce

DataParallelAllReduce::DataParallelAllReduce(Assembly& assembly) : assembly_(assembly) {
  for (const StageTemplate& st : assembly.templates) {
    buckets_.push_back(bucket_units(dense_units(st.plan.grad_units), assembly.grad_element_size,
                                    assembly.spec.dp_bucket_size.count()));
  }
}

void DataParallelAllReduce::gradients_complete(RankEmitter& rank, std::size_t slot) {
  // Each bucket launched once the last microbatch's backward has produced all of its gradients
  // (DDP / Megatron overlap_grad_reduce).
  const int chunk = rank.held[slot];
  const UnitBuckets& buckets = buckets_[assembly_.index_of(chunk, 0)];
  // The gradient buffers are what is reduced (Megatron all-reduces its fp32 main grads).
  const DType dtype = assembly_.grad_dtype;
  for (std::size_t i = 0; i < buckets.buckets.size(); ++i) {
    const UnitBucket& b = buckets.buckets[i];
    const std::string label = "dp grad all-reduce bucket " + std::to_string(i) +
                              (rank.held.size() > 1 ? " chunk " + std::to_string(chunk) : "");
    rank.last_dp_comm = add_bucket_collective(
        rank, slot, b, label,
        Collective{CollectiveKind::all_reduce, dtype, assembly_.groups.dp(rank.rank),
                   Bytes(b.parameters * assembly_.grad_element_size)});
  }
}

// ---- ZeRO stages 1 to 3: reduce-scatter buckets, post-step all-gathers

ZeroGradientSync::ZeroGradientSync(Assembly& assembly)
    : assembly_(assembly), buckets_(assembly.templates.size()) {
  const ZeroSettings& zero = assembly.spec.zero;
  const bool offload = zero.offload_optimizer;
  per_microbatch_ = zero.stage >= 2 && (assembly.spec.state_dp() > 1 || offload);
  qgz_ = zero.quantized_gradients && assembly.spec.layout.dp > 1;
  pool_ = StagingPool(assembly.spec.dp_overlap ? 2 : 1);
  const std::int64_t grad_bytes = assembly.grad_element_size;
  Program& program = assembly.program;
  for (std::size_t s = 0; s < buckets_.size(); ++s) {
    const StageTemplate& st = assembly.templates[s];
    Buckets& out = buckets_[s];
    const std::vector<GradUnit> units = dense_units(st.plan.grad_units);
    UnitBuckets reduce = bucket_units(units, 1, zero.reduce_bucket_size);
    out.of_unit = std::move(reduce.of_unit);
    for (const UnitBucket& b : reduce.buckets) {
      out.largest = std::max(out.largest, b.parameters);
      const std::string index = std::to_string(out.reduce.size());
      out.reduce.push_back(
          {b,
           offload ? assembly.copy_kernels(assembly.shard_of(b.parameters) * grad_bytes,
                                           MemoryTier::device, MemoryTier::host, "grad to host")
                   : 0,
           program.intern_label("grad reduce-scatter bucket " + index),
           program.intern_label("grad to host bucket " + index),
           {},
           {},
           {}});
      if (qgz_) {
        // ZeRO++'s qgZ: the bucket reduced by qgz_sync's steps instead of the reduce-scatter.
        Bucket& bucket = out.reduce.back();
        const int dp = assembly.spec.layout.dp, node = std::max(1, zero.node_ranks);
        bucket.qgz = qgz_sync(b.parameters, node, dp / node, assembly.grad_dtype);
        for (const SyncStep& step : bucket.qgz.steps) {
          bucket.qgz_kernels.push_back(step.compute ? program.add_kernels(step.kernels) : 0);
          bucket.qgz_labels.push_back(
              program.intern_label("grad " + step.what + " bucket " + index));
        }
      }
    }
    if (zero.stage != 1 && zero.stage != 2) continue;
    if (zero.overlap_param_gather) {
      // Megatron's buckets, in layer order; each waited for by its first forward segment.
      const UnitBuckets gather = bucket_units(units, 1, zero.allgather_bucket_size);
      std::vector<int> first(gather.buckets.size(), -1);
      for (const Use& use : parameter_uses(st.plan.forward, units, true)) {
        int& f =
            first[static_cast<std::size_t>(gather.of_unit[static_cast<std::size_t>(use.unit)])];
        if (f < 0 || use.first < f) f = use.first;
      }
      for (std::size_t i = gather.buckets.size(); i-- > 0;) {
        const std::string index = std::to_string(out.gather.size());
        std::int64_t low = 0;
        for (int u = gather.buckets[i].first_unit; u <= gather.buckets[i].last_unit; ++u) {
          low += st.plan.grad_units[static_cast<std::size_t>(u)].low_precision_parameters;
        }
        out.gather.push_back({gather.buckets[i].parameters,
                              program.intern_label("param all-gather bucket " + index), 0, 0,
                              first[i], low});
      }
      continue;
    }
    for (std::int64_t left = st.plan.parameters - st.expert_parameters; left > 0;) {
      const std::int64_t elements = std::min(left, zero.allgather_bucket_size);
      const std::string index = std::to_string(out.gather.size());
      // The linear weights' share of the bucket (buckets cut the plan's parameters evenly).
      const std::int64_t low =
          st.plan.parameters > 0 ? elements * st.plan.low_precision_parameters / st.plan.parameters
                                 : 0;
      out.gather.push_back(
          {elements, program.intern_label("param all-gather bucket " + index),
           offload ? assembly.copy_kernels(assembly.shard_of(elements) * assembly.element_size,
                                           MemoryTier::host, MemoryTier::device, "params to device")
                   : 0,
           program.intern_label("params to device bucket " + index), -1, low});
      left -= elements;
    }
  }
}

OpCount ZeroGradientSync::count_pass(const Pass& pass) const {
  if (!per_microbatch_) return {};
  const std::size_t n = buckets_[assembly_.index_of(pass.chunk, pass.microbatch)].reduce.size();
  return {ops_per_bucket() * n, (ops_per_bucket() - 1) * n};
}

OpCount ZeroGradientSync::count_chunk(int chunk) const {
  const Buckets& b = buckets_[assembly_.index_of(chunk, 0)];
  return {ops_per_bucket() * b.reduce.size() + 2 * b.gather.size(), 0};
}

// The reduction (a reduce-scatter, or qgZ's at most 5 steps) and the copy to the host.
std::size_t ZeroGradientSync::ops_per_bucket() const {
  return qgz_ ? 6 : 2;
}

// A reduce bucket: reduce-scattered over the data-parallel group and, with optimizer offload,
// its shard copied to the host; returns the last of them (after which its staging buffer is
// free).
OpId ZeroGradientSync::emit_bucket(RankEmitter& rank, const Bucket& b, OpId dep, int microbatch) {
  const bool offload = assembly_.spec.zero.offload_optimizer;
  const Bytes bytes(b.units.parameters * assembly_.grad_element_size);
  OpId last = dep;
  if (qgz_) {
    // qgZ's steps in order on the dp-comm stream (DeepSpeed's reduce stream), their collectives
    // on the node or cross-node group.
    for (std::size_t i = 0; i < b.qgz.steps.size(); ++i) {
      const SyncStep& step = b.qgz.steps[i];
      OpInfo info{Stream::dp_comm, Phase::other, microbatch, -1, -1, {}};
      info.label_id = b.qgz_labels[i];
      const MemoryEffect buffer{step.buffer_delta, MemoryCategory::comm_buffers, MemoryTier::device,
                                step.buffer_delta.count() < 0};
      const std::uint32_t group = step.group == SyncGroup::node ? assembly_.groups.node(rank.rank)
                                  : step.group == SyncGroup::cross_node
                                      ? assembly_.groups.cross_node(rank.rank)
                                      : assembly_.groups.dp(rank.rank);
      const Work work = step.compute
                            ? Work(Compute{b.qgz_kernels[i]})
                            : Work(Collective{step.collective, step.dtype, group, step.bytes});
      const std::array<OpId, 1> dep1 = {last};
      last = rank.program.add(
          work, info, dep1,
          std::span<const MemoryEffect>(&buffer, step.buffer_delta.count() != 0 ? 1 : 0));
      if (!step.compute) rank.last_dp_comm = last;
    }
    rank.last_dp_comm = last;
  } else if (assembly_.spec.state_dp() > 1) {
    OpInfo info{Stream::dp_comm, Phase::other, microbatch, -1, -1, {}};
    info.label_id = b.reduce_label;
    const std::array<OpId, 1> dep1 = {last};
    last = rank.program.add(Collective{CollectiveKind::reduce_scatter, assembly_.grad_dtype,
                                       assembly_.groups.dp(rank.rank), bytes},
                            info, dep1);
    rank.last_dp_comm = last;
  }
  if (offload) {
    OpInfo info{Stream::copy, Phase::other, microbatch, -1, -1, {}};
    info.label_id = b.copy_label;
    const std::array<OpId, 1> dep1 = {last};
    last = rank.program.add(Compute{b.copy_kernels}, info, dep1);
    rank.last_copy = last;
  }
  return last;
}

OpId ZeroGradientSync::emit_gather(RankEmitter& rank, std::int64_t elements, std::int64_t low,
                                   std::uint32_t label, std::span<const OpId> deps) {
  OpInfo gather{Stream::dp_comm, Phase::other, -1, -1, -1, {}};
  gather.label_id = label;
  return rank.program.add(
      Collective{CollectiveKind::all_gather, assembly_.spec.dtype, assembly_.groups.dp(rank.rank),
                 gathered_weight_bytes(assembly_.spec.low_precision, elements, low,
                                       assembly_.element_size)},
      gather, deps);
}

void ZeroGradientSync::rank_begins(RankEmitter& rank) {
  pool_.reset();
  gathered_.assign(rank.held.size(), {});
  forwarded_.assign(rank.held.size(), 0);
  if (assembly_.spec.zero.overlap_param_gather && assembly_.spec.state_dp() > 1) {
    // The previous iteration's updated parameters, gathered from the iteration's start.
    for (std::size_t slot = 0; slot < rank.held.size(); ++slot) {
      for (const Gather& g : buckets_[assembly_.index_of(rank.held[slot], 0)].gather) {
        gathered_[slot].push_back(emit_gather(rank, g.elements, g.low, g.label, {}));
      }
    }
  }
  if (!per_microbatch_) return;
  // The staging pool, held from the start: buffers of reduce_bucket_size elements (of the
  // largest bucket where a gradient unit makes one larger) in the gradient buffers' dtype.
  std::int64_t elements = assembly_.spec.zero.reduce_bucket_size;
  for (int chunk : rank.held) {
    elements = std::max(elements, buckets_[assembly_.index_of(chunk, 0)].largest);
  }
  rank.program.add_initial_memory(
      rank.rank, {MemoryCategory::comm_buffers, MemoryTier::device,
                  staging_bytes(pool_.buffers(), elements, assembly_.grad_element_size)});
}

void ZeroGradientSync::pass_begins(RankEmitter&, const PassState& ps) {
  const std::size_t n =
      per_microbatch_ && ps.grad_pass
          ? buckets_[assembly_.index_of(ps.pass.chunk, ps.pass.microbatch)].reduce.size()
          : 0;
  allocated_.assign(n, 0);
  emitted_.assign(n, 0);
}

bool ZeroGradientSync::reduces(const PassState& ps, const SegmentState& seg) const {
  return per_microbatch_ && ps.grad_pass && seg.step.compute;
}

void ZeroGradientSync::before_segment(RankEmitter&, const PassState& ps, SegmentState& seg) {
  const std::vector<OpId>& gathered = gathered_[ps.slot];
  if (!gathered.empty() && ps.phase == Phase::forward && !forwarded_[ps.slot]) {
    // The chunk's first forward: a segment first using a bucket's parameters waits for it.
    const auto& gather = buckets_[assembly_.index_of(ps.pass.chunk, 0)].gather;
    const auto index = static_cast<int>(ps.range.begin) + seg.index;
    for (std::size_t g = 0; g < gather.size() && g < gathered.size(); ++g) {
      if (gather[g].first_forward == index) seg.deps.push_back(gathered[g]);
    }
  }
  if (!reduces(ps, seg)) return;
  // A bucket's gradients start to exist with its first unit's.
  const Buckets& buckets = buckets_[assembly_.index_of(ps.pass.chunk, ps.pass.microbatch)];
  for (int u : *seg.step.grads_done) {
    const auto b = static_cast<std::size_t>(buckets.of_unit[static_cast<std::size_t>(u)]);
    const Bucket& bucket = buckets.reduce[b];
    if (bucket.units.first_unit != u) continue;
    // It needs a buffer of the pool: the segment waits for one to be released.
    pool_.claim(seg.deps);
    allocated_[b] = 1;
  }
}

void ZeroGradientSync::after_segment(RankEmitter& rank, const PassState& ps,
                                     const SegmentState& seg, OpId op) {
  if (!reduces(ps, seg) || !assembly_.spec.dp_overlap) return;
  const Buckets& buckets = buckets_[assembly_.index_of(ps.pass.chunk, ps.pass.microbatch)];
  for (int u : *seg.step.grads_done) {
    const auto b = static_cast<std::size_t>(buckets.of_unit[static_cast<std::size_t>(u)]);
    if (buckets.reduce[b].units.last_unit != u || !allocated_[b]) continue;
    pool_.issued(emit_bucket(rank, buckets.reduce[b], op, ps.microbatch));
    emitted_[b] = 1;
  }
}

void ZeroGradientSync::pass_ends(RankEmitter& rank, const PassState& ps, OpId last) {
  if (ps.phase == Phase::forward && !ps.grad_pass) forwarded_[ps.slot] = 1;
  if (!ps.grad_pass) return;
  // Buckets not reduced yet (no overlap, or units no step completes) go after the pass.
  const Buckets& buckets = buckets_[assembly_.index_of(ps.pass.chunk, ps.pass.microbatch)];
  for (std::size_t b = 0; b < emitted_.size(); ++b) {
    if (emitted_[b]) continue;
    const OpId release = emit_bucket(rank, buckets.reduce[b], last, ps.microbatch);
    if (allocated_[b]) pool_.issued(release);
  }
}

void ZeroGradientSync::gradients_complete(RankEmitter& rank, std::size_t slot) {
  // Stage 1: reduce-scatter (and offload) buckets once the last microbatch has produced them.
  const ZeroSettings& zero = assembly_.spec.zero;
  if (zero.stage != 1 || (assembly_.spec.state_dp() <= 1 && !zero.offload_optimizer)) return;
  for (const Bucket& b : buckets_[assembly_.index_of(rank.held[slot], 0)].reduce) {
    const OpId dep = assembly_.spec.dp_overlap
                         ? rank.unit_done[slot][static_cast<std::size_t>(b.units.last_unit)]
                         : rank.last_backward[slot];
    emit_bucket(rank, b, dep, -1);
  }
}

void ZeroGradientSync::after_optimizer_step(RankEmitter& rank, std::size_t slot, OpId step) {
  // Stages 1 and 2: the updated parameters (copied back from the host) all-gathered; with
  // overlap_param_gather, at the next iteration's start instead (rank_begins).
  if (assembly_.spec.zero.overlap_param_gather) return;
  const std::array<OpId, 1> after_step = {step};
  for (const Gather& g : buckets_[assembly_.index_of(rank.held[slot], 0)].gather) {
    std::array<OpId, 1> dep = after_step;
    if (assembly_.spec.zero.offload_optimizer) {
      OpInfo copy{Stream::copy, Phase::optimizer, -1, -1, -1, {}};
      copy.label_id = g.copy_label;
      dep[0] = rank.program.add(Compute{g.copy}, copy, after_step);
    }
    if (assembly_.spec.state_dp() > 1) emit_gather(rank, g.elements, g.low, g.label, dep);
  }
}

// ---- Mixture of experts: the routed experts' gradients over the expert-data-parallel group

ExpertGradientSync::ExpertGradientSync(Assembly& assembly) : assembly_(assembly) {
  const bool zero = assembly.spec.zero.stage >= 1;
  for (const StageTemplate& st : assembly.templates) {
    const std::vector<GradUnit> units = expert_units(st.plan.grad_units);
    buckets_.push_back(zero ? bucket_units(units, 1, assembly.spec.zero.reduce_bucket_size)
                            : bucket_units(units, assembly.grad_element_size,
                                           assembly.spec.dp_bucket_size.count()));
  }
}

void ExpertGradientSync::gradients_complete(RankEmitter& rank, std::size_t slot) {
  const std::optional<std::uint32_t> group = assembly_.groups.expert_dp(rank.rank);
  if (!group) return;
  const int chunk = rank.held[slot];
  const UnitBuckets& buckets = buckets_[assembly_.index_of(chunk, 0)];
  const bool zero = assembly_.spec.zero.stage >= 1;
  for (std::size_t i = 0; i < buckets.buckets.size(); ++i) {
    const UnitBucket& b = buckets.buckets[i];
    if (b.parameters == 0) continue;  // dense layers only
    const std::string label = std::string(zero ? "expert grad reduce-scatter bucket "
                                               : "expert grad all-reduce bucket ") +
                              std::to_string(i) +
                              (rank.held.size() > 1 ? " chunk " + std::to_string(chunk) : "");
    rank.last_dp_comm = add_bucket_collective(
        rank, slot, b, label,
        Collective{zero ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce,
                   assembly_.grad_dtype, *group,
                   Bytes(b.parameters * assembly_.grad_element_size)});
  }
}

void ExpertGradientSync::after_optimizer_step(RankEmitter& rank, std::size_t slot, OpId step) {
  const std::optional<std::uint32_t> group = assembly_.groups.expert_dp(rank.rank);
  if (!group || assembly_.spec.zero.stage == 0) return;
  const UnitBuckets& buckets = buckets_[assembly_.index_of(rank.held[slot], 0)];
  const std::array<OpId, 1> dep = {step};
  for (std::size_t i = 0; i < buckets.buckets.size(); ++i) {
    if (buckets.buckets[i].parameters == 0) continue;
    const std::string label = "expert param all-gather bucket " + std::to_string(i);
    OpInfo info{Stream::dp_comm, Phase::other, -1, -1, -1, label};
    rank.program.add(Collective{CollectiveKind::all_gather, assembly_.spec.dtype, *group,
                                Bytes(buckets.buckets[i].parameters * assembly_.element_size)},
                     info, dep);
  }
}

// ---- Tied embeddings

EmbeddingSync::EmbeddingSync(Assembly& assembly)
    : assembly_(assembly), label_(assembly.program.intern_label("embedding grad all-reduce")) {}

void EmbeddingSync::gradients_complete(RankEmitter& rank, std::size_t slot) {
  const Schedule& schedule = assembly_.schedule;
  const int part = schedule.part_of_chunk[static_cast<std::size_t>(rank.held[slot])];
  if (part != 0 && part != schedule.parts - 1) return;
  OpInfo info{Stream::dp_comm, Phase::other, -1, -1, -1, {}};
  info.label_id = label_;
  const std::array<OpId, 1> dep = {rank.last_backward[slot]};
  rank.last_dp_comm = rank.program.add(
      Collective{CollectiveKind::all_reduce, assembly_.grad_dtype,
                 assembly_.groups.embedding(rank.rank), assembly_.spec.embedding_sync_bytes},
      info, dep);
}

}  // namespace stratasim::strategies
