#include "strategies/transformer.hpp"

#include <algorithm>
#include <utility>

namespace stratasim::strategies {

namespace {

// Shapes of one layer as seen by one tensor-parallel rank.
struct Dims {
  std::int64_t b, s, h, a, kv, d, t, ffn, up, vocab_local, e;
  std::int64_t s_kv;       // keys each query may attend to: context + s
  std::int64_t tokens;     // b * s
  std::int64_t tokens_sp;  // tokens in sequence-parallel regions: b * s / t with SP, else b * s
  bool sp;
  DType dtype;
  bool flash;
  bool causal;
  bool gated;

  Dims(const TransformerModel& m, const LayerSetting& set)
      : b(set.micro_batch),
        s(set.seq_len),
        h(m.hidden),
        a(m.heads),
        kv(m.kv_heads),
        d(m.head_dim()),
        t(set.tp),
        ffn(m.ffn_hidden),
        up(m.activation == Activation::swiglu ? 2 * std::int64_t{m.ffn_hidden} : m.ffn_hidden),
        vocab_local((std::int64_t{m.vocab} + set.tp - 1) / set.tp),
        e(size_of(set.dtype)),
        s_kv(set.context_len + set.seq_len),
        tokens(b * s),
        tokens_sp(set.sequence_parallel && set.tp > 1 ? b * s / set.tp : b * s),
        sp(set.sequence_parallel && set.tp > 1),
        dtype(set.dtype),
        flash(set.flash_attention),
        causal(m.causal),
        gated(m.activation == Activation::swiglu) {}

