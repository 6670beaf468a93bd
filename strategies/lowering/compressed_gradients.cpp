#include <array>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

namespace {
constexpr OpId kNoOp = 0xFFFFFFFFu;
}  // namespace

CompressedGradients::CompressedGradients(Assembly& assembly)
    : assembly_(assembly), buckets_(assembly.templates.size()) {
  const PipelineSpec& spec = assembly.spec;
  for (std::size_t s = 0; s < buckets_.size(); ++s) {
    // The dense all-reduce's buckets, each synchronised by compressed_sync()'s steps.
    UnitBuckets dense = bucket_units(assembly.templates[s].plan.grad_units, assembly.element_size,
                                     spec.dp_bucket_size.count());
    Buckets& out = buckets_[s];
    out.of_unit = std::move(dense.of_unit);
    for (const UnitBucket& bucket : dense.buckets) {
      Sync b{bucket,
             compressed_sync(spec.grad_compression, bucket.parameters, assembly.groups.dp_size(),
                             spec.dtype),
             {},
             0};
      for (const SyncStep& step : b.sync.steps) {
        b.kernels.push_back(step.compute ? assembly.program.add_kernels(step.kernels) : 0);
        if (b.head == 0 && !step.compute) b.head = b.kernels.size();
      }
      out.residual += b.sync.residual;
      out.syncs.push_back(std::move(b));
    }
  }
}

OpCount CompressedGradients::count_chunk(int chunk) const {
  OpCount count;
  for (const Sync& b : buckets_[assembly_.index_of(chunk, 0)].syncs) {
    count.ops += b.sync.steps.size();
  }
  return count;
}

void CompressedGradients::chunk_held(RankEmitter& rank, int chunk) {
  const Bytes residual = buckets_[assembly_.index_of(chunk, 0)].residual;
  if (residual.count() > 0) {  // top-k's error feedback
    rank.program.add_initial_memory(rank.rank,
                                    {MemoryCategory::gradients, MemoryTier::device, residual});
  }
}

void CompressedGradients::rank_begins(RankEmitter& rank) {
  head_.assign(rank.held.size(), {});
  for (std::size_t k = 0; k < rank.held.size(); ++k) {
    head_[k].assign(buckets_[assembly_.index_of(rank.held[k], 0)].syncs.size(), kNoOp);
  }
}

namespace {
std::string suffix_of(const RankEmitter& rank, std::size_t bucket, int chunk) {
  return " bucket " + std::to_string(bucket) +
         (rank.held.size() > 1 ? " chunk " + std::to_string(chunk) : "");
}
}  // namespace

// Steps [begin, end) of a bucket's, the first waiting for `dep`; returns the last op.
OpId CompressedGradients::emit_sync(RankEmitter& rank, const Sync& b, std::size_t begin,
                                    std::size_t end, OpId dep, const std::string& suffix) {
  OpId last = dep;
  for (std::size_t i = begin; i < end; ++i) {
    const SyncStep& step = b.sync.steps[i];
    const std::string label = "dp grad " + step.what + suffix;
    OpInfo info{step.compute ? Stream::compute : Stream::dp_comm, Phase::other, -1, -1, -1, label};
    const MemoryEffect buffer{step.buffer_delta, MemoryCategory::comm_buffers, MemoryTier::device,
                              step.buffer_delta.count() < 0};
    const std::array<OpId, 1> after = {last};
    const Work work = step.compute ? Work(Compute{b.kernels[i]})
                                   : Work(Collective{step.collective, step.dtype,
                                                     assembly_.groups.dp(rank.rank), step.bytes});
    last = rank.program.add(
        work, info, after,
        std::span<const MemoryEffect>(&buffer, step.buffer_delta.count() != 0 ? 1 : 0));
    if (!step.compute) rank.last_dp_comm = last;
  }
  return last;
}

void CompressedGradients::after_segment(RankEmitter& rank, const PassState& ps,
                                        const SegmentState& seg, OpId op) {
  if (!assembly_.spec.dp_overlap || !ps.final_grad_pass || !seg.step.compute) return;
  // A bucket complete: compress it and start its first collective right away.
  const Buckets& buckets = buckets_[assembly_.index_of(ps.pass.chunk, ps.pass.microbatch)];
  for (int u : *seg.step.grads_done) {
    const auto b = static_cast<std::size_t>(buckets.of_unit[static_cast<std::size_t>(u)]);
    const Sync& sync = buckets.syncs[b];
    if (sync.bucket.last_unit != u || head_[ps.slot][b] != kNoOp) continue;
    head_[ps.slot][b] = emit_sync(rank, sync, 0, sync.head, op, suffix_of(rank, b, ps.pass.chunk));
  }
}

void CompressedGradients::gradients_complete(RankEmitter& rank, std::size_t slot) {
  // What the backward has not issued yet, then the rest in order.
  const int chunk = rank.held[slot];
  const Buckets& buckets = buckets_[assembly_.index_of(chunk, 0)];
  for (std::size_t b = 0; b < buckets.syncs.size(); ++b) {
    const Sync& sync = buckets.syncs[b];
    const std::string suffix = suffix_of(rank, b, chunk);
    OpId head = head_[slot][b];
    if (head == kNoOp) head = emit_sync(rank, sync, 0, sync.head, rank.last_backward[slot], suffix);
    emit_sync(rank, sync, sync.head, sync.sync.steps.size(), head, suffix);
  }
}

}  // namespace stratasim::strategies
