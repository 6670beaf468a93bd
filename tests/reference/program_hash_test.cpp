// The safety net of every change to lowering: a hash of the lowered Program of each shipped
// experiment and of a matrix of strategies that covers every technique (schedules, ZeRO stages,
// offload, compressed gradients, tensor-parallel meshes, recomputation, sub-pipelined TP,
// mirroring) must equal the value recorded in tests/reference/program_hashes.json.
//
// The hash covers what the back ends see: per rank, in issue order, each op's stream, phase,
// microbatch, layers, label text, work (a compute op's kernel list by content; a collective's
// kind, dtype, bytes and group by its members and name; a transfer's peer and bytes), its
// dependencies (as indices within the rank) and memory effects; each rank's initial memory and
// replica; the sorted list of groups; whether iterations overlap. Ids that depend only on
// registration order (kernel lists, labels, groups) are hashed by content, so a refactor may
// register them in another order but may not change a single op.
//
// A change that is meant to change programs (a new cost, a new technique's default) updates the
// file: run the test with STRATASIM_WRITE_PROGRAM_HASHES=<path> and it writes every current hash
// there; say in the commit why the programs changed.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "test_paths.hpp"

namespace stratasim::testing {
namespace {

using namespace strategies;

// FNV-1a, 64 bits, over a canonical byte stream.
class Hasher {
 public:
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 1099511628211ull;
    }
  }
  void i64(std::int64_t v) { bytes(&v, sizeof v); }
  void f64(double v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  std::string hex() const {
    std::ostringstream out;
    out << std::hex << h_;
    return out.str();
  }

 private:
  std::uint64_t h_ = 1469598103934665603ull;
};

void hash_kernel(Hasher& h, const Kernel& k) {
  h.str(k.name);
  h.i64(static_cast<std::int64_t>(k.work.index()));
  std::visit(
      [&h](const auto& w) {
        using T = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<T, Gemm>) {
          for (auto v : {w.m, w.n, w.k, w.batch}) h.i64(v);
          h.i64(static_cast<std::int64_t>(w.dtype));
          // Added later, hashed only when not the default (tensor scaling).
          if (w.scaling != hw::GemmScaling::tensor)
            h.i64(200 + static_cast<std::int64_t>(w.scaling));
        } else if constexpr (std::is_same_v<T, Attention>) {
          for (auto v : {w.batch, w.heads, w.kv_heads, w.seq_q, w.seq_kv, w.head_dim}) h.i64(v);
          h.i64(w.causal);
          h.i64(static_cast<std::int64_t>(w.dtype));
          h.i64(w.backward);
          // Added after the hashes were first recorded: hashed only when not the default, so
          // that programs with FlashAttention-2 keep their hashes.
          if (w.window > 0) h.i64(1000 + w.window);
          if (w.chunk > 0) h.i64(-w.chunk);  // apart from the windows' 1000 + w
          if (w.impl != hw::AttentionImpl::flash_attention_2) {
            h.i64(100 + static_cast<std::int64_t>(w.impl));
          }
        } else if constexpr (std::is_same_v<T, Elementwise>) {
          h.i64(w.elements);
          h.i64(w.bytes_read.count());
          h.i64(w.bytes_written.count());
        } else if constexpr (std::is_same_v<T, OptimizerStep>) {
          h.i64(w.params);
          h.i64(static_cast<std::int64_t>(w.kind));
          h.i64(static_cast<std::int64_t>(w.dtype));
          h.i64(w.on_host);
          // Hashed only when set, so that programs without fp32 gradients keep their hashes.
          if (w.fp32_grads) h.i64(0x46503332);  // "FP32"
        } else if constexpr (std::is_same_v<T, Copy>) {
          h.i64(w.bytes.count());
          h.i64(static_cast<std::int64_t>(w.from));
          h.i64(static_cast<std::int64_t>(w.to));
        } else if constexpr (std::is_same_v<T, Measured>) {
          h.i64(w.duration.picoseconds());
        } else {
          h.f64(w.flops.count());
          h.i64(w.bytes.count());
          h.i64(static_cast<std::int64_t>(w.dtype));
        }
      },
      k.work);
}

void hash_group(Hasher& h, const Group& g) {
  h.str(g.name);
  h.i64(static_cast<std::int64_t>(g.ranks.size()));
  for (auto r : g.ranks) h.i64(r);
}

