#include "strategies/context_parallel.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace stratasim::strategies {

std::string_view name_of(CpMode m) {
  switch (m) {
    case CpMode::ring:
      return "ring";
    case CpMode::ulysses:
      return "ulysses";
    case CpMode::allgather:
      return "allgather";
  }
  return "?";
}

std::optional<CpMode> cp_mode_from_name(std::string_view name) {
  for (CpMode m : {CpMode::ring, CpMode::ulysses, CpMode::allgather}) {
    if (name_of(m) == name) return m;
  }
  return std::nullopt;
}

double ring_attention_pairs(std::int64_t seq, int cp, int rank, int step, bool causal,
                            bool load_balanced) {
  if (cp < 1 || rank < 0 || rank >= cp || step < 0 || step >= cp) {
    throw std::invalid_argument("ring_attention_pairs: rank and step must lie in [0, cp)");
  }
  const double s = static_cast<double>(seq);
  const double local = s / cp;
  if (!causal) return local * local;
  const int source = ((rank - step) % cp + cp) % cp;  // whose KV the rank holds at this step
  if (load_balanced) {
    // Chunks of c = seq / 2cp tokens; rank r holds chunks r and 2cp - 1 - r.
    const double c = s / (2.0 * cp);
    if (step == 0) return c * c / 2 + c * c + c * c / 2;  // causal over [r, 2cp-1-r]
    if (source < rank) return 2 * c * c;  // both query chunks against KV chunk `source`
    return 2 * c * c;                     // query chunk 2cp-1-r against both KV chunks
  }
  if (step == 0) return local * local / 2;  // the diagonal block, causal
  return source < rank ? local * local : 0.0;
}

Bytes ring_kv_bytes(const Attention& a) {
  const std::int64_t kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  return Bytes(2 * a.batch * a.seq_kv * kv_heads * a.head_dim * size_of(a.dtype));
}

UlyssesBytes ulysses_bytes(const Attention& a) {
  const std::int64_t kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const std::int64_t e = size_of(a.dtype);
  const Bytes q(a.batch * a.seq_q * a.heads * a.head_dim * e);
  const Bytes kv(a.batch * a.seq_kv * kv_heads * a.head_dim * e);
  return {q, kv, kv, q};
}

namespace {

// A piece of `s`: its provenance and chain, no memory effects or gradient units.
Segment piece_of(const Segment& s, std::vector<Kernel> kernels) {
  Segment p;
  p.compute = true;
  p.kernels = std::move(kernels);
  p.label = s.label;
  p.layer_begin = s.layer_begin;
  p.layer_end = s.layer_end;
  p.recompute = s.recompute;
  p.chain = s.chain;
  return p;
}

// The pieces one attention kernel of segment `s` becomes, appended to `out`: named after the
// attention's layer (`layer`: its segment's, or in a segment merged over several layers, one
// attention per layer, the k-th one's; -1 when not known).
class AttentionPieces {
 public:
  AttentionPieces(const Segment& s, int layer, std::vector<Segment>& out)
      : s_(s), layer_(layer), out_(out) {}

  void add_comm(const std::string& what, int chain, CollectiveKind kind, Bytes bytes,
                Bytes activation_delta = Bytes(0), bool ring_step = false) {
    Segment c;
    c.compute = false;
    c.axis = TpAxis::cp;
    name(c, what);
    c.recompute = s_.recompute;
    c.chain = chain;
    c.collective = kind;
    c.bytes = bytes;
    c.activation_delta = activation_delta;
    c.ring_step = ring_step;
    out_.push_back(std::move(c));
  }
  void add_block(const Kernel& k, const std::string& what, int chain) {
    Segment b = piece_of(s_, {k});
    name(b, what);
    b.chain = chain;
    out_.push_back(std::move(b));
  }
  // An empty compute segment on `chain`, after what `chain` last did.
  void add_join(const std::string& what, int chain) {
    Segment join = piece_of(s_, {});
    join.label = s_.label + " " + what;
    join.chain = chain;
    out_.push_back(std::move(join));
  }

 private:
  void name(Segment& x, const std::string& what) const {
    x.layer_begin = s_.layer_begin;
    x.layer_end = s_.layer_end;
    if (layer_ >= 0) {
      x.layer_begin = layer_;
      x.layer_end = layer_ + 1;
      x.label = "L" + std::to_string(layer_) + " " + what;
    } else {
      x.label = s_.label + " " + what;
    }
  }