  std::int64_t qkv_width() const { return (a + 2 * kv) * d / t; }  // local QKV output width
  Bytes hidden_bytes() const { return Bytes(tokens * h * e); }     // one full [b, s, h] tensor
};

Kernel gemm(std::string name, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
            std::int64_t batch = 1) {
  return Kernel{Gemm{m, n, k, batch, dtype}, std::move(name)};
}

Kernel elementwise(std::string name, std::int64_t elements, std::int64_t read,
                   std::int64_t written) {
  return Kernel{Elementwise{elements, Bytes(read), Bytes(written)}, std::move(name)};
}

Segment compute(std::string label, std::vector<Kernel> kernels, int layer = -1) {
  Segment s;
  s.compute = true;
  s.kernels = std::move(kernels);
  s.label = std::move(label);
  s.layer_begin = layer;
  s.layer_end = layer < 0 ? -1 : layer + 1;
  return s;
}

Segment collective(std::string label, CollectiveKind kind, Bytes bytes, int layer = -1) {
  Segment s;
  s.compute = false;
  s.collective = kind;
  s.bytes = bytes;
  s.label = std::move(label);
  s.layer_begin = layer;
  s.layer_end = layer < 0 ? -1 : layer + 1;
  return s;
}

std::string layer_name(int layer) {
  return "L" + std::to_string(layer);
}

// Tensor-parallel collective after a row-parallel GEMM (Megatron's g): all-reduce, or
// reduce-scatter with sequence parallelism.
Segment tp_reduce(const Dims& d, const std::string& label, int layer) {
  return collective(label + (d.sp ? " tp reduce-scatter" : " tp all-reduce"),
                    d.sp ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce,
                    d.hidden_bytes(), layer);
}

Segment tp_gather(const Dims& d, const std::string& label, int layer) {
  return collective(label + " tp all-gather", CollectiveKind::all_gather, d.hidden_bytes(), layer);
}

// Norm, dropout and residual work on the [tokens_sp, h] activations.
Kernel norm_kernel(const Dims& d, std::string name, bool backward) {
  std::int64_t n = d.tokens_sp * d.h;
  return backward ? elementwise(std::move(name), n, 2 * n * d.e, n * d.e)
                  : elementwise(std::move(name), n, n * d.e, n * d.e);
}

Kernel dropout_residual(const Dims& d, std::string name, bool backward) {
  std::int64_t n = d.tokens_sp * d.h;
  // forward: read the branch and the residual, write the sum and a 1-byte mask
  return backward ? elementwise(std::move(name), n, n * d.e + n, 2 * n * d.e)
                  : elementwise(std::move(name), n, 2 * n * d.e, n * d.e + n);
}

// The fused (flash) attention kernel of one tensor-parallel rank.
Kernel fused_attention(const Dims& d, bool backward) {
  return Kernel{
      Attention{d.b, d.a / d.t, d.kv / d.t, d.s, d.s_kv, d.d, d.causal, d.dtype, backward},
      backward ? "attention.bwd" : "attention"};
}

void attention_core_forward(const Dims& d, std::vector<Kernel>& k) {
  const std::int64_t heads_local = d.a / d.t;
  if (d.flash) {
    k.push_back(fused_attention(d, false));
    return;
  }
  const std::int64_t scores = d.b * heads_local * d.s * d.s_kv;
  k.push_back(gemm("attention.qk", d.s, d.s_kv, d.d, d.dtype, d.b * heads_local));
  k.push_back(elementwise("attention.softmax", scores, scores * d.e, scores * d.e));
  k.push_back(elementwise("attention.dropout", scores, scores * d.e, scores * d.e + scores));
  k.push_back(gemm("attention.pv", d.s, d.d, d.s_kv, d.dtype, d.b * heads_local));
}

void attention_core_backward(const Dims& d, std::vector<Kernel>& k) {
  const std::int64_t heads_local = d.a / d.t;
  if (d.flash) {
    k.push_back(fused_attention(d, true));
    return;
  }
  const std::int64_t scores = d.b * heads_local * d.s * d.s_kv;
  const std::int64_t batch = d.b * heads_local;
  k.push_back(gemm("attention.pv.dgrad", d.s, d.s_kv, d.d, d.dtype, batch));  // dP = dO V^T
  k.push_back(gemm("attention.pv.vgrad", d.s_kv, d.d, d.s, d.dtype, batch));  // dV = P^T dO
  k.push_back(elementwise("attention.dropout.bwd", scores, scores * d.e + scores, scores * d.e));
  k.push_back(elementwise("attention.softmax.bwd", scores, 2 * scores * d.e, scores * d.e));
  k.push_back(gemm("attention.qk.qgrad", d.s, d.d, d.s_kv, d.dtype, batch));  // dQ = dS K
  k.push_back(gemm("attention.qk.kgrad", d.s_kv, d.d, d.s, d.dtype, batch));  // dK = dS^T Q
}

Bytes sum_bytes(const std::vector<ActivationItem>& items, std::size_t begin, std::size_t end) {
  Bytes total;
  for (std::size_t i = begin; i < end; ++i) total += items[i].bytes;
  return total;
}

// Indices in layer_activations(): [0, kAttentionItems) belong to the attention block, of which
// [kCoreBegin, kCoreEnd) are the attention core's (softmax output, dropout mask and output).
constexpr std::size_t kAttentionItems = 10;
constexpr std::size_t kCoreBegin = 5, kCoreEnd = 8;

void layer_forward(const Dims& d, int layer, Bytes attention_bytes, Bytes mlp_bytes,
                   std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  // Attention block: norm, QKV, core, output projection, then Megatron's g.
  std::vector<Kernel> attention;
  attention.push_back(norm_kernel(d, "ln1", false));
  if (d.sp) {
    out.push_back(compute(L + " ln1", std::move(attention), layer));
    out.push_back(tp_gather(d, L + " attention", layer));
    attention.clear();
  }
  attention.push_back(gemm("qkv", d.tokens, d.qkv_width(), d.h, d.dtype));
  attention_core_forward(d, attention);
  attention.push_back(gemm("proj", d.tokens, d.h, d.h / d.t, d.dtype));
  out.push_back(compute(L + " attention", std::move(attention), layer));
  out.back().activation_delta = attention_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " attention", layer));

  // MLP block.
  std::vector<Kernel> mlp;
  mlp.push_back(dropout_residual(d, "attention.dropout_residual", false));
  mlp.push_back(norm_kernel(d, "ln2", false));
  if (d.sp) {
    out.push_back(compute(L + " ln2", std::move(mlp), layer));
    out.push_back(tp_gather(d, L + " mlp", layer));
    mlp.clear();
  }
  const std::int64_t up_local = d.up / d.t, ffn_local = d.ffn / d.t;
  mlp.push_back(gemm("fc1", d.tokens, up_local, d.h, d.dtype));
  mlp.push_back(elementwise(d.gated ? "swiglu" : "gelu", d.tokens * up_local,
                            d.tokens * up_local * d.e, d.tokens * ffn_local * d.e));
  mlp.push_back(gemm("fc2", d.tokens, d.h, ffn_local, d.dtype));
  out.push_back(compute(L + " mlp", std::move(mlp), layer));
  out.back().activation_delta = mlp_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " mlp", layer));
  out.push_back(
      compute(L + " residual", {dropout_residual(d, "mlp.dropout_residual", false)}, layer));
}

