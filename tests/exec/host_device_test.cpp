// The interpreter on the host device: real programs on CPU threads, checked values.
#include <doctest/doctest.h>

#include <algorithm>

#include "exec/devices.hpp"
#include "exec/host_device.hpp"
#include "exec/interpreter.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using namespace stratasim::exec;
using namespace stratasim::strategies;

namespace {

MeasuredRun run_on_host(const Program& program, bool verify = true, RunOptions options = {},
                        Bytes capacity = Bytes(0)) {
  ExecPlan plan(program);
  WorldOptions world_options;
  world_options.device.verify = verify;
  world_options.capacity = capacity;
  auto world = make_world(DeviceKind::host, plan, world_options);
  return run(plan, *world, options);
}

Experiment tiny_3d() {
  return load_experiment(testing::configs_dir() / "experiments/gpt-tiny-3d-8.json");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("exec host: every collective kind gives the right values on 4 ranks") {
  // Each kind twice on one group of 4 ranks, sizes divisible by 4; verification compares every
  // element with sums of the known inputs (host_device.cpp's input_value).
  for (CollectiveKind kind :
       {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather,
        CollectiveKind::broadcast, CollectiveKind::reduce, CollectiveKind::all_to_all}) {
    CAPTURE(name_of(kind));
    Program p(4);
    const auto g = p.add_group({0, 1, 2, 3}, "all");
    for (int r = 0; r < 4; ++r) {
      p.begin_rank(r);
      for (int i = 0; i < 2; ++i) {
        OpInfo info;
        info.stream = Stream::dp_comm;
        p.add(Collective{kind, DType::fp32, g, Bytes(4 * 1024)}, info);
      }
    }
    p.finish();
    const auto measured = run_on_host(p);
    CHECK(measured.timeline.spans.size() == 8);
    for (const auto& s : measured.timeline.spans) CHECK(s.end >= s.start);
  }
}

TEST_CASE("exec host: a send delivers its bytes and a pipeline of transfers completes") {
  // rank 0 -> 1 -> 2 -> 3, three messages each; verification checks every received byte.
  Program p(4);
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    for (int m = 0; m < 3; ++m) {
      OpId got = 0;
      if (r > 0) {
        OpInfo info;
        info.stream = Stream::pp_recv;
        got = p.add(Recv{r - 1, Bytes(1000 + m)}, info);
      }
      if (r < 3) {
        OpInfo info;
        info.stream = Stream::pp_send;
        if (r > 0) {
          p.add(Send{r + 1, Bytes(1000 + m)}, info, std::span<const OpId>(&got, 1));
        } else {
          p.add(Send{r + 1, Bytes(1000 + m)}, info);
        }
      }
    }
  }
  p.finish();
  const auto measured = run_on_host(p);
  // A receive cannot end before the send that feeds the next stage starts.
  CHECK(measured.timeline.spans.size() == p.op_count());
}

TEST_CASE("exec host: a DP + PP + TP program on 8 ranks completes with verified data") {
  const Experiment e = tiny_3d();
  const Program program = lower(e);
  RunOptions options;
  options.warmup_iterations = 1;
  options.iterations = 3;
  const auto measured = run_on_host(program, true, options);
  REQUIRE(measured.timeline.completed);
  CHECK(measured.iteration_times_s.size() == 3);
  CHECK(measured.timeline.spans.size() == program.op_count());
  for (OpId id = 0; id < program.op_count(); ++id) {
    const auto& s = measured.timeline.spans[id];
    CHECK(s.op == id);
    CHECK(s.end >= s.start);
    // Every op starts after its dependencies end (the interpreter honours them).
    for (OpId d : program.deps_of(program.op(id))) {
      CHECK(measured.timeline.spans[d].end <= s.start);
    }
  }
  // One kernel timing per kernel of every compute op.
  std::size_t kernels = 0;
  for (const Op& op : program.ops()) {
    if (const auto* c = std::get_if<Compute>(&op.work)) kernels += program.kernels_of(*c).size();
  }
  CHECK(measured.kernels.size() == kernels);
  // The median iteration is one of the measured ones.
  const double median =
      measured.iteration_times_s[static_cast<std::size_t>(measured.median_iteration)];
  auto sorted = measured.iteration_times_s;
  std::sort(sorted.begin(), sorted.end());
  CHECK(median == sorted[1]);
}

TEST_CASE("exec host: ops of one stream run in issue order") {
  const Program program = lower(tiny_3d());
  const auto measured = run_on_host(program, false);
  for (int r = 0; r < program.world_size(); ++r) {
    Time last_end[kStreamCount] = {};
    for (std::size_t i = 0; i < program.ops_of(r).size(); ++i) {
      const OpId id = program.first_op(r) + static_cast<OpId>(i);
      const auto& s = measured.timeline.spans[id];
      const auto stream = static_cast<std::size_t>(s.stream);
      CHECK(s.start >= last_end[stream]);
      last_end[stream] = s.end;
    }
  }
}

TEST_CASE("exec host: one rank's memory peak equals the simulator's for the same program") {
  // A single rank runs its ops one after another on both back ends (one stream of work and its
  // effects in program order), so the pools see the same sequence of allocations.
  Experiment e = tiny_3d();
  e.parallelism.tp = 1;
  e.parallelism.pp = 1;
  e.parallelism.dp = 1;
  e.training.global_batch = 2;
  e.cluster.nodes = 1;
  e.cluster.devices_per_node = 1;
  const Program program = lower(e);
  const auto measured = run_on_host(program, false);
  const auto predicted = sim::simulate(program, e.cluster);
  const auto& m = measured.timeline.ranks[0].tiers[0];
  const auto& p = predicted.ranks[0].tiers[0];
  CHECK(m.peak.count() > 0);
  CHECK(m.peak == p.peak);
  CHECK(m.breakdown == p.breakdown);
}

TEST_CASE("exec host: a planted deadlock is reported with the ops each rank waits on") {
  // Each rank receives before it sends, on streams that both wait for the receive: neither
  // send is ever reached.
  Program p(2);
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    OpInfo recv_info;
    recv_info.stream = Stream::pp_recv;
    recv_info.label = "recv activations";
    const OpId got = p.add(Recv{1 - r, Bytes(64)}, recv_info);
    OpInfo send_info;
    send_info.stream = Stream::pp_send;
    p.add(Send{1 - r, Bytes(64)}, send_info, std::span<const OpId>(&got, 1));
  }
  p.finish();
  RunOptions options;
  options.warmup_iterations = 0;
  options.iterations = 1;
  options.watchdog = std::chrono::milliseconds(200);
  const std::string message = error_of([&] { run_on_host(p, true, options); });
  CHECK(message.find("no op finished for 200 ms") != std::string::npos);
  CHECK(message.find("rank 0 op 0 (recv from rank 1") != std::string::npos);
  CHECK(message.find("waiting for rank 1's send #0") != std::string::npos);
  CHECK(message.find("waiting for its dependency rank 1 op 0") != std::string::npos);
}

