#include "strategies/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "strategies/kernel_builders.hpp"

namespace stratasim::strategies {

std::vector<double> expert_fractions(const MoeSpec& moe) {
  const auto n = static_cast<std::size_t>(moe.num_experts);
  std::vector<double> f(n, 1.0);
  if (moe.imbalance == MoeImbalance::zipf) {
    for (std::size_t i = 0; i < n; ++i) {
      f[i] = 1.0 / std::pow(static_cast<double>(i + 1), moe.zipf_exponent);
    }
  } else if (moe.imbalance == MoeImbalance::histogram && moe.histogram.size() == n) {
    f = moe.histogram;
  }
  const double sum = std::accumulate(f.begin(), f.end(), 0.0);
  for (double& x : f) x /= sum;
  return f;
}

ExpertLoad expert_load(const MoeSpec& moe, double tokens, int ep) {
  const std::vector<double> f = expert_fractions(moe);
  const double routed = tokens * moe.top_k * ep;
  const double capacity =
      moe.capacity_factor ? std::ceil(*moe.capacity_factor * routed / moe.num_experts) : routed;
  const int local = moe.num_experts / ep;
  ExpertLoad load;
  for (int r = 0; r < ep; ++r) {
    double rank = 0;
    for (int i = r * local; i < (r + 1) * local; ++i) {
      rank += std::min(f[static_cast<std::size_t>(i)] * routed, capacity);
    }
    load.mean += rank / ep;
    load.max = std::max(load.max, rank);
  }
  return load;
}

Bytes dispatch_bytes(std::int64_t tokens, std::int64_t hidden, int top_k,
                     std::int64_t element_bytes, int ep) {
  return Bytes(tokens * hidden * top_k * element_bytes * (ep - 1) / ep);
}

std::int64_t token_bytes(std::int64_t tokens, std::int64_t hidden, std::int64_t element_bytes,
                         bool fp8) {
  return tokens * (fp8 ? fp8_dispatch_bytes(hidden) : hidden * element_bytes);
}

namespace {

// The shapes of one rank's MoE block.
struct MoeDims {
  const MoeSpec& m;
  const MoeSetting& set;
  std::int64_t h, e, t, T, E, k, local, up, f, sw_up, sw, tokens_full;
  bool gated, sp;
  DType dtype;
  double imbalance;
  std::int64_t received;  // tokens the most loaded rank's experts take (etp-gathered)
  // FP8 / FP4: the spec when this layer runs its linear layers in low precision (else unset).
  std::optional<LowPrecisionSpec> lp;
  int directions;
  bool weight_cache;

