// `stratasim sweep` (every combination of a grid of parallel strategies, in threads or MPI
// processes, streamed to a resumable CSV) and `stratasim search` (the best feasible strategies
// for a GPU budget, with memory pruning and the Pareto frontier). docs/sweep.md describes both.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/common.hpp"

namespace stratasim::cli {

/// Exit code of a sweep stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it).
constexpr int kExitInterrupted = 130;

struct SweepArgs {
  SimulateArgs experiment;  // the experiment and the flags that are not swept
  // Lists: "1,2,4,8", ranges "0..3", or both ("1,4..6").
  std::string tp = "1,2,4,8";
  std::string pp = "1,2,4,8,16";
  std::string dp;  // empty: what the cluster leaves
  std::string zero = "0..3";
  std::string recompute = "none,selective,full";
  std::string micro_batch = "1,2,4";
  std::string schedule;           // empty: the experiment's
  std::string sequence_parallel;  // "0,1"; empty: the experiment's
  std::vector<std::string> axes;  // --axis PATH=V1,V2 (setting axes)
  int jobs = 0;                   // 0: the hardware's threads
  std::string out;
  bool resume = false;
  // search
  int gpus = 0;
  int min_gpus = 0;  // cost: the fewest GPUs tried (0: gpus / 4)
  std::string objective = "throughput";
  int top = 10;
  std::string schedules;         // search: schedules tried; empty: the experiment's
  std::string interleave = "2";  // search: virtual stages tried with interleaved
  std::string search_sp;         // search: sequence parallelism tried; empty: the experiment's
  std::string search_cp;         // search: context-parallel degrees tried; empty: the experiment's
  bool try_fsdp = false;         // search: also PyTorch FSDP where pp is 1
};

/// Registers the experiment positional argument and the experiment flags that a sweep does not
/// take as lists (--global-batch, --seq-len, --set, --exact, ...).
void add_sweep_experiment_options(CLI::App* cmd, SweepArgs& args);
void add_sweep_options(CLI::App* cmd, SweepArgs& args);
void add_search_options(CLI::App* cmd, SweepArgs& args);

int sweep_command(const SweepArgs& args);
int search_command(const SweepArgs& args);

}  // namespace stratasim::cli