// `recomputed_core` > 0: selective recomputation, the attention core's stored items (that many
// bytes) are recomputed right before its backward.
void layer_backward(const Dims& d, int layer, int grad_unit, Bytes attention_bytes, Bytes mlp_bytes,
                    Bytes recomputed_core, std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  const std::int64_t up_local = d.up / d.t, ffn_local = d.ffn / d.t;
  std::vector<Kernel> k;
  k.push_back(dropout_residual(d, "mlp.dropout_residual.bwd", true));
  if (d.sp) {  // the reduce-scatter after fc2 becomes an all-gather of its gradient
    out.push_back(compute(L + " residual bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " mlp bwd", layer));
    k.clear();
  }
  k.push_back(gemm("fc2.dgrad", d.tokens, ffn_local, d.h, d.dtype));
  k.push_back(gemm("fc2.wgrad", ffn_local, d.h, d.tokens, d.dtype));
  k.push_back(elementwise(d.gated ? "swiglu.bwd" : "gelu.bwd", d.tokens * up_local,
                          d.tokens * (up_local + ffn_local) * d.e, d.tokens * up_local * d.e));
  k.push_back(gemm("fc1.dgrad", d.tokens, d.h, up_local, d.dtype));
  if (d.sp) {  // fc1's input was gathered in forward and is gathered again for its wgrad
    out.push_back(compute(L + " mlp bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " mlp input regather", layer));
    k.clear();
  }
  k.push_back(gemm("fc1.wgrad", d.h, up_local, d.tokens, d.dtype));
  out.push_back(compute(L + (d.sp ? " fc1 wgrad" : " mlp bwd"), std::move(k), layer));
  out.back().activation_delta = -mlp_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " mlp bwd", layer));  // Megatron's f in backward

  k.clear();
  k.push_back(norm_kernel(d, "ln2.bwd", true));
  k.push_back(dropout_residual(d, "attention.dropout_residual.bwd", true));
  if (d.sp) {
    out.push_back(compute(L + " ln2 bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " attention bwd", layer));
    k.clear();
  }
  k.push_back(gemm("proj.dgrad", d.tokens, d.h / d.t, d.h, d.dtype));
  k.push_back(gemm("proj.wgrad", d.h / d.t, d.h, d.tokens, d.dtype));
  if (recomputed_core.count() > 0) {  // Megatron's checkpointed core attention
    out.push_back(compute(L + " proj bwd", std::move(k), layer));
    k.clear();
    attention_core_forward(d, k);
    out.push_back(compute("recompute " + L + " attention core", std::move(k), layer));
    out.back().recompute = true;
    out.back().activation_delta = recomputed_core;
    k.clear();
  }
  attention_core_backward(d, k);
  k.push_back(gemm("qkv.dgrad", d.tokens, d.h, d.qkv_width(), d.dtype));
  if (d.sp) {
    out.push_back(compute(L + " attention bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " attention input regather", layer));
    k.clear();
  }
  k.push_back(gemm("qkv.wgrad", d.h, d.qkv_width(), d.tokens, d.dtype));
  out.push_back(compute(L + (d.sp ? " qkv wgrad" : " attention bwd"), std::move(k), layer));
  out.back().activation_delta = -attention_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " attention bwd", layer));

  out.push_back(compute(L + " ln1 bwd",
                        {norm_kernel(d, "ln1.bwd", true),
                         elementwise("residual.bwd", d.tokens_sp * d.h, 2 * d.tokens_sp * d.h * d.e,
                                     d.tokens_sp * d.h * d.e)},
                        layer));
  out.back().grads_done.push_back(grad_unit);
}

// Joins neighbouring compute segments into one (one op per chunk of work between two
// collectives), so that a stage without tensor parallelism is one op per pass.
// The label of a merged op: its pieces joined, or, beyond two pieces, the pieces outside any
// layer around the range of layers ("embedding + L0-L23 + head"), so labels stay short.
std::string merged_label(const std::vector<const Segment*>& pieces) {
  std::string label;
  auto append = [&label](const std::string& part) { label += (label.empty() ? "" : " + ") + part; };
  if (pieces.size() <= 2) {
    for (const Segment* p : pieces) append(p->label);
    return label;
  }
  int first = -1, last = -1;
  bool backward = false, range_written = false;
  for (const Segment* p : pieces) {
    if (p->layer_begin < 0) continue;
    first = first < 0 ? p->layer_begin : first;
    last = p->layer_begin;
    backward = backward || p->label.ends_with("bwd");
  }
  for (const Segment* p : pieces) {
    if (p->layer_begin >= 0) {
      if (!range_written) {
        append("L" + std::to_string(first) + (first == last ? "" : "-L" + std::to_string(last)) +
               (backward ? " bwd" : ""));
        range_written = true;
      }
      continue;
    }
    append(p->label);
  }
  return label;
}

std::vector<Segment> merge_compute(std::vector<Segment> segments, bool split_layers) {
  std::vector<Segment> merged;
  std::vector<std::vector<const Segment*>> pieces;  // originals of each merged segment
  merged.reserve(segments.size());
  for (auto& s : segments) {
    bool joins = false;
    if (!pieces.empty()) {
      const Segment& previous = *pieces.back().back();
      int group_layer = -1;  // the layer the open group belongs to, if any
      for (const Segment* p : pieces.back()) {
        if (p->layer_begin >= 0) group_layer = group_layer < 0 ? p->layer_begin : group_layer;
      }
      const bool other_layer =
          split_layers && s.layer_begin >= 0 && group_layer >= 0 && group_layer != s.layer_begin;
      joins = previous.compute && s.compute && !other_layer && previous.recompute == s.recompute;
    }
    if (joins) {
      pieces.back().push_back(&s);
    } else {
      merged.push_back(Segment{});
      pieces.push_back({&s});
    }
  }
  for (std::size_t i = 0; i < merged.size(); ++i) {
    Segment& m = merged[i];
    m = *pieces[i].front();
    for (std::size_t k = 1; k < pieces[i].size(); ++k) {
      const Segment& s = *pieces[i][k];
      m.kernels.insert(m.kernels.end(), s.kernels.begin(), s.kernels.end());
      if (s.layer_begin >= 0) {
        m.layer_begin = m.layer_begin < 0 ? s.layer_begin : std::min(m.layer_begin, s.layer_begin);
        m.layer_end = std::max(m.layer_end, s.layer_end);
      }
      m.activation_delta += s.activation_delta;
      m.checkpoint_delta += s.checkpoint_delta;
      m.checkpoint_fetch += s.checkpoint_fetch;
      m.grads_done.insert(m.grads_done.end(), s.grads_done.begin(), s.grads_done.end());
    }
    m.label = merged_label(pieces[i]);
  }
  return merged;
}

}  // namespace

std::vector<ActivationItem> layer_activations(const TransformerModel& model,
                                              const LayerSetting& setting) {
  const Dims d(model, setting);
  const std::int64_t e = d.e;
  // Tensors replicated across tensor-parallel ranks, unless sequence parallelism shards them.
  const std::int64_t rep = d.tokens_sp * d.h;
  const std::int64_t scores = d.b * (d.a / d.t) * d.s * d.s_kv;
  const std::int64_t kv_width = d.kv * d.d / d.t;
  std::vector<ActivationItem> items = {
      // attention block (kAttentionItems entries)
      {"ln1 input", Bytes(rep * e)},
      {"qkv input (ln1 output)", Bytes(rep * e)},
      {"q", Bytes(d.tokens * d.h / d.t * e)},
      {"k", Bytes(d.tokens * kv_width * e)},
      {"v", Bytes(d.tokens * kv_width * e)},
      {d.flash ? "softmax statistics (fp32)" : "softmax output",
       Bytes(d.flash ? d.b * (d.a / d.t) * d.s * 4 : scores * e)},
      {"softmax dropout mask", Bytes(d.flash ? 0 : scores)},
      {"softmax dropout output", Bytes(d.flash ? 0 : scores * e)},
      {"proj input", Bytes(d.tokens * d.h / d.t * e)},
      {"attention dropout mask", Bytes(rep)},
      // MLP block
      {"ln2 input", Bytes(rep * e)},
      {"fc1 input (ln2 output)", Bytes(rep * e)},
      {d.gated ? "swiglu input" : "gelu input", Bytes(d.tokens * (d.up / d.t) * e)},
      {"fc2 input", Bytes(d.tokens * (d.ffn / d.t) * e)},
      {"mlp dropout mask", Bytes(rep)},
  };
  return items;
}

Bytes checkpoint_bytes(const TransformerModel& model, const LayerSetting& setting) {
  const Dims d(model, setting);
  return Bytes(d.tokens_sp * d.h * d.e);
}

std::int64_t layer_parameters_per_rank(const TransformerModel& m, int tp) {
  const std::int64_t h = m.hidden, kv = m.kv_hidden(), f = m.ffn_hidden, t = tp;
  const std::int64_t b = m.bias ? 1 : 0;
  const std::int64_t up = m.activation == Activation::swiglu ? 2 * f : f;
  std::int64_t sharded = (h * (h + 2 * kv) + b * (h + 2 * kv)  // QKV (column parallel)
                          + h * h                              // projection weight (row parallel)
                          + h * up + b * up                    // fc1 (column parallel)
                          + f * h) /                           // fc2 weight (row parallel)
                         t;
  std::int64_t replicated = b * h + b * h  // row-parallel biases
                            + 2 * (m.norm == Norm::layernorm ? 2 * h : h);
  return sharded + replicated;
}

StagePlan plan_transformer_stage(const TransformerModel& model, const LayerSetting& setting,
                                 int stage, int stages, int layer_begin, int layer_end,
                                 const StageRecompute& recompute) {
  const Dims d(model, setting);
  const bool first = stage == 0, last = stage == stages - 1;
  const auto items = layer_activations(model, setting);
  const Bytes attention_bytes = sum_bytes(items, 0, kAttentionItems);
  const Bytes mlp_bytes = sum_bytes(items, kAttentionItems, items.size());
  // Selective recomputation: the attention core's items are not stored (none with flash
  // attention, whose core keeps only its softmax statistics: nothing to recompute).
  const Bytes core_bytes =
      recompute.selective && !d.flash ? sum_bytes(items, kCoreBegin, kCoreEnd) : Bytes();
  // Full recomputation: layers [layer_begin, recomputed_end) in groups of `group`.
  const int recomputed_end =
      layer_begin + std::clamp(recompute.recomputed_layers, 0, layer_end - layer_begin);
  const int group = std::max(1, recompute.group);
  const Bytes checkpoint = checkpoint_bytes(model, setting);
  const auto fully_recomputed = [&](int l) { return l < recomputed_end; };
  const auto group_begin = [&](int l) { return layer_begin + (l - layer_begin) / group * group; };
  const auto group_end = [&](int l) { return std::min(group_begin(l) + group, recomputed_end); };
  StagePlan plan;
  plan.boundary_bytes = Bytes(d.tokens_sp * d.h * d.e);

  // Gradient units in the order backward completes them: head, layers last to first, embedding.
  int next_unit = 0;
  const std::int64_t head_params = (model.norm == Norm::layernorm ? 2 * d.h : d.h) +
                                   (!model.tied_embeddings || stages > 1 ? d.vocab_local * d.h : 0);
  const int head_unit = last ? next_unit++ : -1;
  if (last) plan.grad_units.push_back({"head", head_params});
  std::vector<int> layer_unit(static_cast<std::size_t>(layer_end - layer_begin));
  for (int l = layer_end - 1; l >= layer_begin; --l) {
    layer_unit[static_cast<std::size_t>(l - layer_begin)] = next_unit++;
    plan.grad_units.push_back({layer_name(l), layer_parameters_per_rank(model, setting.tp)});
  }
  const std::int64_t embedding_params =
      d.vocab_local * d.h + (model.position_embedding == PositionEmbedding::learned
                                 ? std::int64_t{model.max_seq_len} * d.h
                                 : 0);
  const int embedding_unit = first ? next_unit++ : -1;
  if (first) plan.grad_units.push_back({"embedding", embedding_params});
  for (const auto& u : plan.grad_units) plan.parameters += u.parameters;

  const std::int64_t n_hidden = d.tokens * d.h;
  // ---- forward
  std::vector<Segment> fwd;
  if (first) {
    std::vector<Kernel> k = {
        elementwise("embedding.lookup", n_hidden, n_hidden * d.e + d.tokens * 4, n_hidden * d.e)};
    if (model.position_embedding == PositionEmbedding::learned) {
      k.push_back(
          elementwise("embedding.position_add", n_hidden, 2 * n_hidden * d.e, n_hidden * d.e));
    }
    fwd.push_back(compute("embedding", std::move(k)));
    if (d.t > 1) fwd.push_back(tp_reduce(d, "embedding", -1));  // vocab-parallel embedding
    fwd.push_back(compute("embedding dropout",
                          {elementwise("embedding.dropout", d.tokens_sp * d.h,
                                       d.tokens_sp * d.h * d.e, d.tokens_sp * d.h * (d.e + 1))}));
    fwd.back().activation_delta = Bytes(d.tokens_sp * d.h);  // dropout mask
  }
  for (int l = layer_begin; l < layer_end; ++l) {
    if (fully_recomputed(l)) {  // run it, keep only the group's input
      const std::size_t at = fwd.size();
      layer_forward(d, l, Bytes(), Bytes(), fwd);
      if (l == group_begin(l)) fwd[at].checkpoint_delta += checkpoint;
    } else {
      layer_forward(d, l, attention_bytes - core_bytes, mlp_bytes, fwd);
    }
  }
  const std::int64_t logits = d.tokens * d.vocab_local;
  if (last) {
    std::vector<Kernel> k = {norm_kernel(d, "final_norm", false)};
    if (d.sp) {
      fwd.push_back(compute("final norm", std::move(k)));
      fwd.push_back(tp_gather(d, "head", -1));
      k.clear();
    }
    k.push_back(gemm("logits", d.tokens, d.vocab_local, d.h, d.dtype));
    k.push_back(elementwise("cross_entropy", logits, logits * d.e, logits * 4));
    fwd.push_back(compute("head", std::move(k)));
    // Stored: final norm input and output, fp32 logits (Korthikanti's 4sbv/t term).
    fwd.back().activation_delta = Bytes(2 * d.tokens_sp * d.h * d.e + logits * 4);
    if (d.t > 1) {  // vocab-parallel cross entropy: max, sum of exponentials, target logit
      fwd.push_back(
          collective("loss tp all-reduce", CollectiveKind::all_reduce, Bytes(3 * d.tokens * 4)));
      fwd.push_back(
          compute("loss", {elementwise("loss", d.tokens, 3 * d.tokens * 4, d.tokens * 4)}));
    }
  }
  plan.forward = merge_compute(std::move(fwd), setting.split_layers);

  // ---- backward (reverse order)
  std::vector<Segment> bwd;
  if (last) {
    std::vector<Kernel> k = {elementwise("cross_entropy.bwd", logits, logits * 4, logits * d.e),
                             gemm("logits.dgrad", d.tokens, d.h, d.vocab_local, d.dtype),
                             gemm("logits.wgrad", d.h, d.vocab_local, d.tokens, d.dtype)};
    bwd.push_back(compute("head bwd", std::move(k)));
    bwd.back().activation_delta = -Bytes(2 * d.tokens_sp * d.h * d.e + logits * 4);
    if (d.t > 1) bwd.push_back(tp_reduce(d, "head bwd", -1));
    bwd.push_back(compute("final norm bwd", {norm_kernel(d, "final_norm.bwd", true)}));
    bwd.back().grads_done.push_back(head_unit);
  }
  for (int l = layer_end - 1; l >= layer_begin; --l) {
    const bool full = fully_recomputed(l);
    if (full && l == group_end(l) - 1) {  // the group's forward again, storing its activations
      const std::size_t group_start = bwd.size();
      for (int r = group_begin(l); r <= l; ++r) {
        const std::size_t at = bwd.size();
        layer_forward(d, r, attention_bytes, mlp_bytes, bwd);
        for (std::size_t i = at; i < bwd.size(); ++i) {
          bwd[i].recompute = true;
          bwd[i].label = "recompute " + bwd[i].label;
        }
      }
      bwd[group_start].checkpoint_fetch = checkpoint;  // the recompute starts from the checkpoint
    }
    layer_backward(d, l, layer_unit[static_cast<std::size_t>(l - layer_begin)], attention_bytes,
                   mlp_bytes, full ? Bytes() : core_bytes, bwd);
    if (full && l == group_begin(l)) bwd.back().checkpoint_delta -= checkpoint;
  }
  if (first) {
    std::vector<Kernel> k = {elementwise("embedding.dropout.bwd", d.tokens_sp * d.h,
                                         d.tokens_sp * d.h * (d.e + 1), d.tokens_sp * d.h * d.e)};
    if (d.sp) {
      bwd.push_back(compute("embedding dropout bwd", std::move(k)));
      bwd.push_back(tp_gather(d, "embedding bwd", -1));
      k.clear();
    }
    k.push_back(elementwise("embedding.grad", n_hidden, 2 * n_hidden * d.e, n_hidden * d.e));
    bwd.push_back(compute("embedding bwd", std::move(k)));
    bwd.back().activation_delta = -Bytes(d.tokens_sp * d.h);
    bwd.back().grads_done.push_back(embedding_unit);
  }
  plan.backward = merge_compute(std::move(bwd), setting.split_layers);
  return plan;
}

}  // namespace stratasim::strategies