  // `layer` < 0: a layer in low precision when the setting has it.
  MoeDims(const TransformerModel& model, const LayerSetting& s, int layer)
      : m(*model.moe),
        set(s.moe),
        h(model.hidden),
        e(size_of(s.dtype)),
        t(s.tp),
        T(s.micro_batch * s.seq_len / std::max(1, s.tp)),
        E(m.num_experts),
        k(m.top_k),
        local(m.num_experts / std::max(1, s.moe.ep)),
        up(model.activation == Activation::swiglu ? 2 * std::int64_t{m.ffn_hidden} : m.ffn_hidden),
        f(m.ffn_hidden),
        sw_up((model.activation == Activation::swiglu ? 2 : 1) * std::int64_t{m.shared_width()} *
              m.shared_experts),
        sw(std::int64_t{m.shared_width()} * m.shared_experts),
        tokens_full(s.micro_batch * s.seq_len),
        gated(model.activation == Activation::swiglu),
        sp(s.tp > 1),
        dtype(s.dtype),
        directions(s.quantised_directions),
        weight_cache(s.weight_cache) {
    if (s.low_precision &&
        (layer < 0 || low_precision_layer(*s.low_precision, layer, model.layers))) {
      lp = s.low_precision;
    }
    const ExpertLoad load = expert_load(m, static_cast<double>(T), set.ep);
    imbalance = load.imbalance();
    received = static_cast<std::int64_t>(std::ceil(load.max)) * set.etp;
  }
  // The dispatch all-to-all's size: the T k permuted tokens (in FP8 with `fp8`: the forward
  // dispatch with MoeSetting::fp8_dispatch), scaled by the slowest receiver.
  Bytes a2a_bytes(bool fp8 = false) const {
    return Bytes(static_cast<std::int64_t>(
        std::ceil(static_cast<double>(token_bytes(T * k, h, e, fp8)) * imbalance)));
  }
  bool fp8_dispatch() const { return lp && set.fp8_dispatch && !set.allgather_dispatcher; }
  // A GEMM of `role`: in low precision where low_precision_gemm says so in a low-precision
  // layer, else in the high-precision dtype.
  Kernel gemm_of(GemmRole role, std::string name, std::int64_t rows, std::int64_t n,
                 std::int64_t kk, std::int64_t batch = 1, bool backward = false) const {
    if (lp && low_precision_gemm(*lp, role)) {
      return low_precision_gemm_kernel(*lp, directions, std::move(name), rows, n, kk, batch,
                                       backward);
    }
    return Kernel{Gemm{rows, n, kk, batch, dtype}, std::move(name)};
  }
  // The quantisation (a kernel: nothing fuses it) of a low-precision GEMM's input or output
  // gradient of `elements`, appended to `out`.
  void quantise(const std::string& name, std::int64_t elements, std::vector<Kernel>& out) const {
    if (lp) append_quantise(*lp, name, elements, e, directions, false, out);
  }
  // Without the framework's weight cache, every forward quantises the weights (this rank's
  // `elements`) before their GEMM.
  void forward_weight(const std::string& name, std::int64_t elements,
                      std::vector<Kernel>& out) const {
    if (lp && !weight_cache)
      append_quantise_weight(*lp, name + ".weight", elements, e, directions, out);
  }
  // What a linear layer saves of its input of `elements`: quantised in a low-precision layer.
  std::int64_t saved_input(std::int64_t elements) const {
    return lp ? saved_input_bytes(*lp, elements).count() : elements * e;
  }
  std::int64_t per_expert() const { return (received + local - 1) / local; }
};

Kernel elementwise(std::string name, std::int64_t elements, std::int64_t read,
                   std::int64_t written) {
  return Kernel{Elementwise{elements, Bytes(read), Bytes(written)}, std::move(name)};
}

Segment compute(const std::string& label, std::vector<Kernel> kernels, int layer) {
  Segment s;
  s.kernels = std::move(kernels);
  s.label = label;
  s.layer_begin = layer;
  s.layer_end = layer + 1;
  return s;
}

Segment collective(const std::string& label, CollectiveKind kind, Bytes bytes, TpAxis axis,
                   int layer) {
  Segment s;
  s.compute = false;
  s.collective = kind;
  s.bytes = bytes;
  s.axis = axis;
  s.label = label;
  s.layer_begin = layer;
  s.layer_end = layer + 1;
  return s;
}

// The experts' GEMMs of one pass: one grouped GEMM (batch = local experts) per projection, or
// one GEMM per expert without grouped GEMM.
void expert_gemm(const MoeDims& d, std::vector<Kernel>& k, const std::string& name, std::int64_t m,
                 std::int64_t n, std::int64_t kk, bool backward = false) {
  if (d.set.grouped_gemm) {
    k.push_back(d.gemm_of(GemmRole::expert, name, m, n, kk, d.local, backward));
    return;
  }
  for (std::int64_t i = 0; i < d.local; ++i) {
    k.push_back(d.gemm_of(GemmRole::expert, name, m, n, kk, 1, backward));
  }
}

// The shared experts: a tensor-parallel dense FFN of width sw over the tokens (all-gathered
// over tp with sequence parallelism, reduce-scattered after).
void shared_experts(const MoeDims& d, const std::string& L, int layer, bool backward, int chain,
                    std::vector<Segment>& out) {
  if (d.m.shared_experts == 0) return;
  const std::size_t at = out.size();
  const Bytes full(d.tokens_full * d.h * d.e);
  const std::int64_t n = d.sp ? d.tokens_full : d.T;
  const std::int64_t up_l = d.sw_up / d.t, sw_l = d.sw / d.t;
  if (d.sp) {
    out.push_back(collective(L + " shared experts tp all-gather", CollectiveKind::all_gather, full,
                             TpAxis::tp, layer));
  }
  std::vector<Kernel> k;
  if (!backward) {
    d.quantise("shared.fc1.input", n * d.h, k);
    d.forward_weight("shared.fc1", d.h * up_l, k);
    k.push_back(d.gemm_of(GemmRole::linear, "shared.fc1", n, up_l, d.h));
    k.push_back(elementwise(d.gated ? "shared.swiglu" : "shared.gelu", n * up_l, n * up_l * d.e,
                            n * sw_l * d.e));
    d.quantise("shared.fc2.input", n * sw_l, k);
    d.forward_weight("shared.fc2", sw_l * d.h, k);
    k.push_back(d.gemm_of(GemmRole::linear, "shared.fc2", n, d.h, sw_l));
    if (d.m.shared_expert_gate) {
      k.push_back(gemm("shared.gate", n, 1, d.h, d.dtype));
      k.push_back(elementwise("shared.gate_mul", n * d.h, n * d.h * d.e, n * d.h * d.e));
    }
  } else {
    if (d.m.shared_expert_gate) {
      k.push_back(elementwise("shared.gate_mul.bwd", n * d.h, 2 * n * d.h * d.e, n * d.h * d.e));
      k.push_back(gemm("shared.gate.dgrad", n, d.h, 1, d.dtype));
      k.push_back(gemm("shared.gate.wgrad", d.h, 1, n, d.dtype));
    }
    d.quantise("shared.fc2.grad_output", n * d.h, k);
    k.push_back(d.gemm_of(GemmRole::linear, "shared.fc2.dgrad", n, sw_l, d.h, 1, true));
    k.push_back(d.gemm_of(GemmRole::linear, "shared.fc2.wgrad", sw_l, d.h, n, 1, true));
    k.push_back(elementwise(d.gated ? "shared.swiglu.bwd" : "shared.gelu.bwd", n * up_l,
                            n * (up_l + sw_l) * d.e, n * up_l * d.e));
    d.quantise("shared.fc1.grad_output", n * up_l, k);
    k.push_back(d.gemm_of(GemmRole::linear, "shared.fc1.dgrad", n, d.h, up_l, 1, true));
    k.push_back(d.gemm_of(GemmRole::linear, "shared.fc1.wgrad", d.h, up_l, n, 1, true));
  }
  out.push_back(
      compute(L + (backward ? " shared experts bwd" : " shared experts"), std::move(k), layer));
  if (d.sp) {
    out.push_back(collective(L + " shared experts tp reduce-scatter",
                             CollectiveKind::reduce_scatter, full, TpAxis::tp, layer));
  }
  for (std::size_t i = at; i < out.size(); ++i) out[i].chain = chain;
}

// The dispatch (or, in the combine's place, the combine) collective of the chosen dispatcher.
// `fp8`: the forward dispatch with MoeSetting::fp8_dispatch (alltoall only).
void dispatch(const MoeDims& d, const std::string& label, bool gather, int layer,
              std::vector<Segment>& out, bool fp8 = false) {
  if (d.set.ep <= 1) return;
  if (d.set.allgather_dispatcher) {
    const Bytes all(d.T * d.set.ep * d.h * d.e);
    out.push_back(collective(label + (gather ? " all-gather" : " reduce-scatter"),
                             gather ? CollectiveKind::all_gather : CollectiveKind::reduce_scatter,
                             all, TpAxis::ep, layer));
  } else {
    out.push_back(collective(label + " all-to-all", CollectiveKind::all_to_all, d.a2a_bytes(fp8),
                             TpAxis::ep, layer));
  }
}

void etp_collective(const MoeDims& d, const std::string& label, CollectiveKind kind, int layer,
                    std::vector<Segment>& out) {
  if (d.set.etp <= 1) return;
  out.push_back(collective(label, kind, Bytes(d.received * d.h * d.e), TpAxis::etp, layer));
}

}  // namespace

std::vector<Segment> moe_block_forward(const TransformerModel& model, const LayerSetting& setting,
                                       int layer, Bytes stored) {
  const MoeDims d(model, setting, layer);
  const std::string L = "L" + std::to_string(layer) + " moe";
  std::vector<Segment> out;
  std::vector<Kernel> k;
  const std::int64_t scores = d.T * d.E;
  k.push_back(d.gemm_of(GemmRole::router, "router", d.T, d.E, d.h));
  k.push_back(
      elementwise(d.m.router == MoeRouter::softmax_topk ? "router.softmax" : "router.sigmoid",
                  scores, scores * d.e, scores * 4));
  k.push_back(elementwise("router.topk", scores, scores * 4, d.T * d.k * 12));
  if (d.m.aux_loss_coeff > 0) {
    k.push_back(elementwise("router.aux_loss", scores, scores * 4 + d.T * d.k * 8, d.E * 8));
  }
  if (!d.set.allgather_dispatcher) {
    const std::int64_t n = d.T * d.k * d.h;
    k.push_back(elementwise("moe.permute", n, d.T * d.h * d.e + d.T * d.k * 8, n * d.e));
    // FP8 dispatch: the permuted tokens quantised (1x128 blocks) before the all-to-all.
    if (d.fp8_dispatch() && d.set.ep > 1) {
      k.push_back(elementwise("moe.dispatch.cast", n, n * d.e, fp8_dispatch_bytes(n)));
    }
  }
  out.push_back(compute(L + " router", std::move(k), layer));
  dispatch(d, L + " dispatch", true, layer, out, d.fp8_dispatch());
  if (d.set.shared_expert_overlap) shared_experts(d, L, layer, false, 1, out);
  k.clear();
  if (d.fp8_dispatch() && d.set.ep > 1) {  // the received tokens back in the training dtype
    const std::int64_t n = d.received / d.set.etp * d.h;
    k.push_back(elementwise("moe.dispatch.dequantize", n, fp8_dispatch_bytes(n), n * d.e));
  }
  if (d.set.allgather_dispatcher) {  // the gathered tokens permuted locally
    const std::int64_t n = d.received / d.set.etp * d.h;
    k.push_back(elementwise("moe.permute", n, d.T * d.set.ep * d.h * d.e, n * d.e));
  }
  etp_collective(d, L + " etp all-gather", CollectiveKind::all_gather, layer, out);
  const std::int64_t m = d.per_expert(), up_l = d.up / d.set.etp, f_l = d.f / d.set.etp;
  d.quantise("experts.fc1.input", d.received * d.h, k);
  d.forward_weight("experts.fc1", d.local * d.h * up_l, k);
  expert_gemm(d, k, "experts.fc1", m, up_l, d.h);
  k.push_back(elementwise(d.gated ? "experts.swiglu" : "experts.gelu", d.received * up_l,
                          d.received * up_l * d.e, d.received * f_l * d.e));
  d.quantise("experts.fc2.input", d.received * f_l, k);
  d.forward_weight("experts.fc2", d.local * f_l * d.h, k);
  expert_gemm(d, k, "experts.fc2", m, d.h, f_l);
  out.push_back(compute(L + " experts", std::move(k), layer));
  out.back().activation_delta = stored;
  etp_collective(d, L + " etp reduce-scatter", CollectiveKind::reduce_scatter, layer, out);
  dispatch(d, L + " combine", false, layer, out);
  const std::int64_t n = d.T * d.k * d.h;
  out.push_back(compute(L + " unpermute",
                        {elementwise("moe.unpermute", n, n * d.e + d.T * d.k * 4, d.T * d.h * d.e)},
                        layer));
  if (!d.set.shared_expert_overlap) shared_experts(d, L, layer, false, 0, out);
  return out;
}

std::vector<Segment> moe_block_backward(const TransformerModel& model, const LayerSetting& setting,
                                        int layer, Bytes stored) {
  const MoeDims d(model, setting, layer);
  const std::string L = "L" + std::to_string(layer) + " moe";
  std::vector<Segment> out;
  if (!d.set.shared_expert_overlap) shared_experts(d, L, layer, true, 0, out);
  const std::int64_t n = d.T * d.k * d.h;
  out.push_back(compute(
      L + " unpermute bwd",
      {elementwise("moe.unpermute.bwd", n, d.T * d.h * d.e + d.T * d.k * 4, n * d.e)}, layer));
  dispatch(d, L + " combine bwd", true, layer, out);
  if (d.set.shared_expert_overlap) shared_experts(d, L, layer, true, 1, out);
  etp_collective(d, L + " etp all-gather bwd", CollectiveKind::all_gather, layer, out);
  std::vector<Kernel> k;
  const std::int64_t m = d.per_expert(), up_l = d.up / d.set.etp, f_l = d.f / d.set.etp;
  d.quantise("experts.fc2.grad_output", d.received * d.h, k);
  expert_gemm(d, k, "experts.fc2.dgrad", m, f_l, d.h, true);
  expert_gemm(d, k, "experts.fc2.wgrad", f_l, d.h, m, true);
  k.push_back(elementwise(d.gated ? "experts.swiglu.bwd" : "experts.gelu.bwd", d.received * up_l,
                          d.received * (up_l + f_l) * d.e, d.received * up_l * d.e));
  d.quantise("experts.fc1.grad_output", d.received * up_l, k);
  expert_gemm(d, k, "experts.fc1.dgrad", m, d.h, up_l, true);
  expert_gemm(d, k, "experts.fc1.wgrad", d.h, up_l, m, true);
  out.push_back(compute(L + " experts bwd", std::move(k), layer));
  etp_collective(d, L + " etp reduce-scatter bwd", CollectiveKind::reduce_scatter, layer, out);
  dispatch(d, L + " dispatch bwd", false, layer, out);
  k.clear();
  const std::int64_t scores = d.T * d.E;
  k.push_back(elementwise("moe.permute.bwd", n, n * d.e, d.T * d.h * d.e));
  k.push_back(elementwise("router.scores.bwd", scores, scores * 8, scores * d.e));
  k.push_back(d.gemm_of(GemmRole::router, "router.dgrad", d.T, d.h, d.E));
  k.push_back(d.gemm_of(GemmRole::router, "router.wgrad", d.E, d.h, d.T));
  out.push_back(compute(L + " router bwd", std::move(k), layer));
  out.back().activation_delta = -stored;
  return out;
}

Bytes moe_block_activations(const TransformerModel& model, const LayerSetting& setting, int layer) {
  const MoeDims d(model, setting, layer);
  const std::int64_t up_l = d.up / d.set.etp, f_l = d.f / d.set.etp;
  std::int64_t bytes = d.T * d.h * d.e                    // router input (ln2 output)
                       + d.T * d.E * 4                    // fp32 routing probabilities
                       + d.T * d.k * d.h * d.e            // permuted tokens
                       + d.saved_input(d.received * d.h)  // fc1 input
                       + d.received * up_l * d.e          // activation input
                       + d.saved_input(d.received * f_l)  // fc2 input
                       + d.T * d.k * d.h * d.e;           // combine output (unpermute input)
  if (d.m.shared_experts > 0) {
    const std::int64_t n = d.sp ? d.tokens_full : d.T;
    bytes += d.saved_input(n * d.h) + n * (d.sw_up / d.t) * d.e + d.saved_input(n * (d.sw / d.t));
  }
  return Bytes(bytes);
}

std::vector<LinearWeight> moe_linear_weights(const TransformerModel& model,
                                             const LayerSetting& setting) {
  const MoeDims d(model, setting, -1);
  const std::int64_t up_l = d.up / d.set.etp, f_l = d.f / d.set.etp;
  std::vector<LinearWeight> out;
  if (d.m.shared_experts > 0) {
    out.push_back({"shared.fc1", d.h * (d.sw_up / d.t), 1});
    out.push_back({"shared.fc2", d.sw / d.t * d.h, 1});
  }
  out.push_back({"experts.fc1", d.local * d.h * up_l, d.local});
  out.push_back({"experts.fc2", d.local * f_l * d.h, d.local});
  return out;
}

MoeRankParameters moe_parameters_per_rank(const TransformerModel& model,
                                          const LayerSetting& setting) {
  const MoeSpec& m = *model.moe;
  const std::int64_t h = model.hidden, b = model.bias ? 1 : 0, t = setting.tp;
  const std::int64_t gate_up = model.activation == Activation::swiglu ? 2 : 1;
  auto ffn = [&](std::int64_t f, std::int64_t split) {
    return (h * gate_up * f + b * gate_up * f + f * h) / split + b * h;
  };
  MoeRankParameters p;
  p.dense = m.num_experts * h + (m.router == MoeRouter::sigmoid_group_topk ? m.num_experts : 0) +
            m.shared_experts * ffn(m.shared_width(), t) + (m.shared_expert_gate ? h : 0);
  p.experts = m.num_experts / setting.moe.ep * ffn(m.ffn_hidden, setting.moe.etp);
  return p;
}

std::int64_t attention_parameters_per_rank(const TransformerModel& model, int tp) {
  const std::int64_t h = model.hidden, t = tp, b = model.bias ? 1 : 0;
  if (model.mla) {
    const MlaSpec& a = *model.mla;
    const std::int64_t H = model.heads, qr = a.q_lora_rank, kvr = a.kv_lora_rank;
    const std::int64_t replicated =
        (qr > 0 ? h * qr + qr : 0) + h * (kvr + a.qk_rope_head_dim) + kvr;
    const std::int64_t sharded = (qr > 0 ? qr : h) * H * a.qk_head_dim() +
                                 kvr * H * (a.qk_nope_head_dim + a.v_head_dim) +
                                 H * a.v_head_dim * h;
    return replicated + sharded / t;
  }
  const std::int64_t kv = model.kv_hidden();
  return (h * (h + 2 * kv) + b * (h + 2 * kv) + h * h) / t + b * h;
}

double training_flops_per_token(const TransformerModel& model, std::int64_t seq_len) {
  const double h = model.hidden, a = model.heads;
  const double gate_up = model.activation == Activation::swiglu ? 3 : 2;  // matrices per FFN
  double attention_matrices = 0, d_qk = model.head_dim(), d_v = model.head_dim();
  if (model.mla) {
    const MlaSpec& m = *model.mla;
    const double qr = m.q_lora_rank, kvr = m.kv_lora_rank;
    attention_matrices = (qr > 0 ? h * qr + qr * a * m.qk_head_dim() : h * a * m.qk_head_dim()) +
                         h * (kvr + m.qk_rope_head_dim) +
                         kvr * a * (m.qk_nope_head_dim + m.v_head_dim) + a * m.v_head_dim * h;
    d_qk = m.qk_head_dim();
    d_v = m.v_head_dim;
  } else {
    attention_matrices = h * (h + 2.0 * model.kv_hidden()) + h * h;
  }
  double matrices = h * model.vocab;  // LM head
  for (int l = 0; l < model.layers; ++l) {
    matrices += attention_matrices;
    if (model.is_moe_layer(l)) {
      const MoeSpec& m = *model.moe;
      matrices += m.num_experts * h + m.top_k * gate_up * h * m.ffn_hidden +
                  m.shared_experts * gate_up * h * m.shared_width() +
                  (m.shared_expert_gate ? h : 0.0);
    } else {
      matrices += gate_up * h * model.ffn_hidden;
    }
  }
  const double attention = 6.0 * static_cast<double>(seq_len) * a * (d_qk + d_v) * model.layers;
  return 6.0 * matrices + attention;
}

}  // namespace stratasim::strategies