std::string program_hash(const Program& p) {
  Hasher h;
  h.i64(p.world_size());
  h.i64(p.overlapping_iterations());
  std::vector<std::string> groups;
  for (const Group& g : p.groups()) {
    Hasher one;
    hash_group(one, g);
    groups.push_back(one.hex());
  }
  std::sort(groups.begin(), groups.end());
  for (const auto& g : groups) h.str(g);
  for (int r = 0; r < p.world_size(); ++r) {
    h.i64(p.replica_of(r));
    if (p.event_driven(r)) h.i64(-3);  // parameter servers only: other hashes are unchanged
    for (const ResidentMemory& m : p.initial_memory(r)) {
      h.i64(static_cast<std::int64_t>(m.category));
      h.i64(static_cast<std::int64_t>(m.tier));
      h.i64(m.bytes.count());
    }
    const OpId first = p.first_op(r);
    const auto ops = p.ops_of(r);
    h.i64(static_cast<std::int64_t>(ops.size()));
    for (const Op& op : ops) {
      h.i64(op.rank);
      h.i64(static_cast<std::int64_t>(op.stream));
      h.i64(static_cast<std::int64_t>(op.phase));
      h.i64(op.microbatch);
      h.i64(op.layer_begin);
      h.i64(op.layer_end);
      h.str(p.label_of(op));
      h.i64(static_cast<std::int64_t>(op.work.index()));
      if (const auto* c = std::get_if<Compute>(&op.work)) {
        const auto& kernels = p.kernels_of(*c);
        h.i64(static_cast<std::int64_t>(kernels.size()));
        for (const Kernel& k : kernels) hash_kernel(h, k);
      } else if (const auto* coll = std::get_if<Collective>(&op.work)) {
        h.i64(static_cast<std::int64_t>(coll->kind));
        h.i64(static_cast<std::int64_t>(coll->dtype));
        h.i64(coll->bytes.count());
        hash_group(h, p.groups()[coll->group]);
      } else if (const auto* s = std::get_if<Send>(&op.work)) {
        h.i64(s->peer);
        h.i64(s->bytes.count());
        if (s->eager) h.i64(1);     // only imports make eager sends: lowered hashes are unchanged
        if (s->detached) h.i64(2);  // parameter servers' pushes and pulls only
      } else if (const auto* v = std::get_if<Recv>(&op.work)) {
        h.i64(v->peer);
        h.i64(v->bytes.count());
      }
      const auto deps = p.deps_of(op);
      h.i64(static_cast<std::int64_t>(deps.size()));
      for (OpId d : deps) h.i64(static_cast<std::int64_t>(d) - first);
      const auto effects = p.effects_of(op);
      h.i64(static_cast<std::int64_t>(effects.size()));
      for (const MemoryEffect& e : effects) {
        h.i64(e.delta.count());
        h.i64(static_cast<std::int64_t>(e.category));
        h.i64(static_cast<std::int64_t>(e.tier));
        h.i64(e.at_end);
      }
    }
  }
  return h.hex();
}

// One case: an experiment file with overrides, lowered as `stratasim simulate` lowers it
// (mirroring replicas where they behave alike) or with the given mirroring.
struct Case {
  std::string name;
  std::string experiment;
  std::vector<std::pair<std::string, nlohmann::json>> set;
  int mirror = -1;     // -1: as simulate does; 0: none; 1: data parallel; 2: data and tensor
  int iterations = 1;  // back to back (LowerOptions::iterations)
};

using Settings = std::vector<std::pair<std::string, nlohmann::json>>;

// The matrix over a small 3D-parallel GPT (gpt3-1.7b on 8 GPUs as tp 2, pp 2, dp 2): every
// technique the lowering knows, each at least once. add() puts a case on top of the 3D base.
struct Matrix {
  std::vector<Case>& all;
  std::string base = (configs_dir() / "experiments/gpt3-1.7b-a100-8.json").string();
  void add(const std::string& name, const Settings& set, int mirror = 0) {
    Settings s = {{"parallelism.tp", 2},
                  {"parallelism.pp", 2},
                  {"parallelism.dp", 2},
                  {"training.global_batch", 16}};
    s.insert(s.end(), set.begin(), set.end());
    all.push_back({"matrix/" + name, base, s, mirror});
  }
};

