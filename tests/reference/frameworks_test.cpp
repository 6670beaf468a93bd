// What frameworks do around the layers, through the whole path (config -> lowering -> memory):
// Megatron-LM's table of model-state bytes per parameter with and without its distributed
// optimizer, the optimizers' states, the dtype the data-parallel gradients move in, and the
// memory every framework holds back from the tensors (strategies/framework.hpp,
// strategies/optimizer.hpp, docs/frameworks.md).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "hw_models/device.hpp"
#include "reference/helpers.hpp"
#include "sim/cost.hpp"
#include "sim/memory.hpp"
#include "strategies/framework.hpp"
#include "study/study.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// A 4-layer GPT (hidden 1024, 16 heads) on tp x pp x dp test devices.
Experiment small(int tp, int pp, int dp, DType dtype, Framework framework) {
  auto e = make_experiment(gpt(16, 1024, 4), tp, pp, dp, 4 * dp, 1, 512);
  e.training.dtype = dtype;
  e.training.framework = framework;
  e.cluster.device.peak_flops[static_cast<std::size_t>(DType::fp16)] = FlopRate(100e12);
  e.cluster.device.peak_flops[static_cast<std::size_t>(DType::fp32)] = FlopRate(100e12);
  return e;
}

std::int64_t stage_parameters(const Experiment& e, int stage) {
  return pipeline_spec(e).stages[static_cast<std::size_t>(stage)].parameters;
}

// Bytes of the data-parallel collectives of `kind` that `rank` issues, and their dtypes.
struct Moved {
  std::int64_t bytes = 0;
  std::vector<DType> dtypes;
};
Moved dp_moved(const Program& p, int rank, CollectiveKind kind) {
  Moved m;
  for (const auto& op : p.ops_of(rank)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (!c || c->kind != kind || !p.groups()[c->group].name.starts_with("dp")) continue;
    m.bytes += c->bytes.count();
    m.dtypes.push_back(c->dtype);
  }
  return m;
}

}  // namespace

TEST_CASE("megatron-dist-optimizer: model-state bytes per parameter as Megatron-LM's table") {
  // NVIDIA/Megatron-LM docs/source/api-guide/dist_optimizer.md, "theoretical number of bytes
  // per parameter (where d is the data parallel size)":
  //                               non-distributed   distributed
  //   fp16 params, fp16 grads           20            4 + 16/d
  //   bf16 params, fp32 grads           18            6 + 12/d
  //   fp32 params, fp32 grads           16            8 + 8/d
  // (fp16: 2 weights + 2 grads, optimizer 4 master + 4 fp32 grad copy + 8 Adam states;
  // bf16: 2 weights + 4 fp32 main grads, optimizer 4 + 8; fp32: 4 + 4, optimizer 8.)
  struct Row {
    DType dtype;
    std::int64_t whole, replicated, sharded;
  };
  const int d = 8;
  for (const Row& row :
       {Row{DType::fp16, 20, 4, 16}, Row{DType::bf16, 18, 6, 12}, Row{DType::fp32, 16, 8, 8}}) {
    CAPTURE(name_of(row.dtype));
    auto e = small(1, 1, d, row.dtype, Framework::megatron);
    const std::int64_t psi = stage_parameters(e, 0);
    const Program plain = lower_checked(e);
    CHECK(model_state_bytes(plain, 0) == row.whole * psi);
    e.training.distributed_optimizer = true;
    const Program distributed = lower_checked(e);
    // The optimizer's part is sharded: ceil(psi / d) parameters per rank.
    for (int rank : {0, d - 1}) {
      CHECK(model_state_bytes(distributed, rank) ==
            row.replicated * psi + row.sharded * ((psi + d - 1) / d));
    }
    MESSAGE(name_of(row.dtype) << ": " << static_cast<double>(model_state_bytes(plain, 0)) / psi
                               << " and "
                               << static_cast<double>(model_state_bytes(distributed, 0)) / psi
                               << " bytes per parameter (Megatron " << row.whole << " and "
                               << row.replicated << " + " << row.sharded << "/" << d << ")");
  }
}

