// The CUDA device on real GPUs (label "gpu"; main.cpp skips the whole executable without one).
// Each case says when it needs more GPUs than the machine has and passes without running.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "exec/devices.hpp"
#include "exec/interpreter.hpp"
#include "exec/plan.hpp"
#include "experiment_helpers.hpp"
#include "strategies/lowering.hpp"
#include "strategies/program.hpp"

using namespace stratasim;
using namespace stratasim::exec;
using namespace stratasim::strategies;

namespace {

#define STRATASIM_REQUIRE_GPUS(n)                                                              \
  if (visible_gpus() < (n)) {                                                                  \
    MESSAGE("needs " << (n) << " GPU(s); this machine has " << visible_gpus() << ": skipped"); \
    return;                                                                                    \
  }

OpInfo info(std::string_view label, Stream stream = Stream::compute) {
  OpInfo i;
  i.label = label;
  i.stream = stream;
  return i;
}

MeasuredRun run_on_cuda(const Program& program, RunOptions options = {}) {
  const ExecPlan plan(program);
  WorldOptions world_options;
  world_options.launch = Launch::single_process;
  auto world = make_world(DeviceKind::cuda, plan, world_options);
  return run(plan, *world, options);
}

std::string error_of(const Program& program, RunOptions options = {}) {
  try {
    run_on_cuda(program, options);
  } catch (const ExecError& e) {
    return e.what();
  }
  return "";
}

bool is_hopper() {
  const std::string d = cuda_description();
  return d.find("H100") != std::string::npos || d.find("H200") != std::string::npos;
}

}  // namespace

TEST_CASE("a GEMM op is timed; a 4096^3 bf16 GEMM reaches 30% of an H100's dense peak") {
  STRATASIM_REQUIRE_GPUS(1);
  Program p(1);
  p.begin_rank(0);
  std::vector<Kernel> kernels(9, Kernel{Gemm{4096, 4096, 4096, 1, DType::bf16}, "gemm"});
  p.add(Compute{p.add_kernels(kernels)}, info("gemms"));
  p.finish();
  const MeasuredRun run = run_on_cuda(p);
  REQUIRE(run.timeline.spans.size() == 1);
  CHECK(run.timeline.spans[0].end > run.timeline.spans[0].start);
  REQUIRE(run.kernels.size() == kernels.size());
  std::vector<double> seconds;
  for (const KernelTiming& k : run.kernels) {
    CHECK(k.end > k.start);
    seconds.push_back((k.end - k.start).seconds());
  }
  std::sort(seconds.begin(), seconds.end());
  const double tflops = 2.0 * 4096.0 * 4096.0 * 4096.0 / seconds[seconds.size() / 2] / 1e12;
  MESSAGE("4096^3 bf16 GEMM: " << tflops << " TFLOP/s on " << cuda_description());
  if (is_hopper()) CHECK(tflops > 0.3 * 989.0);
}

TEST_CASE("a measured spin kernel takes its duration") {
  STRATASIM_REQUIRE_GPUS(1);
  Program p(1);
  p.begin_rank(0);
  p.add(Compute{p.add_kernels({Kernel{Measured{Time::us(500)}, "spin"}})}, info("spin"));
  p.finish();
  const MeasuredRun run = run_on_cuda(p);
  const double s = (run.timeline.spans[0].end - run.timeline.spans[0].start).seconds();
  CHECK(s == doctest::Approx(500e-6).epsilon(0.1));
}