// Every schedule; sequence parallelism, scatter-gather, batched p2p, buckets, partitions.
void add_schedule_cases(Matrix& m) {
  for (const char* schedule :
       {"gpipe", "1f1b", "pipedream-2bw", "merak-scp", "zb-h1", "zb-h2", "zb-v", "chimera"}) {
    m.add(std::string("schedule ") + schedule, {{"parallelism.schedule", schedule}});
  }
  m.add("schedule interleaved",
        {{"parallelism.schedule", "interleaved"}, {"parallelism.virtual_stages", 2}});
  m.add("schedule terapipe",
        {{"parallelism.schedule", "terapipe"}, {"parallelism.sequence_slices", 4}});
  m.add("sequence parallel", {{"parallelism.sequence_parallel", true}});
  m.add("no pipeline scatter gather", {{"parallelism.pipeline_scatter_gather", false}});
  m.add("interleaved batched p2p", {{"parallelism.pp", 4},
                                    {"parallelism.dp", 1},
                                    {"parallelism.schedule", "interleaved"},
                                    {"parallelism.virtual_stages", 2},
                                    {"parallelism.pipeline_batched_p2p", true}});
  m.add("no dp overlap", {{"parallelism.dp_overlap", false}});
  m.add("small dp buckets", {{"parallelism.dp_bucket_size", "200 MiB"}});
  m.add("explicit partition", {{"parallelism.partition", nlohmann::json::array({10, 14})}});
  m.add("balanced partition", {{"parallelism.partition", "balanced"}});
}

// ZeRO stages with buckets, overlap and schedules; the distributed optimizer; prefetch.
void add_zero_cases(Matrix& m) {
  for (int zero = 1; zero <= 3; ++zero) {
    m.add("zero " + std::to_string(zero), {{"parallelism.zero", zero}});
    m.add("zero " + std::to_string(zero) + " small buckets",
          {{"parallelism.zero", zero},
           {"parallelism.reduce_bucket_size", 20'000'000},
           {"parallelism.allgather_bucket_size", 30'000'000}});
    m.add("zero " + std::to_string(zero) + " no overlap",
          {{"parallelism.zero", zero}, {"parallelism.dp_overlap", false}});
    m.add("zero " + std::to_string(zero) + " zb-h1",
          {{"parallelism.zero", zero}, {"parallelism.schedule", "zb-h1"}});
    m.add("zero " + std::to_string(zero) + " interleaved", {{"parallelism.zero", zero},
                                                            {"parallelism.schedule", "interleaved"},
                                                            {"parallelism.virtual_stages", 2}});
  }
  m.add("distributed optimizer overlap param gather",
        {{"training.distributed_optimizer", true}, {"parallelism.overlap_param_gather", true}});
  m.add("distributed optimizer overlap param gather interleaved",
        {{"training.distributed_optimizer", true},
         {"parallelism.overlap_param_gather", true},
         {"parallelism.schedule", "interleaved"},
         {"parallelism.virtual_stages", 2}});
  m.add("zero 3 prefetch 0", {{"parallelism.zero", 3}, {"parallelism.zero_prefetch_layers", 0}});
  m.add("zero 3 prefetch 3", {{"parallelism.zero", 3}, {"parallelism.zero_prefetch_layers", 3}});
  m.add("zero 3 full recompute", {{"parallelism.zero", 3}, {"parallelism.recompute", "full"}});
  m.add("zero 3 merak", {{"parallelism.zero", 3},
                         {"parallelism.schedule", "merak-scp"},
                         {"parallelism.recompute", "full"}});
}

