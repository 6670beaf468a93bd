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

// Builds the context-parallel version of one pass.
class PassRewriter {
 public:
  PassRewriter(const ContextParallel& cp, int fresh_chain) : cp_(cp), fresh_(fresh_chain) {}

  std::vector<Segment> rewrite(const std::vector<Segment>& pass) {
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
  // A piece of `s`: its provenance and chain, no memory effects or gradient units.
  static Segment piece_of(const Segment& s, std::vector<Kernel> kernels) {
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

  // The layer of the attention being split (its segment's, or in a segment merged over several
  // layers, one attention per layer, the k-th one's), and its label.
  void name(Segment& x, const Segment& s, const std::string& what) const {
    x.layer_begin = s.layer_begin;
    x.layer_end = s.layer_end;
    if (layer_ >= 0) {
      x.layer_begin = layer_;
      x.layer_end = layer_ + 1;
      x.label = "L" + std::to_string(layer_) + " " + what;
    } else {
      x.label = s.label + " " + what;
    }
  }

  Segment comm(const Segment& s, const std::string& what, int chain) const {
    Segment c;
    c.compute = false;
    c.axis = TpAxis::cp;
    name(c, s, what);
    c.recompute = s.recompute;
    c.chain = chain;
    return c;
  }

  Segment block(const Segment& s, const Kernel& k, const std::string& what, int chain) const {
    Segment b = piece_of(s, {k});
    name(b, s, what);
    b.chain = chain;
    return b;
  }

  void split(const Segment& s, std::vector<Segment>& out) {
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
      layer_ = per_layer ? s.layer_begin + index : -1;
      ++index;
      release = attention_steps(s, k, *a, out);
    }
    flush(true);
  }

  // The steps of one attention kernel; returns the buffers to release after them.
  Bytes attention_steps(const Segment& s, const Kernel& k, const Attention& a,
                        std::vector<Segment>& out) {
    const int n = cp_.cp;
    const int c = s.chain;
    if (cp_.mode == CpMode::ulysses) {
      if (a.heads % n != 0 || (a.kv_heads > 0 && a.kv_heads % n != 0)) {
        throw std::invalid_argument("context_parallel: Ulysses needs the rank's heads (" +
                                    std::to_string(a.heads) + ") and kv_heads (" +
                                    std::to_string(a.kv_heads) + ") divisible by cp " +
                                    std::to_string(n));
      }
      const UlyssesBytes bytes = ulysses_bytes(a);
      auto a2a = [&](const std::string& what, Bytes b) {
        Segment x = comm(s, "cp all-to-all " + what, c);
        x.collective = CollectiveKind::all_to_all;
        x.bytes = b;
        out.push_back(std::move(x));
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
        out.push_back(block(s, whole, "attention (heads / cp)", c));
        a2a("out", bytes.out);
      } else {
        a2a("dout", bytes.out);
        out.push_back(block(s, whole, "attention.bwd (heads / cp)", c));
        a2a("dq", bytes.q);
        a2a("dk", bytes.k);
        a2a("dv", bytes.v);
      }
      return Bytes(0);
    }
    const Bytes kv = ring_kv_bytes(a);
    if (cp_.mode == CpMode::allgather) {
      // The whole sequence's KV gathered (forward and backward), dKV reduce-scattered.
      const Bytes gathered = kv * static_cast<std::int64_t>(n);
      Segment g = comm(s, "cp all-gather kv", c);
      g.collective = CollectiveKind::all_gather;
      g.bytes = gathered;
      g.activation_delta = gathered;
      out.push_back(std::move(g));
      Kernel all = k;
      std::get<Attention>(all.work).batch *= n;
      out.push_back(block(s, all, a.backward ? "attention.bwd (all kv)" : "attention (all kv)", c));
      if (a.backward) {
        Segment r = comm(s, "cp reduce-scatter dkv", c);
        r.collective = CollectiveKind::reduce_scatter;
        r.bytes = gathered;
        out.push_back(std::move(r));
      }
      return gathered;
    }
    // Ring: see the header. Chains: `c` and fresh ones from fresh_, so that each exchange
    // overlaps the block before it.
    auto step_label = [](const char* what, int i) {
      return std::string(what) + " " + std::to_string(i);
    };
    if (!a.backward) {
      // Exchange j (1 .. n-1) brings the KV block j; block i waits for exchange i.
      auto chain_of = [&](int i) { return i == 0 ? fresh_ : i == 1 ? c : fresh_ + i - 1; };
      const Bytes buffers = kv * 2;
      for (int i = 0; i < n; ++i) {
        if (i + 1 < n) {
          Segment x = comm(s, step_label("cp ring kv", i + 1), chain_of(i + 1));
          x.ring_step = true;
          x.bytes = kv;
          if (i == 0) x.activation_delta = buffers;
          out.push_back(std::move(x));
        }
        out.push_back(block(s, k, step_label("attention cp step", i), chain_of(i)));
      }
      return buffers;
    }
    // Backward: exchange i (0 .. n-1) sends KV for block i + 1 (i < n - 1) and the dKV of block
    // i - 1 (i > 0); it waits for block i - 1 and block i for exchange i - 1. Two chains
    // alternate: exchange 0 on c, block 0 on the fresh one; exchange i on block i - 1's chain,
    // block i on exchange i - 1's.
    const Bytes buffers = kv * 4;
    int exchange_chain = c, block_chain = fresh_;
    int last_exchange = c;
    for (int i = 0; i < n; ++i) {
      Segment x = comm(s, step_label("cp ring kv+dkv", i), exchange_chain);
      x.ring_step = true;
      x.bytes = kv * static_cast<std::int64_t>((i + 1 < n ? 1 : 0) + (i > 0 ? 1 : 0));
      if (i == 0) x.activation_delta = buffers;
      last_exchange = exchange_chain;
      out.push_back(std::move(x));
      out.push_back(block(s, k, step_label("attention.bwd cp step", i), block_chain));
      std::swap(exchange_chain, block_chain);
    }
    if (last_exchange != c) {
      // The last dKV reaches its owner on the other chain: an empty compute segment waits for it
      // so that the compute after the attention (on `c`, after it on the compute stream) does.
      Segment join = piece_of(s, {});
      join.label = s.label + " cp ring dkv received";
      join.chain = last_exchange;
      out.push_back(std::move(join));
    }
    return buffers;
  }

  ContextParallel cp_;
  int fresh_;
  int layer_ = -1;
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
