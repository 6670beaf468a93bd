// The interpreter's own cost per op on the host device: Programs whose kernels do (almost) no
// work, so that what is timed is issuing, dependency checks, stream scheduling, rendezvous and
// timing. Prints one line per scenario:
//   bench_exec [scenario...]   scenarios: compute-1, deps-1, p2p-2, all-reduce-8, tiny-3d-8
#include <chrono>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "exec/devices.hpp"
#include "exec/interpreter.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

constexpr int kOps = 20000;

// One rank, kOps compute ops of one 1-element elementwise kernel on one stream.
Program compute_only(bool with_deps) {
  Program p(1);
  const auto k = p.add_kernels({Kernel{Elementwise{1, Bytes(4), Bytes(4)}, "tiny"}});
  p.begin_rank(0);
  OpId last = 0;
  for (int i = 0; i < kOps; ++i) {
    OpInfo info;
    // With deps: alternate two streams, each op waiting for the previous one.
    info.stream = with_deps && i % 2 ? Stream::copy : Stream::compute;
    if (with_deps && i > 0) {
      last = p.add(Compute{k}, info, std::span<const OpId>(&last, 1));
    } else {
      last = p.add(Compute{k}, info);
    }
  }
  p.finish();
  return p;
}

// Two ranks exchanging kOps / 2 4-byte messages each way.
Program ping_pong() {
  Program p(2);
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    for (int i = 0; i < kOps / 4; ++i) {
      OpInfo send;
      send.stream = Stream::pp_send;
      OpInfo recv;
      recv.stream = Stream::pp_recv;
      p.add(Send{1 - r, Bytes(4)}, send);
      p.add(Recv{1 - r, Bytes(4)}, recv);
    }
  }
  p.finish();
  return p;
}

// Eight ranks, kOps / 8 all-reduces of 64 bytes each.
Program all_reduces() {
  Program p(8);
  const auto g = p.add_group({0, 1, 2, 3, 4, 5, 6, 7}, "all");
  for (int r = 0; r < 8; ++r) {
    p.begin_rank(r);
    for (int i = 0; i < kOps / 8; ++i) {
      OpInfo info;
      info.stream = Stream::dp_comm;
      p.add(Collective{CollectiveKind::all_reduce, DType::fp32, g, Bytes(64)}, info);
    }
  }
  p.finish();
  return p;
}

void measure(const std::string& name, const Program& program) {
  exec::ExecPlan plan(program);
  auto world = exec::make_world(exec::DeviceKind::host, plan, {});
  exec::RunOptions options;
  options.warmup_iterations = 1;
  options.iterations = 3;
  const auto t0 = std::chrono::steady_clock::now();
  const auto run = exec::run(plan, *world, options);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double median = run.iteration_times_s[static_cast<std::size_t>(run.median_iteration)];
  const auto ops = static_cast<double>(program.op_count());
  std::cout << std::left << std::setw(14) << name << std::right << std::setw(8)
            << program.world_size() << " ranks" << std::setw(9) << program.op_count() << " ops"
            << "   median iteration " << std::fixed << std::setprecision(2) << median * 1e3
            << " ms   " << std::setprecision(3) << median / ops * 1e6 << " us/op (all ranks), "
            << median / (ops / program.world_size()) * 1e6 << " us/op per rank   "
            << std::setprecision(2) << wall << " s in all\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> scenarios(argv + 1, argv + argc);
  if (scenarios.empty()) scenarios = {"compute-1", "deps-1", "p2p-2", "all-reduce-8", "tiny-3d-8"};
  for (const auto& s : scenarios) {
    if (s == "compute-1") {
      measure(s, compute_only(false));
    } else if (s == "deps-1") {
      measure(s, compute_only(true));
    } else if (s == "p2p-2") {
      measure(s, ping_pong());
    } else if (s == "all-reduce-8") {
      measure(s, all_reduces());
    } else if (s == "tiny-3d-8") {
      const auto e = load_experiment(std::string(STRATASIM_SOURCE_DIR) +
                                     "/configs/experiments/gpt-tiny-3d-8.json");
      measure(s, lower(e));
    } else {
      std::cerr << "unknown scenario " << s << "\n";
      return 2;
    }
  }
  return 0;
}
