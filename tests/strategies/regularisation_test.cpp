// What frameworks run around the layers: dropout only when its probability is above zero,
// gradient clipping, the fp16 loss-scale check and the host overheads (strategies/model.hpp,
// strategies/lowering/techniques.hpp). Expected bytes are computed by hand in the comments.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "experiment_helpers.hpp"
#include "strategies/lowering.hpp"
#include "strategies/transformer.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

LayerSetting setting(int tp, bool sp, int b, int s, bool flash = false) {
  LayerSetting set;
  set.tp = tp;
  set.sequence_parallel = sp;
  set.micro_batch = b;
  set.seq_len = s;
  set.dtype = DType::bf16;
  set.flash_attention = flash;
  return set;
}

std::int64_t total(const std::vector<ActivationItem>& items) {
  std::int64_t sum = 0;
  for (const auto& i : items) sum += i.bytes.count();
  return sum;
}

bool has_item(const std::vector<ActivationItem>& items, const std::string& name) {
  for (const auto& i : items) {
    if (i.name == name) return true;
  }
  return false;
}

// Names of every kernel of a stage plan's forward and backward passes.
std::multiset<std::string> kernel_names(const StagePlan& plan) {
  std::multiset<std::string> names;
  for (const auto* pass : {&plan.forward, &plan.backward}) {
    for (const auto& seg : *pass) {
      for (const auto& k : seg.kernels) names.insert(k.name);
    }
  }
  return names;
}

std::size_t count_containing(const std::multiset<std::string>& names, const std::string& part) {
  std::size_t n = 0;
  for (const auto& name : names) n += name.find(part) != std::string::npos ? 1 : 0;
  return n;
}

TransformerModel with_dropout(double hidden, double attention) {
  auto m = gpt(16, 1024, 2);
  m.hidden_dropout = hidden;
  m.attention_dropout = attention;
  return m;
}

// Ops of `rank` labelled `label`.
std::vector<OpId> ops_labelled(const Program& p, int rank, const std::string& label) {
  std::vector<OpId> ids;
  const OpId first = p.first_op(rank);
  const auto ops = p.ops_of(rank);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (p.label_of(ops[i]) == label) ids.push_back(first + static_cast<OpId>(i));
  }
  return ids;
}

const Elementwise& only_elementwise(const Program& p, OpId id) {
  const auto& kernels = p.kernels_of(std::get<Compute>(p.op(id).work));
  REQUIRE(kernels.size() == 1);
  return std::get<Elementwise>(kernels.front().work);
}