TEST_CASE("optimizers: model-state bytes per parameter, lowered") {
  // GPipe-style fp32 training with RMSProp (no master copy): 4 weights + 4 gradients + 4
  // square average = 12 bytes per parameter.
  auto rmsprop = small(1, 2, 1, DType::fp32, Framework::generic);
  rmsprop.parallelism.schedule = ScheduleKind::gpipe;
  rmsprop.training.optimizer = OptimizerKind::rmsprop;
  const Program p = lower_checked(rmsprop);
  for (int stage : {0, 1}) {
    CHECK(model_state_bytes(p, stage) == 12 * stage_parameters(rmsprop, stage));
  }
  // Mixed-precision Adam: 2 weights + 2 gradients + 12 (master, m, v) = 16; with fp32
  // gradient buffers 2 + 4 + 12 = 18.
  auto adam = small(1, 2, 1, DType::bf16, Framework::generic);
  adam.parallelism.schedule = ScheduleKind::gpipe;
  CHECK(model_state_bytes(lower_checked(adam), 0) == 16 * stage_parameters(adam, 0));
  adam.training.grad_accumulation_dtype = DType::fp32;
  CHECK(model_state_bytes(lower_checked(adam), 0) == 18 * stage_parameters(adam, 0));
  CHECK(initial_bytes(lower_checked(adam), 0, MemoryCategory::gradients) ==
        4 * stage_parameters(adam, 0));
}

TEST_CASE("optimizers: the optimizer's part of the model states, hand-computed") {
  // n = 4096^2 parameters in bf16 (mixed precision: a 4-byte fp32 master for every optimizer):
  const std::int64_t n = 4096LL * 4096;
  auto bytes = [&](OptimizerKind k) {
    return optimizer_state_bytes(ModelStateFormat{DType::bf16, DType::bf16, k, false, {}, 2}, n)
        .count();
  };
  CHECK(bytes(OptimizerKind::adam) == (4 + 8) * n);   // master, m, v
  CHECK(bytes(OptimizerKind::adamw) == (4 + 8) * n);  // the same states
  CHECK(bytes(OptimizerKind::sgd) == 4 * n);          // the master only
  for (OptimizerKind k : {OptimizerKind::sgd_momentum, OptimizerKind::rmsprop,
                          OptimizerKind::adagrad, OptimizerKind::lion}) {
    CHECK(bytes(k) == (4 + 4) * n);  // master and one fp32 state
  }
  // Adafactor: master plus a row and a column of 4096 fp32 each (one square matrix).
  CHECK(bytes(OptimizerKind::adafactor) == 4 * n + 4 * (4096 + 4096));
  // 8-bit Adam: master, m and v in one byte each, and per 2048-element block one fp32 absmax
  // per state: 8192 blocks x 4 x 2.
  CHECK(bytes(OptimizerKind::adam8bit) == (4 + 2) * n + 8192 * 4 * 2);
  // fp32 training keeps no master: Adam's 8, RMSProp's 4.
  CHECK(optimizer_state_bytes({DType::fp32, DType::fp32, OptimizerKind::adam, false, {}, 2}, n)
            .count() == 8 * n);
  // Megatron's fp16 optimizer keeps an fp32 copy of fp16 gradients: 4 + 4 + 8.
  CHECK(optimizer_state_bytes({DType::fp16, DType::fp16, OptimizerKind::adam, true, {}, 2}, n)
            .count() == 16 * n);
}

TEST_CASE("gradients move in the gradient buffers' dtype: Megatron all-reduces fp32 main grads") {
  const int d = 4;
  auto e = small(1, 1, d, DType::bf16, Framework::generic);
  const std::int64_t psi = stage_parameters(e, 0);
  // generic: bf16 gradients, 2 bytes per parameter all-reduced.
  const Moved generic = dp_moved(lower_checked(e), 0, CollectiveKind::all_reduce);
  CHECK(generic.bytes == 2 * psi);
  for (DType t : generic.dtypes) CHECK(t == DType::bf16);
  // megatron: the fp32 main-grad buffer, 4 bytes per parameter.
  e.training.framework = Framework::megatron;
  const Moved main_grads = dp_moved(lower_checked(e), 0, CollectiveKind::all_reduce);
  CHECK(main_grads.bytes == 4 * psi);
  for (DType t : main_grads.dtypes) CHECK(t == DType::fp32);
  // The distributed optimizer reduce-scatters the fp32 buffer and all-gathers bf16 parameters.
  e.training.distributed_optimizer = true;
  const Program distributed = lower_checked(e);
  CHECK(dp_moved(distributed, 0, CollectiveKind::all_reduce).bytes == 0);
  const Moved rs = dp_moved(distributed, 0, CollectiveKind::reduce_scatter);
  const Moved ag = dp_moved(distributed, 0, CollectiveKind::all_gather);
  CHECK(rs.bytes == 4 * psi);
  CHECK(ag.bytes == 2 * psi);
  for (DType t : rs.dtypes) CHECK(t == DType::fp32);
  for (DType t : ag.dtypes) CHECK(t == DType::bf16);
  // And the step reads fp32 gradients.
  simulate_checked(e, distributed);
}

