#include "strategies/transformer.hpp"

#include "strategies/moe.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "strategies/kernel_builders.hpp"

namespace stratasim::strategies {

namespace {

// Shapes of one layer as seen by one tensor-parallel rank.
struct Dims {
  std::int64_t b, s, h, a, kv, d, t, ffn, up, vocab_local, e;
  std::int64_t qd;         // width of the Q projection: a * d (h unless head_dim is explicit)
  std::int64_t s_kv;       // keys each query may attend to: context + s
  std::int64_t tokens;     // b * s
  std::int64_t tokens_sp;  // tokens in sequence-parallel regions: b * s / t with SP, else b * s
  bool sp;
  DType dtype;
  bool flash;
  hw::AttentionImpl attention_kernel;
  bool causal;
  bool gated;
  const char* act;  // the MLP activation's kernel name
  bool qk_norm, post_norm;
  // Dropout runs (masks stored, dropout kernels issued) only with a probability above zero:
  // `hidden_dropout` on the embedding output and each block's output, `attention_dropout` on
  // the softmax output, which the fused (flash) kernel applies itself, storing no mask.
  bool hidden_dropout;
  bool attention_dropout;
  // The tensor-parallel mesh and what one rank holds of an activation: its samples (bl) and
  // tokens (tl), its slice of the hidden dimension (hl), its attention heads, and the elements
  // of the residual stream it holds (1D: tokens_sp * h; 2D, 2.5D, 3D: tl * hl).
  TpMesh mesh;
  bool nd;  // tp_mode 2d, 2.5d or 3d
  std::int64_t q;
  std::int64_t bl, tl, hl, heads_l, kv_l, n_res;
  const TransformerModel* model;  // MoE layers and MLA (1D only)
  const LayerSetting* setting;
  std::int64_t attn_out;  // the output projection's local input width: a d / t, MLA's a v / t
  // FP8 / FP4 linear layers (strategies/precision.hpp), 1D only; the model's layer count for
  // the layers kept in the high-precision dtype.
  std::optional<LowPrecisionSpec> lp;
  int directions;
  int layers;
  bool fused_modules, weight_cache;

  Dims(const TransformerModel& m, const LayerSetting& set)
      : b(set.micro_batch),
        s(set.seq_len),
        h(m.hidden),
        a(m.heads),
        kv(m.kv_heads),
        d(m.mla ? m.mla->qk_head_dim() : m.head_dim()),
        t(set.tp),
        ffn(m.ffn_hidden),
        up(m.up_width()),
        vocab_local((std::int64_t{m.vocab} + set.tp - 1) / set.tp),
        e(size_of(set.dtype)),
        qd(m.query_width()),
        s_kv(set.context_len + set.seq_len),
        tokens(b * s),
        tokens_sp(set.sequence_parallel && set.tp > 1 ? b * s / set.tp : b * s),
        sp(set.sequence_parallel && set.tp > 1 && set.tp_mode == TpMode::one_d),
        dtype(set.dtype),
        flash(set.flash_attention),
        attention_kernel(set.attention_kernel),
        causal(m.causal),
        gated(m.gated()),
        act(m.activation_kernel()),
        qk_norm(m.qk_norm),
        post_norm(m.post_norm),
        hidden_dropout(m.hidden_dropout > 0.0),
        attention_dropout(m.attention_dropout > 0.0 && !set.flash_attention),
        mesh(set.mesh()),
        nd(mesh.mode != TpMode::one_d),
        q(mesh.q),
        bl(nd ? b / mesh.batch_split() : b),
        tl(bl * s),
        hl(nd ? h / q : h),
        heads_l(nd ? a / q : a / t),
        kv_l(nd ? kv / q : kv / t),
        n_res(nd ? tl * hl : tokens_sp * h),
        model(&m),
        setting(&set),
        attn_out(m.mla ? std::int64_t{m.heads} * m.mla->v_head_dim / set.tp
                       : m.query_width() / set.tp),
        lp(set.low_precision),
        directions(set.quantised_directions),
        layers(m.layers),
        fused_modules(set.te_fused_modules),
        weight_cache(set.weight_cache) {}

  bool moe_layer(int layer) const { return model->is_moe_layer(layer); }

  // Whether layer `layer`'s linear layers run in low precision.
  bool low(int layer) const { return lp && !nd && low_precision_layer(*lp, layer, layers); }
  // A linear layer's GEMM of layer `layer`: in low precision (the recipe's kernel class,
  // low_precision_gemm_kernel) or in the high-precision dtype.
  Kernel linear(int layer, std::string name, std::int64_t m, std::int64_t n, std::int64_t k,
                bool backward = false) const {
    if (!low(layer)) return Kernel{Gemm{m, n, k, 1, dtype}, std::move(name)};
    return low_precision_gemm_kernel(*lp, directions, std::move(name), m, n, k, 1, backward);
  }
  // The quantisation of a tensor of `elements` feeding a low-precision GEMM of layer `layer`,
  // appended to `k` (append_quantise): `fusable` when the producing kernel is one of TE's fused
  // modules' (with a framework that uses them).
  void quantise(int layer, const std::string& name, std::int64_t elements, bool fusable,
                std::vector<Kernel>& k) const {
    if (!low(layer)) return;
    append_quantise(*lp, name, elements, e, directions, fusable && fused_modules, k);
  }
  // The quantisation of a linear weight (`elements` of this rank), appended to `k`.
  void quantise_weight(const std::string& name, std::int64_t elements,
                       std::vector<Kernel>& k) const {
    append_quantise_weight(*lp, name, elements, e, directions, k);
  }
  // Without the framework's weight cache, every forward of layer `layer` quantises the weight of
  // linear `index` (linear_weight_shapes) before its GEMM.
  void forward_weight(int layer, int index, std::vector<Kernel>& k) const {
    if (!low(layer) || weight_cache) return;
    const auto weights = linear_weight_shapes();
    const auto [name, elements] = weights[static_cast<std::size_t>(index)];
    quantise_weight(std::string(name) + ".weight", elements, k);
  }
  // The elements of the rank's linear weights of a layer (qkv, proj, fc1, fc2), and their sum.
  std::array<std::pair<const char*, std::int64_t>, 4> linear_weight_shapes() const {
    return {{{"qkv", h * qkv_width()},
             {"proj", attn_out * h},
             {"fc1", h * (up / t)},
             {"fc2", ffn / t * h}}};
  }
  std::int64_t linear_weights() const {
    std::int64_t n = 0;
    for (const auto& w : linear_weight_shapes()) n += w.second;
    return n;
  }
  // The low-precision weights of layer `layer` (this rank's): none in a high-precision layer;
  // qkv, proj, fc1, fc2 in a dense one; qkv, proj and the MoE block's linear layers
  // (moe_linear_weights: shared and routed experts) in an MoE layer.
  std::vector<LinearWeight> low_precision_weight_list(int layer) const {
    std::vector<LinearWeight> out;
    if (!low(layer)) return out;
    const auto w = linear_weight_shapes();
    const std::size_t dense = moe_layer(layer) ? 2 : w.size();
    for (std::size_t i = 0; i < dense; ++i) out.push_back({w[i].first, w[i].second, 1});
    if (moe_layer(layer)) {
      for (LinearWeight& x : moe_linear_weights(*model, *setting)) out.push_back(std::move(x));
    }
    return out;
  }
  std::int64_t low_precision_weights(int layer) const {
    std::int64_t n = 0;
    for (const LinearWeight& w : low_precision_weight_list(layer)) n += w.elements;
    return n;
  }
  // The low-precision GEMMs of layer `layer` (a grouped GEMM of n experts counts n): the amax
  // reduction's tensors. The attention block's projections (MLA's several) and proj, then
  // the MLP's (dense fc1 and fc2, or the MoE block's).
  std::int64_t low_precision_gemms(int layer) const;
  // Bytes of a sequence-parallel all-gather of a linear layer's input: in the low-precision
  // dtype with FP8 tensor-parallel communication.
  Bytes gathered_input_bytes(int layer) const {
    if (low(layer) && lp->tp_comm) return Bytes(packed_bytes(lp->dtype, tokens * h));
    return hidden_bytes();
  }

