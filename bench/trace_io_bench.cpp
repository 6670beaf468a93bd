// Big traces in and out (issue 19, item 5): GPT-3 175B on 1,024 A100s (tp 8, pp 16, dp 8,
// configs/experiments/gpt3-175b-a100-1024.json).
//
//   timeline-write         `stratasim simulate --trace-ranks all --out DIR`: simulate (data-
//                          parallel replicas mirrored: the 128 ranks of one replica issue ops,
//                          1.38 M of them) and write report.json, timeline.json, memory.csv
//   timeline-import        traces::import_timeline of that timeline.json (what `stratasim
//                          replay --format stratasim` reads)
//   timeline-write-exact   the same with --exact: all 1,024 ranks, 11 M ops (about 3 GB)
//   timeline-import-exact  its import
//   chakra-export          lower without mirroring (11 M ops) and write the Chakra trace
//                          (traces::write_chakra, `stratasim export --format chakra`)
//   chakra-import          traces::import_chakra of those 1,024 files (`replay --format chakra`)
//
// Each step runs in its own child process, forked from this small parent, so that its peak
// resident memory is its own; it prints its wall time, CPU time (user + system) and peak RSS.
// The steps that write report the RSS before they write (the simulation's or lowering's own)
// beside the peak. Files go to a temporary folder removed at the end, or to DIR with --keep.
//
//   build/bench/bench_trace_io [--keep DIR] [STEP...]   # default: every step, in the order above
//                                                      but the exact timeline last
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "strategies/experiment.hpp"
#include "study/study.hpp"
#include "traces/chakra.hpp"
#include "traces/timeline_import.hpp"

using namespace stratasim;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kExperiment =
    std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt3-175b-a100-1024.json";

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double peak_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is KiB
}

double mib(std::uintmax_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// Wall and CPU time of `step` and the peak RSS after it.
template <class F>
void measure(const char* what, F&& step) {
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  step();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("  %s: wall %.2f s, CPU %.2f s, peak RSS %.0f MiB\n", what, wall, cpu_seconds() - c0,
              peak_mib());
}

std::uintmax_t folder_bytes(const fs::path& dir) {
  std::uintmax_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

// The timeline's folder: run (mirrored) or run-exact.
fs::path run_dir(const fs::path& dir, bool exact) {
  return dir / (exact ? "run-exact" : "run");
}

int timeline_write(const fs::path& dir, bool exact) {
  study::Options options;
  options.exact = exact;
  options.trace_ranks = "all";
  options.max_memory = Bytes(0);  // measured here, not refused
  const auto result = study::simulate(strategies::load_experiment(kExperiment), options);
  std::printf("timeline-write%s: %zu ops%s; RSS before writing %.0f MiB\n", exact ? "-exact" : "",
              result.program.op_count(),
              exact ? ", every replica simulated" : ", replicas mirrored", peak_mib());
  const fs::path out = run_dir(dir, exact);
  measure("write report.json, timeline.json, memory.csv",
          [&] { study::write_outputs(out, result); });
  std::printf("  timeline.json %.0f MiB\n", mib(fs::file_size(out / "timeline.json")));
  return result.timeline.completed ? 0 : 1;
}

int timeline_import(const fs::path& dir, bool exact) {
  const fs::path file = run_dir(dir, exact) / "timeline.json";
  std::printf("timeline-import%s of %.0f MiB:\n", exact ? "-exact" : "", mib(fs::file_size(file)));
  std::size_t ops = 0;
  measure("import_timeline", [&] { ops = traces::import_timeline(file).trace.program.op_count(); });
  std::printf("  %zu ops\n", ops);
  return 0;
}

int chakra_export(const fs::path& dir) {
  const auto program =
      study::lower(strategies::load_experiment(kExperiment), {.mirror_data_parallel = false});
  std::printf("chakra-export: %zu ops, %d ranks; RSS before writing %.0f MiB\n", program.op_count(),
              program.world_size(), peak_mib());
  measure("write_chakra", [&] { traces::write_chakra(dir / "chakra" / "gpt3", program); });
  std::printf("  %.0f MiB in %d rank files\n", mib(folder_bytes(dir / "chakra")),
              program.world_size());
  return 0;
}

int chakra_import(const fs::path& dir) {
  std::printf("chakra-import of %.0f MiB:\n", mib(folder_bytes(dir / "chakra")));
  std::size_t ops = 0;
  measure("import_chakra", [&] { ops = traces::import_chakra(dir / "chakra").program.op_count(); });
  std::printf("  %zu ops\n", ops);
  return 0;
}

int run_step(const std::string& step, const fs::path& dir) {
  if (step == "timeline-write") return timeline_write(dir, false);
  if (step == "timeline-import") return timeline_import(dir, false);
  if (step == "timeline-write-exact") return timeline_write(dir, true);
  if (step == "timeline-import-exact") return timeline_import(dir, true);
  if (step == "chakra-export") return chakra_export(dir);
  if (step == "chakra-import") return chakra_import(dir);
  std::fprintf(stderr,
               "unknown step %s (timeline-write, timeline-import, timeline-write-exact, "
               "timeline-import-exact, chakra-export, chakra-import)\n",
               step.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> steps;
  fs::path keep;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else {
      steps.push_back(arg);
    }
  }
  if (steps.empty())
    steps = {"timeline-write", "timeline-import", "chakra-export", "chakra-import"};
  fs::path dir = keep;
  if (dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "stratasim-trace-io-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = pattern;
  }
  fs::create_directories(dir);
  int status = 0;
  for (const auto& step : steps) {
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      int rc = 1;
      try {
        rc = run_step(step, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", step.c_str(), e.what());
      }
      std::fflush(stdout);  // _exit does not flush stdio
      _exit(rc);
    }
    int child_status = 0;
    waitpid(child, &child_status, 0);
    if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) status = 1;
  }
  if (keep.empty()) fs::remove_all(dir);
  return status;
}