  const Segment& s_;
  int layer_;
  std::vector<Segment>& out_;
};

std::string step_label(const char* what, int i) {
  return std::string(what) + " " + std::to_string(i);
}

// DeepSpeed-Ulysses: all-to-alls trade the sequence split for a head split around the whole
// attention. Returns the buffers to release after it (none).
Bytes ulysses_steps(AttentionPieces& pieces, const Kernel& k, const Attention& a, int n, int c) {
  if (a.heads % n != 0 || (a.kv_heads > 0 && a.kv_heads % n != 0)) {
    throw std::invalid_argument(
        "context_parallel: Ulysses needs the rank's heads (" + std::to_string(a.heads) +
        ") and kv_heads (" + std::to_string(a.kv_heads) + ") divisible by cp " + std::to_string(n));
  }
  const UlyssesBytes bytes = ulysses_bytes(a);
  auto a2a = [&](const std::string& what, Bytes b) {
    pieces.add_comm("cp all-to-all " + what, c, CollectiveKind::all_to_all, b);
  };
  Kernel whole = k;
  auto& w = std::get<Attention>(whole.work);
  w.heads /= n;
  if (w.kv_heads > 0) w.kv_heads /= n;
  w.seq_q *= n;
  w.seq_kv *= n;
  if (!a.backward) {
    a2a("q", bytes.q);
    a2a("k", bytes.k);
    a2a("v", bytes.v);
    pieces.add_block(whole, "attention (heads / cp)", c);
    a2a("out", bytes.out);
  } else {
    a2a("dout", bytes.out);
    pieces.add_block(whole, "attention.bwd (heads / cp)", c);
    a2a("dq", bytes.q);
    a2a("dk", bytes.k);
    a2a("dv", bytes.v);
  }
  return Bytes(0);
}

// The whole sequence's KV gathered (forward and backward), dKV reduce-scattered. Returns the
// gathered buffer, released after the attention.
Bytes allgather_steps(AttentionPieces& pieces, const Kernel& k, const Attention& a, int n, int c) {
  const Bytes gathered = ring_kv_bytes(a) * static_cast<std::int64_t>(n);
  pieces.add_comm("cp all-gather kv", c, CollectiveKind::all_gather, gathered, gathered);
  Kernel all = k;
  std::get<Attention>(all.work).batch *= n;
  pieces.add_block(all, a.backward ? "attention.bwd (all kv)" : "attention (all kv)", c);
  if (a.backward) {
    pieces.add_comm("cp reduce-scatter dkv", c, CollectiveKind::reduce_scatter, gathered);
  }
  return gathered;
}

// Ring, forward (see the header): exchange j (1 .. n-1) brings the KV block j; block i waits
// for exchange i. Chains: `c` and fresh ones from `fresh`, so that each exchange overlaps the
// block before it. Returns the two receive buffers.
Bytes ring_forward_steps(AttentionPieces& pieces, const Kernel& k, Bytes kv, int n, int c,
                         int fresh) {
  auto chain_of = [&](int i) { return i == 0 ? fresh : i == 1 ? c : fresh + i - 1; };
  const Bytes buffers = kv * 2;
  for (int i = 0; i < n; ++i) {
    if (i + 1 < n) {
      pieces.add_comm(step_label("cp ring kv", i + 1), chain_of(i + 1), CollectiveKind::all_reduce,
                      kv, i == 0 ? buffers : Bytes(0), true);
    }
    pieces.add_block(k, step_label("attention cp step", i), chain_of(i));
  }
  return buffers;
}

// Ring, backward: exchange i (0 .. n-1) sends KV for block i + 1 (i < n - 1) and the dKV of
// block i - 1 (i > 0); it waits for block i - 1 and block i for exchange i - 1. Two chains
// alternate: exchange 0 on c, block 0 on the fresh one; exchange i on block i - 1's chain,
// block i on exchange i - 1's. Returns the four receive buffers.
Bytes ring_backward_steps(AttentionPieces& pieces, const Kernel& k, Bytes kv, int n, int c,
                          int fresh) {
  const Bytes buffers = kv * 4;
  int exchange_chain = c, block_chain = fresh;
  int last_exchange = c;
  for (int i = 0; i < n; ++i) {
    const Bytes bytes = kv * static_cast<std::int64_t>((i + 1 < n ? 1 : 0) + (i > 0 ? 1 : 0));
    pieces.add_comm(step_label("cp ring kv+dkv", i), exchange_chain, CollectiveKind::all_reduce,
                    bytes, i == 0 ? buffers : Bytes(0), true);
    last_exchange = exchange_chain;
    pieces.add_block(k, step_label("attention.bwd cp step", i), block_chain);
    std::swap(exchange_chain, block_chain);
  }
  if (last_exchange != c) {
    // The last dKV reaches its owner on the other chain: an empty compute segment waits for it
    // so that the compute after the attention (on `c`, after it on the compute stream) does.
    pieces.add_join("cp ring dkv received", last_exchange);
  }
  return buffers;
}

// Builds the context-parallel version of one pass.
class PassRewriter {
 public:
  PassRewriter(const ContextParallel& cp, int fresh_chain) : cp_(cp), fresh_(fresh_chain) {}

