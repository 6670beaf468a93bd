// RNN models: reading, checks, and the two lowerings (BPTT, ADMMiRNN). docs/rnn.md has the
// kernels each emits and their FLOPs; the header comments below give the same in short.
#include "strategies/rnn.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <sstream>

#include "strategies/kernel_builders.hpp"

namespace stratasim::strategies {

namespace {

std::string number(std::int64_t v) {
  return std::to_string(v);
}

constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;

// A positive integer at `key`; 0 or less is refused with `what` saying what it counts.
int positive(config::ObjectReader& r, std::string_view key, std::string_view what) {
  const std::int64_t v = r.integer(key);
  if (v < 1 || v > kMaxSize) {
    r.fail(key, "must be at least 1 (" + std::string(what) + ") and at most " + number(kMaxSize) +
                    ", got " + number(v));
  }
  return static_cast<int>(v);
}

}  // namespace

RnnModel read_rnn_model(config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "an RNN model");
  r.choice("type", {"rnn"});
  RnnModel m;
  m.name = r.string("name");
  m.source = r.string_or("source", "");
  const std::string cell = r.choice_or("cell", {"lstm", "gru", "vanilla"}, "lstm");
  m.cell = cell == "gru" ? RnnCell::gru : cell == "vanilla" ? RnnCell::vanilla : RnnCell::lstm;
  m.layers = positive(r, "layers", "stacked recurrent layers");
  m.hidden = positive(r, "hidden", "hidden units per layer and direction");
  m.timesteps = positive(r, "timesteps", "the steps the network is unrolled over");
  m.input_size = positive(r, "input_size", "features per step entering the first layer");
  m.output_size = positive(r, "output_size", "features of the output layer at each step");
  m.bidirectional = r.boolean_or("bidirectional", false);
  r.finish();
  return m;
}

