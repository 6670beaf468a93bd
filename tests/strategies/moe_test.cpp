// Mixture of experts: parameter counts against the published figures, FLOPs per token, the
// expert load model, the dispatch volume and the expert-parallel lowering.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>

#include "experiment_helpers.hpp"
#include "strategies/lowering.hpp"
#include "strategies/moe.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

TransformerModel model_file(const char* name) {
  return load_model(configs_dir() / "models" / name);
}

// A small Mixtral-like model: 4 layers, 8 experts, top-2.
TransformerModel small_moe() {
  TransformerModel m;
  m.name = "small-moe";
  m.layers = 4;
  m.hidden = 256;
  m.heads = 8;
  m.kv_heads = 8;
  m.ffn_hidden = 512;
  m.vocab = 1024;
  m.activation = Activation::swiglu;
  m.position_embedding = PositionEmbedding::rotary;
  m.norm = Norm::rmsnorm;
  m.bias = false;
  m.hidden_dropout = 0;
  m.attention_dropout = 0;
  MoeSpec e;
  e.num_experts = 8;
  e.top_k = 2;
  e.ffn_hidden = 512;
  m.moe = e;
  return m;
}

Experiment moe_experiment(int dp, int ep, int pp = 1) {
  Experiment e = make_experiment(small_moe(), 1, pp, dp, 4 * dp, 1, 128);
  e.parallelism.ep = ep;
  e.training.framework = Framework::megatron;
  e.training.distributed_optimizer = true;
  return e;
}

// The optimizer states `rank` holds from the start.
std::int64_t optimizer_bytes(const Program& p, int rank) {
  std::int64_t bytes = 0;
  for (const auto& r : p.initial_memory(rank)) {
    if (r.category == MemoryCategory::optimizer_states) bytes += r.bytes.count();
  }
  return bytes;
}

int group_size(const Program& p, std::uint32_t group) {
  return static_cast<int>(p.groups()[group].ranks.size());
}

// Rank 0's groups: the sizes of the expert-gradient ("expert") and dense gradient
// reduce-scatter ("dense") groups, and the members of its all-to-all (ep) group.
std::pair<std::map<std::string, int>, std::set<std::int32_t>> rank0_groups(const Program& p) {
  std::map<std::string, int> sizes;
  std::set<std::int32_t> ep_members;
  for (const Op& op : p.ops_of(0)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr) continue;
    const std::string& label = p.label_of(op);
    if (label.find("expert grad") != std::string::npos) sizes["expert"] = group_size(p, c->group);
    if (label.find("grad reduce-scatter") == 0) sizes["dense"] = group_size(p, c->group);
    if (c->kind == CollectiveKind::all_to_all) {
      for (int r : p.groups()[c->group].ranks) ep_members.insert(r);
    }
  }
  return {sizes, ep_members};
}

}  // namespace