TEST_CASE("every kind of kernel runs on one GPU, with memory effects on every tier") {
  STRATASIM_REQUIRE_GPUS(1);
  Program p(1);
  p.begin_rank(0);
  p.add_initial_memory(0, {MemoryCategory::parameters, MemoryTier::device, Bytes(64 << 20)});
  p.add_initial_memory(0, {MemoryCategory::optimizer_states, MemoryTier::host, Bytes(32 << 20)});
  std::vector<Kernel> kernels = {
      {Gemm{1024, 2048, 512, 4, DType::bf16}, "bf16 batched"},
      {Gemm{1000, 999, 77, 1, DType::fp16}, "fp16 odd"},
      {Gemm{512, 512, 512, 1, DType::fp32}, "fp32"},
      {Gemm{512, 512, 512, 1, DType::tf32}, "tf32"},
      {Attention{2, 16, 4, 1024, 1024, 64, true, DType::bf16, false}, "attention"},
      {Attention{2, 16, 4, 1024, 1024, 64, true, DType::bf16, true}, "attention.bwd"},
      {Attention{1, 8, 8, 256, 512, 128, false, DType::fp16, false}, "cross attention"},
      {Elementwise{1 << 20, Bytes(2 << 20), Bytes(2 << 20)}, "ln1"},
      {Elementwise{1 << 22, Bytes(8 << 20), Bytes(8 << 20)}, "gelu"},
      {Elementwise{1 << 20, Bytes(4 << 20), Bytes(3 << 20)}, "attention.dropout_residual"},
      {Elementwise{std::int64_t{1} << 29, Bytes(std::int64_t{1} << 30),
                   Bytes(std::int64_t{1} << 30)},
       "big add (wraps)"},
      {OptimizerStep{1 << 22, OptimizerKind::adam, DType::bf16, false}, "adam"},
      {OptimizerStep{(1 << 24) + 5, OptimizerKind::adam, DType::fp16, false}, "adam (wraps)"},
      {OptimizerStep{1 << 20, OptimizerKind::sgd, DType::fp32, false}, "sgd"},
      {OptimizerStep{1 << 20, OptimizerKind::adam, DType::bf16, true}, "host adam"},
      {Copy{Bytes(16 << 20), MemoryTier::device, MemoryTier::host}, "d2h"},
      {Copy{Bytes(16 << 20), MemoryTier::host, MemoryTier::device}, "h2d"},
      {Copy{Bytes(16 << 20), MemoryTier::device, MemoryTier::device}, "d2d"},
      {Copy{Bytes(16 << 20), MemoryTier::nvme, MemoryTier::host}, "nvme read"},
      {Measured{Time::us(20)}, "measured"},
      {RooflineWork{Flops(2e11), Bytes(64 << 20), DType::bf16}, "roofline (tensor)"},
      {RooflineWork{Flops(1e9), Bytes(64 << 20), DType::fp32}, "roofline (fp32)"},
      {RooflineWork{Flops(1e8), Bytes(0), DType::fp32}, "roofline (no bytes)"},
  };
  const MemoryEffect grow[] = {
      {Bytes(256 << 20), MemoryCategory::activations, MemoryTier::device, false},
      {Bytes(8 << 20), MemoryCategory::comm_buffers, MemoryTier::host, true},
      {Bytes(1 << 30), MemoryCategory::optimizer_states, MemoryTier::nvme, true}};
  const OpId a = p.add(Compute{p.add_kernels(kernels)}, info("everything"), {}, grow);
  const MemoryEffect shrink[] = {
      {Bytes(-(100 << 20)), MemoryCategory::activations, MemoryTier::device, true}};
  const OpId deps[] = {a};
  p.add(Compute{p.add_kernels({Kernel{Measured{Time::us(5)}, "tail"}})}, info("copy", Stream::copy),
        deps, shrink);
  p.finish();
  const MeasuredRun run = run_on_cuda(p);
  REQUIRE(run.kernels.size() == kernels.size() + 1);
  for (const KernelTiming& k : run.kernels) CHECK(k.end >= k.start);
  CHECK(run.timeline.spans[1].start >= run.timeline.spans[0].end);
  const auto& device = run.timeline.ranks[0].tiers[0];
  CHECK(device.peak == Bytes((64 << 20) + (256 << 20)));
  CHECK(run.timeline.ranks[0].tiers[1].peak == Bytes((32 << 20) + (8 << 20)));
  CHECK(run.timeline.ranks[0].tiers[2].peak == Bytes(1 << 30));
  CHECK(run.reserved_peak >= device.peak);
  CHECK(!run.timeline.memory.empty());
}

TEST_CASE("fp8 GEMMs run on Hopper") {
  STRATASIM_REQUIRE_GPUS(1);
  if (!is_hopper()) {
    MESSAGE("fp8 GEMMs need sm_89+; skipped on " << cuda_description());
    return;
  }
  Program p(1);
  p.begin_rank(0);
  p.add(Compute{p.add_kernels({Kernel{Gemm{4096, 4096, 4096, 1, DType::fp8}, "fp8"}})},
        info("fp8"));
  p.finish();
  const MeasuredRun run = run_on_cuda(p);
  CHECK(run.kernels.at(0).end > run.kernels.at(0).start);
}

