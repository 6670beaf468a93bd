// Scale (issue 19): the stratasim executable on GPT-3 175B and the 1T model at 1,024, 16,384 and
// 98,304 GPUs, with data-parallel replicas mirrored (the default), every replica simulated on the
// analytical network (--exact) and on the flow-level network over a rail-optimised fat-tree
// (every replica: replicas contend for links; "flow-sym" rows with cluster.flow_symmetry "auto",
// which mirrors replicas where the topology's symmetry makes it exact). Each run is its own
// process, timed as a user runs it (`stratasim simulate ... --quiet`); the bench prints the median
// wall time, CPU time (user + system) and peak resident memory over N runs of each row, or how the
// run ended when it did not succeed (exit 2 with the host-memory estimate when the run would not
// fit: study/footprint.hpp).
//
// Targets (issue 19, on the 2-core development machine, medians of 3):
//   exact-98304      under 30 s, under 4 GB
//   flow-16384       under 15 s, under 2 GB
//   flow-98304       under 120 s, under 8 GB
//   1t-flow-98304    completes
//   (flow-sym-ring-98304 and 1t-flow-sym-ring-98304: the same with flow symmetry and NCCL's
//   ring all-reduce forced, which the symmetry reduces)
//   mirrored-*       within 10% of the time before issue 19 (1,024 GPUs: 0.87 s wall, median of
//                    3 on 2026-11-26 before any issue-19 change landed in the simulator)
//
// Rows: GPT-3 175B is configs/experiments/gpt3-175b-a100-1024.json (tp 8, pp 16, micro batch
// 1, global batch 1,536) sized by cluster.nodes (8 GPUs each) and parallelism.dp; at 98,304 GPUs
// (dp 768) the global batch grows to 12,288 so that each pipeline keeps 16 micro-batches (85.8 M
// ops with every replica, the size of issue 19's table). The flow rows use
// configs/experiments/gpt3-175b-a100-1024-fat-tree.json (Selene's rail-optimised fat-tree,
// racks of 16 nodes) sized the same way. The 1T model is configs/models/gpt3-1t.json with
// Megatron-LM's SC21 layout (tp 8, pp 64; Narayanan et al. table 1) at dp 192 and a global batch
// of 12,288 (64 micro-batches per pipeline).
//
//   build/bench/bench_scale [--runs N] [--binary PATH] [ROW...]    (default: every row, N = 3)
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.hpp"

namespace fs = std::filesystem;