  std::int64_t qkv_width() const { return (a + 2 * kv) * d / t; }  // local QKV output width
  Bytes hidden_bytes() const { return Bytes(tokens * h * e); }     // one full [b, s, h] tensor
};

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

// Norm, dropout and residual work on the rank's n_res elements of the residual stream.
Kernel norm_kernel(const Dims& d, std::string name, bool backward) {
  std::int64_t n = d.n_res;
  return backward ? elementwise(std::move(name), n, 2 * n * d.e, n * d.e)
                  : elementwise(std::move(name), n, n * d.e, n * d.e);
}

// A block's output joining the residual stream: Megatron's fused bias-dropout-add with hidden
// dropout (forward reads the branch and the residual, writes the sum and a 1-byte mask; backward
// reads the gradient and the mask and writes the branch's and the residual's gradients), or a
// plain residual add without it (forward reads both, writes the sum; backward: none, the sum's
// gradient is both operands' gradient). Empty when there is nothing to run.
std::vector<Kernel> dropout_residual(const Dims& d, const std::string& name, bool backward) {
  const std::int64_t n = d.n_res;
  if (!d.hidden_dropout) {
    if (backward) return {};
    return {elementwise(name.substr(0, name.find("dropout_residual")) + "residual", n, 2 * n * d.e,
                        n * d.e)};
  }
  return {backward ? elementwise(name, n, n * d.e + n, 2 * n * d.e)
                   : elementwise(name, n, 2 * n * d.e, n * d.e + n)};
}

void append(std::vector<Kernel>& to, std::vector<Kernel> kernels) {
  to.insert(to.end(), std::make_move_iterator(kernels.begin()),
            std::make_move_iterator(kernels.end()));
}

// The fused (flash) attention kernel of one tensor-parallel rank of layer `layer` (-1: none in
// particular): its sliding window or attention chunk, if any (the unfused path computes the
// whole score matrix and masks it, so neither saves anything there); in FP8 with FP8 attention
// (LowPrecisionSpec::attention) in a low-precision layer.
Kernel fused_attention(const Dims& d, bool backward, int layer) {
  const DType dtype =
      layer >= 0 && d.low(layer) && low_precision_gemm(*d.lp, GemmRole::attention_core) ? DType::fp8
                                                                                        : d.dtype;
  Attention a{d.bl, d.heads_l, d.kv_l, d.s,      d.s_kv,
              d.d,  d.causal,  dtype,  backward, d.attention_kernel};
  // A window no shorter than the keys changes nothing: left unset (the Program is the same).
  if (const std::int64_t w = layer >= 0 ? d.model->window_of(layer) : 0; w > 0 && w < d.s_kv) {
    a.window = w;
  }
  // Likewise a chunk no shorter than the keys (Llama 4's 8192 at 8192 tokens or fewer).
  if (const std::int64_t c = layer >= 0 ? d.model->chunk_of(layer) : 0; c > 0 && c < d.s_kv) {
    a.chunk = c;
  }
  return Kernel{a, backward ? "attention.bwd" : "attention"};
}

void attention_core_forward(const Dims& d, int layer, std::vector<Kernel>& k) {
  const std::int64_t heads_local = d.heads_l;
  if (d.flash) {
    k.push_back(fused_attention(d, false, layer));
    return;
  }
  const std::int64_t scores = d.bl * heads_local * d.s * d.s_kv;
  k.push_back(gemm("attention.qk", d.s, d.s_kv, d.d, d.dtype, d.bl * heads_local));
  if (d.model->attention_logit_softcap > 0) {  // c tanh(scores / c), in place
    k.push_back(elementwise("attention.softcap", scores, scores * d.e, scores * d.e));
  }
  k.push_back(elementwise("attention.softmax", scores, scores * d.e, scores * d.e));
  if (d.attention_dropout) {
    k.push_back(elementwise("attention.dropout", scores, scores * d.e, scores * d.e + scores));
  }
  k.push_back(gemm("attention.pv", d.s, d.d, d.s_kv, d.dtype, d.bl * heads_local));
}

void attention_core_backward(const Dims& d, int layer, std::vector<Kernel>& k) {
  const std::int64_t heads_local = d.heads_l;
  if (d.flash) {
    k.push_back(fused_attention(d, true, layer));
    return;
  }
  const std::int64_t scores = d.bl * heads_local * d.s * d.s_kv;
  const std::int64_t batch = d.bl * heads_local;
  k.push_back(gemm("attention.pv.dgrad", d.s, d.s_kv, d.d, d.dtype, batch));  // dP = dO V^T
  k.push_back(gemm("attention.pv.vgrad", d.s_kv, d.d, d.s, d.dtype, batch));  // dV = P^T dO
  if (d.attention_dropout) {
    k.push_back(elementwise("attention.dropout.bwd", scores, scores * d.e + scores, scores * d.e));
  }
  k.push_back(elementwise("attention.softmax.bwd", scores, 2 * scores * d.e, scores * d.e));
  if (d.model->attention_logit_softcap > 0) {  // times 1 - tanh^2, from the capped scores
    k.push_back(elementwise("attention.softcap.bwd", scores, 2 * scores * d.e, scores * d.e));
  }
  k.push_back(gemm("attention.qk.qgrad", d.s, d.d, d.s_kv, d.dtype, batch));  // dQ = dS K
  k.push_back(gemm("attention.qk.kgrad", d.s_kv, d.d, d.s, d.dtype, batch));  // dK = dS^T Q
}

Bytes sum_bytes(const std::vector<ActivationItem>& items, std::size_t begin, std::size_t end) {
  Bytes total;
  for (std::size_t i = begin; i < end; ++i) total += items[i].bytes;
  return total;
}

// Indices in layer_activations(): [0, attention_end) belong to the attention block, of which
// [core_begin, core_end) are the attention core's (softmax output, and with attention dropout
// its mask and output). The attention block ends with the proj input, the attention dropout
// mask (hidden dropout) and, with 3D, the block's gathered weights.
struct ItemRanges {
  std::size_t core_begin, core_end, attention_end;
};
ItemRanges item_ranges(const Dims& d) {
  const std::size_t core_end = 6 + (d.attention_dropout ? 2 : 0);
  return {5, core_end,
          core_end + 1 + (d.hidden_dropout ? 1 : 0) + (d.mesh.mode == TpMode::three_d ? 1 : 0) +
              (d.qk_norm ? 1 : 0) + (d.post_norm ? 1 : 0)};
}

// The MLP block's output joining the residual stream (forward): its post-norm (post_norm),
// then the dropout and residual add.
std::vector<Kernel> mlp_output(const Dims& d) {
  std::vector<Kernel> k;
  if (d.post_norm) k.push_back(norm_kernel(d, "post_ln2", false));
  append(k, dropout_residual(d, "mlp.dropout_residual", false));
  return k;
}

// The per-head norms of the queries and keys (qk_norm), on the rank's heads.
Kernel qk_norm_kernel(const Dims& d, bool backward) {
  const std::int64_t n = d.tokens * (d.heads_l + d.kv_l) * d.d;
  return backward ? elementwise("qk_norm.bwd", n, 2 * n * d.e, n * d.e)
                  : elementwise("qk_norm", n, n * d.e, n * d.e);
}

// The query, key and value projections (one fused QKV GEMM), or MLA's: query down (or none),
// its norm and up; key-value down (with the shared rope key), its norm and up. The down
// projections are replicated over the tensor-parallel ranks, the up projections split by heads.
struct Projection {
  std::string name;
  std::int64_t in, out;
};
std::vector<Projection> qkv_projections(const Dims& d) {
  if (d.model->mla == std::nullopt) return {{"qkv", d.h, d.qkv_width()}};
  const MlaSpec& a = *d.model->mla;
  const std::int64_t heads_l = d.a / d.t;
  std::vector<Projection> p;
  if (a.q_lora_rank > 0) {
    p.push_back({"q_down", d.h, a.q_lora_rank});
    p.push_back({"q_up", a.q_lora_rank, heads_l * a.qk_head_dim()});
  } else {
    p.push_back({"q", d.h, heads_l * a.qk_head_dim()});
  }
  p.push_back({"kv_down", d.h, std::int64_t{a.kv_lora_rank} + a.qk_rope_head_dim});
  p.push_back({"kv_up", a.kv_lora_rank, heads_l * (a.qk_nope_head_dim + a.v_head_dim)});
  return p;
}

std::int64_t Dims::low_precision_gemms(int layer) const {
  if (!low(layer)) return 0;
  std::int64_t n = static_cast<std::int64_t>(qkv_projections(*this).size()) + 1;
  if (!moe_layer(layer)) return n + 2;
  for (const LinearWeight& w : moe_linear_weights(*model, *setting)) n += w.gemms;
  return n;
}

void qkv_forward(const Dims& d, int layer, std::vector<Kernel>& k) {
  for (const Projection& p : qkv_projections(d)) {
    k.push_back(d.linear(layer, p.name, d.tokens, p.out, p.in));
    if (p.name == "q_down" || p.name == "kv_down") {  // the latent's RMSNorm
      k.push_back(elementwise(p.name + ".norm", d.tokens * p.out, d.tokens * p.out * d.e,
                              d.tokens * p.out * d.e));
    }
  }
}

// The data gradients (last projection first), or the weight gradients.
void qkv_backward(const Dims& d, int layer, std::vector<Kernel>& k, bool weight) {
  const std::vector<Projection> ps = qkv_projections(d);
  for (auto it = ps.rbegin(); it != ps.rend(); ++it) {
    if (weight) {
      k.push_back(d.linear(layer, it->name + ".wgrad", it->in, it->out, d.tokens, true));
    } else {
      k.push_back(d.linear(layer, it->name + ".dgrad", d.tokens, it->in, it->out, true));
    }
  }
}

void layer_forward(const Dims& d, int layer, Bytes attention_bytes, Bytes mlp_bytes,
                   std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  // Attention block: norm, QKV, core, output projection, then Megatron's g.
  std::vector<Kernel> attention;
  attention.push_back(norm_kernel(d, "ln1", false));
  if (d.sp) {
    out.push_back(compute(L + " ln1", std::move(attention), layer));
    out.push_back(tp_gather(d, L + " attention", layer));
    out.back().bytes = d.gathered_input_bytes(layer);
    attention.clear();
  }
  d.quantise(layer, "qkv.input", d.tokens * d.h, true, attention);  // fused into ln1
  d.forward_weight(layer, 0, attention);
  qkv_forward(d, layer, attention);
  if (d.qk_norm) attention.push_back(qk_norm_kernel(d, false));
  attention_core_forward(d, layer, attention);
  // FP8 attention writes proj's FP8 input itself.
  d.quantise(layer, "proj.input", d.tokens * d.attn_out, d.lp && d.lp->attention && d.flash,
             attention);
  d.forward_weight(layer, 1, attention);
  attention.push_back(d.linear(layer, "proj", d.tokens, d.h, d.attn_out));
  out.push_back(compute(L + " attention", std::move(attention), layer));
  out.back().activation_delta = attention_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " attention", layer));