namespace {

// parallelism and training keys an RNN experiment takes; any other one given is refused.
constexpr std::array<std::string_view, 8> kParallelismKeys = {
    "tp", "pp", "cp", "ep", "etp", "dp", "micro_batch", "dp_overlap"};
constexpr std::array<std::string_view, 11> kTrainingKeys = {"global_batch",
                                                            "gradient_accumulation_steps",
                                                            "seq_len",
                                                            "dtype",
                                                            "optimizer",
                                                            "framework",
                                                            "grad_accumulation_dtype",
                                                            "algorithm",
                                                            "iterations_to_accuracy",
                                                            "compute_efficiency",
                                                            "elementwise_traffic"};

// Keys of the transformer's strategies that sweeps and searches set (search/, cli/sweep_*):
// accepted at the value that means "off" for a data-parallel run, refused otherwise.
struct NeutralKey {
  std::string_view path;
  bool (*neutral)(const Experiment&);
  std::string_view off;  // what "off" is, for the message
};
constexpr std::array<NeutralKey, 7> kNeutralKeys = {{
    {"parallelism.zero", [](const Experiment& e) { return e.parallelism.zero == 0; }, "0"},
    {"parallelism.recompute",
     [](const Experiment& e) { return e.parallelism.recompute == RecomputeKind::none; },
     "\"none\""},
    {"parallelism.sequence_parallel",
     [](const Experiment& e) { return !e.parallelism.sequence_parallel; }, "false"},
    {"parallelism.virtual_stages",
     [](const Experiment& e) { return e.parallelism.virtual_stages == 1; }, "1"},
    {"parallelism.sequence_slices",
     [](const Experiment& e) { return e.parallelism.sequence_slices == 1; }, "1"},
    {"parallelism.schedule",
     [](const Experiment& e) {
       return e.parallelism.schedule == ScheduleKind::one_f_one_b ||
              e.parallelism.schedule == ScheduleKind::gpipe;
     },
     "\"1f1b\" or \"gpipe\" (one stage: no pipeline)"},
    {"training.flash_attention", [](const Experiment& e) { return !e.training.flash_attention; },
     "false"},
}};

constexpr std::string_view kNotForRnn =
    "does not apply to an RNN model (model.type \"rnn\"), which trains data parallel by BPTT or "
    "ADMM";

template <std::size_t N>
void refuse_other_keys(const config::Document& doc, const Experiment& e, const std::string& section,
                       const std::array<std::string_view, N>& allowed) {
  const nlohmann::json* object = doc.find(section);
  if (object == nullptr || !object->is_object()) return;
  for (const auto& [key, value] : object->items()) {
    if (value.is_null()) continue;
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    const std::string path = section + "." + key;
    const auto neutral = std::find_if(kNeutralKeys.begin(), kNeutralKeys.end(),
                                      [&](const NeutralKey& k) { return k.path == path; });
    if (neutral != kNeutralKeys.end()) {
      if (neutral->neutral(e)) continue;
      doc.fail(path, std::string(kNotForRnn) + "; leave it out or set it to " +
                         std::string(neutral->off));
    }
    std::string keys;
    for (std::string_view k : allowed) keys += (keys.empty() ? "" : ", ") + std::string(k);
    doc.fail(path, std::string(kNotForRnn) + "; " + section + " takes " + keys);
  }
}

void refuse_model_parallelism(const config::Document& doc, const ParallelismSpec& p) {
  for (auto [key, value] : {std::pair{"tp", p.tp}, std::pair{"pp", p.pp}, std::pair{"cp", p.cp},
                            std::pair{"ep", p.ep}, std::pair{"etp", p.etp}}) {
    if (value != 1) {
      doc.fail(std::string("parallelism.") + key,
               "must be 1: an RNN model (model.type \"rnn\") trains data parallel only, got " +
                   number(value));
    }
  }
}

void check_admm(const config::Document& doc, Experiment& e, std::vector<std::string>& notes) {
  const RnnModel& m = *e.rnn;
  if (m.cell != RnnCell::vanilla) {
    doc.fail("model.cell",
             "training.algorithm \"admm\" (ADMMiRNN, Tang et al. 2020) has update rules for the "
             "vanilla tanh cell only; got \"" +
                 std::string(name_of(m.cell)) +
                 "\" (use \"vanilla\", or training.algorithm "
                 "\"bptt\")");
  }
  if (m.layers != 1) {
    doc.fail("model.layers",
             "training.algorithm \"admm\" (ADMMiRNN) unfolds one recurrent layer, as the paper "
             "does; got " +
                 number(m.layers));
  }
  if (m.bidirectional) {
    doc.fail("model.bidirectional",
             "training.algorithm \"admm\" (ADMMiRNN) unfolds one direction, as the paper does");
  }
  if (const nlohmann::json* optimizer = doc.find("training.optimizer");
      optimizer != nullptr && !optimizer->is_null()) {
    doc.fail("training.optimizer",
             "ADMMiRNN updates the weights by its own rules: no optimizer applies");
  }
  if (e.microbatches() > 1) {
    notes.push_back("training.algorithm \"admm\": each rank updates its " +
                    number(e.training.global_batch / e.parallelism.dp) +
                    " samples at once; parallelism.micro_batch is not used");
  }
}

}  // namespace

void check_rnn_experiment(const config::Document& doc, Experiment& e,
                          std::vector<std::string>& notes) {
  refuse_model_parallelism(doc, e.parallelism);
  refuse_other_keys(doc, e, "parallelism", kParallelismKeys);
  refuse_other_keys(doc, e, "training", kTrainingKeys);
  if (e.training.low_precision) {
    doc.fail("training.dtype",
             "fp8 and fp4 training apply to transformers; an RNN trains in "
             "bf16, fp16 or fp32");
  }
  const RnnModel& m = *e.rnn;
  // tokens/s counts timesteps: a sample is a sequence of `timesteps` steps.
  if (e.training.seq_len == 0) {
    e.training.seq_len = m.timesteps;
  } else if (e.training.seq_len != m.timesteps) {
    doc.fail("training.seq_len", "must equal model.timesteps (" + number(m.timesteps) +
                                     ") for an RNN, or be left out; got " +
                                     number(e.training.seq_len));
  }
  if (e.training.algorithm == TrainingAlgorithm::admm) check_admm(doc, e, notes);
}

// ---- Lowering