bool depends_on(const Program& p, OpId op, OpId on) {
  for (OpId d : p.deps_of(p.op(op))) {
    if (d == on) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("dropout at p = 0 removes exactly its masks and outputs (Korthikanti et al. eq. 1)") {
  // s = 512, b = 2, h = 1024, a = 16, bf16, no parallelism: sbh = 1,048,576 bytes per byte of
  // element. Korthikanti et al. (arXiv:2205.05198) eq. 1, dropout on: sbh(34 + 5as/h) with
  // 5as/h = 40: 74 sbh = 77,594,624 bytes. Their items: the attention dropout mask and the MLP
  // dropout mask are sbh each (1 byte per element); the softmax dropout mask as^2b (1 byte)
  // and its output 2as^2b = 16 x 512^2 x 2 x (1 + 2) = 25,165,824 bytes.
  const std::int64_t sbh = 512 * 2 * 1024, as2b = 16LL * 512 * 512 * 2;
  const auto on = layer_activations(with_dropout(0.1, 0.1), setting(1, false, 2, 512));
  CHECK(total(on) == 74 * sbh);
  CHECK(total(on) == 77'594'624);

  const auto no_hidden = layer_activations(with_dropout(0.0, 0.1), setting(1, false, 2, 512));
  CHECK(total(on) - total(no_hidden) == 2 * sbh);
  CHECK(!has_item(no_hidden, "attention dropout mask"));
  CHECK(!has_item(no_hidden, "mlp dropout mask"));
  CHECK(has_item(no_hidden, "softmax dropout mask"));

  const auto no_attention = layer_activations(with_dropout(0.1, 0.0), setting(1, false, 2, 512));
  CHECK(total(on) - total(no_attention) == 3 * as2b);
  CHECK(!has_item(no_attention, "softmax dropout mask"));
  CHECK(!has_item(no_attention, "softmax dropout output"));
  CHECK(has_item(no_attention, "softmax output"));  // the attention over V reads it

  // Both off: sbh(32 + 2as/h) = sbh(32 + 16) = 48 sbh = 50,331,648 bytes.
  const auto off = layer_activations(with_dropout(0.0, 0.0), setting(1, false, 2, 512));
  CHECK(total(off) == 48 * sbh);
  CHECK(total(off) == 50'331'648);

  // Tensor and sequence parallelism (t = 2): sbh(34/t + 5as/(ht)) = 37 sbh with dropout; the
  // masks are sharded (sbh/t each) and the softmax ones too (as^2b/t, 2as^2b/t).
  const auto sp_on = layer_activations(with_dropout(0.1, 0.1), setting(2, true, 2, 512));
  const auto sp_off = layer_activations(with_dropout(0.0, 0.0), setting(2, true, 2, 512));
  CHECK(total(sp_on) == 37 * sbh);
  CHECK(total(sp_on) - total(sp_off) == 2 * sbh / 2 + 3 * as2b / 2);
}

TEST_CASE("dropout kernels run only with a probability above zero; flash attention fuses it") {
  const auto plan = [](double hidden, double attention, bool flash) {
    return plan_transformer_stage(with_dropout(hidden, attention), setting(1, false, 1, 256, flash),
                                  0, 1, 0, 2);
  };
  // On: per layer the softmax dropout and two dropout-residuals, forward and backward, and
  // the embedding's dropout.
  const auto on = kernel_names(plan(0.1, 0.1, false));
  CHECK(on.count("attention.dropout") == 2);
  CHECK(on.count("attention.dropout.bwd") == 2);
  CHECK(count_containing(on, "dropout_residual") == 2 * 2 * 2);
  CHECK(on.count("embedding.dropout") == 1);
  CHECK(on.count("embedding.dropout.bwd") == 1);

  // Off: no dropout kernel at all; the residual adds stay (forward only).
  const auto off = kernel_names(plan(0.0, 0.0, false));
  CHECK(count_containing(off, "dropout") == 0);
  CHECK(off.count("attention.residual") == 2);
  CHECK(off.count("mlp.residual") == 2);
  CHECK(off.count("attention.softmax") == 2);

  // Flash attention applies attention dropout inside the fused kernel: no separate kernel.
  const auto flash = kernel_names(plan(0.1, 0.1, true));
  CHECK(flash.count("attention.dropout") == 0);
  CHECK(flash.count("attention") == 2);
  CHECK(count_containing(flash, "dropout_residual") == 8);

  // Without hidden dropout the first stage stores no embedding dropout mask: its forward
  // allocates 2 layers x 48 sbh... here s = 256, b = 1, h = 1024: per layer sbh(32 + 2as/h)
  // = sbh(32 + 8) = 40 sbh, sbh = 262,144; stored by the head 2 x 2sbh (final norm input and
  // output) and the fp32 softmax 4 s b v = 4 x 256 x 51200.
  const auto off_plan = plan(0.0, 0.0, false);
  Bytes allocated;
  for (const auto& seg : off_plan.forward) allocated += seg.activation_delta;
  const std::int64_t sbh = 256 * 1024;
  CHECK(allocated.count() == 2 * 40 * sbh + 4 * sbh + 4LL * 256 * 51200);
}

TEST_CASE("model and training dropout keys: read, overridden and validated") {
  const auto file = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";
  auto e = load_experiment(file);
  CHECK(e.model.hidden_dropout == 0.1);  // configs/models/gpt3-1.7b.json
  e = load_experiment(file, {cli("training.hidden_dropout", 0.0)});
  CHECK(e.model.hidden_dropout == 0.0);
  CHECK(e.model.attention_dropout == 0.1);
  e = load_experiment(configs_dir() / "experiments/llama2-7b-h100-8.json");
  CHECK(e.model.hidden_dropout == 0.0);  // Llama trains without dropout
  CHECK(e.model.attention_dropout == 0.0);

  const auto bad = experiment_error(file, {cli("training.attention_dropout", 1.0)});
  CHECK(std::string(bad.what())
            .find("at training.attention_dropout: expected a dropout "
                  "probability from 0") != std::string::npos);
  const auto negative = experiment_error(file, {cli("model.hidden_dropout", -0.5)});
  CHECK(std::string(negative.what()).find("model.hidden_dropout") != std::string::npos);
}

TEST_CASE("gradient clipping: a norm over the local gradients, a scalar all-reduce, a scale") {
  // tp 2, pp 2, dp 2 with a small GPT (h = 64, a = 4, 2 layers, vocabulary 51200, 2048
  // positions, tied embeddings), bf16: 2-byte gradients. Parameters per rank by hand:
  // a layer holds (12h^2 + 7h)/2 = 24,800 sharded plus 2h + 4h = 384 replicated = 25,184;
  // stage 0 adds the word embedding 25600 h = 1,638,400 and the positions 2048 h = 131,072:
  // 1,794,656; stage 1 adds the final norm 2h = 128 and the (tied, split) head 1,638,400:
  // 1,663,712.
  auto model = gpt(4, 64, 2);
  auto e = make_experiment(model, 2, 2, 2, 8, 1, 128);
  e.training.grad_clip = 1.0;
  const std::int64_t stage_params[2] = {1'794'656, 1'663'712};
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    e.parallelism.zero = zero;
    const Program p = lower(e);
    // The grad-stats group: the 4 ranks of one replica (tp x pp), or all 8 with ZeRO.
    std::set<std::size_t> sizes;
    for (const auto& g : p.groups()) {
      if (g.name.starts_with("grad stats")) sizes.insert(g.ranks.size());
    }
    CHECK(sizes == std::set<std::size_t>{zero == 0 ? 4u : 8u});
    for (int r = 0; r < 8; ++r) {
      CAPTURE(r);
      const int stage = r / 4;
      // With ZeRO-1 the optimizer (and the norm) covers the rank's shard: ceil(P / 2).
      const std::int64_t n = zero == 0 ? stage_params[stage] : (stage_params[stage] + 1) / 2;
      const auto norm = ops_labelled(p, r, "grad norm");
      const auto reduce = ops_labelled(p, r, "grad norm all-reduce");
      const auto scale = ops_labelled(p, r, "clip scale");
      const auto step = ops_labelled(p, r, "optimizer step");
      REQUIRE(norm.size() == 1);
      REQUIRE(reduce.size() == 1);
      REQUIRE(scale.size() == 1);
      REQUIRE(step.size() == 1);
      CHECK(only_elementwise(p, norm[0]).bytes_read.count() == 2 * n);
      CHECK(only_elementwise(p, norm[0]).bytes_written.count() == 4);
      CHECK(only_elementwise(p, scale[0]).bytes_read.count() == 2 * n);
      CHECK(only_elementwise(p, scale[0]).bytes_written.count() == 2 * n);
      const auto& c = std::get<Collective>(p.op(reduce[0]).work);
      CHECK(c.kind == CollectiveKind::all_reduce);
      CHECK(c.bytes.count() == 4);  // one fp32 scalar
      CHECK(depends_on(p, reduce[0], norm[0]));
      CHECK(depends_on(p, scale[0], reduce[0]));
      CHECK(depends_on(p, step[0], scale[0]));
    }
  }
  // Off by default: no such ops.
  e.training.grad_clip = 0.0;
  CHECK(ops_labelled(lower(e), 0, "grad norm").empty());
}

TEST_CASE("fp16 loss scaling: an unscale-and-check pass and an all-reduce of the inf flag") {
  const auto file = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";
  const auto fp16 = load_experiment(file, {cli("training.dtype", "fp16"), cli("parallelism.tp", 2),
                                           cli("parallelism.dp", nullptr)});
  CHECK(fp16.training.loss_scaling == LossScaling::dynamic);  // fp16's default
  const Program p = lower(fp16);
  // Rank 0 (tp 2, dp 4, no ZeRO) holds its stage's parameters P0 (plan.parameters); the check
  // reads their fp16 gradients and writes them back unscaled with a 4-byte flag.
  const std::int64_t params = pipeline_spec(fp16).stages[0].parameters;
  const auto check = ops_labelled(p, 0, "loss scale unscale and check");
  const auto flag = ops_labelled(p, 0, "loss scale inf all-reduce");
  const auto step = ops_labelled(p, 0, "optimizer step");
  REQUIRE(check.size() == 1);
  REQUIRE(flag.size() == 1);
  CHECK(only_elementwise(p, check[0]).bytes_read.count() == 2 * params);
  CHECK(only_elementwise(p, check[0]).bytes_written.count() == 2 * params + 4);
  CHECK(std::get<Collective>(p.op(flag[0]).work).bytes.count() == 4);
  CHECK(p.groups()[std::get<Collective>(p.op(flag[0]).work).group].ranks.size() == 2);  // tp
  CHECK(depends_on(p, step[0], flag[0]));

  const auto bf16 = load_experiment(file);
  CHECK(bf16.training.loss_scaling == LossScaling::none);
  CHECK(ops_labelled(lower(bf16), 0, "loss scale unscale and check").empty());
  const auto off =
      load_experiment(file, {cli("training.dtype", "fp16"), cli("training.loss_scaling", "none")});
  CHECK(ops_labelled(lower(off), 0, "loss scale unscale and check").empty());
  const auto bad = experiment_error(file, {cli("training.loss_scaling", "dynamc")});
  CHECK(std::string(bad.what()).find("did you mean \"dynamic\"") != std::string::npos);
}

TEST_CASE("host overheads: one op per iteration and per pass on every rank's host stream") {
  auto model = gpt(4, 64, 2);
  auto e = make_experiment(model, 1, 2, 1, 4, 1, 128);  // pp 2, 4 microbatches
  e.training.step_overhead = Time::ms(30);
  e.training.microbatch_overhead = Time::us(500);
  const Program p = lower(e);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto step = ops_labelled(p, r, "step overhead (host)");
    const auto passes = ops_labelled(p, r, "microbatch overhead (host)");
    REQUIRE(step.size() == 1);
    CHECK(passes.size() == 8);  // 4 forward and 4 backward passes
    CHECK(step[0] == p.first_op(r));
    CHECK(p.op(step[0]).stream == Stream::host);
    const auto& k = p.kernels_of(std::get<Compute>(p.op(step[0]).work));
    CHECK(std::get<Measured>(k.front().work).duration == Time::ms(30));
  }
  const auto file = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";
  const auto bad = experiment_error(file, {cli("training.step_overhead", "-1 ms")});
  CHECK(std::string(bad.what()).find("training.step_overhead") != std::string::npos);
  const auto unitless = experiment_error(file, {cli("training.microbatch_overhead", 5)});
  CHECK(std::string(unitless.what()).find("training.microbatch_overhead") != std::string::npos);
}