TEST_CASE("exec host: a collective some members never reach names the missing ranks") {
  // Rank 0 sends to rank 2 only after the all-reduce; rank 2 joins the all-reduce only after
  // that receive: ranks 0 and 1 wait in the collective for rank 2 for ever.
  Program p(3);
  const auto g = p.add_group({0, 1, 2}, "dp 0");
  OpInfo comm;
  comm.stream = Stream::dp_comm;
  OpInfo send;
  send.stream = Stream::pp_send;
  OpInfo recv;
  recv.stream = Stream::pp_recv;
  const Collective all_reduce{CollectiveKind::all_reduce, DType::fp32, g, Bytes(64)};
  p.begin_rank(0);
  const OpId reduced = p.add(all_reduce, comm);
  p.add(Send{2, Bytes(64)}, send, std::span<const OpId>(&reduced, 1));
  p.begin_rank(1);
  p.add(all_reduce, comm);
  p.begin_rank(2);
  const OpId got = p.add(Recv{0, Bytes(64)}, recv);
  p.add(all_reduce, comm, std::span<const OpId>(&got, 1));
  p.finish();
  RunOptions options;
  options.warmup_iterations = 0;
  options.iterations = 1;
  options.watchdog = std::chrono::milliseconds(200);
  const std::string message = error_of([&] { run_on_host(p, true, options); });
  CHECK(message.find("rank 1 op 0 (all-reduce on dp 0, 64 B on dp-comm): waiting for rank(s) 2 "
                     "of 'dp 0' (collective #0 on the group)") != std::string::npos);
  CHECK(message.find("rank 2 op 0 (recv from rank 0, 64 B on pp-recv): waiting for rank 0's "
                     "send #0") != std::string::npos);
}

TEST_CASE("exec host: running out of the pool's capacity names the op and what is held") {
  const Program program = lower(tiny_3d());
  RunOptions options;
  options.warmup_iterations = 0;
  options.iterations = 1;
  const std::string message =
      error_of([&] { run_on_host(program, false, options, Bytes(1200 * 1024)); });
  CHECK(message.find("device memory: out of memory at rank") != std::string::npos);
  CHECK(message.find("of 1.172 MiB; held: parameters") != std::string::npos);
}

TEST_CASE("exec host: kernels too large for the CPU are refused before the run") {
  Experiment e = tiny_3d();
  e.model.hidden = 8192;
  e.model.ffn_hidden = 4 * 8192;
  e.model.heads = 64;
  e.model.kv_heads = 64;
  const Program program = lower(e);
  ExecPlan plan(program);
  const std::string message = error_of([&] { make_world(DeviceKind::host, plan, {}); });
  CHECK(message.find("is too large for the host device") != std::string::npos);
  CHECK(message.find("--device cuda") != std::string::npos);
}

TEST_CASE("exec: a mirrored program is refused for a real run") {
  const Program program = lower(tiny_3d(), {.mirror_data_parallel = true});
  REQUIRE(program.mirrored());
  CHECK(error_of([&] { ExecPlan plan(program); }).find("without data-parallel mirroring") !=
        std::string::npos);
}

TEST_CASE("exec: without a CUDA build or enough GPUs, --device cuda says why") {
  const Program program = lower(tiny_3d());
  ExecPlan plan(program);
  if (cuda_available() && visible_gpus() >= 8) return;  // a machine that can run it
  const std::string message = error_of([&] { make_world(DeviceKind::cuda, plan, {}); });
  if (cuda_available()) {
    CHECK(message.find("the strategy needs 8 GPUs; this machine has " +
                       std::to_string(visible_gpus())) != std::string::npos);
  } else {
    CHECK(message.find("--device host") != std::string::npos);
  }
}