namespace {

Bytes elements_bytes(std::int64_t elements, DType dtype) {
  return Bytes(elements * static_cast<std::int64_t>(size_of(dtype)));
}

// Elementwise work over `elements` values reading `reads` and writing `writes` tensors of that
// size.
Kernel elementwise(std::string name, std::int64_t elements, int reads, int writes, DType dtype) {
  return Kernel{Elementwise{elements, elements_bytes(elements * reads, dtype),
                            elements_bytes(elements * writes, dtype)},
                std::move(name)};
}

// What every lowering of a rank shares: the Program, the dp group, the op builder.
struct RankBuilder {
  Program& program;
  std::uint32_t dp_group = 0;
  bool data_parallel = false;

  static OpInfo info(Stream stream, Phase phase, int microbatch, int layer, std::uint32_t label) {
    OpInfo i{stream,
             phase,
             microbatch,
             static_cast<std::int16_t>(layer),
             static_cast<std::int16_t>(layer < 0 ? -1 : layer + 1),
             {}};
    i.label_id = label;
    return i;
  }
  OpId compute(std::uint32_t kernels, Phase phase, int microbatch, int layer, std::uint32_t label,
               std::span<const OpId> deps = {}, std::span<const MemoryEffect> effects = {}) {
    return program.add(Compute{kernels}, info(Stream::compute, phase, microbatch, layer, label),
                       deps, effects);
  }
  // An all-reduce of `elements` over the dp group once `after` has ended.
  OpId all_reduce(std::int64_t elements, DType dtype, int layer, std::uint32_t label, OpId after) {
    const std::array<OpId, 1> dep = {after};
    return program.add(
        Collective{CollectiveKind::all_reduce, dtype, dp_group, elements_bytes(elements, dtype)},
        info(Stream::dp_comm, Phase::other, -1, layer, label), dep);
  }
};

// ---- BPTT
//
// Per microbatch of b samples, per layer l (input I_l, G gate blocks of H) and direction:
// forward, the input projection of all T steps as one GEMM [bT x I_l] x [I_l x GH] (cuDNN's
// layout), then per step the recurrent GEMM [b x H] x [H x GH] and the gate kernel; the output
// layer [bT x H dirs] x [H dirs x O] and the loss. Backward in reverse: the output layer's dgrad
// and wgrad; per layer from the top, per step from the last, the gate backward and the
// recurrent dgrad [b x GH] x [GH x H]; then the input dgrad [bT x GH] x [GH x I_l] and the
// wgrads of W_x [GH x bT] x [bT x I_l] and W_h [GH x bT] x [bT x H]. Backward = 2 x forward.
class BpttLowering {
 public:
  BpttLowering(const Experiment& e, Program& program) : e_(e), m_(*e.rnn), program_(program) {
    format_ = model_state_format(e);
    dtype_ = e.training.dtype;
    b_ = e.parallelism.micro_batch;
    const std::int64_t T = m_.timesteps, H = m_.hidden, G = m_.gates();
    const std::int64_t GH = G * H, dirs = m_.directions(), O = m_.output_size;
    for (int l = 0; l < m_.layers; ++l) {
      const std::int64_t I = m_.layer_input(l);
      const std::string L = "L" + std::to_string(l);
      Layer k;
      k.input_projection = program.add_kernels({gemm(L + ".input_proj", b_ * T, GH, I, dtype_)});
      // The gate kernel reads the two projections (G H each) and the cell state, writes h and
      // c, and keeps the activated gates for the backward.
      k.step_forward = program.add_kernels({gemm(L + ".recurrent", b_, GH, H, dtype_),
                                            elementwise(L + ".gates", b_ * GH, 2, 1, dtype_)});
      k.step_backward = program.add_kernels({elementwise(L + ".gates.bwd", b_ * GH, 3, 1, dtype_),
                                             gemm(L + ".recurrent.dgrad", b_, H, GH, dtype_)});
      k.weights_backward =
          program.add_kernels({gemm(L + ".input.dgrad", b_ * T, I, GH, dtype_),
                               gemm(L + ".input_proj.wgrad", GH, I, b_ * T, dtype_),
                               gemm(L + ".recurrent.wgrad", GH, H, b_ * T, dtype_)});
      k.forward_label = program.intern_label(L + " forward");
      k.step_label = program.intern_label(L + " step");
      k.step_backward_label = program.intern_label(L + " step backward");
      k.weights_label = program.intern_label(L + " input dgrad + wgrad");
      k.all_reduce_label = program.intern_label("dp grad all-reduce " + L);
      k.stash = elements_bytes(b_ * (GH + 2 * H), dtype_);  // gates, h and c of a step
      layers_.push_back(k);
    }
    const std::int64_t HD = H * dirs;
    output_forward_ = program.add_kernels(
        {gemm("output", b_ * T, O, HD, dtype_), elementwise("loss", b_ * T * O, 1, 1, dtype_)});
    output_backward_ = program.add_kernels({elementwise("loss.bwd", b_ * T * O, 1, 1, dtype_),
                                            gemm("output.dgrad", b_ * T, HD, O, dtype_),
                                            gemm("output.wgrad", O, HD, b_ * T, dtype_)});
    logits_ = elements_bytes(b_ * T * O, dtype_);
    output_forward_label_ = program.intern_label("output + loss");
    output_backward_label_ = program.intern_label("output backward");
    output_all_reduce_label_ = program.intern_label("dp grad all-reduce output");
    optimizer_label_ = program.intern_label("optimizer step");
    optimizer_ = program.add_kernels(
        {Kernel{OptimizerStep{m_.parameters(), format_.optimizer, format_.dtype, false,
                              size_of(format_.grad_dtype) == 4 || format_.fp32_grad_copy},
                std::string(name_of(format_.optimizer))}});
  }

