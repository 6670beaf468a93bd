// Pieces every stratasim command shares: finding configs by path or catalog name, the flags
// that describe an experiment, lowering and simulating, and the errors that map to exit codes.
// Exit codes: 0 success, 2 bad input (kExitBadInput), 3 the simulation or run could not
// complete (kExitSimulationFailed), 1 anything else.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "hw_models/cluster.hpp"
#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/program.hpp"
#include "traces/report.hpp"
#include "traces/timeline.hpp"

namespace stratasim::cli {

constexpr int kExitBadInput = 2;
constexpr int kExitSimulationFailed = 3;

/// Arguments or input files the user got wrong (exit code 2).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A lowering bug, not bad input: reported with exit code 3.
struct InvalidProgram : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The shipped configs (STRATASIM_CONFIG_DIR in the environment overrides the build's).
std::filesystem::path config_dir();
/// An experiment given by path, or by name from the catalog ("gpt3-175b-a100-1024").
std::filesystem::path resolve_experiment(const std::string& given);
/// A cluster given by path, or by name from configs/hardware/clusters.
std::filesystem::path resolve_cluster(const std::string& given);

struct SimulateArgs {
  std::string experiment;
  std::vector<std::string> more_experiments;  // simulate: further jobs on one cluster
  std::string cluster;                        // the cluster the jobs share
  std::string placement = "packed";
  std::optional<int> tp, pp, dp, micro_batch, seq_len;
  std::optional<std::int64_t> global_batch;
  std::optional<std::string> schedule, partition;
  std::optional<int> virtual_stages;
  bool sequence_parallel = false;
  std::optional<int> zero, recompute_num_layers;
  std::optional<std::string> recompute, offload;
  std::optional<std::string> tp_mode, grad_compression;
  bool stop_on_oom = false;
  std::vector<std::string> sets;
  std::string out;
  std::string trace_ranks = "auto";
  bool quiet = false;
  bool exact = false;  // no data-parallel mirroring
  // Inputs users already have (strategies/foreign_inputs.hpp, docs/inputs.md): a model file (ours
  // or a Hugging Face config.json), a DeepSpeed config and Megatron-LM arguments.
  std::optional<std::string> model, deepspeed, megatron_args;
};

/// Adds the experiment positional argument and the flags that change it (--tp, --pp, --zero,
/// --set, ...) to `cmd`, writing into `args`.
void add_experiment_options(CLI::App* cmd, SimulateArgs& args);
/// Adds --model, --deepspeed and --megatron-args (part of add_experiment_options; for commands
/// with experiment flags of their own). Call it after the command's --quiet, which then
/// silences the notes too.
void add_foreign_input_options(CLI::App* cmd, SimulateArgs& args);
/// The flags of `args` as overrides of the experiment document: --model, then --deepspeed, then
/// --megatron-args, then the other flags in the order given (so that --tp beats the DeepSpeed or
/// Megatron value). The notes of --deepspeed and --megatron-args go to strategies::report_note.
std::vector<strategies::Override> overrides_of(const SimulateArgs& args);
/// A model given by path, or by name from configs/models or configs/models/hf.
std::filesystem::path resolve_model(const std::string& given);
/// Prints "note: ..." on stderr, each distinct note once per process (thread-safe).
void print_note(const std::string& note);

constexpr int kTraceAllUpTo = 256;  // ranks: above this the trace holds one rank per stage
/// The ranks timeline.json and memory.csv cover for --trace-ranks `spec`.
std::vector<std::int32_t> trace_ranks(const std::string& spec, const strategies::RankLayout& layout,
                                      bool mirrored);

/// Fails early (BadInput) when --out cannot become a folder.
void check_out_dir(const std::string& out);

/// Whether data-parallel replicas are simulated once and mirrored (analytical network,
/// homogeneous cluster, no --exact).
bool mirrors(const strategies::Experiment& experiment, bool exact);
/// Lowers (with the balanced partition when asked) and validates; InvalidProgram on failure.
strategies::Program lower_and_validate(const strategies::Experiment& experiment, bool exact);
/// Simulates on the cluster's network model; with the flow-level network also fills `links`
/// with the busiest links.
traces::Timeline run_simulation(const strategies::Program& program, const hw::ClusterSpec& cluster,
                                const sim::SimOptions& options,
                                std::vector<traces::LinkLoad>& links);
/// {0,1,2,3,8,9} -> "0-3,8-9".
std::string ranges_text(const std::vector<std::int32_t>& devices);

}  // namespace stratasim::cli
