#include "cli/cluster_command.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/common.hpp"
#include "cluster/simulator.hpp"
#include "cluster/workload.hpp"
#include "hw_models/files.hpp"
#include "hw_models/units.hpp"
#include "study/errors.hpp"

namespace stratasim::cli {

namespace {

Time time_flag(const std::string& flag, const std::string& text, bool positive) {
  Time t;
  try {
    t = parse_time(text);
  } catch (const std::exception& e) {
    throw study::BadInput(flag + ": expected a time such as \"30 s\", got \"" + text + "\" (" +
                          e.what() + ")");
  }
  if (t < Time() || (positive && t == Time())) {
    throw study::BadInput(flag + ": expected a time " + (positive ? "> 0" : ">= 0") + ", got \"" +
                          text + "\"");
  }
  return t;
}

std::string seconds(double s) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.1f", s);
  return buffer;
}

void print(const cluster::ClusterResult& r) {
  const cluster::ClusterSummary& m = r.summary;
  std::cout << "scheduler " << r.scheduler << " on " << r.total_gpus << " GPUs, restart cost "
            << seconds(r.restart_cost_s) << " s, " << m.jobs << " jobs\n"
            << "  JCT mean " << seconds(m.mean_jct_s) << " s, p50 " << seconds(m.p50_jct_s)
            << " s, p90 " << seconds(m.p90_jct_s) << " s, p99 " << seconds(m.p99_jct_s) << " s\n"
            << "  queueing mean " << seconds(m.mean_queueing_s) << " s, makespan "
            << seconds(m.makespan_s) << " s, utilisation " << seconds(m.mean_utilisation * 100)
            << "%, preemptions " << m.preemptions << "\n";
  std::cout << "  id  gpus  samples/s  arrival_s  start_s  completion_s  jct_s  preemptions\n";
  for (const cluster::JobResult& j : r.jobs) {
    std::cout << "  " << j.id << "  " << j.gpus << "  " << seconds(j.samples_per_s) << "  "
              << seconds(j.arrival_s) << "  " << seconds(j.start_s) << "  "
              << seconds(j.completion_s) << "  " << seconds(j.jct_s) << "  " << j.preemptions
              << "\n";
  }
}

}  // namespace

void add_cluster_options(CLI::App* cmd, ClusterArgs& args) {
  cmd->add_option("trace", args.trace, "job trace (JSON lines; docs/cluster.md)")->required();
  cmd->add_option("--cluster", args.cluster,
                  "cluster config or name from configs/hardware/clusters: its devices are the "
                  "GPUs")
      ->required();
  cmd->add_option("--scheduler", args.scheduler,
                  "fifo, srtf, tiresias, pollux or ones (default fifo)");
  cmd->add_option("--restart-cost", args.restart_cost,
                  "checkpoint and restart time of a preempted or resized job (default \"30 s\")");
  cmd->add_option("--tick", args.tick,
                  "seconds between periodic decisions (tiresias, pollux, ones; default \"60 s\")");
  cmd->add_option("--out", args.out, "folder for jobs.csv, summary.json and timeline.json");
  cmd->add_option("--trace-format", args.trace_format,
                  "jsonl (default), philly (cluster_job_log) or helios (cluster_log.csv); "
                  "docs/cluster.md");
  cmd->add_option("--seed", args.seed, "seed of stochastic schedulers (ones; default 0)");
  cmd->add_option("--pollux-p", args.pollux_p,
                  "pollux: the power of the generalised mean of speedups (default -1)");
  cmd->add_option("--ones-population", args.ones_population,
                  "ones: candidate schedules in the population (default 16)");
  cmd->add_option("--ones-generations", args.ones_generations,
                  "ones: generations evolved per decision (default 5)");
  cmd->add_option("--ones-resize-interval", args.ones_resize_interval,
                  "ones: the least time between two changes of a running job (default \"300 s\")");
}

CLI::App* add_cluster_trace_options(CLI::App* cmd, ClusterTraceArgs& args) {
  CLI::App* generate = cmd->add_subcommand(
      "generate",
      "A Philly- or Helios-like job trace: Poisson arrivals, the published GPU mix, "
      "lognormal run times (cluster/workload.hpp)");
  generate->add_option("--format", args.format, "philly (default), helios or jsonl");
  generate->add_option("--mix", args.mix,
                       "distributions: philly or helios (default: the format's; jsonl: philly)");
  generate->add_option("--jobs", args.jobs, "jobs (default 100)");
  generate->add_option("--gpus", args.gpus, "the cluster's GPUs (default 64)");
  generate->add_option("--load", args.load,
                       "offered GPU demand / the cluster's GPUs (default 1.0)");
  generate->add_option("--days", args.days,
                       "arrivals spread over this many days (jobs / days per day) instead of "
                       "--load");
  generate->add_option("--seed", args.seed, "seed (default 1)");
  generate->add_option("--out", args.out, "the trace file to write")->required();
  cmd->require_subcommand(1);
  return generate;
}

int cluster_trace_command(const ClusterTraceArgs& args) {
  cluster::GenerateOptions options;
  options.format = cluster::parse_trace_format(args.format, "--format");
  options.mix = !args.mix.empty()                                ? args.mix
                : options.format == cluster::TraceFormat::helios ? "helios"
                                                                 : "philly";
  options.jobs = args.jobs;
  options.gpus = args.gpus;
  options.load = args.load;
  options.days = args.days;
  options.seed = args.seed;
  const cluster::SimulatedThroughput speeds;
  std::ostringstream text;
  cluster::write_generated(text, options, speeds);
  files::write_atomically(args.out, text.str());
  std::cout << "wrote " << args.out << " (" << args.jobs << " jobs, " << args.format << ", mix "
            << options.mix << ", seed " << args.seed << ")\n";
  return 0;
}

int cluster_command(const ClusterArgs& args) {
  cluster::RunOptions options;
  options.trace = args.trace;
  options.cluster = args.cluster;
  options.scheduler = args.scheduler;
  options.trace_format = cluster::parse_trace_format(args.trace_format, "--trace-format");
  options.scheduler_options.seed = args.seed;
  options.scheduler_options.pollux_p = args.pollux_p;
  options.scheduler_options.ones_population = args.ones_population;
  options.scheduler_options.ones_generations = args.ones_generations;
  options.scheduler_options.ones_min_resize_interval_s =
      time_flag("--ones-resize-interval", args.ones_resize_interval, false).seconds();
  options.restart_cost = time_flag("--restart-cost", args.restart_cost, false);
  if (!args.tick.empty()) {
    options.scheduler_options.tick_s = time_flag("--tick", args.tick, true).seconds();
  }
  if (!args.out.empty()) check_out_dir(args.out);
  const cluster::ClusterResult result = cluster::run(options);
  print(result);
  if (!args.out.empty()) {
    cluster::write_outputs(args.out, result);
    std::cout << "wrote " << args.out << "/{jobs.csv,summary.json,timeline.json}\n";
  }
  return 0;
}

}  // namespace stratasim::cli