  void emit(RankBuilder& rank, int r) {
    const std::int64_t P = m_.parameters();
    const StateBytes state = state_bytes_per_parameter(format_);
    program_.add_initial_memory(
        r, {MemoryCategory::parameters, MemoryTier::device, Bytes(P * state.parameters)});
    program_.add_initial_memory(
        r, {MemoryCategory::gradients, MemoryTier::device, Bytes(P * state.gradients)});
    program_.add_initial_memory(r, {MemoryCategory::optimizer_states, MemoryTier::device,
                                    optimizer_state_bytes(format_, P)});
    const auto microbatches = static_cast<int>(e_.microbatches());
    std::vector<ReadyGradients> ready;
    OpId last = 0;
    for (int mb = 0; mb < microbatches; ++mb) {
      forward(rank, mb);
      last = backward(rank, mb, ready);
    }
    std::vector<OpId> deps = {last};
    if (rank.data_parallel) deps.push_back(all_reduce(rank, ready, last));
    rank.compute(optimizer_, Phase::optimizer, -1, -1, optimizer_label_, deps);
  }

 private:
  struct Layer {
    std::uint32_t input_projection = 0, step_forward = 0, step_backward = 0, weights_backward = 0;
    std::uint32_t forward_label = 0, step_label = 0, step_backward_label = 0, weights_label = 0;
    std::uint32_t all_reduce_label = 0;
    Bytes stash;
  };

  void forward(RankBuilder& rank, int mb) {
    for (int l = 0; l < m_.layers; ++l) {
      const Layer& k = layers_[static_cast<std::size_t>(l)];
      const std::array<MemoryEffect, 1> stash = {
          MemoryEffect{k.stash, MemoryCategory::activations, MemoryTier::device, true}};
      for (int d = 0; d < m_.directions(); ++d) {
        rank.compute(k.input_projection, Phase::forward, mb, l, k.forward_label);
        for (int t = 0; t < m_.timesteps; ++t) {
          rank.compute(k.step_forward, Phase::forward, mb, l, k.step_label, {}, stash);
        }
      }
    }
    const std::array<MemoryEffect, 1> logits = {
        MemoryEffect{logits_, MemoryCategory::activations, MemoryTier::device, true}};
    rank.compute(output_forward_, Phase::forward, mb, m_.layers, output_forward_label_, {}, logits);
  }

  // Returns the microbatch's last backward op; on the last microbatch, each layer's gradients
  // (and the output layer's) are all-reduced as soon as its wgrads are done.
  // Gradients of `elements` parameters complete at op `ready` (on the last microbatch).
  struct ReadyGradients {
    std::int64_t elements;
    int layer;
    std::uint32_t label;
    OpId ready;
  };

