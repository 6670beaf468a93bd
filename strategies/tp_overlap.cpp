#include "strategies/tp_overlap.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace stratasim::strategies {

namespace {

// One pass, k copies interleaved block by block: a block ends with a collective (or the pass).
std::vector<Segment> interleave(const std::vector<Segment>& pass, int k) {
  std::vector<Segment> out;
  out.reserve(pass.size() * static_cast<std::size_t>(k));
  std::size_t begin = 0;
  while (begin < pass.size()) {
    std::size_t end = begin;
    while (end < pass.size() && pass[end].compute) ++end;
    if (end < pass.size()) ++end;  // the collective that closes the block
    for (int j = 0; j < k; ++j) {
      for (std::size_t i = begin; i < end; ++i) {
        Segment copy = pass[i];
        copy.chain = j;
        copy.label += " [sub " + std::to_string(j) + "]";
        if (j != k - 1) copy.grads_done.clear();
        out.push_back(std::move(copy));
      }
    }
    begin = end;
  }
  return out;
}

void require_one_chain(const std::vector<Segment>& pass) {
  for (const Segment& s : pass) {
    if (s.chain != 0) {
      throw std::invalid_argument("sub_pipeline: segment '" + s.label + "' is already on chain " +
                                  std::to_string(s.chain) +
                                  "; sub-pipelining expects a plan with one chain");
    }
  }
}

}  // namespace

StagePlan sub_pipeline(const StagePlan& sub, int k) {
  if (k < 1) {
    throw std::invalid_argument("sub_pipeline: tp_overlap must be >= 1 sub-batches, got " +
                                std::to_string(k));
  }
  require_one_chain(sub.forward);
  require_one_chain(sub.backward);
  require_one_chain(sub.weight);
  if (k == 1) return sub;
  StagePlan plan;
  plan.forward = interleave(sub.forward, k);
  plan.backward = interleave(sub.backward, k);
  plan.weight = interleave(sub.weight, k);
  plan.grad_units = sub.grad_units;
  plan.parameters = sub.parameters;
  plan.boundary_bytes = sub.boundary_bytes * k;
  return plan;
}

StagePlan plan_transformer_stage_sub_pipelined(const TransformerModel& model,
                                               const LayerSetting& setting, int stage, int stages,
                                               int layer_begin, int layer_end,
                                               const StageRecompute& recompute, int k) {
  if (k < 1 || setting.micro_batch % k != 0) {
    throw std::invalid_argument(
        "tp_overlap = " + std::to_string(k) + " must be >= 1 and divide the micro batch (" +
        std::to_string(setting.micro_batch) +
        " samples): sub-pipelined tensor parallelism splits each microbatch into tp_overlap "
        "sub-batches of equal size");
  }
  LayerSetting per_sub = setting;
  per_sub.micro_batch = setting.micro_batch / k;
  return sub_pipeline(
      plan_transformer_stage(model, per_sub, stage, stages, layer_begin, layer_end, recompute), k);
}

}  // namespace stratasim::strategies

