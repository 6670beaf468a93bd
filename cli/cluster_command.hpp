// `stratasim cluster TRACE --cluster C --scheduler fifo|srtf|tiresias|pollux|ones
// [--trace-format jsonl|philly|helios] [--seed S] [--restart-cost T] [--tick T] [--out DIR]`: many
// jobs on a shared cluster (cluster/simulator.hpp composes the run; docs/cluster.md), and
// `stratasim cluster-trace generate --format philly|helios|jsonl --jobs N --gpus G --seed S
// [--mix philly|helios] [--load L] --out FILE` (cluster/workload.hpp). Parses the flags and prints
// the summary and the per-job table only.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace stratasim::cli {

struct ClusterArgs {
  std::string trace;
  std::string cluster;
  std::string scheduler = "fifo";
  std::string restart_cost = "30 s";
  std::string tick;  // empty: the policy's default
  std::string out;   // empty: print only
  std::string trace_format = "jsonl";
  std::uint64_t seed = 0;
  double pollux_p = -1.0;
  int ones_population = 16;
  int ones_generations = 5;
  std::string ones_resize_interval = "300 s";
};

struct ClusterTraceArgs {
  std::string format = "philly";
  std::string mix;  // empty: the format's (jsonl: philly)
  int jobs = 100;
  int gpus = 64;
  double load = 1.0;
  double days = 0;
  std::uint64_t seed = 1;
  std::string out;
};

/// Adds `cluster-trace generate`'s flags under `cmd` (the cluster-trace command); returns the
/// generate subcommand.
CLI::App* add_cluster_trace_options(CLI::App* cmd, ClusterTraceArgs& args);

/// Writes the generated trace to args.out and says so.
int cluster_trace_command(const ClusterTraceArgs& args);

/// Adds the cluster command's flags to `cmd`, writing into `args`.
void add_cluster_options(CLI::App* cmd, ClusterArgs& args);

/// Runs the simulation, prints the summary and writes DIR/{jobs.csv,summary.json,timeline.json}
/// with --out. Bad input (trace, cluster, flags) throws study::BadInput or config::ConfigError
/// (exit code 2).
int cluster_command(const ClusterArgs& args);

}  // namespace stratasim::cli