TEST_CASE("memory held back: a run that fitted with no headroom is out of memory by it") {
  auto e = small(1, 1, 1, DType::bf16, Framework::generic);
  const Program program = lower_checked(e);
  const auto bare = sim::estimate_memory(program, e.cluster, sim::MemoryOverheads{});
  const Bytes peak = bare.ranks[0].tiers[0].peak;
  const auto other = static_cast<std::size_t>(MemoryCategory::other);
  CHECK(bare.ranks[0].tiers[0].breakdown[other] == Bytes(0));
  e.cluster.device.memory_capacity = peak;  // fits with no headroom, as before
  CHECK(sim::estimate_memory(program, e.cluster, sim::MemoryOverheads{}).out_of_memory.empty());
  // With the experiment's defaults, one device with no communicator holds back the CUDA
  // context: 512 MiB (strategies/framework.hpp).
  const auto held = sim::estimate_memory(program, e.cluster, study::memory_overheads(e));
  CHECK(held.ranks[0].tiers[0].breakdown[other] == Bytes(512LL << 20));
  CHECK(held.ranks[0].tiers[0].peak == peak + Bytes(512LL << 20));
  REQUIRE(held.out_of_memory.size() == 1);
  CHECK(held.out_of_memory[0].peak - held.out_of_memory[0].capacity == Bytes(512LL << 20));

  // Two tensor-parallel ranks: one communicator more, 512 MiB + 64 MiB of NCCL buffers.
  auto tp = small(2, 1, 1, DType::bf16, Framework::generic);
  const Program tp_program = lower_checked(tp);
  CHECK(sim::communicators_of(tp_program, 0) == 1);
  const auto tp_held = sim::estimate_memory(tp_program, tp.cluster, study::memory_overheads(tp));
  CHECK(tp_held.ranks[1].tiers[0].breakdown[other] == Bytes(576LL << 20));
  // Two pipeline stages: each rank sends to or receives from its one peer.
  auto pp = small(1, 2, 1, DType::bf16, Framework::generic);
  const Program pp_program = lower_checked(pp);
  CHECK(sim::communicators_of(pp_program, 0) >= 1);
  // memory.reserved replaces the modelled figure.
  tp.memory.reserved = Bytes(1LL << 30);
  const auto reserved = sim::estimate_memory(tp_program, tp.cluster, study::memory_overheads(tp));
  CHECK(reserved.ranks[0].tiers[0].breakdown[other] == Bytes(1LL << 30));
}

TEST_CASE("frameworks: the fitted defaults are configs/frameworks.json's figures") {
  // scripts/fit-profiles writes configs/frameworks.json; strategies/framework.hpp carries its
  // figures as the frameworks' defaults. A framework without fitted runs takes generic's.
  std::ifstream in(std::filesystem::path(STRATASIM_SOURCE_DIR) / "configs" / "frameworks.json");
  const auto j = nlohmann::json::parse(in).at("frameworks");
  const auto generic =
      strategies::framework_defaults(strategies::Framework::generic, DType::bf16, 0);
  const auto fsdp = strategies::framework_defaults(strategies::Framework::fsdp, DType::bf16, 3);
  CHECK(generic.compute_efficiency == j.at("generic").at("compute_efficiency").get<double>());
  CHECK(generic.elementwise_traffic == j.at("generic").at("elementwise_traffic").get<double>());
  CHECK(fsdp.compute_efficiency == j.at("fsdp").at("compute_efficiency").get<double>());
  CHECK(fsdp.elementwise_traffic == j.at("fsdp").at("elementwise_traffic").get<double>());
  CHECK(generic.attention_efficiency == j.at("generic").at("attention_efficiency").get<double>());
  CHECK(fsdp.attention_efficiency == j.at("fsdp").at("attention_efficiency").get<double>());
  for (auto f : {strategies::Framework::megatron, strategies::Framework::deepspeed}) {
    CHECK(!j.contains(std::string(strategies::name_of(f))));
    CHECK(strategies::framework_defaults(f, DType::bf16, 0).compute_efficiency ==
          generic.compute_efficiency);
    CHECK(strategies::framework_defaults(f, DType::bf16, 0).elementwise_traffic ==
          generic.elementwise_traffic);
    CHECK(strategies::framework_defaults(f, DType::bf16, 0).attention_efficiency ==
          generic.attention_efficiency);
  }
}