  // Returns the microbatch's last backward op; `ready` gets each layer's gradients (the output
  // layer's first) as its wgrads end.
  OpId backward(RankBuilder& rank, int mb, std::vector<ReadyGradients>& ready) {
    ready.clear();
    const std::array<MemoryEffect, 1> logits = {
        MemoryEffect{-logits_, MemoryCategory::activations, MemoryTier::device, true}};
    OpId op = rank.compute(output_backward_, Phase::backward, mb, m_.layers, output_backward_label_,
                           {}, logits);
    ready.push_back({m_.output_parameters(), m_.layers, output_all_reduce_label_, op});
    for (int l = m_.layers - 1; l >= 0; --l) {
      const Layer& k = layers_[static_cast<std::size_t>(l)];
      const std::array<MemoryEffect, 1> free = {
          MemoryEffect{-k.stash, MemoryCategory::activations, MemoryTier::device, true}};
      for (int d = 0; d < m_.directions(); ++d) {
        for (int t = m_.timesteps - 1; t >= 0; --t) {
          rank.compute(k.step_backward, Phase::backward, mb, l, k.step_backward_label, {}, free);
        }
        op = rank.compute(k.weights_backward, Phase::backward, mb, l, k.weights_label);
      }
      ready.push_back({m_.layer_parameters(l), l, k.all_reduce_label, op});
    }
    return op;
  }

  // One all-reduce per layer on the dp-comm stream: launched as soon as the layer's gradients are
  // complete (parallelism.dp_overlap, DDP's overlap), else after the whole backward. Returns the
  // last.
  OpId all_reduce(RankBuilder& rank, const std::vector<ReadyGradients>& ready, OpId last_backward) {
    OpId last = last_backward;
    for (const ReadyGradients& g : ready) {
      last = rank.all_reduce(g.elements, format_.grad_dtype, g.layer, g.label,
                             e_.parallelism.dp_overlap ? g.ready : last_backward);
    }
    return last;
  }

  const Experiment& e_;
  const RnnModel& m_;
  Program& program_;
  ModelStateFormat format_;
  DType dtype_ = DType::bf16;
  std::int64_t b_ = 1;
  std::vector<Layer> layers_;
  std::uint32_t output_forward_ = 0, output_backward_ = 0, optimizer_ = 0;
  std::uint32_t output_forward_label_ = 0, output_backward_label_ = 0, output_all_reduce_label_ = 0;
  std::uint32_t optimizer_label_ = 0;
  Bytes logits_;
};

// ---- ADMMiRNN
//
// One iteration updates, in the paper's order, U, W, b, a_t, h_t, V, c, o_t and the dual
// variable lambda_t over the rank's B = global_batch / dp samples and T steps, with input I,
// hidden H and output O (a_t = x_t U^T + h_{t-1} W^T + b, h_t = tanh(a_t), o_t = h_t V^T + c).
// U, W, V, a_t and h_t take the paper's quadratic approximation (a step along the subproblem's
// gradient, no linear solve); b, c and o_t have closed forms. The products x U^T, h W^T and
// h V^T are kept from the step that last computed them with the current values. Kernels, per
// iteration (GEMMs over all T steps as one batched GEMM, or one GEMM with k = B T for the sums
// over samples and steps):
//   U: residual r (elementwise), grad_U = r^T X [H x I, k = BT], all-reduce H I, update U
//   W: X U^T [B x H, k = I, batch T], residual, grad_W = r^T H_prev [H x H, k = BT],
//      all-reduce H^2, update W
//   b: H_prev W^T [B x H, k = H, batch T], column sums, all-reduce H, update b
//   a: elementwise (the residual, tanh and its derivative)
//   h: r_{t+1} W [B x H, k = H, batch T], e V [B x H, k = O, batch T] with e = o - h V^T - c,
//      elementwise update
//   V: H V^T [B x O, k = H, batch T], residual e, grad_V = e^T H [O x H, k = BT],
//      all-reduce O H, update V
//   c: H V^T [B x O, k = H, batch T], column sums, all-reduce O, update c
//   o: elementwise (the loss's proximal step)
//   lambda: H_prev W^T [B x H, k = H, batch T], elementwise lambda += rho r
// FLOPs per iteration on a rank: 4 B T (H I + 2 H^2 + 2 H O).
class AdmmLowering {
 public:
  AdmmLowering(const Experiment& e, Program& program) : program_(program) {
    const RnnModel& m = *e.rnn;
    dtype_ = e.training.dtype;
    B_ = e.training.global_batch / e.parallelism.dp;
    T_ = m.timesteps;
    H_ = m.hidden;
    I_ = m.input_size;
    O_ = m.output_size;
  }