TEST_CASE("embedding and LM head: lookups, scatter-add gradients and an fp32 cross-entropy") {
  // One stage (embedding and head), tp 2, b = 2, s = 128, bf16 (e = 2), h = 64, vocabulary
  // 51200 (V/t = 25,600 rows per rank), 2048 learned positions. T = 256 tokens, n = T h =
  // 16,384 elements, logits L = T V/t = 6,553,600 per rank.
  const auto model = gpt(4, 64, 1);
  const StagePlan plan = plan_transformer_stage(model, setting(2, false, 2, 128), 0, 1, 0, 1);
  Bytes ce_read_fwd, ce_written_fwd, ce_read_bwd, ce_written_bwd;
  const Kernel *lookup = nullptr, *logits = nullptr, *grad = nullptr, *position_grad = nullptr;
  for (const auto* pass : {&plan.forward, &plan.backward}) {
    for (const auto& seg : *pass) {
      for (const auto& k : seg.kernels) {
        if (k.name == "embedding.lookup") lookup = &k;
        if (k.name == "logits") logits = &k;
        if (k.name == "embedding.grad") grad = &k;
        if (k.name == "embedding.position_grad") position_grad = &k;
        if (!k.name.starts_with("cross_entropy")) continue;
        const auto& w = std::get<Elementwise>(k.work);
        (pass == &plan.forward ? ce_read_fwd : ce_read_bwd) += w.bytes_read;
        (pass == &plan.forward ? ce_written_fwd : ce_written_bwd) += w.bytes_written;
      }
    }
  }
  REQUIRE(lookup != nullptr);
  REQUIRE(logits != nullptr);
  REQUIRE(grad != nullptr);
  REQUIRE(position_grad != nullptr);
  // Lookup: the rows n e = 32,768 bytes and the int64 ids 8 T = 2,048 read; n e written.
  CHECK(std::get<Elementwise>(lookup->work).bytes_read.count() == 34'816);
  CHECK(std::get<Elementwise>(lookup->work).bytes_written.count() == 32'768);
  // The head GEMM: 2 T (V/t) h = 2 x 256 x 25,600 x 64 = 838,860,800 FLOPs.
  CHECK(matmul_flops(*logits).count() == doctest::Approx(838'860'800.0));
  // Megatron's fp32 cross-entropy: cast (e read, 4 written per logit), max (4 read), subtract
  // (4 read, 4 written), exp (4, 4), sum (4 read), divide (4, 4): L (e + 20) = 144,179,200
  // bytes read plus the per-token max and sum read back (2 x 4T = 2,048); 16 L = 104,857,600
  // written plus the per-token max and sum (2,048).
  CHECK(ce_read_fwd.count() == 144'181'248);
  CHECK(ce_written_fwd.count() == 104'859'648);
  // Backward: softmax times the loss gradient in place (4 L read plus 4 T, 4 L written), cast
  // to bf16 (4 L read, 2 L written): 52,429,824 read, 39,321,600 written.
  CHECK(ce_read_bwd.count() == 52'429'824);
  CHECK(ce_written_bwd.count() == 39'321'600);
  // Embedding backward (embedding_dense_backward): the [25,600, 64] gradient zero-filled
  // (3,276,800 bytes) and each token's gradient row added into it (n e read from the output
  // gradient, n e read and written in the table, 8 T of ids): 67,584 read, 3,309,568 written;
  // the position table's [2048, 64]: 67,584 read, 262,144 + 32,768 = 294,912 written.
  CHECK(std::get<Elementwise>(grad->work).bytes_read.count() == 67'584);
  CHECK(std::get<Elementwise>(grad->work).bytes_written.count() == 3'309'568);
  CHECK(std::get<Elementwise>(position_grad->work).bytes_read.count() == 67'584);
  CHECK(std::get<Elementwise>(position_grad->work).bytes_written.count() == 294'912);
}