// Offload, recomputation, gradient compression, tensor-parallel overlap.
void add_offload_recompute_compression_cases(Matrix& m) {
  for (int zero : {1, 2, 3}) {
    m.add("offload optimizer zero " + std::to_string(zero),
          {{"parallelism.zero", zero},
           {"parallelism.offload", nlohmann::json::array({"optimizer"})}});
    m.add("offload optimizer nvme zero " + std::to_string(zero),
          {{"parallelism.zero", zero},
           {"parallelism.offload", nlohmann::json::array({"optimizer", "nvme"})}});
  }
  m.add("offload params",
        {{"parallelism.zero", 3}, {"parallelism.offload", nlohmann::json::array({"params"})}});
  m.add("offload params nvme",
        {{"parallelism.zero", 3},
         {"parallelism.offload", nlohmann::json::array({"params", "nvme"})}});
  m.add("offload params and optimizer",
        {{"parallelism.zero", 3},
         {"parallelism.offload", nlohmann::json::array({"params", "optimizer"})}});
  m.add("offload everything to nvme",
        {{"parallelism.zero", 3},
         {"parallelism.offload", nlohmann::json::array({"params", "optimizer", "nvme"})}});
  m.add("offload activations", {{"parallelism.recompute", "full"},
                                {"parallelism.offload", nlohmann::json::array({"activations"})}});
  for (const char* r : {"full", "selective", "stage_aware"}) {
    m.add(std::string("recompute ") + r, {{"parallelism.recompute", r}});
  }
  m.add("recompute block 2", {{"parallelism.recompute", "full"},
                              {"parallelism.recompute_method", "block"},
                              {"parallelism.recompute_num_layers", 2}});
  m.add("recompute merak",
        {{"parallelism.recompute", "full"}, {"parallelism.schedule", "merak-scp"}});
  m.add("recompute zb-h1", {{"parallelism.recompute", "full"}, {"parallelism.schedule", "zb-h1"}});
  for (const char* c : {"fp16", "int8", "topk", "s2-reducer"}) {
    m.add(std::string("compression ") + c, {{"parallelism.grad_compression", c}});
    m.add(std::string("compression ") + c + " no overlap",
          {{"parallelism.grad_compression", c}, {"parallelism.dp_overlap", false}});
  }
  m.add("compression interleaved", {{"parallelism.grad_compression", "int8"},
                                    {"parallelism.schedule", "interleaved"},
                                    {"parallelism.virtual_stages", 2}});
  m.add("tp overlap", {{"parallelism.tp_overlap", 2}, {"parallelism.micro_batch", 2}});
}

// Context parallelism; what frameworks do around the layers; optimizers.
void add_cp_framework_cases(Matrix& m) {
  // Context parallelism (strategies/context_parallel.hpp): tp 2, cp 2, pp 2 on the 8 GPUs.
  for (const char* mode : {"ring", "ulysses", "allgather"}) {
    m.add(std::string("cp ") + mode, {{"parallelism.dp", 1},
                                      {"parallelism.cp", 2},
                                      {"parallelism.cp_mode", mode},
                                      {"training.flash_attention", true}});
  }
  m.add("cp ring sequence parallel zero 1 recompute", {{"parallelism.dp", 1},
                                                       {"parallelism.cp", 2},
                                                       {"parallelism.sequence_parallel", true},
                                                       {"parallelism.zero", 1},
                                                       {"parallelism.recompute", "full"},
                                                       {"training.flash_attention", true}});
  m.add("cp ring mirrored",
        {{"parallelism.pp", 1}, {"parallelism.cp", 2}, {"training.flash_attention", true}}, 2);
  // What frameworks do around the layers (docs/frameworks.md).
  m.add("framework megatron", {{"training.framework", "megatron"}});
  m.add("megatron distributed optimizer",
        {{"training.framework", "megatron"}, {"training.distributed_optimizer", true}});
  m.add("megatron fp16", {{"training.framework", "megatron"}, {"training.dtype", "fp16"}});
  m.add("fsdp", {{"training.framework", "fsdp"}});
  for (const char* o : {"sgd", "rmsprop", "adafactor", "adam8bit"}) {
    m.add(std::string("optimizer ") + o, {{"training.optimizer", o}});
  }
  m.add("optimizer offload lion", {{"parallelism.zero", 2},
                                   {"parallelism.offload", nlohmann::json::array({"optimizer"})},
                                   {"training.optimizer", "lion"}});
}

// Tensor-parallel meshes need tp 4 (2D), 8 (2.5D with depth 2, 3D): their own degrees, not the
// 3D base's.
void add_tp_mesh_cases(Matrix& m) {
  m.all.push_back({"matrix/tp 2d",
                   m.base,
                   {{"parallelism.tp", 4},
                    {"parallelism.tp_mode", "2d"},
                    {"parallelism.micro_batch", 4},
                    {"parallelism.pp", 2},
                    {"parallelism.dp", 1},
                    {"training.global_batch", 16}},
                   0});
  m.all.push_back({"matrix/tp 2.5d",
                   m.base,
                   {{"parallelism.tp", 8},
                    {"parallelism.tp_mode", "2.5d"},
                    {"parallelism.tp_depth", 2},
                    {"parallelism.micro_batch", 4},
                    {"parallelism.pp", 1},
                    {"parallelism.dp", 1}},
                   0});
  m.all.push_back({"matrix/tp 3d",
                   m.base,
                   {{"parallelism.tp", 8},
                    {"parallelism.tp_mode", "3d"},
                    {"parallelism.micro_batch", 4},
                    {"parallelism.pp", 1},
                    {"parallelism.dp", 1}},
                   0});
}