  void emit(RankBuilder& rank, int r) {
    last_ = 0;
    pending_comm_.reset();
    const std::int64_t BT = B_ * T_, BTH = BT * H_, BTO = BT * O_;
    const std::int64_t weights = H_ * I_ + H_ * H_ + H_ + O_ * H_ + O_;
    program_.add_initial_memory(
        r, {MemoryCategory::parameters, MemoryTier::device, elements_bytes(weights, dtype_)});
    program_.add_initial_memory(
        r, {MemoryCategory::gradients, MemoryTier::device, elements_bytes(weights, dtype_)});
    // The per-sample variables live across iterations: x, a, h, lambda, the residual and the
    // kept products x U^T and h W^T (B T H or B T I each); o, h V^T and e (B T O each).
    program_.add_initial_memory(r, {MemoryCategory::activations, MemoryTier::device,
                                    elements_bytes(BT * I_ + 6 * BTH + 3 * BTO, dtype_)});
    // U
    step(rank, 0, "admm U", Phase::backward,
         {elementwise("U.residual", BTH, 4, 1, dtype_), gemm("U.grad", H_, I_, BT, dtype_)});
    weight_update(rank, 0, "U", H_ * I_);
    // W
    step(rank, 0, "admm W: x U^T", Phase::forward, {gemm("xU", B_, H_, I_, dtype_, T_)});
    step(rank, 0, "admm W", Phase::backward,
         {elementwise("W.residual", BTH, 4, 1, dtype_), gemm("W.grad", H_, H_, BT, dtype_)});
    weight_update(rank, 0, "W", H_ * H_);
    // b
    step(rank, 0, "admm b: h W^T", Phase::forward, {gemm("hW", B_, H_, H_, dtype_, T_)});
    step(rank, 0, "admm b", Phase::backward, {elementwise("b.sums", BTH, 4, 0, dtype_)});
    weight_update(rank, 0, "b", H_);
    // a_t, h_t
    step(rank, 0, "admm a", Phase::backward, {elementwise("a.update", BTH, 5, 1, dtype_)});
    step(rank, 0, "admm h", Phase::backward,
         {elementwise("h.residuals", BTH + BTO, 2, 1, dtype_), gemm("rW", B_, H_, H_, dtype_, T_),
          gemm("eV", B_, H_, O_, dtype_, T_), elementwise("h.update", BTH, 4, 1, dtype_)});
    // V, c, o_t
    step(rank, 1, "admm V: h V^T", Phase::forward, {gemm("hV", B_, O_, H_, dtype_, T_)});
    step(rank, 1, "admm V", Phase::backward,
         {elementwise("V.residual", BTO, 2, 1, dtype_), gemm("V.grad", O_, H_, BT, dtype_)});
    weight_update(rank, 1, "V", O_ * H_);
    step(rank, 1, "admm c: h V^T", Phase::forward, {gemm("hV", B_, O_, H_, dtype_, T_)});
    step(rank, 1, "admm c", Phase::backward, {elementwise("c.sums", BTO, 2, 0, dtype_)});
    weight_update(rank, 1, "c", O_);
    step(rank, 1, "admm o", Phase::backward, {elementwise("o.update", BTO, 2, 1, dtype_)});
    // lambda
    step(rank, 0, "admm lambda: h W^T", Phase::forward, {gemm("hW", B_, H_, H_, dtype_, T_)});
    step(rank, 0, "admm lambda", Phase::backward,
         {elementwise("lambda.update", BTH, 4, 1, dtype_)});
  }