  std::vector<Segment> rewrite(const std::vector<Segment>& pass) const {
    std::vector<Segment> out;
    for (const Segment& s : pass) {
      const bool has_attention =
          s.compute && std::any_of(s.kernels.begin(), s.kernels.end(), [](const Kernel& k) {
            return std::holds_alternative<Attention>(k.work);
          });
      if (!has_attention) {
        out.push_back(s);
        continue;
      }
      split(s, out);
    }
    return out;
  }

 private:
  void split(const Segment& s, std::vector<Segment>& out) const {
    const auto attentions = std::count_if(s.kernels.begin(), s.kernels.end(), [](const Kernel& k) {
      return std::holds_alternative<Attention>(k.work);
    });
    const bool per_layer = s.layer_begin >= 0 && s.layer_end - s.layer_begin == attentions;
    int index = 0;
    std::vector<Kernel> current;
    bool first_piece = true;
    Bytes release;  // receive buffers freed by the piece after an attention
    auto flush = [&](bool last) {
      if (current.empty() && !last) return;
      Segment p = piece_of(s, std::move(current));
      current.clear();
      if (first_piece) p.checkpoint_fetch = s.checkpoint_fetch;
      first_piece = false;
      p.activation_delta = -release;
      release = Bytes(0);
      if (last) {
        p.activation_delta += s.activation_delta;
        p.checkpoint_delta = s.checkpoint_delta;
        p.grads_done = s.grads_done;
        p.weight_grad_bytes = s.weight_grad_bytes;
      }
      out.push_back(std::move(p));
    };
    for (const Kernel& k : s.kernels) {
      const auto* a = std::get_if<Attention>(&k.work);
      if (a == nullptr) {
        current.push_back(k);
        continue;
      }
      flush(false);
      AttentionPieces pieces(s, per_layer ? s.layer_begin + index : -1, out);
      ++index;
      release = attention_steps(pieces, k, *a, s.chain);
    }
    flush(true);
  }

  // The steps of one attention kernel; returns the buffers to release after them.
  Bytes attention_steps(AttentionPieces& pieces, const Kernel& k, const Attention& a,
                        int chain) const {
    switch (cp_.mode) {
      case CpMode::ulysses:
        return ulysses_steps(pieces, k, a, cp_.cp, chain);
      case CpMode::allgather:
        return allgather_steps(pieces, k, a, cp_.cp, chain);
      case CpMode::ring:
        break;
    }
    return a.backward ? ring_backward_steps(pieces, k, ring_kv_bytes(a), cp_.cp, chain, fresh_)
                      : ring_forward_steps(pieces, k, ring_kv_bytes(a), cp_.cp, chain, fresh_);
  }

  ContextParallel cp_;
  int fresh_;
};

}  // namespace

StagePlan context_parallel(const StagePlan& plan, const ContextParallel& cp) {
  if (cp.cp <= 1) return plan;
  int chains = 0;
  for (const auto* pass : {&plan.forward, &plan.backward, &plan.weight}) {
    for (const Segment& s : *pass) {
      chains = std::max(chains, s.chain + 1);
      if (!s.compute) continue;
      for (const Kernel& k : s.kernels) {
        if (k.name.rfind("attention.qk", 0) == 0) {
          throw std::invalid_argument(
              "context_parallel: attention is not fused (context parallelism runs Transformer "
              "Engine's fused attention: set training.flash_attention)");
        }
      }
    }
  }
  StagePlan out = plan;
  PassRewriter rewriter(cp, chains);
  out.forward = rewriter.rewrite(plan.forward);
  out.backward = rewriter.rewrite(plan.backward);
  out.weight = rewriter.rewrite(plan.weight);
  return out;
}

}  // namespace stratasim::strategies
