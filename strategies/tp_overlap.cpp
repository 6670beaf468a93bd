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
  return !s.compute && s.collective == kind && s.axis == TpAxis::tp;
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

Segment collective_chunk(const Segment& s, int n, int j, int chain) {
  Segment c = s;
  c.bytes = Bytes(piece(s.bytes.count(), n, j));
  c.chain = chain;
  c.label += " [chunk " + std::to_string(j) + "]";
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
// produced the shard the first step sends); step and chunk j >= 2 on chain j.
int gathered_chain(int j, int n) {
  return j == 0 ? n : j == 1 ? 0 : j;
}

std::vector<Segment> overlap_pass(const std::vector<Segment>& pass, int n) {
  std::vector<Segment> out;
  for (std::size_t i = 0; i < pass.size(); ++i) {
    const Segment& s = pass[i];
    if (!s.compute) {
      const bool gathers = tp_collective(s, CollectiveKind::all_gather) && i + 1 < pass.size() &&
                           pass[i + 1].compute && !pass[i + 1].kernels.empty() &&
                           is_gemm(pass[i + 1].kernels.front());
      if (!gathers) {
        out.push_back(s);
        continue;
      }
      // The ring exchange's n - 1 steps, each bringing one more rank's shard.
      for (int j = 1; j < n; ++j) {
        out.push_back(collective_chunk(s, n - 1, j - 1, gathered_chain(j, n)));
      }
      continue;  // the GEMM's chunks come with its segment
    }
    const bool front = i > 0 && tp_collective(pass[i - 1], CollectiveKind::all_gather) &&
                       !s.kernels.empty() && is_gemm(s.kernels.front());
    const bool reduces = i + 1 < pass.size() &&
                         tp_collective(pass[i + 1], CollectiveKind::reduce_scatter) &&
                         !s.kernels.empty() && is_gemm(s.kernels.back());
    // One GEMM between a gather and a reduce-scatter (a backward's weight-gradient GEMM after
    // its input's regather, before the data gradient's reduce-scatter): TE's bulk overlap.
    const bool bulk = front && reduces && s.kernels.size() == 1;
    const bool back = reduces && !bulk;
    if (!front && !back) {
      out.push_back(s);
      continue;
    }
    const std::size_t first = out.size();
    const std::size_t middle_begin = front ? 1 : 0;
    const std::size_t middle_end = s.kernels.size() - (back ? 1 : 0);
    std::size_t last = 0;  // index in `out` of the segment's last compute piece
    if (front) {
      for (int j = 0; j < n; ++j) {
        out.push_back(compute_piece(s, {gemm_chunk(s.kernels.front(), n, j)}, gathered_chain(j, n),
                                    " [chunk " + std::to_string(j) + "]"));
        // Bulk: the whole reduce-scatter on chain 0 after chunk 1 (its data, the earlier
        // segments' output, is ready before then), beside the chunks after it.
        if (bulk && j == std::min(1, n - 1)) out.push_back(pass[i + 1]);
      }
      last = out.size() - 1;
      if (bulk) ++i;  // the reduce-scatter is done
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
      const Segment& rs = pass[i + 1];
      for (int j = 0; j < n; ++j) {
        const int chain = n - 1 - j;
        out.push_back(compute_piece(s, {gemm_chunk(s.kernels.back(), n, j)}, chain,
                                    " [chunk " + std::to_string(j) + "]"));
        last = out.size() - 1;
        out.push_back(collective_chunk(rs, n, j, chain));
      }
      ++i;  // the reduce-scatter is done
    } else if (middle_begin >= middle_end) {
      out.push_back(compute_piece(s, {}, 0, " [join]"));  // the chunks' chains meet on chain 0
      last = out.size() - 1;
    }
    out[first].checkpoint_fetch = s.checkpoint_fetch;
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