 private:
  OpId step(RankBuilder& rank, int layer, std::string_view label, Phase phase,
            std::vector<Kernel> kernels) {
    std::vector<OpId> deps;
    if (pending_comm_) deps.push_back(*pending_comm_);
    pending_comm_.reset();
    last_ = rank.compute(program_.add_kernels(std::move(kernels)), phase, -1, layer,
                         program_.intern_label(label), deps);
    return last_;
  }

  // The summed subproblem gradient (or sums) of `elements` all-reduced over dp, then the
  // weight's elementwise update, which the next step waits for.
  void weight_update(RankBuilder& rank, int layer, const std::string& name, std::int64_t elements) {
    if (rank.data_parallel) {
      pending_comm_ =
          rank.all_reduce(elements, dtype_, layer,
                          program_.intern_label("dp all-reduce admm " + name + " sums"), last_);
    }
    step(rank, layer, "admm " + name + " update", Phase::backward,
         {elementwise(name + ".update", elements, 2, 1, dtype_)});
  }

  Program& program_;
  DType dtype_ = DType::bf16;
  std::int64_t B_ = 0, T_ = 0, H_ = 0, I_ = 0, O_ = 0;
  OpId last_ = 0;
  std::optional<OpId> pending_comm_;
};

}  // namespace

Program lower_rnn(const Experiment& e, bool mirror_data_parallel) {
  const int world = e.cluster.world_size();
  Program program(world);
  RankBuilder builder{program};
  builder.data_parallel = e.parallelism.dp > 1;
  if (builder.data_parallel) {
    std::vector<std::int32_t> ranks(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) ranks[static_cast<std::size_t>(r)] = r;
    builder.dp_group = program.add_group(std::move(ranks), "dp 0");
  }
  std::optional<BpttLowering> bptt;
  std::optional<AdmmLowering> admm;
  if (e.training.algorithm == TrainingAlgorithm::admm) {
    admm.emplace(e, program);
  } else {
    bptt.emplace(e, program);
  }
  for (int r = 0; r < world; ++r) {
    program.begin_rank(r);
    if (mirror_data_parallel && r > 0) {
      program.set_replica(r, 0);  // a replica of rank 0: same ops on the same dp group
      continue;
    }
    if (admm) {
      admm->emit(builder, r);
    } else {
      bptt->emit(builder, r);
    }
  }
  program.finish();
  return program;
}

std::vector<std::pair<std::string, std::string>> rnn_setup(const Experiment& e) {
  const RnnModel& m = *e.rnn;
  const auto& p = e.parallelism;
  std::ostringstream params;
  params.setf(std::ios::fixed);
  params.precision(2);
  params << static_cast<double>(m.parameters()) / 1e6 << " M parameters";
  std::string cell(name_of(m.cell));
  const bool admm = e.training.algorithm == TrainingAlgorithm::admm;
  const ModelStateFormat format = model_state_format(e);
  std::string training = "global batch " + number(e.training.global_batch) + " x " +
                         number(m.timesteps) + " timesteps, " +
                         std::string(name_of(e.training.dtype)) + ", " +
                         (admm ? std::string("ADMMiRNN (ADMM updates, no optimizer)")
                               : "BPTT, " + std::string(name_of(format.optimizer)));
  if (e.training.iterations_to_accuracy > 0) {
    training += ", " + number(e.training.iterations_to_accuracy) + " iterations to accuracy";
  }
  return {
      {"model", m.name + ": " + cell + " RNN, " + number(m.layers) +
                    (m.layers == 1 ? " layer" : " layers") +
                    (m.bidirectional ? " (bidirectional)" : "") + ", hidden " + number(m.hidden) +
                    ", " + number(m.timesteps) + " timesteps, input " + number(m.input_size) +
                    ", output " + number(m.output_size) + ", " + params.str()},
      {"parallelism",
       "dp " + number(p.dp) +
           (admm ? ", " + number(e.training.global_batch / p.dp) + " samples per rank at once"
                 : ", micro batch " + number(p.micro_batch) + ", " + number(e.microbatches()) +
                       (e.microbatches() == 1 ? " microbatch" : " microbatches") + " per replica")},
      {"training", training},
  };
}

}  // namespace stratasim::strategies