namespace {

struct Row {
  std::string name;
  std::vector<std::string> args;  // after `stratasim simulate`
};

std::vector<Row> rows() {
  const std::string root = STRATASIM_SOURCE_DIR;
  const std::string gpt3 = root + "/configs/experiments/gpt3-175b-a100-1024.json";
  const std::string fat_tree = root + "/configs/experiments/gpt3-175b-a100-1024-fat-tree.json";
  // `nodes` nodes of 8 GPUs, dp replicas; a global batch of `batch` sequences (0: the file's).
  auto sized = [](std::vector<std::string> args, int nodes, int dp, int batch = 0) {
    args.insert(args.end(), {"--set", "cluster.nodes=" + std::to_string(nodes), "--set",
                             "parallelism.dp=" + std::to_string(dp)});
    if (batch > 0)
      args.insert(args.end(), {"--set", "training.global_batch=" + std::to_string(batch)});
    return args;
  };
  std::vector<Row> out;
  struct Size {
    int gpus, dp, batch;
  };
  for (const auto& [gpus, dp, batch] :
       std::vector<Size>{{1024, 8, 0}, {16384, 128, 0}, {98304, 768, 12288}}) {
    const int nodes = gpus / 8;
    const std::string g = std::to_string(gpus);
    out.push_back({"mirrored-" + g, sized({gpt3}, nodes, dp, batch)});
    out.push_back({"exact-" + g, sized({gpt3, "--exact"}, nodes, dp, batch)});
    out.push_back({"flow-" + g, sized({fat_tree}, nodes, dp, batch)});
    // The flow network with replica symmetry (docs/network.md): replicas mirrored where exact.
    out.push_back({"flow-sym-" + g,
                   sized({fat_tree, "--set", "cluster.flow_symmetry=auto"}, nodes, dp, batch)});
  }
  const std::vector<std::string> one_t = {"--model", root + "/configs/models/gpt3-1t.json",
                                          "--set",   "parallelism.pp=64",
                                          "--set",   "training.global_batch=12288"};
  auto with_1t = [&](std::vector<std::string> args) {
    args.insert(args.begin() + 1, one_t.begin(), one_t.end());
    return args;
  };
  out.push_back({"1t-mirrored-98304", with_1t(sized({gpt3}, 12288, 192))});
  out.push_back({"1t-exact-98304", with_1t(sized({gpt3, "--exact"}, 12288, 192))});
  out.push_back({"1t-flow-98304", with_1t(sized({fat_tree}, 12288, 192))});
  // NCCL's tree all-reduce (what the NCCL model picks over many nodes) is no symmetry of the
  // replicas, so flow-sym runs at 98,304 GPUs fall back to every replica; with the ring forced
  // they reduce (docs/network.md "Symmetry").
  const std::vector<std::string> ring = {"--set", "cluster.flow_symmetry=auto", "--set",
                                         "cluster.collectives.algorithm.all_reduce=ring"};
  auto with_ring = [&](std::vector<std::string> args) {
    args.insert(args.begin() + 1, ring.begin(), ring.end());
    return args;
  };
  out.push_back({"flow-sym-ring-98304", with_ring(sized({fat_tree}, 12288, 768, 12288))});
  out.push_back({"1t-flow-sym-ring-98304", with_1t(with_ring(sized({fat_tree}, 12288, 192)))});
  return out;
}

// The first line of `path` that starts with "error:" (or its first line), for a failed run.
std::string first_error(const fs::path& path) {
  std::ifstream in(path);
  std::string line, first;
  while (std::getline(in, line)) {
    if (first.empty()) first = line;
    if (line.rfind("error:", 0) == 0) return line;
  }
  return first;
}

void measure(const Row& row, const std::string& binary, int runs, const fs::path& dir) {
  std::vector<std::string> argv = {binary, "simulate"};
  argv.insert(argv.end(), row.args.begin(), row.args.end());
  argv.push_back("--quiet");
  std::vector<double> wall, cpu, rss;
  const fs::path log = dir / (row.name + ".log");
  for (int i = 0; i < runs; ++i) {
    const auto r = stratasim::bench::run_child(argv, {}, log.string());
    if (r.exit_code != 0) {
      std::printf(
          "%-18s did not complete: %s after %.1f s wall, %.1f s CPU, peak RSS %.0f MiB\n"
          "%-18s   %s\n",
          row.name.c_str(),
          r.exit_code > 0 ? ("exit " + std::to_string(r.exit_code)).c_str()
                          : ("signal " + std::to_string(-r.exit_code)).c_str(),
          r.wall_s, r.cpu_s, r.max_rss_mib, "", first_error(log).substr(0, 400).c_str());
      return;
    }
    wall.push_back(r.wall_s);
    cpu.push_back(r.cpu_s);
    rss.push_back(r.max_rss_mib);
  }
  using stratasim::bench::median;
  std::printf("%-18s wall %8.2f s  CPU %8.2f s  peak RSS %8.0f MiB  (medians of %d)\n",
              row.name.c_str(), median(wall), median(cpu), median(rss), runs);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 3;
  std::string binary = STRATASIM_BINARY;
  std::vector<std::string> wanted;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--binary" && i + 1 < argc) {
      binary = argv[++i];
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "usage: bench_scale [--runs N] [--binary PATH] [ROW...]\n";
      return 2;
    } else {
      wanted.push_back(a);
    }
  }
  const auto all = rows();
  std::vector<Row> chosen;
  for (const auto& w : wanted) {
    bool found = false;
    for (const auto& r : all) {
      if (r.name == w) {
        chosen.push_back(r);
        found = true;
      }
    }
    if (!found) {
      std::cerr << "bench_scale: unknown row " << w << "; rows:";
      for (const auto& r : all) std::cerr << " " << r.name;
      std::cerr << "\n";
      return 2;
    }
  }
  if (wanted.empty()) chosen = all;
  const fs::path dir = fs::temp_directory_path() / ("stratasim-scale-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::printf("binary: %s\n", binary.c_str());
  for (const auto& row : chosen) measure(row, binary, runs, dir);
  fs::remove_all(dir);
  return 0;
}