TEST_CASE("an all-reduce over two GPUs") {
  STRATASIM_REQUIRE_GPUS(2);
  Program p(2);
  const auto group = p.add_group({0, 1}, "dp 0");
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    p.add(Collective{CollectiveKind::all_reduce, DType::bf16, group, Bytes(256 << 20)},
          info("all-reduce", Stream::dp_comm));
    p.add(Collective{CollectiveKind::all_gather, DType::bf16, group, Bytes(64 << 20)},
          info("all-gather", Stream::dp_comm));
    p.add(Collective{CollectiveKind::all_to_all, DType::fp32, group, Bytes(16 << 20)},
          info("all-to-all", Stream::tp_comm));
  }
  p.finish();
  const MeasuredRun run = run_on_cuda(p);
  for (const traces::Span& s : run.timeline.spans) CHECK(s.end > s.start);
  const double seconds = (run.timeline.spans[0].end - run.timeline.spans[0].start).seconds();
  MESSAGE("256 MiB bf16 all-reduce on 2 GPUs: busbw " << (256.0 * 1048576 / seconds / 1e9)
                                                      << " GB/s");
}

TEST_CASE("a single-GPU GPT program from the lowering runs, every op timed") {
  STRATASIM_REQUIRE_GPUS(1);
  const Program p = lower(testing::make_experiment(testing::gpt(16, 1024, 2), 1, 1, 1, 4, 1, 512));
  RunOptions options;
  options.iterations = 2;
  const MeasuredRun run = run_on_cuda(p, options);
  REQUIRE(run.timeline.spans.size() == p.op_count());
  int timed = 0;
  for (const traces::Span& s : run.timeline.spans) {
    const Op& op = p.op(s.op);
    const auto* c = std::get_if<Compute>(&op.work);
    const bool has_work = !c || !p.kernels_of(*c).empty();
    CHECK(s.end >= s.start);
    if (has_work) {
      CHECK_MESSAGE(s.end > s.start, p.describe(s.op));
      ++timed;
    }
  }
  CHECK(timed > 0);
  CHECK(run.timeline.ranks[0].tiers[0].peak > Bytes(0));
  MESSAGE("GPT (2 layers, hidden 1024) iteration: " << run.iteration_times_s[0] << " s");
}

TEST_CASE("an allocation larger than the GPU is an OutOfMemoryError naming the op") {
  STRATASIM_REQUIRE_GPUS(1);
  Program p(1);
  p.begin_rank(0);
  const MemoryEffect huge[] = {
      {Bytes(std::int64_t{1} << 50), MemoryCategory::activations, MemoryTier::device, false}};
  p.add(Compute{p.add_kernels({Kernel{Measured{Time::us(10)}, "spin"}})}, info("too big"), {},
        huge);
  p.finish();
  std::string message;
  try {
    run_on_cuda(p);
  } catch (const OutOfMemoryError& e) {
    message = e.what();
  }
  CHECK(message.find("rank 0 op 0") != std::string::npos);
  CHECK(message.find("too big") != std::string::npos);
}

TEST_CASE("a strategy with more ranks than GPUs is refused with the counts") {
  Program p(visible_gpus() + 1);
  p.finish();
  const std::string message = error_of(p);
  CHECK(message.find("needs " + std::to_string(visible_gpus() + 1) + " GPUs") != std::string::npos);
}

// Last: aborting NCCL communicators with work queued behind them may leave the GPUs unusable
// for the rest of the process.
TEST_CASE("two ranks that each receive before they send hang, and the watchdog says where") {
  STRATASIM_REQUIRE_GPUS(2);
  Program p(2);
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    const OpId recv = p.add(Recv{1 - r, Bytes(1 << 20)}, info("recv", Stream::pp_recv));
    const OpId deps[] = {recv};
    p.add(Send{1 - r, Bytes(1 << 20)}, info("send", Stream::pp_send), deps);
  }
  p.finish();
  RunOptions options;
  options.warmup_iterations = 0;
  options.iterations = 1;
  options.watchdog = std::chrono::seconds(3);
  const ExecPlan plan(p);
  WorldOptions world_options;
  world_options.launch = Launch::single_process;
  auto world = make_world(DeviceKind::cuda, plan, world_options);
  std::string message;
  try {
    run(plan, *world, options);
  } catch (const HangError& e) {
    message = e.what();
  }
  CHECK(message.find("ncclRecv from rank") != std::string::npos);
  CHECK(message.find("rank 0 op 1") != std::string::npos);  // the send, waiting for the recv
}
