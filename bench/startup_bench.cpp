// What starting the stratasim executable costs: runs `stratasim --version` and a simulation of
// the 1,024-GPU GPT-3 demo several times, each as its own process (fork, exec, wait4), and
// prints the median (and smallest) wall time and the largest maximum resident set size
// (ru_maxrss of the child), then which shared libraries each command loaded (one more run with the
// dynamic loader's LD_DEBUG=libs written to a file: every library it initialised, dlopen'ed ones
// too), naming the GPU (CUDA, cuBLAS, NCCL), MPI and protobuf libraries among them. A bench, not a
// test: it times things. stdout and stderr of the runs are discarded.
//   bench_startup [--runs N] [--sim-runs M] [BINARY]
// BINARY defaults to the stratasim built with this bench; N (default 10) runs of --version,
// M (default 3) of the simulation.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "child_process.hpp"

namespace fs = std::filesystem;

namespace {

struct Sample {
  double wall_s = 0;
  double max_rss_mib = 0;
};

// Runs `argv` with extra environment `env` (NAME=value), its output to /dev/null; exits the
// bench when it fails.
Sample run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  const auto r = stratasim::bench::run_child(argv, env);
  if (r.exit_code != 0) {
    std::cerr << "bench_startup: " << argv[0] << " " << argv[1] << " failed ("
              << (r.exit_code > 0 ? "exit code " + std::to_string(r.exit_code) +
                                        (r.exit_code == 127 ? ": cannot execute" : "")
                                  : "signal " + std::to_string(-r.exit_code))
              << ")\n";
    std::exit(1);
  }
  return {r.wall_s, r.max_rss_mib};
}

// The libraries the dynamic loader initialised in one run of `argv` (LD_DEBUG=libs), by path.
std::set<std::string> loaded_libraries(const std::vector<std::string>& argv, const fs::path& dir) {
  const fs::path prefix = dir / "ld";
  run(argv, {"LD_DEBUG=libs", "LD_DEBUG_OUTPUT=" + prefix.string()});
  std::set<std::string> libs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("ld.", 0) != 0) continue;
    std::ifstream in(entry.path());
    std::string line;
    const std::string marker = "calling init: ";
    while (std::getline(in, line)) {
      const auto at = line.find(marker);
      if (at != std::string::npos) libs.insert(line.substr(at + marker.size()));
    }
    fs::remove(entry.path());
  }
  return libs;
}

bool is_heavy(const std::string& lib) {
  for (const char* name : {"libcuda", "libcublas", "libnccl", "libmpi", "libopen-pal",
                           "libopen-rte", "libprotobuf", "libstratasim_"}) {
    if (lib.find(name) != std::string::npos) return true;
  }
  return false;
}

void measure(const std::string& what, const std::vector<std::string>& argv, int runs,
             const fs::path& dir) {
  std::vector<double> walls;
  double rss = 0;
  for (int i = 0; i < runs; ++i) {
    const Sample s = run(argv);
    walls.push_back(s.wall_s);
    rss = std::max(rss, s.max_rss_mib);
  }
  const double median = stratasim::bench::median(walls);
  std::sort(walls.begin(), walls.end());
  const auto libs = loaded_libraries(argv, dir);
  std::vector<std::string> heavy;
  for (const auto& l : libs) {
    if (is_heavy(l)) heavy.push_back(fs::path(l).filename().string());
  }
  std::cout << std::left << std::setw(26) << what << std::right << std::fixed
            << std::setprecision(1) << " median " << std::setw(7) << median * 1e3 << " ms (min "
            << walls.front() * 1e3 << "), max RSS " << rss << " MiB (" << runs << " runs); "
            << libs.size() << " libraries loaded; GPU/MPI/protobuf/plugins: ";
  if (heavy.empty()) std::cout << "none";
  for (std::size_t i = 0; i < heavy.size(); ++i) std::cout << (i ? ", " : "") << heavy[i];
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10, sim_runs = 3;
  std::string binary = STRATASIM_BINARY;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--runs" || a == "--sim-runs") && i + 1 < argc) {
      (a == "--runs" ? runs : sim_runs) = std::max(1, std::atoi(argv[++i]));
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "usage: bench_startup [--runs N] [--sim-runs M] [BINARY]\n";
      return 2;
    } else {
      binary = a;
    }
  }
  const fs::path dir =
      fs::temp_directory_path() / ("stratasim-startup-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string demo =
      std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt3-175b-a100-1024.json";
  std::cout << "binary: " << binary << "\n";
  measure("stratasim --version", {binary, "--version"}, runs, dir);
  measure("stratasim simulate (demo)", {binary, "simulate", demo, "--quiet"}, sim_runs, dir);
  fs::remove_all(dir);
  return 0;
}