  // MLP block.
  std::vector<Kernel> mlp;
  if (d.post_norm) mlp.push_back(norm_kernel(d, "post_ln1", false));
  append(mlp, dropout_residual(d, "attention.dropout_residual", false));
  mlp.push_back(norm_kernel(d, "ln2", false));
  if (d.moe_layer(layer)) {  // the MoE block (strategies/moe.hpp) in place of the dense MLP
    out.push_back(compute(L + " ln2", std::move(mlp), layer));
    for (Segment& s : moe_block_forward(*d.model, *d.setting, layer, mlp_bytes)) {
      out.push_back(std::move(s));
    }
    out.push_back(compute(L + " residual", mlp_output(d), layer));
    return;
  }
  if (d.sp) {
    out.push_back(compute(L + " ln2", std::move(mlp), layer));
    out.push_back(tp_gather(d, L + " mlp", layer));
    out.back().bytes = d.gathered_input_bytes(layer);
    mlp.clear();
  }
  const std::int64_t up_local = d.up / d.t, ffn_local = d.ffn / d.t;
  d.quantise(layer, "fc1.input", d.tokens * d.h, true, mlp);  // fused into ln2
  d.forward_weight(layer, 2, mlp);
  mlp.push_back(d.linear(layer, "fc1", d.tokens, up_local, d.h));
  mlp.push_back(elementwise(d.act, d.tokens * up_local, d.tokens * up_local * d.e,
                            d.tokens * ffn_local * d.e));
  d.quantise(layer, "fc2.input", d.tokens * ffn_local, true, mlp);  // fused into the activation
  d.forward_weight(layer, 3, mlp);
  mlp.push_back(d.linear(layer, "fc2", d.tokens, d.h, ffn_local));
  out.push_back(compute(L + " mlp", std::move(mlp), layer));
  out.back().activation_delta = mlp_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " mlp", layer));
  out.push_back(compute(L + " residual", mlp_output(d), layer));
}

// Appends a compute segment of `kernels` unless there are none.
void push_compute(std::vector<Segment>& out, std::string label, std::vector<Kernel> kernels,
                  int layer) {
  if (!kernels.empty()) out.push_back(compute(std::move(label), std::move(kernels), layer));
}

void dense_mlp_backward(const Dims& d, int layer, Bytes mlp_bytes, std::vector<Kernel> k,
                        std::vector<Segment>& out);
void layer_attention_backward(const Dims& d, int layer, int grad_unit, Bytes attention_bytes,
                              Bytes recomputed_core, std::vector<Segment>& out);

// `recomputed_core` > 0: selective recomputation, the attention core's stored items (that many
// bytes) are recomputed right before its backward.
void layer_backward(const Dims& d, int layer, int grad_unit, Bytes attention_bytes, Bytes mlp_bytes,
                    Bytes recomputed_core, std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  std::vector<Kernel> k = dropout_residual(d, "mlp.dropout_residual.bwd", true);
  if (d.post_norm) k.push_back(norm_kernel(d, "post_ln2.bwd", true));
  if (d.moe_layer(layer)) {
    push_compute(out, L + " residual bwd", std::move(k), layer);
    for (Segment& s : moe_block_backward(*d.model, *d.setting, layer, mlp_bytes)) {
      out.push_back(std::move(s));
    }
    k.clear();
  } else {
    dense_mlp_backward(d, layer, mlp_bytes, std::move(k), out);
  }
  layer_attention_backward(d, layer, grad_unit, attention_bytes, recomputed_core, out);
}

void dense_mlp_backward(const Dims& d, int layer, Bytes mlp_bytes, std::vector<Kernel> k,
                        std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  const std::int64_t up_local = d.up / d.t, ffn_local = d.ffn / d.t;
  if (d.sp) {  // the reduce-scatter after fc2 becomes an all-gather of its gradient
    push_compute(out, L + " residual bwd", std::move(k), layer);
    out.push_back(tp_gather(d, L + " mlp bwd", layer));
    k.clear();
  }
  d.quantise(layer, "fc2.grad_output", d.tokens * d.h, false, k);
  k.push_back(d.linear(layer, "fc2.dgrad", d.tokens, ffn_local, d.h, true));
  k.push_back(d.linear(layer, "fc2.wgrad", ffn_local, d.h, d.tokens, true));
  k.push_back(elementwise(std::string(d.act) + ".bwd", d.tokens * up_local,
                          d.tokens * (up_local + ffn_local) * d.e, d.tokens * up_local * d.e));
  // Fused into the activation's backward (TE's cast_transpose_dbias_dgelu).
  d.quantise(layer, "fc1.grad_output", d.tokens * up_local, true, k);
  k.push_back(d.linear(layer, "fc1.dgrad", d.tokens, d.h, up_local, true));
  if (d.sp) {  // fc1's input was gathered in forward and is gathered again for its wgrad
    out.push_back(compute(L + " mlp bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " mlp input regather", layer));
    k.clear();
  }
  k.push_back(d.linear(layer, "fc1.wgrad", d.h, up_local, d.tokens, true));
  out.push_back(compute(L + (d.sp ? " fc1 wgrad" : " mlp bwd"), std::move(k), layer));
  out.back().activation_delta = -mlp_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " mlp bwd", layer));  // Megatron's f in backward
}