namespace stratasim::strategies {

namespace {

bool is_gemm(const Kernel& k) {
  return std::holds_alternative<Gemm>(k.work);
}

bool tp_collective(const Segment& s, CollectiveKind kind) {
  return !s.compute && !s.ring_step && s.collective == kind && s.axis == TpAxis::tp;
}

bool ends_with_gemm(const Segment& s) {
  return s.compute && !s.kernels.empty() && is_gemm(s.kernels.back());
}

// Piece j of n of `total`, the first total % n pieces one larger.
std::int64_t piece(std::int64_t total, int n, int j) {
  return total / n + (j < total % n ? 1 : 0);
}

// Chunk j of n of a GEMM, along the tokens: k for a weight-gradient GEMM, else m.
Kernel gemm_chunk(const Kernel& k, int n, int j) {
  Kernel chunk = k;
  Gemm& g = std::get<Gemm>(chunk.work);
  const bool wgrad = k.name.size() >= 6 && k.name.compare(k.name.size() - 6, 6, ".wgrad") == 0;
  std::int64_t& tokens = wgrad ? g.k : g.m;
  tokens = piece(tokens, n, j);
  chunk.name += " [chunk " + std::to_string(j) + "]";
  return chunk;
}

// Communication segment `s` on `chain` holding `sms` SMs, labelled with `suffix`.
Segment comm_piece(const Segment& s, int chain, std::int16_t sms, const std::string& suffix) {
  Segment c = s;
  c.chain = chain;
  c.sms = sms;
  c.label += suffix;
  return c;
}

// Ring step j (1 <= j < n) of the exchange that gathers all-gather `s` over n ranks: every rank
// sends one shard (s.bytes / n, the nccl-tests size being the gathered buffer) to its ring
// successor and receives the next one from its predecessor, over the copy engines.
Segment ring_step(const Segment& s, int n, int j, int chain) {
  Segment c = comm_piece(s, chain, kTeRingSms, " [step " + std::to_string(j) + "]");
  c.ring_step = true;
  c.bytes = Bytes(piece(s.bytes.count(), n, j));
  return c;
}

// A piece of compute segment `s`: its kernels `kernels`, on `chain`, without the segment's
// memory effects and gradient completions (overlap_pass hands those to its first and last
// pieces).
Segment compute_piece(const Segment& s, std::vector<Kernel> kernels, int chain,
                      const std::string& suffix) {
  Segment p = s;
  p.kernels = std::move(kernels);
  p.chain = chain;
  p.label += suffix;
  p.activation_delta = Bytes(0);
  p.checkpoint_delta = Bytes(0);
  p.checkpoint_fetch = Bytes(0);
  p.weight_grad_bytes = Bytes(0);
  p.grads_done.clear();
  return p;
}

// The chain of GEMM chunk j after a gather and of the ring step that brings its shard (j >= 1):
// chunk 0 (the rank's own shard) needs no step and runs on an extra chain n, after the segment
// before it on the compute stream; step 1 and chunk 1 on chain 0, after that segment (which
// produced the shard step 1 sends); step and chunk j >= 2 on chain j.
int gathered_chain(int j, int n) {
  return j == 0 ? n : j == 1 ? 0 : j;
}

// TE's bulk overlaps at pass[i]: a compute segment ending with a data-gradient GEMM, the regather
// of that layer's input, its weight-gradient GEMM alone, and the data gradient's reduce-scatter.
bool bulk_at(const std::vector<Segment>& pass, std::size_t i) {
  return i + 3 < pass.size() && ends_with_gemm(pass[i]) &&
         tp_collective(pass[i + 1], CollectiveKind::all_gather) && pass[i + 2].compute &&
         pass[i + 2].kernels.size() == 1 && is_gemm(pass[i + 2].kernels.front()) &&
         tp_collective(pass[i + 3], CollectiveKind::reduce_scatter);
}

// Whether the compute segment at pass[i] gets the ring exchange of the all-gather before it.
bool ring_at(const std::vector<Segment>& pass, std::size_t i) {
  const Segment& s = pass[i];
  if (i == 0 || !s.compute || s.kernels.empty() || !is_gemm(s.kernels.front())) return false;
  if (!tp_collective(pass[i - 1], CollectiveKind::all_gather)) return false;
  if (i >= 2 && bulk_at(pass, i - 2)) return false;  // the bulk regather, beside the dgrad GEMM
  // A lone GEMM cannot be both the ring's and a bulk overlap's dgrad.
  return !(s.kernels.size() == 1 && bulk_at(pass, i));
}

std::vector<Segment> overlap_pass(const std::vector<Segment>& pass, int n) {
  std::vector<Segment> out;
  const int bulk_chain = n + 1;  // the dgrad GEMM and the reduce-scatter beside the wgrad GEMM
  for (std::size_t i = 0; i < pass.size(); ++i) {
    const Segment& s = pass[i];
    if (!s.compute) {
      // A gather some GEMM overlaps is emitted with that GEMM's chunks.
      if (!(i + 1 < pass.size() && ring_at(pass, i + 1))) out.push_back(s);
      continue;
    }
    const bool front = ring_at(pass, i);
    const bool bulk = bulk_at(pass, i);
    const bool back = !bulk && i + 1 < pass.size() &&
                      tp_collective(pass[i + 1], CollectiveKind::reduce_scatter) &&
                      ends_with_gemm(s) && !(front && s.kernels.size() == 1);
    if (!front && !back && !bulk) {
      out.push_back(s);
      continue;
    }
    const std::size_t first = out.size();
    const std::size_t middle_begin = front ? 1 : 0;
    const std::size_t middle_end = s.kernels.size() - (back || bulk ? 1 : 0);
    std::size_t last = 0;  // index in `out` of the segment's last compute piece
    if (front) {
      // The ring exchange: chunk 0 of the rank's own shard at once, step j bringing the shard
      // of chunk j; the steps run back to back (each forwards what the one before received).
      const Segment& gather = pass[i - 1];
      out.push_back(compute_piece(s, {gemm_chunk(s.kernels.front(), n, 0)}, gathered_chain(0, n),
                                  " [chunk 0]"));
      for (int j = 1; j < n; ++j) {
        out.push_back(ring_step(gather, n, j, gathered_chain(j, n)));
        out.push_back(compute_piece(s, {gemm_chunk(s.kernels.front(), n, j)}, gathered_chain(j, n),
                                    " [chunk " + std::to_string(j) + "]"));
      }
      last = out.size() - 1;
    }
    if (middle_begin < middle_end) {
      out.push_back(compute_piece(
          s,
          std::vector<Kernel>(s.kernels.begin() + static_cast<std::ptrdiff_t>(middle_begin),
                              s.kernels.begin() + static_cast<std::ptrdiff_t>(middle_end)),
          0, ""));
      last = out.size() - 1;
    }
    if (back) {
      // TE's pipeline: GEMM chunk j, then its reduce-scatter beside chunk j + 1.
      const Segment& rs = pass[i + 1];
      const int p = kTePipelineSplits;
      for (int j = 0; j < p; ++j) {
        const int chain = p - 1 - j;
        out.push_back(compute_piece(s, {gemm_chunk(s.kernels.back(), p, j)}, chain,
                                    " [chunk " + std::to_string(j) + "]"));
        last = out.size() - 1;
        Segment c = comm_piece(rs, chain, kTeCommSms, " [chunk " + std::to_string(j) + "]");
        c.bytes = Bytes(piece(rs.bytes.count(), p, j));
        out.push_back(std::move(c));
      }
      ++i;  // the reduce-scatter is done
    } else if (bulk) {
      // TE's bulk overlaps: the regather beside the dgrad GEMM, then the dgrad's reduce-scatter
      // beside the wgrad GEMM; a join waits for both before what follows.
      out.push_back(comm_piece(pass[i + 1], 0, kTeCommSms, " [bulk]"));
      out.push_back(compute_piece(s, {s.kernels.back()}, bulk_chain, ""));
      last = out.size() - 1;
      Segment wgrad = pass[i + 2];
      wgrad.chain = 0;
      out.push_back(std::move(wgrad));
      out.push_back(comm_piece(pass[i + 3], bulk_chain, kTeCommSms, " [bulk]"));
      out.push_back(compute_piece(pass[i + 2], {}, bulk_chain, " [join]"));
      i += 3;  // the regather, the wgrad GEMM and the reduce-scatter are done
    } else if (middle_begin >= middle_end) {
      out.push_back(compute_piece(s, {}, 0, " [join]"));  // the chunks' chains meet on chain 0
      last = out.size() - 1;
    }
    std::size_t first_compute = first;
    while (!out[first_compute].compute) ++first_compute;
    out[first_compute].checkpoint_fetch = s.checkpoint_fetch;
    Segment& end = out[last];
    end.activation_delta = s.activation_delta;
    end.checkpoint_delta = s.checkpoint_delta;
    end.weight_grad_bytes = s.weight_grad_bytes;
    end.grads_done = s.grads_done;
  }
  return out;
}

}  // namespace

StagePlan tp_comm_overlap(const StagePlan& plan, int chunks) {
  if (chunks < 1) {
    throw std::invalid_argument("tp_comm_overlap: expected >= 1 chunks, got " +
                                std::to_string(chunks));
  }
  require_one_chain(plan.forward);
  require_one_chain(plan.backward);
  require_one_chain(plan.weight);
  if (chunks == 1) return plan;
  StagePlan out = plan;
  out.forward = overlap_pass(plan.forward, chunks);
  out.backward = overlap_pass(plan.backward, chunks);
  out.weight = overlap_pass(plan.weight, chunks);
  return out;
}

}  // namespace stratasim::strategies
