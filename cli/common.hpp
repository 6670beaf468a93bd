// Pieces every stratasim command shares: the flags that describe an experiment and the errors
// that map to exit codes. What a command computes comes from study/ (study/study.hpp); cli/
// only parses arguments and prints.
// Exit codes: 0 success, 2 bad input (kExitBadInput), 3 the simulation or run could not
// complete (kExitSimulationFailed), 1 anything else.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "hw_models/units.hpp"
#include "strategies/experiment.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"

namespace stratasim::cli {

constexpr int kExitBadInput = 2;
constexpr int kExitSimulationFailed = 3;

/// Arguments or input files the user got wrong (exit code 2); a lowering bug (exit code 3).
using study::BadInput;
using study::config_dir;
using study::InvalidProgram;
using study::resolve_cluster;
using study::resolve_experiment;
using study::resolve_model;

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
  bool exact = false;                     // no data-parallel mirroring
  int iterations = 1;                     // simulate: iterations back to back (--iterations)
  std::optional<std::string> max_memory;  // --max-memory "4 GiB" (study::Options::max_memory)
  // Inputs users already have (strategies/foreign_inputs.hpp, docs/inputs.md): a model file (ours
  // or a Hugging Face config.json), a DeepSpeed config and Megatron-LM arguments.
  std::optional<std::string> model, deepspeed, megatron_args, fsdp;
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
/// Prints "note: ..." on stderr, each distinct note once per process (thread-safe).
void print_note(const std::string& note);

/// CLI11 check for integer flags: the value must be a whole number in [min, max]. The message
/// names what was expected and the value as given, e.g. "--gpus: expected a positive integer,
/// got 0" (CLI11's own PositiveNumber and Range print their bounds as doubles of 309 digits).
/// Use it for every integer flag with a lower bound (one rule, one place).
CLI::Validator integer_at_least(std::int64_t min,
                                std::int64_t max = std::numeric_limits<std::int32_t>::max());
/// integer_at_least(1): counts, degrees and sizes that cannot be zero.
CLI::Validator positive_integer();

/// CLI11 check for text flags whose empty value would silently mean the default: "--ranks:
/// expected device ranges like "0-7,16", got nothing".
CLI::Validator non_empty(const std::string& expected);

/// Adds --max-memory SIZE (the host memory a simulation may use; default the machine's
/// available memory; "0 B" turns the check off) to a command that runs study::simulate.
void add_max_memory_option(CLI::App* cmd, SimulateArgs& args);
/// The limit --max-memory gives (study::Options::max_memory), unset when not given.
std::optional<Bytes> max_memory_of(const SimulateArgs& args);

/// Fails early (BadInput) when --out cannot become a folder.
void check_out_dir(const std::string& out);

/// {0,1,2,3,8,9} -> "0-3,8-9".
std::string ranges_text(const std::vector<std::int32_t>& devices);

}  // namespace stratasim::cli