void layer_attention_backward(const Dims& d, int layer, int grad_unit, Bytes attention_bytes,
                              Bytes recomputed_core, std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  std::vector<Kernel> k;
  k.push_back(norm_kernel(d, "ln2.bwd", true));
  append(k, dropout_residual(d, "attention.dropout_residual.bwd", true));
  if (d.post_norm) k.push_back(norm_kernel(d, "post_ln1.bwd", true));
  if (d.sp) {
    out.push_back(compute(L + " ln2 bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " attention bwd", layer));
    k.clear();
  }
  d.quantise(layer, "proj.grad_output", d.tokens * d.h, false, k);
  k.push_back(d.linear(layer, "proj.dgrad", d.tokens, d.attn_out, d.h, true));
  k.push_back(d.linear(layer, "proj.wgrad", d.attn_out, d.h, d.tokens, true));
  if (recomputed_core.count() > 0) {  // Megatron's checkpointed core attention
    out.push_back(compute(L + " proj bwd", std::move(k), layer));
    k.clear();
    attention_core_forward(d, layer, k);
    out.push_back(compute("recompute " + L + " attention core", std::move(k), layer));
    out.back().recompute = true;
    out.back().activation_delta = recomputed_core;
    k.clear();
  }
  attention_core_backward(d, layer, k);
  if (d.qk_norm) k.push_back(qk_norm_kernel(d, true));
  d.quantise(layer, "qkv.grad_output", d.tokens * d.qkv_width(), false, k);
  qkv_backward(d, layer, k, false);
  if (d.sp) {
    out.push_back(compute(L + " attention bwd", std::move(k), layer));
    out.push_back(tp_gather(d, L + " attention input regather", layer));
    k.clear();
  }
  qkv_backward(d, layer, k, true);
  out.push_back(compute(L + (d.sp ? " qkv wgrad" : " attention bwd"), std::move(k), layer));
  out.back().activation_delta = -attention_bytes;
  if (d.t > 1) out.push_back(tp_reduce(d, L + " attention bwd", layer));

  out.push_back(compute(L + " ln1 bwd",
                        {norm_kernel(d, "ln1.bwd", true),
                         elementwise("residual.bwd", d.n_res, 2 * d.n_res * d.e, d.n_res * d.e)},
                        layer));
  out.back().grads_done.push_back(grad_unit);
}

// ---- Colossal-AI's 2D, 2.5D and 3D tensor parallelism (docs/tensor-parallelism.md).

Segment axis_collective(std::string label, CollectiveKind kind, Bytes bytes, TpAxis axis,
                        int layer) {
  Segment s = collective(std::move(label), kind, bytes, layer);
  s.axis = axis;
  return s;
}

// The 3D axes of the k-th Linear of a layer (0 qkv, 1 proj, 2 fc1, 3 fc2): its input is
// all-gathered along `input`, its weight along `weight` and its output reduce-scattered along
// `output` (the axis its input's hidden slices lie along: the partial products are summed there).
// Consecutive Linears swap input and output axes (Colossal-AI's swap_in_out_group), so the
// residual stream entering qkv and fc1 has its hidden dimension split along tp_row, as in 2D.
struct Axes3d {
  TpAxis input, weight, output;
};
Axes3d axes_3d(int k) {
  return k % 2 == 0 ? Axes3d{TpAxis::tp_col, TpAxis::tp_depth, TpAxis::tp_row}
                    : Axes3d{TpAxis::tp_row, TpAxis::tp_depth, TpAxis::tp_col};
}

// Forward of Linear `name`, [tokens, in] -> [tokens, out], on this rank's blocks.
// - 2D and 2.5D (SUMMA, Colossal-AI's Matmul_AB): q steps; step i broadcasts the input block of
//   mesh column i along each row ([tl, in/q]) and the weight block of mesh row i along each
//   column ([in/q, out/q]), then multiplies them into the [tl, out/q] output block.
// - 3D (Colossal-AI's linear_3d): all-gather the input along its input axis ([q tl, in/q]) and
//   the weight along the depth ([in/q, out/q]), one GEMM, reduce-scatter the output along the
//   output axis back to [tl, out/q].
void nd_linear_forward(const Dims& d, const std::string& L, const std::string& name,
                       std::int64_t in, std::int64_t out, int k, int layer,
                       std::vector<Segment>& segs) {
  const std::int64_t q = d.q, e = d.e, t = d.tl;
  const std::string base = L + " " + name;
  if (d.mesh.mode == TpMode::three_d) {
    const Axes3d ax = axes_3d(k);
    segs.push_back(axis_collective(base + " input all-gather", CollectiveKind::all_gather,
                                   Bytes(q * t * (in / q) * e), ax.input, layer));
    segs.push_back(axis_collective(base + " weight all-gather", CollectiveKind::all_gather,
                                   Bytes((in / q) * (out / q) * e), ax.weight, layer));
    segs.push_back(compute(base, {gemm(name, q * t, out / q, in / q, d.dtype)}, layer));
    segs.push_back(axis_collective(base + " output reduce-scatter", CollectiveKind::reduce_scatter,
                                   Bytes(q * t * (out / q) * e), ax.output, layer));
    return;
  }
  for (std::int64_t step = 0; step < q; ++step) {
    const std::string at = base + " summa " + std::to_string(step);
    segs.push_back(axis_collective(at + " input broadcast", CollectiveKind::broadcast,
                                   Bytes(t * (in / q) * e), TpAxis::tp_row, layer));
    segs.push_back(axis_collective(at + " weight broadcast", CollectiveKind::broadcast,
                                   Bytes((in / q) * (out / q) * e), TpAxis::tp_col, layer));
    segs.push_back(compute(at, {gemm(name, t, out / q, in / q, d.dtype)}, layer));
  }
}

// Backward of Linear `name`: the input gradient, then the weight gradient.
// - 2D and 2.5D (Colossal-AI's Matmul_ABT and Matmul_ATB): dX in q steps, each broadcasting a
//   weight block along the columns, multiplying, and reducing the [tl, in/q] partial dX along
//   the row to its owner; dW in q steps, each broadcasting an input block along the rows,
//   multiplying, and reducing the [in/q, out/q] partial dW along the column. 2.5D then sums the
//   weight gradient of the d depth layers (each saw its own samples): an all-reduce along the
//   depth.
// - 3D: all-gather dY along the output axis, dX = dY W^T reduce-scattered along the input axis,
//   dW = X^T dY reduce-scattered along the depth (the gathered X and W are kept from forward).
void nd_linear_backward(const Dims& d, const std::string& L, const std::string& name,
                        std::int64_t in, std::int64_t out, int k, int layer,
                        std::vector<Segment>& segs) {
  const std::int64_t q = d.q, e = d.e, t = d.tl;
  const std::string base = L + " " + name + " bwd";
  if (d.mesh.mode == TpMode::three_d) {
    const Axes3d ax = axes_3d(k);
    segs.push_back(axis_collective(base + " output-grad all-gather", CollectiveKind::all_gather,
                                   Bytes(q * t * (out / q) * e), ax.output, layer));
    segs.push_back(
        compute(base + " dgrad", {gemm(name + ".dgrad", q * t, in / q, out / q, d.dtype)}, layer));
    segs.push_back(axis_collective(base + " input-grad reduce-scatter",
                                   CollectiveKind::reduce_scatter, Bytes(q * t * (in / q) * e),
                                   ax.input, layer));
    segs.push_back(
        compute(base + " wgrad", {gemm(name + ".wgrad", in / q, out / q, q * t, d.dtype)}, layer));
    segs.push_back(axis_collective(base + " weight-grad reduce-scatter",
                                   CollectiveKind::reduce_scatter, Bytes((in / q) * (out / q) * e),
                                   ax.weight, layer));
    return;
  }
  for (std::int64_t step = 0; step < q; ++step) {
    const std::string at = base + " dgrad summa " + std::to_string(step);
    segs.push_back(axis_collective(at + " weight broadcast", CollectiveKind::broadcast,
                                   Bytes((in / q) * (out / q) * e), TpAxis::tp_col, layer));
    segs.push_back(compute(at, {gemm(name + ".dgrad", t, in / q, out / q, d.dtype)}, layer));
    segs.push_back(axis_collective(at + " input-grad reduce", CollectiveKind::reduce,
                                   Bytes(t * (in / q) * e), TpAxis::tp_row, layer));
  }
  for (std::int64_t step = 0; step < q; ++step) {
    const std::string at = base + " wgrad summa " + std::to_string(step);
    segs.push_back(axis_collective(at + " input broadcast", CollectiveKind::broadcast,
                                   Bytes(t * (in / q) * e), TpAxis::tp_row, layer));
    segs.push_back(compute(at, {gemm(name + ".wgrad", in / q, out / q, t, d.dtype)}, layer));
    segs.push_back(axis_collective(at + " weight-grad reduce", CollectiveKind::reduce,
                                   Bytes((in / q) * (out / q) * e), TpAxis::tp_col, layer));
  }
  if (d.mesh.mode == TpMode::two_half_d && d.mesh.d > 1) {
    segs.push_back(axis_collective(base + " weight-grad depth all-reduce",
                                   CollectiveKind::all_reduce, Bytes((in / q) * (out / q) * e),
                                   TpAxis::tp_depth, layer));
  }
}

// A norm over a hidden dimension split along tp_row: local sums, an all-reduce of the two fp32
// statistics per token (mean and mean square forward; their gradients backward), as
// Colossal-AI's LayerNorm2D / _Layernorm3D do, then the elementwise work.
void nd_norm(const Dims& d, const std::string& label, const std::string& name, bool backward,
             int layer, std::vector<Segment>& segs) {
  const std::int64_t n = d.n_res, stats = 2 * d.tl * 4;
  const std::string kname = backward ? name + ".bwd" : name;
  segs.push_back(compute(label + " stats",
                         {elementwise(kname + ".stats", n, (backward ? 2 : 1) * n * d.e, stats)},
                         layer));
  segs.push_back(axis_collective(label + " stats all-reduce", CollectiveKind::all_reduce,
                                 Bytes(stats), TpAxis::tp_row, layer));
  segs.push_back(compute(label, {elementwise(kname, n, n * d.e + stats, n * d.e)}, layer));
}

// The widths of a layer's Linears: qkv h -> (a + 2 kv) d, proj h -> h, fc1 h -> up,
// fc2 ffn -> h.
std::int64_t qkv_out(const Dims& d) {
  return (d.a + 2 * d.kv) * d.d;
}

void add_to_last_compute(std::vector<Segment>& segs, Bytes delta) {
  for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
    if (it->compute) {
      it->activation_delta += delta;
      return;
    }
  }
}

void nd_layer_forward(const Dims& d, int layer, Bytes attention_bytes, Bytes mlp_bytes,
                      std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  nd_norm(d, L + " ln1", "ln1", false, layer, out);
  nd_linear_forward(d, L, "qkv", d.h, qkv_out(d), 0, layer, out);
  std::vector<Kernel> core;
  attention_core_forward(d, layer, core);
  out.push_back(compute(L + " attention core", std::move(core), layer));
  out.back().activation_delta = attention_bytes;
  nd_linear_forward(d, L, "proj", d.h, d.h, 1, layer, out);
  out.push_back(compute(L + " attention residual",
                        dropout_residual(d, "attention.dropout_residual", false), layer));
  nd_norm(d, L + " ln2", "ln2", false, layer, out);
  nd_linear_forward(d, L, "fc1", d.h, d.up, 2, layer, out);
  const std::int64_t up_l = d.tl * (d.up / d.q), ffn_l = d.tl * (d.ffn / d.q);
  out.push_back(
      compute(L + " mlp activation", {elementwise(d.act, up_l, up_l * d.e, ffn_l * d.e)}, layer));
  out.back().activation_delta = mlp_bytes;
  nd_linear_forward(d, L, "fc2", d.ffn, d.h, 3, layer, out);
  out.push_back(
      compute(L + " residual", dropout_residual(d, "mlp.dropout_residual", false), layer));
}

void nd_layer_backward(const Dims& d, int layer, int grad_unit, Bytes attention_bytes,
                       Bytes mlp_bytes, Bytes recomputed_core, std::vector<Segment>& out) {
  const std::string L = layer_name(layer);
  push_compute(out, L + " residual bwd", dropout_residual(d, "mlp.dropout_residual.bwd", true),
               layer);
  nd_linear_backward(d, L, "fc2", d.ffn, d.h, 3, layer, out);
  const std::int64_t up_l = d.tl * (d.up / d.q), ffn_l = d.tl * (d.ffn / d.q);
  out.push_back(compute(
      L + " mlp activation bwd",
      {elementwise(std::string(d.act) + ".bwd", up_l, (up_l + ffn_l) * d.e, up_l * d.e)}, layer));
  nd_linear_backward(d, L, "fc1", d.h, d.up, 2, layer, out);
  add_to_last_compute(out, -mlp_bytes);
  nd_norm(d, L + " ln2 bwd", "ln2", true, layer, out);
  push_compute(out, L + " attention residual bwd",
               dropout_residual(d, "attention.dropout_residual.bwd", true), layer);
  nd_linear_backward(d, L, "proj", d.h, d.h, 1, layer, out);
  std::vector<Kernel> k;
  if (recomputed_core.count() > 0) {  // Megatron's checkpointed core attention
    attention_core_forward(d, layer, k);
    out.push_back(compute("recompute " + L + " attention core", std::move(k), layer));
    out.back().recompute = true;
    out.back().activation_delta = recomputed_core;
    k.clear();
  }
  attention_core_backward(d, layer, k);
  out.push_back(compute(L + " attention core bwd", std::move(k), layer));
  nd_linear_backward(d, L, "qkv", d.h, qkv_out(d), 0, layer, out);
  add_to_last_compute(out, -attention_bytes);
  nd_norm(d, L + " ln1 bwd", "ln1", true, layer, out);
  out.push_back(compute(L + " residual grad",
                        {elementwise("residual.bwd", d.n_res, 2 * d.n_res * d.e, d.n_res * d.e)},
                        layer));
  out.back().grads_done.push_back(grad_unit);
}

// A layer's forward and backward under the setting's tp mode.
void any_layer_forward(const Dims& d, int layer, Bytes attention_bytes, Bytes mlp_bytes,
                       std::vector<Segment>& out) {
  if (d.nd) {
    nd_layer_forward(d, layer, attention_bytes, mlp_bytes, out);
  } else {
    layer_forward(d, layer, attention_bytes, mlp_bytes, out);
  }
}

void any_layer_backward(const Dims& d, int layer, int grad_unit, Bytes attention_bytes,
                        Bytes mlp_bytes, Bytes recomputed_core, std::vector<Segment>& out) {
  if (d.nd) {
    nd_layer_backward(d, layer, grad_unit, attention_bytes, mlp_bytes, recomputed_core, out);
  } else {
    layer_backward(d, layer, grad_unit, attention_bytes, mlp_bytes, recomputed_core, out);
  }
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
      joins = previous.compute && s.compute && !other_layer && previous.recompute == s.recompute &&
              previous.chain == s.chain;
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

namespace {

// 2D, 2.5D and 3D: every tensor is this rank's block ([tl, hl] for the residual stream, local
// heads for attention); 3D keeps each Linear's gathered input [q tl, in/q] and gathered weight
// [in/q, out/q] from forward for its backward, as Colossal-AI's linear_3d saves them.
std::vector<ActivationItem> nd_layer_activations(const Dims& d) {
  const std::int64_t e = d.e, q = d.q, tl = d.tl;
  const std::int64_t rep = d.n_res;
  const std::int64_t scores = d.bl * d.heads_l * d.s * d.s_kv;
  const std::int64_t kv_width = d.kv_l * d.d;
  const bool three = d.mesh.mode == TpMode::three_d;
  const std::int64_t g = three ? q : 1;  // rows of a stored Linear input, in tl
  std::vector<ActivationItem> items = {
      {"ln1 input", Bytes(rep * e)},
      {three ? "qkv input (gathered)" : "qkv input (ln1 output)", Bytes(g * rep * e)},
      {"q", Bytes(tl * d.heads_l * d.d * e)},
      {"k", Bytes(tl * kv_width * e)},
      {"v", Bytes(tl * kv_width * e)},
      {d.flash ? "softmax statistics (fp32)" : "softmax output",
       Bytes(d.flash ? d.bl * d.heads_l * d.s * 4 : scores * e)},
  };
  if (d.attention_dropout) {
    items.push_back({"softmax dropout mask", Bytes(scores)});
    items.push_back({"softmax dropout output", Bytes(scores * e)});
  }
  items.push_back({three ? "proj input (gathered)" : "proj input", Bytes(g * tl * (d.h / q) * e)});
  if (d.hidden_dropout) items.push_back({"attention dropout mask", Bytes(rep)});
  if (three) {
    items.push_back({"qkv and proj weights (gathered)",
                     Bytes(((d.h / q) * (qkv_out(d) / q) + (d.h / q) * (d.h / q)) * e)});
  }
  const std::vector<ActivationItem> mlp = {
      {"ln2 input", Bytes(rep * e)},
      {three ? "fc1 input (gathered)" : "fc1 input (ln2 output)", Bytes(g * rep * e)},
      {std::string(d.act) + " input", Bytes(tl * (d.up / q) * e)},
      {three ? "fc2 input (gathered)" : "fc2 input", Bytes(g * tl * (d.ffn / q) * e)},
  };
  items.insert(items.end(), mlp.begin(), mlp.end());
  if (d.hidden_dropout) items.push_back({"mlp dropout mask", Bytes(rep)});
  if (three) {
    items.push_back({"fc1 and fc2 weights (gathered)",
                     Bytes(((d.h / q) * (d.up / q) + (d.ffn / q) * (d.h / q)) * e)});
  }
  return items;
}

}  // namespace

std::vector<ActivationItem> layer_activations(const TransformerModel& model,
                                              const LayerSetting& setting, int layer) {
  const Dims d(model, setting);
  if (d.nd) return nd_layer_activations(d);
  const std::int64_t e = d.e;
  // A linear layer's saved input of `elements`: quantised in a low-precision layer.
  const bool low = layer < 0 ? d.lp.has_value() : d.low(layer);
  const auto saved = [&](std::int64_t elements) {
    return low ? saved_input_bytes(*d.lp, elements) : Bytes(elements * e);
  };
  const std::int64_t proj_in = d.tokens * d.qd / d.t;
  // The attention output: kept by the fused kernel in its dtype besides proj's FP8 copy.
  const Bytes proj_input =
      low ? saved(proj_in) + Bytes(d.flash && !low_precision_gemm(*d.lp, GemmRole::attention_core)
                                       ? proj_in * e
                                       : 0)
          : Bytes(proj_in * e);
  // Tensors replicated across tensor-parallel ranks, unless sequence parallelism shards them.
  const std::int64_t rep = d.tokens_sp * d.h;
  const std::int64_t scores = d.b * (d.a / d.t) * d.s * d.s_kv;
  const std::int64_t kv_width = d.kv * d.d / d.t;
  // Attention block (item_ranges() gives its bounds), then the MLP block; dropout masks and
  // outputs only where that dropout runs (Dims::hidden_dropout, Dims::attention_dropout).
  std::vector<ActivationItem> items = {
      {"ln1 input", Bytes(rep * e)},
      {"qkv input (ln1 output)", saved(rep)},
      {"q", Bytes(d.tokens * d.qd / d.t * e)},
      {"k", Bytes(d.tokens * kv_width * e)},
      {"v", Bytes(d.tokens * kv_width * e)},
      {d.flash ? "softmax statistics (fp32)" : "softmax output",
       Bytes(d.flash ? d.b * (d.a / d.t) * d.s * 4 : scores * e)},
  };
  if (d.attention_dropout) {
    items.push_back({"softmax dropout mask", Bytes(scores)});
    items.push_back({"softmax dropout output", Bytes(scores * e)});
  }
  items.push_back({"proj input", proj_input});
  if (d.hidden_dropout) items.push_back({"attention dropout mask", Bytes(rep)});
  if (d.qk_norm) {
    items.push_back({"q and k norm inputs", Bytes(d.tokens * (d.heads_l + d.kv_l) * d.d * e)});
  }
  if (d.post_norm) items.push_back({"post_ln1 input", Bytes(rep * e)});
  items.push_back({"ln2 input", Bytes(rep * e)});
  items.push_back({"fc1 input (ln2 output)", saved(rep)});
  items.push_back({std::string(d.act) + " input", Bytes(d.tokens * (d.up / d.t) * e)});
  items.push_back({"fc2 input", saved(d.tokens * (d.ffn / d.t))});
  if (d.hidden_dropout) items.push_back({"mlp dropout mask", Bytes(rep)});
  if (d.post_norm) items.push_back({"post_ln2 input", Bytes(rep * e)});
  return items;
}

Bytes checkpoint_bytes(const TransformerModel& model, const LayerSetting& setting) {
  const Dims d(model, setting);
  return Bytes(d.n_res * d.e);
}

std::int64_t layer_parameters_per_rank(const TransformerModel& m, int tp) {
  const std::int64_t h = m.hidden, kv = m.kv_hidden(), f = m.ffn_hidden, t = tp;
  const std::int64_t qw = m.query_width();
  const std::int64_t b = m.bias ? 1 : 0, qb = m.has_qkv_bias() ? 1 : 0;
  const std::int64_t up = m.up_width();
  std::int64_t sharded = (h * (qw + 2 * kv) + qb * (qw + 2 * kv)  // QKV (column parallel)
                          + qw * h           // projection weight (row parallel)
                          + h * up + b * up  // fc1 (column parallel)
                          + f * h) /         // fc2 weight (row parallel)
                         t;
  std::int64_t replicated = b * h + b * h  // row-parallel biases
                            + m.layer_norm_parameters();
  return sharded + replicated;
}

namespace {

// Parameters of one norm held by one rank: replicated in 1D, q^2 pieces in 2D and 2.5D, q
// slices in 3D (docs/tensor-parallelism.md).
std::int64_t norm_parameters_per_rank(const TransformerModel& m, const TpMesh& mesh) {
  const std::int64_t n = m.norm == Norm::layernorm ? 2 * std::int64_t{m.hidden} : m.hidden;
  const std::int64_t q = mesh.q;
  switch (mesh.mode) {
    case TpMode::one_d:
      return n;
    case TpMode::two_d:
    case TpMode::two_half_d:
      return n / (q * q);
    case TpMode::three_d:
      return n / q;
  }
  return n;
}

}  // namespace

std::int64_t layer_parameters_per_rank(const TransformerModel& m, const LayerSetting& setting) {
  const TpMesh mesh = setting.mesh();
  if (mesh.mode == TpMode::one_d) return layer_parameters_per_rank(m, setting.tp);
  const std::int64_t h = m.hidden, kv = m.kv_hidden(), f = m.ffn_hidden, q = mesh.q;
  const std::int64_t b = m.bias ? 1 : 0;
  const std::int64_t up = m.up_width();
  // (in, out) of qkv, proj, fc1, fc2.
  const std::int64_t linears[4][2] = {{h, h + 2 * kv}, {h, h}, {h, up}, {f, h}};
  std::int64_t total = 2 * norm_parameters_per_rank(m, mesh);
  for (const auto& [in, out] : linears) {
    if (mesh.mode == TpMode::three_d) {
      total += (in / q) * (out / (q * q)) + b * (out / q);
    } else {
      total += (in / q) * (out / q) + b * (out / (q * q));
    }
  }
  return total;
}

namespace {

// Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py)
// over the rank's `logits` = tokens x V/t elements, computed in fp32 as Megatron does (the
// logits are cast with .float() first): the cast (none when training in fp32), the max over
// the vocabulary, the max subtracted, exp, the sum of exponentials, and the division that
// leaves the fp32 softmax stored for backward (Korthikanti's 4sbv/t). The all-reduces between
// them (t > 1) are the "loss tp all-reduce" after. Per logit: e + 20 bytes read, 16 written.
void cross_entropy_forward(const Dims& d, std::int64_t logits, std::vector<Kernel>& k) {
  const std::int64_t per_token = d.tokens * 4;  // one fp32 value per token
  if (d.e != 4) k.push_back(elementwise("cross_entropy.cast", logits, logits * d.e, logits * 4));
  k.push_back(elementwise("cross_entropy.max", logits, logits * 4, per_token));
  k.push_back(elementwise("cross_entropy.sub_max", logits, logits * 4 + per_token, logits * 4));
  k.push_back(elementwise("cross_entropy.exp", logits, logits * 4, logits * 4));
  k.push_back(elementwise("cross_entropy.sum", logits, logits * 4, per_token));
  k.push_back(elementwise("cross_entropy.softmax", logits, logits * 4 + per_token, logits * 4));
}

// Its backward: the stored softmax, one subtracted at each target, times the loss gradient
// (in place, fp32), then cast to the training dtype for the logits GEMM's backward.
void cross_entropy_backward(const Dims& d, std::int64_t logits, std::vector<Kernel>& k) {
  k.push_back(elementwise("cross_entropy.bwd", logits, logits * 4 + d.tokens * 4, logits * 4));
  if (d.e != 4) {
    k.push_back(elementwise("cross_entropy.bwd.cast", logits, logits * 4, logits * d.e));
  }
}

// The backward of an embedding table of `rows` rows looked up by the rank's tokens
// (PyTorch's embedding_dense_backward): the dense [rows, h] gradient zero-filled, then each
// token's output gradient (n elements, with its int64 id) added into its row (read and
// written back).
Kernel embedding_backward(const Dims& d, std::string name, std::int64_t rows) {
  const std::int64_t n = d.tokens * d.h, table = rows * d.h;
  return elementwise(std::move(name), table + n, 2 * n * d.e + d.tokens * 8, table * d.e + n * d.e);
}

}  // namespace

GradUnit layer_unit_of(const TransformerModel& m, const LayerSetting& setting, int layer) {
  GradUnit unit{layer_name(layer), layer_parameters_per_rank(m, setting), layer};
  if (!m.mla && !m.is_moe_layer(layer)) return unit;
  // 1D (MLA and MoE are modelled with Megatron's 1D only): attention, MLP, two norms.
  const std::int64_t h = m.hidden, f = m.ffn_hidden, t = setting.tp, b = m.bias ? 1 : 0;
  const std::int64_t up = m.activation == Activation::swiglu ? 2 * f : f;
  std::int64_t mlp = (h * up + b * up + f * h) / t + b * h;
  if (m.is_moe_layer(layer)) {
    const MoeRankParameters p = moe_parameters_per_rank(m, setting);
    mlp = p.dense + p.experts;
    unit.expert_parameters = p.experts;
  }
  unit.parameters = attention_parameters_per_rank(m, setting.tp) + mlp +
                    2 * (m.norm == Norm::layernorm ? 2 * h : h);
  return unit;
}

namespace {

// What a stage's layers store and which of them are recomputed: per layer, the bytes its
// attention and MLP blocks keep for the backward (linear inputs quantised in a low-precision
// layer; an MoE layer's MLP block the MoE block's tensors and the hidden dropout's mask), and
// full recomputation's groups.
class StageStorage {
 public:
  StageStorage(const TransformerModel& model, const LayerSetting& setting, const Dims& d,
               int layer_begin, int layer_end, const StageRecompute& recompute)
      : model_(model),
        setting_(setting),
        d_(d),
        ranges_(item_ranges(d)),
        layer_begin_(layer_begin),
        recomputed_end_(layer_begin +
                        std::clamp(recompute.recomputed_layers, 0, layer_end - layer_begin)),
        group_(std::max(1, recompute.group)),
        checkpoint(checkpoint_bytes(model, setting)),
        // Selective recomputation: the attention core's items are not stored (none with flash
        // attention, whose core keeps only its softmax statistics: nothing to recompute).
        core_bytes(recompute.selective && !d.flash ? sum_bytes(layer_activations(model, setting),
                                                               ranges_.core_begin, ranges_.core_end)
                                                   : Bytes()) {}

  Bytes attention_bytes(int l) const {
    return sum_bytes(layer_activations(model_, setting_, l), 0, ranges_.attention_end);
  }
  Bytes mlp_bytes(int l) const {
    if (model_.is_moe_layer(l)) {
      return moe_block_activations(model_, setting_, l) + Bytes(d_.hidden_dropout ? d_.n_res : 0);
    }
    const auto items = layer_activations(model_, setting_, l);
    return sum_bytes(items, ranges_.attention_end, items.size());
  }
  // Full recomputation: layers [layer_begin, recomputed_end) in groups of `group`.
  bool fully_recomputed(int l) const { return l < recomputed_end_; }
  int group_begin(int l) const { return layer_begin_ + (l - layer_begin_) / group_ * group_; }
  int group_end(int l) const { return std::min(group_begin(l) + group_, recomputed_end_); }

 private:
  const TransformerModel& model_;
  const LayerSetting& setting_;
  const Dims& d_;
  ItemRanges ranges_;
  int layer_begin_, recomputed_end_, group_;

 public:
  const Bytes checkpoint;  // a full-recomputation group's input
  const Bytes core_bytes;  // what selective recomputation does not store per layer
};

// The gradient units of a stage in the order backward completes them: head, layers last to
// first, embedding; their ids (-1: the stage has none).
struct StageUnits {
  int head = -1, embedding = -1;
  std::vector<int> layer;  // per layer of the stage, from layer_begin
};

StageUnits add_grad_units(const TransformerModel& model, const LayerSetting& setting, const Dims& d,
                          bool first, bool last, int stages, int layer_begin, int layer_end,
                          StagePlan& plan) {
  StageUnits ids;
  int next_unit = 0;
  const std::int64_t head_params = norm_parameters_per_rank(model, d.mesh) +
                                   (!model.tied_embeddings || stages > 1 ? d.vocab_local * d.h : 0);
  if (last) {
    ids.head = next_unit++;
    plan.grad_units.push_back({"head", head_params, -1});
  }
  ids.layer.resize(static_cast<std::size_t>(layer_end - layer_begin));
  for (int l = layer_end - 1; l >= layer_begin; --l) {
    ids.layer[static_cast<std::size_t>(l - layer_begin)] = next_unit++;
    GradUnit unit = layer_unit_of(model, setting, l);
    unit.low_precision_parameters = d.low_precision_weights(l);
    plan.grad_units.push_back(unit);
  }
  const std::int64_t embedding_params =
      d.vocab_local * d.h + (model.position_embedding == PositionEmbedding::learned
                                 ? std::int64_t{model.max_seq_len} * d.h
                                 : 0);
  if (first) {
    ids.embedding = next_unit++;
    plan.grad_units.push_back({"embedding", embedding_params, -1});
  }
  for (const auto& u : plan.grad_units) plan.parameters += u.parameters;
  return ids;
}

// FP8 / FP4: each low-precision layer's linear weights (this rank's shards: an MoE layer's
// shared and local experts' too), quantised once per iteration after the optimizer step (an
// amax pass first where the recipe has no fused casts), and with delayed scaling one update of
// the amax histories and scales of the stage's 3 tensors per GEMM (TE's fused
// amax_and_scale_update: reads and writes each history). Returns the stage's low-precision
// GEMMs (the amax reduction's size).
std::int64_t add_weight_casts(const Dims& d, int layer_begin, int layer_end, StagePlan& plan) {
  std::int64_t low_gemms = 0;
  if (!d.lp) return low_gemms;
  for (int l = layer_begin; l < layer_end; ++l) {
    for (const LinearWeight& w : d.low_precision_weight_list(l)) {
      // Cached over the microbatches: once per iteration (else in every forward).
      if (d.weight_cache) {
        d.quantise_weight(layer_name(l) + "." + w.name + ".weight", w.elements, plan.weight_casts);
      }
      plan.low_precision_parameters += w.elements;
    }
    low_gemms += d.low_precision_gemms(l);
  }
  if (d.lp->recipe == ScalingRecipe::delayed && low_gemms > 0) {
    const std::int64_t history = std::int64_t{3} * low_gemms * d.lp->amax_history_len;
    plan.weight_casts.push_back(
        elementwise("fp8.amax_and_scale_update", history, history * 4, history * 4));
  }
  return low_gemms;
}

// The first stage's embedding: the rank's rows of the (vocab-parallel) table gathered by the
// int64 token ids; the learned positions' rows added.
void embedding_forward(const TransformerModel& model, const Dims& d, std::vector<Segment>& fwd) {
  const std::int64_t n_hidden = d.tokens * d.h;
  std::vector<Kernel> k = {
      elementwise("embedding.lookup", n_hidden, n_hidden * d.e + d.tokens * 8, n_hidden * d.e)};
  if (model.position_embedding == PositionEmbedding::learned) {
    k.push_back(
        elementwise("embedding.position_add", n_hidden, 2 * n_hidden * d.e, n_hidden * d.e));
  }
  fwd.push_back(compute("embedding", std::move(k)));
  if (d.t > 1) fwd.push_back(tp_reduce(d, "embedding", -1));  // vocab-parallel embedding
  // The embedding's all-reduce leaves the whole [b s, h] on every rank; with 2D, 2.5D and 3D
  // each keeps its block (n_res elements). Megatron applies hidden dropout to it.
  if (d.hidden_dropout) {
    fwd.push_back(compute("embedding dropout", {elementwise("embedding.dropout", d.n_res,
                                                            d.n_res * d.e, d.n_res * (d.e + 1))}));
    fwd.back().activation_delta = Bytes(d.n_res);  // dropout mask
  }
}

void embedding_backward_segments(const TransformerModel& model, const Dims& d, int unit,
                                 std::vector<Segment>& bwd) {
  std::vector<Kernel> k;
  if (d.hidden_dropout) {
    k.push_back(elementwise("embedding.dropout.bwd", d.n_res, d.n_res * (d.e + 1), d.n_res * d.e));
  }
  if (d.sp || d.nd) {  // the vocab-parallel table's gradient needs the whole [b s, h]
    push_compute(bwd, "embedding dropout bwd", std::move(k), -1);
    bwd.push_back(tp_gather(d, "embedding bwd", -1));
    k.clear();
  }
  k.push_back(embedding_backward(d, "embedding.grad", d.vocab_local));
  if (model.position_embedding == PositionEmbedding::learned) {
    k.push_back(embedding_backward(d, "embedding.position_grad", model.max_seq_len));
  }
  bwd.push_back(compute("embedding bwd", std::move(k)));
  bwd.back().activation_delta = -Bytes(d.hidden_dropout ? d.n_res : 0);  // the dropout mask
  bwd.back().grads_done.push_back(unit);
}

// Stored by the head: final norm input and output (with 2D, 2.5D and 3D its input block and
// the output all-gathered over the tp group), fp32 logits (Korthikanti's 4sbv/t term), and
// with a final soft-cap the capped logits its backward differentiates (1 - tanh^2).
Bytes head_stored_bytes(const TransformerModel& model, const Dims& d) {
  const std::int64_t logits = d.tokens * d.vocab_local;
  const bool softcap = model.final_logit_softcap > 0;
  return Bytes((d.nd ? d.n_res * d.e + d.tokens * d.h * d.e : 2 * d.n_res * d.e) + logits * 4 +
               (softcap ? logits * d.e : 0));
}

// The last stage's final norm, logits and loss.
void head_forward(const TransformerModel& model, const Dims& d, std::vector<Segment>& fwd) {
  const std::int64_t logits = d.tokens * d.vocab_local;
  std::vector<Kernel> k;
  if (d.nd) {  // the vocab-parallel head (as 1D) needs the whole [b s, h] on every rank
    nd_norm(d, "final norm", "final_norm", false, -1, fwd);
    fwd.push_back(tp_gather(d, "head", -1));
  } else {
    k.push_back(norm_kernel(d, "final_norm", false));
  }
  if (d.sp) {
    fwd.push_back(compute("final norm", std::move(k)));
    fwd.push_back(tp_gather(d, "head", -1));
    k.clear();
  }
  k.push_back(gemm("logits", d.tokens, d.vocab_local, d.h, d.dtype));
  if (model.final_logit_softcap > 0) {  // c tanh(logits / c)
    k.push_back(elementwise("logits.softcap", logits, logits * d.e, logits * d.e));
  }
  cross_entropy_forward(d, logits, k);
  fwd.push_back(compute("head", std::move(k)));
  fwd.back().activation_delta = head_stored_bytes(model, d);
  if (d.t > 1) {  // vocab-parallel cross entropy: max, sum of exponentials, target logit
    fwd.push_back(
        collective("loss tp all-reduce", CollectiveKind::all_reduce, Bytes(3 * d.tokens * 4)));
    fwd.push_back(compute("loss", {elementwise("loss", d.tokens, 3 * d.tokens * 4, d.tokens * 4)}));
  }
}

void head_backward(const TransformerModel& model, const Dims& d, int unit,
                   std::vector<Segment>& bwd) {
  const std::int64_t logits = d.tokens * d.vocab_local;
  std::vector<Kernel> k;
  cross_entropy_backward(d, logits, k);
  if (model.final_logit_softcap > 0) {
    k.push_back(elementwise("logits.softcap.bwd", logits, 2 * logits * d.e, logits * d.e));
  }
  k.push_back(gemm("logits.dgrad", d.tokens, d.h, d.vocab_local, d.dtype));
  k.push_back(gemm("logits.wgrad", d.h, d.vocab_local, d.tokens, d.dtype));
  bwd.push_back(compute("head bwd", std::move(k)));
  bwd.back().activation_delta = -head_stored_bytes(model, d);
  if (d.t > 1) bwd.push_back(tp_reduce(d, "head bwd", -1));
  if (d.nd) {  // each rank keeps its block of the all-reduced input gradient
    nd_norm(d, "final norm bwd", "final_norm", true, -1, bwd);
  } else {
    bwd.push_back(compute("final norm bwd", {norm_kernel(d, "final_norm.bwd", true)}));
  }
  bwd.back().grads_done.push_back(unit);
}

// The layers' forward: a fully recomputed layer runs keeping only its group's input.
void layers_forward(const Dims& d, const StageStorage& s, int layer_begin, int layer_end,
                    std::vector<Segment>& fwd) {
  for (int l = layer_begin; l < layer_end; ++l) {
    if (s.fully_recomputed(l)) {
      const std::size_t at = fwd.size();
      any_layer_forward(d, l, Bytes(), Bytes(), fwd);
      if (l == s.group_begin(l)) fwd[at].checkpoint_delta += s.checkpoint;
    } else {
      any_layer_forward(d, l, s.attention_bytes(l) - s.core_bytes, s.mlp_bytes(l), fwd);
    }
  }
}

// The layers' backward, last to first; a full-recomputation group's forward runs again before
// its last layer's backward, storing its activations.
void layers_backward(const Dims& d, const StageStorage& s, const StageUnits& units, int layer_begin,
                     int layer_end, std::vector<Segment>& bwd) {
  for (int l = layer_end - 1; l >= layer_begin; --l) {
    const bool full = s.fully_recomputed(l);
    if (full && l == s.group_end(l) - 1) {
      const std::size_t group_start = bwd.size();
      for (int r = s.group_begin(l); r <= l; ++r) {
        const std::size_t at = bwd.size();
        any_layer_forward(d, r, s.attention_bytes(r), s.mlp_bytes(r), bwd);
        for (std::size_t i = at; i < bwd.size(); ++i) {
          bwd[i].recompute = true;
          bwd[i].label = "recompute " + bwd[i].label;
        }
      }
      bwd[group_start].checkpoint_fetch = s.checkpoint;  // the recompute starts from it
    }
    any_layer_backward(d, l, units.layer[static_cast<std::size_t>(l - layer_begin)],
                       s.attention_bytes(l), s.mlp_bytes(l), full ? Bytes() : s.core_bytes, bwd);
    if (full && l == s.group_begin(l)) bwd.back().checkpoint_delta -= s.checkpoint;
  }
}

}  // namespace

StagePlan plan_transformer_stage(const TransformerModel& model, const LayerSetting& setting,
                                 int stage, int stages, int layer_begin, int layer_end,
                                 const StageRecompute& recompute) {
  const Dims d(model, setting);
  const bool first = stage == 0, last = stage == stages - 1;
  const StageStorage storage(model, setting, d, layer_begin, layer_end, recompute);
  StagePlan plan;
  plan.boundary_bytes = Bytes(d.n_res * d.e);
  const StageUnits units =
      add_grad_units(model, setting, d, first, last, stages, layer_begin, layer_end, plan);
  const std::int64_t low_gemms = add_weight_casts(d, layer_begin, layer_end, plan);
  // Delayed scaling: TE all-reduces (max) the amaxes of the stage's FP8 tensors over the amax
  // reduction group when the forward's fp8_autocast region ends (Megatron wraps the stage's
  // layers in one region with this recipe) and when its backward ends.
  const bool amax_reduction =
      d.lp && reduces_amax(*d.lp) && low_gemms > 0 && setting.amax_reduction_ranks > 1;
  const auto amax_all_reduce = [&](bool forward, std::vector<Segment>& out) {
    if (!amax_reduction) return;
    out.push_back(axis_collective(forward ? "fp8 amax all-reduce" : "fp8 amax all-reduce bwd",
                                  CollectiveKind::all_reduce,
                                  amax_reduction_bytes(low_gemms, forward), TpAxis::amax, -1));
  };

  std::vector<Segment> fwd;
  if (first) embedding_forward(model, d, fwd);
  layers_forward(d, storage, layer_begin, layer_end, fwd);
  amax_all_reduce(true, fwd);
  if (last) head_forward(model, d, fwd);
  plan.forward = merge_compute(std::move(fwd), setting.split_layers);

  std::vector<Segment> bwd;  // in reverse order
  if (last) head_backward(model, d, units.head, bwd);
  layers_backward(d, storage, units, layer_begin, layer_end, bwd);
  amax_all_reduce(false, bwd);
  if (first) embedding_backward_segments(model, d, units.embedding, bwd);
  plan.backward = merge_compute(std::move(bwd), setting.split_layers);
  return plan;
}

}  // namespace stratasim::strategies
