// `stratasim cluster TRACE --cluster C --scheduler fifo|srtf|tiresias [--restart-cost T]
// [--tick T] [--out DIR]`: many jobs on a shared cluster (cluster/simulator.hpp composes the run;
// docs/cluster.md). Parses the flags and prints the summary and the per-job table only.
#pragma once

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
};

/// Adds the cluster command's flags to `cmd`, writing into `args`.
void add_cluster_options(CLI::App* cmd, ClusterArgs& args);

/// Runs the simulation, prints the summary and writes DIR/{jobs.csv,summary.json,timeline.json}
/// with --out. Bad input (trace, cluster, flags) throws study::BadInput or config::ConfigError
/// (exit code 2).
int cluster_command(const ClusterArgs& args);

}  // namespace stratasim::cli