TEST_CASE("MoE parameter counts equal the published figures") {
  // Mixtral 8x7B: 46,702,792,704 parameters (Hugging Face's count of
  // mistralai/Mixtral-8x7B-v0.1) and 12,879,925,248 active per token (2 of 8 experts):
  // per layer attention 4096 (4096 + 2 x 1024) + 4096^2, router 8 x 4096, experts
  // 3 x 4096 x 14336 each, 2 RMSNorms; embedding and head 2 x 32000 x 4096; final norm 4096.
  const TransformerModel mixtral = model_file("mixtral-8x7b.json");
  CHECK(mixtral.parameters() == 46'702'792'704);
  CHECK(mixtral.active_parameters() == 12'879'925'248);

  // DeepSeek-V3 (arXiv:2412.19437: 671B total, 37B activated; the MTP module left out), from its
  // config.json shapes: MLA attention per layer 7168 x 1536 + 1536 + 1536 x 128 x 192
  // + 7168 x (512 + 64) + 512 + 512 x 128 x 256 + 128 x 128 x 7168 = 187,107,328; 3 dense
  // layers with SwiGLU 18432 (3 x 7168 x 18432 = 396,361,728); 58 MoE layers with the router
  // 256 x 7168 + 256 (bias), 256 routed + 1 shared experts of 3 x 7168 x 2048 = 44,040,192
  // (8 + 1 active); 2 x 7168 norms per layer; embedding and head 2 x 129280 x 7168, final norm.
  // Total 671,026,419,200 (rounds to 671B), active 37,552,297,472 (37.6B, published "37B").
  const TransformerModel v3 = model_file("deepseek-v3.json");
  CHECK(v3.parameters() == 671'026'419'200);
  CHECK(v3.active_parameters() == 37'552'297'472);
  CHECK(std::round(static_cast<double>(v3.parameters()) / 1e9) == 671);
  CHECK(std::floor(static_cast<double>(v3.active_parameters()) / 1e9) == 37);

  // DeepSeek-V2-Lite (arXiv:2405.04434 appendix B: 15.7B total, 2.4B activated): 27 layers, the
  // first dense (SwiGLU 10944), 64 routed of 1408 (6 active) and 2 shared experts, MLA without
  // query compression. 15,706,484,224 total; active 2,661,150,208, of which the input embedding
  // (102400 x 2048 = 209,715,200) is not counted in the published 2.4B: 2,451,435,008.
  const TransformerModel lite = model_file("deepseek-v2-lite.json");
  CHECK(lite.parameters() == 15'706'484'224);
  CHECK(lite.active_parameters() == 2'661'150'208);
  CHECK(std::floor((lite.active_parameters() - 102400LL * 2048) / 1e8) == 24);

  // Mixtral 8x22B (Mistral AI: 141B total, 39B active), config.json shapes (vocab 32768):
  // 140,630,071,296 and 39,161,468,928.
  const TransformerModel big = model_file("mixtral-8x22b.json");
  CHECK(big.parameters() == 140'630'071'296);
  CHECK(big.active_parameters() == 39'161'468'928);
  CHECK(std::round(static_cast<double>(big.parameters()) / 1e9) == 141);
  CHECK(std::round(static_cast<double>(big.active_parameters()) / 1e9) == 39);
}

TEST_CASE("MoE training FLOPs per token follow 6 x active matrices + attention") {
  // Mixtral 8x7B at s = 4096: per layer matrices 41,943,040 (attention) + 32,768 (router)
  // + 2 x 3 x 4096 x 14336 = 352,321,536 (two experts); x 32 layers plus the head 4096 x 32000:
  // 12,748,587,008. FLOPs = 6 x 12,748,587,008 + 6 s a (d + d) L
  //                        = 76,491,522,048 + 6 x 4096 x 32 x 256 x 32 = 82,933,972,992.
  CHECK(training_flops_per_token(model_file("mixtral-8x7b.json"), 4096) ==
        doctest::Approx(82'933'972'992.0).epsilon(1e-12));
}

TEST_CASE("the expert load: zipf's slowest rank over the mean, capacity, histogram") {
  MoeSpec e;
  e.num_experts = 8;
  e.top_k = 2;
  e.ffn_hidden = 64;
  CHECK(expert_load(e, 1000, 4).imbalance() == doctest::Approx(1.0));
  // Zipf s = 1 over 8 experts: shares 1/i / H8, H8 = 761/280 = 2.717857. With ep 4 the first
  // rank holds experts 1 and 2: (1 + 1/2) / H8 = 0.551906 of the routed tokens, against a mean of
  // 1/4: imbalance 4 x 1.5 x 280 / 761 = 2.207622.
  e.imbalance = MoeImbalance::zipf;
  e.zipf_exponent = 1.0;
  const ExpertLoad zipf = expert_load(e, 1000, 4);
  CHECK(zipf.imbalance() == doctest::Approx(4 * 1.5 * 280.0 / 761.0).epsilon(1e-9));
  // 1000 tokens x top-2 x 4 ranks = 8000 routed copies; the first rank's 8000 x 0.551906.
  CHECK(zipf.max == doctest::Approx(8000 * 1.5 * 280.0 / 761.0).epsilon(1e-9));
  // Capacity factor 1: each expert takes at most 8000 / 8 = 1000 tokens: the first rank's
  // experts (2943.5 and 1471.8 wanted) are cut to 1000 each.
  e.capacity_factor = 1.0;
  CHECK(expert_load(e, 1000, 4).max == doctest::Approx(2000));
  // A measured histogram, normalised: rank 1 (experts 3, 4) takes 0.4 of 8000.
  e.capacity_factor.reset();
  e.imbalance = MoeImbalance::histogram;
  e.histogram = {1, 1, 2, 2, 1, 1, 1, 1};
  CHECK(expert_load(e, 1000, 4).max == doctest::Approx(8000 * 0.4));
}

TEST_CASE("the dispatch all-to-all moves tokens x hidden x top_k x bytes x (ep - 1) / ep") {
  // 128 tokens x 256 hidden x top-2 x 2 bytes x 3/4 = 98,304 bytes per rank.
  CHECK(dispatch_bytes(128, 256, 2, 2, 4) == Bytes(128 * 256 * 2 * 2 * 3 / 4));
  const Experiment e = moe_experiment(8, 4);
  const Program p = lower(e);
  int all_to_all = 0;
  for (const Op& op : p.ops_of(0)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr || c->kind != CollectiveKind::all_to_all) continue;
    ++all_to_all;
    CHECK(group_size(p, c->group) == 4);
    // What leaves the rank: the nccl-tests size minus the slice it keeps.
    const std::int64_t n = 4;
    CHECK(c->bytes.count() * (n - 1) / n == dispatch_bytes(128, 256, 2, 2, 4).count());
  }
  // 4 MoE layers x 4 microbatches x (dispatch + combine) x (forward + backward).
  CHECK(all_to_all == 4 * 4 * 2 * 2);
}

TEST_CASE("the experts' gradients are reduced over the expert-data-parallel group") {
  // dp 8, ep 4: expert_dp = 8 / 4 = 2; Megatron-Core's layout puts ep ranks consecutive.
  const Experiment e = moe_experiment(8, 4);
  const Program p = lower(e);
  auto [sizes, ep_members] = rank0_groups(p);
  CHECK(sizes["expert"] == 2);
  CHECK(sizes["dense"] == 8);  // Megatron's distributed optimizer: dense over dp
  CHECK(ep_members == std::set<std::int32_t>{0, 1, 2, 3});
}

TEST_CASE("with context parallelism, ep is carved out of dp x cp as Megatron-Core does") {
  // dp 4, cp 2, ep 4 on 8 ranks: expert_dp = tp x cp x dp / (ep x etp) = 8 / 4 = 2; the ep
  // group is 4 consecutive ranks of the dp x cp flat index (rank = c + cp d at tp 1), dense
  // gradients are reduced over dp x cp = 8 and the cp ring runs over ranks {0, 1}.
  Experiment e = moe_experiment(4, 4);
  e.parallelism.cp = 2;
  e.training.seq_len = 256;
  e.training.flash_attention = true;
  CHECK(e.parallelism.expert_dp() == 2);
  const Program p = lower(e);
  CHECK(p.world_size() == 8);
  auto [sizes, ep_members] = rank0_groups(p);
  CHECK(sizes["expert"] == 2);
  CHECK(sizes["dense"] == 8);
  CHECK(ep_members == std::set<std::int32_t>{0, 1, 2, 3});
}

TEST_CASE("expert optimizer states are sharded over expert-data-parallel ranks") {
  // Megatron's distributed optimizer, bf16 with fp32 main grads: 12 bytes of optimizer state
  // per parameter, dense parameters sharded over dp 8, the experts' over expert_dp 2.
  const Experiment e = moe_experiment(8, 4);
  const Program p = lower(e);
  const TransformerModel& m = e.model;
  // Per rank: 2 local experts x 3 x 256 x 512 per layer, 4 layers.
  const std::int64_t experts = 4 * 2 * 3 * 256 * 512;
  const std::int64_t total = 4 * layer_unit_of(m, layer_setting(e), 0).parameters + 2 * 1024 * 256 +
                             256;  // embedding, head, final norm
  const std::int64_t optimizer = optimizer_bytes(p, 0);
  const std::int64_t dense = total - experts;
  CHECK(optimizer == 12 * ((dense + 7) / 8 + (experts + 1) / 2));
}

TEST_CASE("dualpipe: both copies of a part share its expert-dp group and its state shards") {
  // pp 2, dp 4, ep 2 with DualPipe (m = 16 / 4 = 4 = 2p): every device holds both parts, each
  // also held by the other device. The expert gradients of a part are summed over its expert-dp
  // ranks on both devices: 2 x tp dp / ep = 4 ranks; the dense ones over both devices' dp
  // groups: 2 x 4 = 8 ranks. The distributed optimizer shards the device's states (all of the
  // model: parts 0 and 1, i.e. 4 layers, embedding, head, final norm) over those groups.
  Experiment e = moe_experiment(4, 2, 2);
  e.parallelism.schedule = ScheduleKind::dualpipe;
  const Program p = lower(e);
  auto [sizes, ep_members] = rank0_groups(p);
  CHECK(sizes["expert"] == 4);
  CHECK(sizes["dense"] == 8);
  CHECK(ep_members == std::set<std::int32_t>{0, 1});
  const TransformerModel& m = e.model;
  // Per rank: 4 local experts (8 / ep 2) x 3 x 256 x 512 per layer, 4 layers.
  const std::int64_t experts = 4 * 4 * 3 * 256 * 512;
  const std::int64_t total = 4 * layer_unit_of(m, layer_setting(e), 0).parameters + 2 * 1024 * 256 +
                             256;  // embedding, head, final norm
  const std::int64_t optimizer = optimizer_bytes(p, 0);
  // Each of the two chunks' states sharded apart: part 0 holds the embedding and 2 layers,
  // part 1 the other 2 layers, the final norm and the head.
  const std::int64_t layer = layer_unit_of(m, layer_setting(e), 0).parameters;
  const std::int64_t part_experts = experts / 2;
  const std::int64_t dense0 = 1024 * 256 + 2 * layer - part_experts;
  const std::int64_t dense1 = 2 * layer + 256 + 1024 * 256 - part_experts;
  CHECK(total == dense0 + dense1 + experts);
  CHECK(optimizer == 12 * ((dense0 + 7) / 8 + (part_experts + 3) / 4 + (dense1 + 7) / 8 +
                           (part_experts + 3) / 4));
}

TEST_CASE("MoE options: allgather dispatcher, shared-expert overlap, etp") {
  Experiment e = moe_experiment(8, 4);
  e.parallelism.moe_allgather_dispatcher = true;
  Program p = lower(e);
  int gathers = 0;
  for (const Op& op : p.ops_of(0)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c != nullptr && p.label_of(op).find("dispatch all-gather") != std::string::npos) {
      ++gathers;
      CHECK(c->bytes == Bytes(128 * 4 * 256 * 2));  // every ep rank's tokens, gathered
    }
  }
  CHECK(gathers == 4 * 4);  // per MoE layer and microbatch, in forward

  Experiment etp = moe_experiment(8, 2);
  etp.parallelism.etp = 2;
  p = lower(etp);
  bool etp_gather = false;
  for (const Op& op : p.ops_of(0)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c != nullptr && p.label_of(op).find("etp all-gather") != std::string::npos) {
      etp_gather = true;
      CHECK(group_size(p, c->group) == 2);
    }
  }
  CHECK(etp_gather);
}

TEST_CASE("bad MoE settings are errors at their keys") {
  const auto file = configs_dir() / "experiments/mixtral-8x7b-h100-64-ep8.json";
  CHECK(experiment_error(file, {cli("parallelism.ep", 3)}).path() == "parallelism.ep");
  CHECK(experiment_error(file, {cli("model.moe.top_k", 9)}).path() == "model.moe.top_k");
  CHECK(experiment_error(file, {cli("model.moe.first_dense", 32)}).path() ==
        "model.moe.first_dense");
  CHECK(experiment_error(file, {cli("model.moe.imbalance", {{"distribution", "zipf"}})}).path() ==
        "model.moe.imbalance.exponent");
  CHECK(experiment_error(file, {cli("model.moe.num_expert", 8)}).path() == "model.moe.num_expert");
  CHECK(experiment_error(configs_dir() / "experiments/llama2-7b-h100-8.json",
                         {cli("parallelism.ep", 2)})
            .path() == "parallelism.ep");
}
