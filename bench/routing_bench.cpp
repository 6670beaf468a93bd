// Routing speed and memory (issue 19): hw::Topology::route between device pairs on a
// rail-optimised fat-tree (8 GPUs per node, racks of 16 nodes, 2:1 oversubscribed, spines by
// default), closed form ("closed": Topology::route) against the reference per-destination BFS
// tables ("tables": Topology::route_by_tables). Each (size, method) runs in its own child
// process, so the peak resident memory printed (getrusage ru_maxrss) is its own. Prints
// figures, asserts nothing.
//
// Pairs: every source device to D destination devices spread evenly over the cluster (D = all
// devices up to 4,096; above that 1,024 unless given, since the tables for all 16,384
// destinations of a 16k-GPU fat-tree need about 5 GB).
//
//   build/bench/bench_routing                 # 4096 and 16384 devices
//   build/bench/bench_routing 16384 16384     # devices, destinations
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/topology.hpp"

using namespace stratasim;
using Clock = std::chrono::steady_clock;

namespace {

hw::Topology fat_tree(int devices) {
  hw::ClusterSpec c;
  c.name = "routing-bench";
  c.devices_per_node = 8;
  c.nodes = devices / 8;
  c.intra_node = {Bandwidth(300e9), Time::us(2)};
  c.inter_node = {Bandwidth(50e9), Time::us(5)};
  hw::TopologySpec s;
  s.kind = hw::TopologyKind::fat_tree;
  s.nodes_per_rack = 16;
  s.oversubscription = 2.0;
  c.topology = s;
  return hw::build_topology(c);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

void run(int devices, int destinations, bool closed) {
  const auto start = Clock::now();
  const hw::Topology t = fat_tree(devices);
  const double build_s = std::chrono::duration<double>(Clock::now() - start).count();
  const int step = std::max(1, devices / destinations);
  std::vector<int> out;
  std::uint64_t hops = 0, routes = 0;
  const auto routing = Clock::now();
  for (int b = 0; b < devices; b += step) {
    for (int a = 0; a < devices; ++a) {
      out.clear();
      const auto key = static_cast<std::uint64_t>(a) * 31 + static_cast<std::uint64_t>(b);
      if (closed) {
        t.route(a, b, key, out);
      } else {
        t.route_by_tables(a, b, key, out);
      }
      hops += out.size();
      ++routes;
    }
  }
  const double route_s = std::chrono::duration<double>(Clock::now() - routing).count();
  std::printf(
      "%6d devices %6s: %11llu routes (%5d destinations) in %7.2f s (%6.1f ns/route, "
      "%.2f hops/route), build %.2f s, tables kept %zu, peak RSS %7.1f MiB\n",
      devices, closed ? "closed" : "tables", static_cast<unsigned long long>(routes),
      (devices + step - 1) / step, route_s, route_s * 1e9 / static_cast<double>(routes),
      static_cast<double>(hops) / static_cast<double>(routes), build_s, t.routing_tables(),
      peak_rss_mib());
  std::fflush(stdout);
}

void in_child(int devices, int destinations, bool closed) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    run(devices, destinations, closed);
    std::_Exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("%6d devices %6s: failed (status %d)\n", devices, closed ? "closed" : "tables",
                status);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int, int>> sizes;
  if (argc >= 2) {
    const int devices = std::atoi(argv[1]);
    sizes.emplace_back(devices,
                       argc >= 3 ? std::atoi(argv[2]) : (devices <= 4096 ? devices : 1024));
  } else {
    sizes = {{4096, 4096}, {16384, 1024}};
  }
  for (const auto& [devices, destinations] : sizes) {
    in_child(devices, destinations, true);
    in_child(devices, destinations, false);
  }
  return 0;
}