TEST_CASE(
    "frameworks: the fitted die factors are configs/frameworks.json's; the reference keeps 1") {
  // scripts/fit-profiles writes the dies' factors beside the frameworks'; strategies/framework.hpp
  // carries them (strategies::die_training).
  std::ifstream in(std::filesystem::path(STRATASIM_SOURCE_DIR) / "configs" / "frameworks.json");
  const auto dies = nlohmann::json::parse(in).at("dies");
  REQUIRE(dies.contains(std::string(strategies::kReferenceDie)));
  const auto& reference = dies.at(std::string(strategies::kReferenceDie));
  CHECK(reference.at("reference").get<bool>());
  CHECK(reference.at("gemm").get<double>() == 1.0);
  CHECK(reference.at("attention").get<double>() == 1.0);
  for (const auto& [name, d] : dies.items()) {
    CAPTURE(name);
    CHECK(strategies::die_training(name).gemm == d.at("gemm").get<double>());
    CHECK(strategies::die_training(name).attention == d.at("attention").get<double>());
    CHECK(d.at("cases").size() == d.at("runs").get<std::size_t>());
  }
  // A die without fitted runs, or none, keeps the kernel models' rates.
  CHECK(strategies::die_training("GV100").gemm == 1.0);
  CHECK(strategies::die_training("").attention == 1.0);
}

TEST_CASE("frameworks: a device's die factors reach it; a measured profile's GEMMs ignore them") {
  // The H100's die (GH100) carries its fitted factors into the experiment's devices; the cost of
  // a compute-bound GEMM on the calibrated model scales by 1 / die_gemm.
  const auto file = configs_dir() / "experiments/gpt3-175b-a100-1024.json";
  const auto a100 = strategies::load_experiment(file, {});
  CHECK(a100.cluster.device.die == "GA100");
  CHECK(a100.cluster.device.efficiency.die_gemm == 1.0);
  CHECK(a100.cluster.device.efficiency.die_attention == 1.0);
  auto h100 = hw::load_device(configs_dir() / "hardware/devices/h100-sxm5-80gb.json");
  CHECK(h100.die == "GH100");
  hw::DeviceSpec halved = h100;
  halved.efficiency.die_gemm = 0.5;
  // 8192^3 bf16: compute-bound by far (2 x 8192^3 FLOPs against 3 x 8192^2 x 2 bytes).
  const strategies::Kernel gemm{strategies::Gemm{8192, 8192, 8192, 1, DType::bf16}, "g"};
  const double full =
      (sim::DeviceCostModel(h100).kernel_time(gemm) - sim::DeviceCostModel(h100).launch_overhead())
          .seconds();
  const double half = (sim::DeviceCostModel(halved).kernel_time(gemm) -
                       sim::DeviceCostModel(halved).launch_overhead())
                          .seconds();
  const double latency = h100.kernel_model->gemm_for(DType::bf16)->latency;
  CHECK(half - latency == doctest::Approx(2 * (full - latency)).epsilon(1e-9));
}

TEST_CASE("frameworks: training.attention_efficiency reaches every GPU; out of range is an error") {
  const auto file = configs_dir() / "experiments/gpt3-175b-a100-1024.json";
  // Unset: the framework's fitted value (the example's framework is generic).
  const auto plain = strategies::load_experiment(file, {});
  CHECK(plain.cluster.device.efficiency.framework_attention ==
        strategies::framework_defaults(plain.training.framework, plain.training.dtype,
                                       plain.parallelism.zero)
            .attention_efficiency);
  const auto fsdp = strategies::load_experiment(file, {cli("training.framework", "fsdp")});
  CHECK(fsdp.cluster.device.efficiency.framework_attention == kFsdpAttentionEfficiency);
  const auto set = strategies::load_experiment(file, {cli("training.attention_efficiency", 2.5)});
  CHECK(set.cluster.device.efficiency.framework_attention == 2.5);
  for (double bad : {0.05, 11.0, -1.0}) {
    CAPTURE(bad);
    const auto e = default_experiment_error({cli("training.attention_efficiency", bad)});
    CHECK(e.path() == "training.attention_efficiency");
    CHECK(e.message().find("[0.1, 10]") != std::string::npos);
  }
}