// PyTorch FSDP's runtime (strategies/fsdp.hpp): one pipeline stage, tp 2 x dp 4.
void add_fsdp_cases(Matrix& m) {
  auto fsdp = [&](const std::string& name, Settings set) {
    Settings s = {{"parallelism.tp", 2},
                  {"parallelism.pp", 1},
                  {"parallelism.dp", 4},
                  {"training.global_batch", 16},
                  {"training.framework", "fsdp"}};
    s.insert(s.end(), set.begin(), set.end());
    m.all.push_back({"matrix/fsdp " + name, m.base, s, 0});
  };
  fsdp("defaults", {});
  fsdp("post prefetch forward prefetch", {{"training.fsdp.backward_prefetch", "BACKWARD_POST"},
                                          {"training.fsdp.forward_prefetch", true}});
  fsdp("no prefetch no limit",
       {{"training.fsdp.backward_prefetch", "NONE"}, {"training.fsdp.limit_all_gathers", false}});
  fsdp("pure recompute",
       {{"training.fsdp.mixed_precision", "PURE"}, {"parallelism.recompute", "full"}});
  fsdp("shard grad op", {{"training.fsdp.sharding_strategy", "SHARD_GRAD_OP"}});
  fsdp("no shard", {{"training.fsdp.sharding_strategy", "NO_SHARD"}});
  fsdp("wrap model", {{"training.fsdp.wrap", "model"}});
  fsdp("hybrid", {{"training.fsdp.sharding_strategy", "HYBRID_SHARD"},
                  {"cluster.nodes", 2},
                  {"cluster.devices_per_node", 4},
                  {"parallelism.tp", 1},
                  {"parallelism.dp", 8}});
}

// Dropout, clipping, loss scaling, host overheads, mirroring.
void add_training_cases(Matrix& m) {
  m.add("no dropout", {{"training.hidden_dropout", 0.0}, {"training.attention_dropout", 0.0}});
  m.add("grad clip", {{"training.grad_clip", 1.0}});
  m.add("grad clip zero 1", {{"training.grad_clip", 1.0}, {"parallelism.zero", 1}});
  m.add("fp16 loss scaling", {{"training.dtype", "fp16"}});
  m.add("fp16 loss scaling and clip offload",
        {{"training.dtype", "fp16"},
         {"training.grad_clip", 1.0},
         {"parallelism.zero", 2},
         {"parallelism.offload", nlohmann::json::array({"optimizer"})}});
  m.add("host overheads",
        {{"training.step_overhead", "20 ms"}, {"training.microbatch_overhead", "300 us"}});
  m.add("mirror dp", {}, 1);
  m.add("mirror dp and tp", {}, 2);
  m.add("mirror dp zero 3", {{"parallelism.zero", 3}}, 1);
}

// Parameter servers (docs/parameter-server.md): the 1.7B GPT at tp = pp = 1 with 6 workers and
// 2 servers, fp16's loss-scale check and clipping on the workers; and the same over 3 iterations
// back to back (strategies/iterations.hpp).
void add_parameter_server_cases(Matrix& m) {
  const std::string gpt = (configs_dir() / "experiments/gpt3-1.7b-a100-8.json").string();
  const Settings ps = {
      {"parallelism.dp", 6},      {"parallelism.data_parallel", "parameter_server"},
      {"parallelism.servers", 2}, {"training.global_batch", 48},
      {"training.dtype", "fp16"}, {"training.grad_clip", 1.0}};
  m.all.push_back({"matrix/parameter server gpt", gpt, ps, -1});
  m.all.push_back({"matrix/parameter server gpt 3 iterations", gpt, ps, -1, 3});
  m.all.push_back({"matrix/allreduce gpt 3 iterations", gpt, {}, -1, 3});
}

// Mixture of experts (docs/moe.md): Mixtral 8x7B on 64 H100s (pp 4, dp 16, ep 8), two
// microbatches per pipeline, every rank emitted; and DeepSeek-V2-Lite (shared experts, MLA).
void add_moe_cases(Matrix& m) {
  const std::string moe = (configs_dir() / "experiments/mixtral-8x7b-h100-64-ep8.json").string();
  auto add_moe = [&](const std::string& name, Settings set) {
    set.insert(set.begin(), {"training.global_batch", 32});
    m.all.push_back({"matrix/moe " + name, moe, set, 0});
  };
  add_moe("ep 8", {});
  add_moe("allgather dispatcher", {{"parallelism.moe_token_dispatcher", "allgather"}});
  add_moe("no grouped gemm", {{"parallelism.moe_grouped_gemm", false}});
  add_moe("zipf zero 0", {{"model.moe.imbalance", {{"distribution", "zipf"}, {"exponent", 1.0}}},
                          {"training.distributed_optimizer", false}});
  add_moe("tp 2 ep 4 etp 2", {{"parallelism.tp", 2},
                              {"parallelism.dp", 8},
                              {"parallelism.sequence_parallel", true},
                              {"parallelism.ep", 4},
                              {"parallelism.etp", 2}});
  add_moe("deepseek-v2-lite shared overlap",
          {{"model", (configs_dir() / "models/deepseek-v2-lite.json").string()},
           {"parallelism.moe_shared_expert_overlap", true}});
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const auto& entry : std::filesystem::directory_iterator(configs_dir() / "experiments")) {
    if (entry.path().extension() != ".json") continue;
    all.push_back({"shipped/" + entry.path().stem().string(), entry.path().string(), {}, -1});
  }
  Matrix m{all};
  add_schedule_cases(m);
  add_zero_cases(m);
  add_offload_recompute_compression_cases(m);
  add_cp_framework_cases(m);
  add_tp_mesh_cases(m);
  add_fsdp_cases(m);
  add_training_cases(m);
  add_moe_cases(m);
  add_parameter_server_cases(m);
  return all;
}

Program lower_case(const Case& c) {
  std::vector<Override> overrides;
  for (const auto& [path, value] : c.set) {
    overrides.push_back({path, value, "program hash case " + c.name});
  }
  const Experiment e = load_experiment(c.experiment, overrides);
  LowerOptions options;
  if (c.mirror < 0) {
    options.mirror_data_parallel = sim::replicas_behave_alike(e.cluster);
  } else {
    options.mirror_data_parallel = c.mirror >= 1;
    options.mirror_tensor_parallel = c.mirror >= 2;
  }
  options.iterations = c.iterations;
  return study::lower(e, options);
}

std::filesystem::path hashes_file() {
  return std::filesystem::path(STRATASIM_SOURCE_DIR) / "tests/reference/program_hashes.json";
}

}  // namespace

TEST_CASE("every shipped experiment and every technique lowers to the recorded Program") {
  nlohmann::json expected;
  {
    std::ifstream in(hashes_file());
    REQUIRE_MESSAGE(in.good(), "cannot read " << hashes_file());
    in >> expected;
  }
  nlohmann::json actual = nlohmann::json::object();
  const std::vector<Case> all = cases();
  for (const Case& c : all) {
    CAPTURE(c.name);
    const std::string hash = program_hash(lower_case(c));
    actual[c.name] = hash;
    if (!expected.contains(c.name)) {
      FAIL_CHECK("no recorded hash for " << c.name << " (now " << hash << ")");
      continue;
    }
    CHECK_MESSAGE(expected[c.name].get<std::string>() == hash,
                  c.name << ": the lowered Program changed (now " << hash << ")");
  }
  CHECK(expected.size() == actual.size());
  if (const char* out = std::getenv("STRATASIM_WRITE_PROGRAM_HASHES")) {
    std::ofstream file(out);
    file << actual.dump(2) << "\n";
  }
}

TEST_CASE("the Program hash sees a change of a single op's field") {
  // The hash must not be blind: a program and the same program with one effect, one dependency
  // or one label different hash differently.
  auto build = [](std::int64_t bytes, bool dep, const char* label) {
    Program p(2);
    const auto g = p.add_group({0, 1}, "dp");
    for (int r = 0; r < 2; ++r) {
      p.begin_rank(r);
      OpInfo info;
      info.label = "a";
      const OpId first = p.add(Compute{p.add_kernels({})}, info);
      info.label = label;
      info.stream = Stream::dp_comm;
      const std::array<OpId, 1> deps = {first};
      const MemoryEffect fx{Bytes(bytes), MemoryCategory::comm_buffers, MemoryTier::device, true};
      p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(64)}, info,
            dep ? std::span<const OpId>(deps) : std::span<const OpId>(),
            std::span<const MemoryEffect>(&fx, 1));
    }
    p.finish();
    return program_hash(p);
  };
  const std::string base = build(8, true, "b");
  CHECK(build(8, true, "b") == base);
  CHECK(build(16, true, "b") != base);
  CHECK(build(8, false, "b") != base);
  CHECK(build(8, true, "c") != base);
}

}  // namespace stratasim::testing
