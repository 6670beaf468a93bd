// The stratasim command line. Exit codes: 0 success (an out-of-memory verdict is a result, not
// a failure), 2 bad input (arguments or configs; the message names the file and JSON path),
// 3 the simulation could not complete (a deadlock or an invalid program), 1 anything else.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "hw_models/cluster.hpp"
#include "sim/memory.hpp"
#include "sim/partition.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/program.hpp"
#include "strategies/schedule.hpp"
#include "traces/context.hpp"
#include "traces/export.hpp"
#include "traces/report.hpp"

namespace fs = std::filesystem;
using namespace stratasim;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitSimulationFailed = 3;

struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

fs::path config_dir() {
  if (const char* env = std::getenv("STRATASIM_CONFIG_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return STRATASIM_CONFIG_DIR;
}

// An experiment given by path, or by name from the catalog ("gpt3-175b-a100-1024").
fs::path resolve_experiment(const std::string& given) {
  fs::path path(given);
  std::error_code ec;
  if (fs::exists(path, ec)) return path;
  if (path.parent_path().empty()) {
    fs::path catalog = config_dir() / "experiments" / (given + ".json");
    if (fs::exists(catalog, ec)) return catalog;
  }
  return path;  // loading reports "no such file" with the name given
}

struct SimulateArgs {
  std::string experiment;
  std::optional<int> tp, pp, dp, micro_batch, seq_len;
  std::optional<std::int64_t> global_batch;
  std::optional<std::string> schedule, partition;
  std::optional<int> virtual_stages;
  bool sequence_parallel = false;
  std::optional<int> zero, recompute_num_layers;
  std::optional<std::string> recompute, offload;
  bool stop_on_oom = false;
  std::vector<std::string> sets;
  std::string out;
  std::string trace_ranks = "auto";
  bool quiet = false;
  bool exact = false;  // no data-parallel mirroring
};

constexpr int kTraceAllUpTo = 256;  // ranks: above this the trace holds one rank per stage

// The ranks timeline.json and memory.csv cover: "all", "stages" (tensor- and data-parallel
// rank 0 of every pipeline stage), a comma-separated list, or "auto" (all up to 256 ranks).
// With mirroring only data-parallel replica 0 runs ops: "all" means its ranks, and a mirrored
// rank asked for by number is an error that points to --exact.
std::vector<std::int32_t> trace_ranks(const std::string& spec, const strategies::RankLayout& layout,
                                      bool mirrored) {
  const int world = layout.world_size();
  std::string mode = spec == "auto" ? (world <= kTraceAllUpTo ? "all" : "stages") : spec;
  std::vector<std::int32_t> ranks;
  if (mode == "all") {
    if (mirrored && layout.dp > 1) {
      for (int r = 0; r < world; ++r) {
        if (layout.dp_index(r) == 0) ranks.push_back(r);
      }
    }
    return ranks;
  }
  if (mode == "stages") {
    for (int s = 0; s < layout.pp; ++s) ranks.push_back(layout.rank(0, 0, s));
    return ranks;
  }
  std::stringstream list(mode);
  std::string item;
  while (std::getline(list, item, ',')) {
    int rank = -1;
    try {
      std::size_t used = 0;
      rank = std::stoi(item, &used);
      if (used != item.size()) rank = -1;
    } catch (const std::exception&) {
    }
    if (rank < 0 || rank >= world) {
      throw BadInput("--trace-ranks expects all, stages or ranks from 0 to " +
                     std::to_string(world - 1) + " separated by commas, got \"" + item + "\"");
    }
    if (mirrored && layout.dp_index(rank) != 0) {
      throw BadInput("--trace-ranks: rank " + std::to_string(rank) + " mirrors rank " +
                     std::to_string(layout.rank(layout.tp_index(rank), 0, layout.stage(rank))) +
                     " (data-parallel replicas are simulated once); add --exact to trace it");
    }
    ranks.push_back(rank);
  }
  return ranks;
}

std::vector<strategies::Override> overrides_of(const SimulateArgs& a) {
  std::vector<strategies::Override> o;
  auto flag = [&](const char* name, const char* path, nlohmann::json value) {
    o.push_back({path, value, "command line (" + std::string(name) + " " + value.dump() + ")"});
  };
  if (a.tp) flag("--tp", "parallelism.tp", *a.tp);
  if (a.pp) flag("--pp", "parallelism.pp", *a.pp);
  if (a.dp) {
    flag("--dp", "parallelism.dp", *a.dp);
  } else if (a.tp || a.pp) {
    // A new tp or pp with no --dp: derive dp from the cluster again.
    o.push_back({"parallelism.dp", nullptr, "command line (--tp/--pp without --dp)"});
  }
  if (a.micro_batch) flag("--micro-batch", "parallelism.micro_batch", *a.micro_batch);
  if (a.global_batch) flag("--global-batch", "training.global_batch", *a.global_batch);
  if (a.seq_len) flag("--seq-len", "training.seq_len", *a.seq_len);
  if (a.schedule) flag("--schedule", "parallelism.schedule", *a.schedule);
  if (a.virtual_stages) flag("--virtual-stages", "parallelism.virtual_stages", *a.virtual_stages);
  if (a.partition) {  // "balanced", "even" or "9,8,8,7"
    nlohmann::json value = *a.partition;
    if (a.partition->find(',') != std::string::npos ||
        a.partition->find_first_not_of("0123456789") == std::string::npos) {
      value = nlohmann::json::array();
      std::stringstream items(*a.partition);
      std::string item;
      while (std::getline(items, item, ',')) value.push_back(config::parse_override_value(item));
    }
    o.push_back(
        {"parallelism.partition", value, "command line (--partition " + *a.partition + ")"});
  }
  if (a.sequence_parallel) flag("--sequence-parallel", "parallelism.sequence_parallel", true);
  if (a.zero) flag("--zero", "parallelism.zero", *a.zero);
  if (a.recompute) flag("--recompute", "parallelism.recompute", *a.recompute);
  if (a.recompute_num_layers) {
    flag("--recompute-num-layers", "parallelism.recompute_num_layers", *a.recompute_num_layers);
  }
  if (a.offload) {  // "optimizer,params" -> ["optimizer", "params"]
    nlohmann::json list = nlohmann::json::array();
    std::stringstream items(*a.offload);
    std::string item;
    while (std::getline(items, item, ',')) list.push_back(item);
    o.push_back({"parallelism.offload", list, "command line (--offload " + *a.offload + ")"});
  }
  for (const auto& s : a.sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw BadInput("--set expects dotted.key=value, got \"" + s + "\"");
    }
    std::string key = s.substr(0, eq);
    o.push_back(
        {key, config::parse_override_value(s.substr(eq + 1)), "command line (--set " + s + ")"});
  }
  return o;
}

// Fails early (before any work) when --out cannot become a folder: it, or its nearest existing
// ancestor, is not a directory. Missing folders are created when the outputs are written.
void check_out_dir(const std::string& out) {
  if (out.empty()) return;
  std::error_code ec;
  fs::path dir = fs::absolute(fs::path(out), ec).lexically_normal();
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw BadInput("--out " + out + ": exists and is not a directory");
  }
  for (fs::path p = dir.parent_path(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec)) {
        throw BadInput("--out " + out + ": " + p.string() + " is not a directory");
      }
      break;
    }
    if (p == p.parent_path()) break;
  }
}

// A lowering bug, not bad input: reported with exit code 3.
struct InvalidProgram : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Data-parallel replicas behave alike on the analytical network (no contention), so by default
// one replica is simulated and mirrored; --exact simulates every rank (the same results).
strategies::Program lower_and_validate(const strategies::Experiment& experiment, bool exact) {
  auto program = sim::lower_partitioned(experiment, {.mirror_data_parallel = !exact});
  try {
    strategies::validate(program);
  } catch (const strategies::ProgramError& e) {
    throw InvalidProgram(std::string("the lowered program is invalid: ") + e.what());
  }
  return program;
}

sim::MemoryOverheads overheads_of(const strategies::Experiment& e) {
  return sim::MemoryOverheads{e.memory.fragmentation, e.memory.reserved};
}

int simulate_command(const SimulateArgs& args) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  check_out_dir(args.out);
  const auto experiment =
      strategies::load_experiment(resolve_experiment(args.experiment), overrides_of(args));
  const auto layout = strategies::layout_of(experiment);
  traces::ExportOptions export_options;
  export_options.ranks = trace_ranks(args.trace_ranks, layout, !args.exact);
  const auto program = lower_and_validate(experiment, args.exact);
  sim::SimOptions options;
  options.overheads = overheads_of(experiment);
  options.stop_on_oom = args.stop_on_oom;
  options.memory_sample_ranks = export_options.ranks;  // memory.csv covers these ranks only
  const auto timeline = sim::simulate(program, experiment.cluster, options);

  const auto context = traces::report_context(experiment);
  const auto report = traces::make_report(program, timeline, context);
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  if (!args.quiet) {
    traces::print_summary(std::cout, report, context);
    std::cout << "simulated " << traces::with_commas(static_cast<std::int64_t>(program.op_count()))
              << " ops (" << traces::with_commas(static_cast<std::int64_t>(timeline.events))
              << " events) in " << std::fixed << std::setprecision(2) << elapsed << " s\n";
  }
  if (!args.out.empty()) {
    traces::write_outputs(args.out, program, timeline, report, context, export_options);
    if (!args.quiet) {
      std::cout << "wrote " << (fs::path(args.out) / "report.json").string() << ", timeline.json"
                << " (open it at https://ui.perfetto.dev) and memory.csv";
      if (!export_options.ranks.empty()) {
        std::cout << " for ranks";
        for (auto r : export_options.ranks) std::cout << ' ' << r;
        std::cout << " (--trace-ranks all for every rank)";
      }
      std::cout << "\n";
    }
  }
  if (!timeline.completed && !timeline.stopped_on_oom) {
    std::cerr << "error: the simulation did not complete: " << timeline.problem << "\n";
    return kExitSimulationFailed;
  }
  return 0;
}

// Peak memory per rank without timing: the schedule's order of memory effects, per rank.
int memory_command(const SimulateArgs& args) {
  const auto experiment =
      strategies::load_experiment(resolve_experiment(args.experiment), overrides_of(args));
  const auto program = lower_and_validate(experiment, args.exact);
  const auto timeline = sim::estimate_memory(program, experiment.cluster, overheads_of(experiment));
  const auto context = traces::report_context(experiment);
  const auto report = traces::make_report(program, timeline, context);
  if (!args.quiet) traces::print_memory_summary(std::cout, report, context);
  return 0;
}

std::string gib(Bytes b) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(b.count()) / (1LL << 30);
  return out.str();
}

// The stage partition the experiment asks for, with the partitioner's predicted stage times;
// the even and the balanced (BaPipe) splits beside it for comparison.
int partition_command(const SimulateArgs& args) {
  const auto e =
      strategies::load_experiment(resolve_experiment(args.experiment), overrides_of(args));
  const auto problem = sim::partition_problem(e);
  const auto chosen = sim::partition_layers(e);
  const auto plan = strategies::evaluate_partition(problem, chosen);
  const auto& par = e.parallelism;
  std::cout << e.name << ": " << e.model.name << ", " << e.model.layers << " layers into "
            << problem.parts << " parts on " << par.pp << " pipeline stages ("
            << strategies::name_of(par.schedule) << ", partition "
            << (par.partition.kind == strategies::PartitionKind::balanced ? "balanced"
                : par.partition.kind == strategies::PartitionKind::even   ? "even"
                                                                          : "explicit")
            << "), micro batch " << par.micro_batch << "\n";
  std::cout << "  part  device  layers        time/microbatch  memory / capacity (GiB)\n";
  int begin = 0;
  for (std::size_t k = 0; k < chosen.size(); ++k) {
    const int end = begin + chosen[k];
    std::ostringstream row;
    row << "  " << std::setw(4) << k << "  " << std::setw(6)
        << strategies::part_device(par.schedule, static_cast<int>(k), par.pp) << "  "
        << std::setw(12) << (std::to_string(begin) + "-" + std::to_string(end - 1)) << "  "
        << std::setw(15) << to_string(plan.part_time[k]) << "  " << gib(plan.part_memory[k])
        << " / " << gib(problem.capacity.empty() ? Bytes(0) : problem.capacity[k]);
    std::cout << row.str() << "\n";
    begin = end;
  }
  std::cout << "  bottleneck " << to_string(plan.bottleneck) << " per microbatch\n";
  const auto even = strategies::evaluate_partition(
      problem, strategies::even_partition(e.model.layers, problem.parts));
  std::cout << "  even split:     bottleneck " << to_string(even.bottleneck) << "\n";
  try {
    const auto balanced = strategies::balanced_partition(problem);
    std::cout << "  balanced split: bottleneck " << to_string(balanced.bottleneck) << ", layers";
    for (int n : balanced.layers_per_part) std::cout << ' ' << n;
    std::cout << "  (--partition balanced, or --partition ";
    for (std::size_t k = 0; k < balanced.layers_per_part.size(); ++k) {
      std::cout << (k ? "," : "") << balanced.layers_per_part[k];
    }
    std::cout << ")\n";
  } catch (const std::invalid_argument& error) {
    std::cout << "  balanced split: " << error.what() << "\n";
  }
  return 0;
}

struct ScheduleRow {
  std::string schedule;
  int micro_batch = 0;
  std::int64_t microbatches = 0;
  double iteration_s = 0, bubble = 0;
  bool fits = true;
  std::vector<Bytes> stage_peaks;
};

// Every applicable schedule and micro-batch size of the experiment, simulated; best first.
int schedules_command(const SimulateArgs& args, const std::vector<int>& micro_batches_given) {
  check_out_dir(args.out);
  const auto base =
      strategies::load_experiment(resolve_experiment(args.experiment), overrides_of(args));
  std::vector<int> micro_batches = micro_batches_given;
  if (micro_batches.empty()) {
    for (int mb = 1; mb <= 64; mb *= 2) micro_batches.push_back(mb);
  }
  std::vector<ScheduleRow> rows;
  std::vector<std::string> skipped;
  for (strategies::ScheduleKind kind : strategies::kAllSchedules) {
    const std::string name(strategies::name_of(kind));
    for (int mb : micro_batches) {
      if (base.training.global_batch % (std::int64_t{base.parallelism.dp} * mb) != 0) continue;
      SimulateArgs a = args;
      a.schedule = name;
      a.micro_batch = mb;
      if (kind == strategies::ScheduleKind::interleaved && !a.virtual_stages) a.virtual_stages = 2;
      if (kind != strategies::ScheduleKind::interleaved) a.virtual_stages = 1;
      auto overrides = overrides_of(a);
      if (kind == strategies::ScheduleKind::terapipe) {
        overrides.push_back({"parallelism.sequence_slices", 4, "schedules (terapipe: 4 slices)"});
      } else {
        overrides.push_back({"parallelism.sequence_slices", 1, "schedules"});
      }
      std::optional<strategies::Experiment> e;
      try {
        e = strategies::load_experiment(resolve_experiment(args.experiment), overrides);
      } catch (const config::ConfigError& error) {
        if (mb == micro_batches.front() || micro_batches.size() == 1) {
          skipped.push_back(name + " (micro batch " + std::to_string(mb) + "): " + error.what());
        }
        continue;
      }
      const auto program = lower_and_validate(*e, false);
      sim::SimOptions options;
      options.overheads = overheads_of(*e);
      options.memory_sample_ranks = {};
      const auto timeline = sim::simulate(program, e->cluster, options);
      if (!timeline.completed) {
        throw InvalidProgram(name + " (micro batch " + std::to_string(mb) +
                             ") did not complete: " + timeline.problem);
      }
      const auto context = traces::report_context(*e);
      const auto report = traces::make_report(program, timeline, context);
      ScheduleRow row{name,
                      mb,
                      e->microbatches(),
                      report.iteration_time_s,
                      report.bubble_fraction,
                      report.fits,
                      std::vector<Bytes>(static_cast<std::size_t>(e->parallelism.pp))};
      for (const auto& rank : report.ranks) {
        auto& peak = row.stage_peaks[static_cast<std::size_t>(rank.stage)];
        peak = std::max(peak, rank.peak_memory);
      }
      rows.push_back(std::move(row));
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const ScheduleRow& a, const ScheduleRow& b) {
    if (a.fits != b.fits) return a.fits;
    return a.iteration_s < b.iteration_s;
  });
  std::ostringstream table;
  table << base.name << ": " << rows.size() << " schedule and micro-batch choices, best first "
        << "(bubble: idle share of the pipeline time)\n";
  table
      << "  schedule        mb      m  iteration      bubble  fits  peak memory per stage (GiB)\n";
  for (const auto& r : rows) {
    std::ostringstream line;
    line << "  " << std::left << std::setw(14) << r.schedule << std::right << std::setw(4)
         << r.micro_batch << std::setw(7) << r.microbatches << std::setw(11) << std::fixed
         << std::setprecision(1) << r.iteration_s * 1e3 << " ms" << std::setw(8)
         << std::setprecision(1) << r.bubble * 100 << "%  " << (r.fits ? "yes " : "no  ") << " ";
    for (std::size_t s = 0; s < r.stage_peaks.size(); ++s) {
      line << (s ? " " : "") << gib(r.stage_peaks[s]);
    }
    table << line.str() << "\n";
  }
  for (const auto& s : skipped) table << "  not applicable: " << s << "\n";
  if (!args.quiet) std::cout << table.str();
  if (!args.out.empty()) {
    std::ostringstream csv;
    csv << "schedule,micro_batch,microbatches,iteration_time_s,bubble_fraction,fits,"
           "peak_memory_bytes_per_stage\n";
    for (const auto& r : rows) {
      csv << r.schedule << ',' << r.micro_batch << ',' << r.microbatches << ','
          << std::setprecision(9) << r.iteration_s << ',' << r.bubble << ','
          << (r.fits ? "true" : "false") << ',';
      for (std::size_t s = 0; s < r.stage_peaks.size(); ++s) {
        csv << (s ? ";" : "") << r.stage_peaks[s].count();
      }
      csv << "\n";
    }
    fs::create_directories(args.out);
    const fs::path target = fs::path(args.out) / "schedules.csv";
    const fs::path partial = fs::path(args.out) / ".schedules.csv.partial";
    {
      std::ofstream file(partial);
      file << csv.str();
      if (!file) throw BadInput("cannot write " + partial.string());
    }
    fs::rename(partial, target);
    if (!args.quiet) std::cout << "wrote " << target.string() << "\n";
  }
  return 0;
}

int list_command(const std::string& what) {
  const std::map<std::string, fs::path> folders = {
      {"devices", config_dir() / "hardware" / "devices"},
      {"clusters", config_dir() / "hardware" / "clusters"},
      {"models", config_dir() / "models"},
      {"experiments", config_dir() / "experiments"}};
  const fs::path folder = folders.at(what);
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  if (ec) throw BadInput("cannot list " + folder.string() + ": " + ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ostringstream line;
    if (what == "devices") {
      auto d = hw::load_device(f);
      line << d.name << "  " << to_string(d.peak(DType::bf16)) << " bf16, "
           << to_string(d.memory_capacity) << " at " << to_string(d.memory_bandwidth);
    } else if (what == "clusters") {
      auto c = hw::load_cluster(f);
      line << c.name << "  " << c.nodes << " x " << c.devices_per_node << " " << c.device.name
           << ", " << to_string(c.intra_node.bandwidth) << " in node, "
           << to_string(c.inter_node.bandwidth) << " between nodes";
    } else if (what == "models") {
      auto doc = config::Document::load(f);
      auto m = strategies::read_model(doc, "");
      line << m.name << "  " << traces::billions(m.parameters()) << " parameters, " << m.layers
           << " layers, hidden " << m.hidden;
    } else {
      auto e = strategies::load_experiment(f);
      line << e.name << "  " << e.description;
    }
    std::cout << line.str() << "\n    " << f.string() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "stratasim: simulate distributed deep-learning training before reserving the cluster.\n"
      "It predicts iteration time, throughput, MFU, pipeline bubble and per-device memory\n"
      "for data, tensor and pipeline parallelism on GPU clusters.",
      "stratasim"};
  app.set_version_flag("--version", std::string("stratasim ") + STRATASIM_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  stratasim simulate configs/experiments/gpt3-175b-a100-1024.json\n"
      "  stratasim simulate gpt3-175b-a100-1024 --tp 4 --pp 32 --out out/\n"
      "  stratasim simulate gpt3-175b-a100-1024 --set cluster.inter_node.bandwidth=\"400 Gb/s\"\n"
      "  stratasim simulate gpt3-175b-a100-1024 --zero 1 --recompute selective\n"
      "  stratasim memory llama2-7b-h100-8 --zero 3 --micro-batch 4\n"
      "  stratasim schedules gpt3-1.7b-a100-8 --tp 2 --pp 4 --dp 1\n"
      "  stratasim partition gpt3-1.7b-a100-8 --pp 4 --partition balanced\n"
      "  stratasim list models");

  SimulateArgs sim_args;
  // The options that describe the experiment, shared by simulate and memory.
  auto add_experiment_options = [&sim_args](CLI::App* cmd) {
    cmd->add_option("experiment", sim_args.experiment,
                    "Experiment JSON file, or the name of one in configs/experiments")
        ->required();
    cmd->add_option("--tp", sim_args.tp, "Tensor-parallel degree")->check(CLI::PositiveNumber);
    cmd->add_option("--pp", sim_args.pp, "Pipeline stages")->check(CLI::PositiveNumber);
    cmd->add_option("--dp", sim_args.dp, "Data-parallel degree (default: the remaining devices)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--micro-batch", sim_args.micro_batch, "Samples per microbatch")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--global-batch", sim_args.global_batch, "Samples per iteration")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--seq-len", sim_args.seq_len, "Tokens per sample")->check(CLI::PositiveNumber);
    cmd->add_option("--schedule", sim_args.schedule,
                    "Pipeline schedule: gpipe, 1f1b, interleaved, pipedream-2bw, merak-scp, zb-h1, "
                    "zb-h2, zb-v, chimera or terapipe (docs/schedules.md)");
    cmd->add_option("--virtual-stages", sim_args.virtual_stages,
                    "Model chunks per device with the interleaved schedule")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--partition", sim_args.partition,
                    "Layers per stage: even, balanced (BaPipe) or a list like 9,8,8,7");
    cmd->add_flag("--sequence-parallel", sim_args.sequence_parallel,
                  "Megatron sequence parallelism");
    cmd->add_option("--zero", sim_args.zero, "ZeRO stage 0-3 (DeepSpeed)");
    cmd->add_option("--recompute", sim_args.recompute,
                    "Activation recomputation: none, full, selective or stage_aware");
    cmd->add_option("--recompute-num-layers", sim_args.recompute_num_layers,
                    "Layers per checkpoint (uniform) or recomputed per stage (block)");
    cmd->add_option("--offload", sim_args.offload,
                    "Offload to the host: optimizer, params, nvme, activations (comma-separated)");
    cmd->add_option("--set", sim_args.sets,
                    "Override any config value: dotted.key=value (repeatable), e.g. "
                    "training.seq_len=4096 or cluster.inter_node.bandwidth=\"400 Gb/s\"");
    cmd->add_flag("--quiet", sim_args.quiet, "Print nothing on success");
    cmd->add_flag("--exact", sim_args.exact,
                  "Simulate every data-parallel replica instead of one mirrored for all (the "
                  "report is the same; slower; traces then cover every rank)");
  };
  auto* simulate =
      app.add_subcommand("simulate", "Simulate one training iteration of an experiment");
  add_experiment_options(simulate);
  simulate->add_option(
      "--out", sim_args.out,
      "Write report.json, timeline.json (Chrome trace for Perfetto) and memory.csv here");
  simulate->add_option("--trace-ranks", sim_args.trace_ranks,
                       "Ranks in timeline.json and memory.csv: all, stages (rank 0 of each "
                       "pipeline stage), or a list like 0,8,16; default all up to 256 ranks, "
                       "else stages");
  simulate->add_flag("--stop-on-oom", sim_args.stop_on_oom,
                     "End the simulation at the first out-of-memory (default: finish and report)");
  auto* memory = app.add_subcommand(
      "memory", "Peak memory per rank and its breakdown, without timing the iteration (fast)");
  add_experiment_options(memory);

  auto* partition = app.add_subcommand(
      "partition",
      "The stage partition (even, explicit or BaPipe's balanced) with predicted stage "
      "times and memory");
  add_experiment_options(partition);
  auto* schedules = app.add_subcommand(
      "schedules", "Simulate every applicable pipeline schedule and micro-batch size; best first");
  add_experiment_options(schedules);
  std::vector<int> schedule_micro_batches;
  schedules
      ->add_option("--micro-batches", schedule_micro_batches,
                   "Micro-batch sizes to try (default 1 2 4 ... 64 that divide the batch)")
      ->delimiter(',');
  schedules->add_option("--out", sim_args.out, "Write schedules.csv here");

  std::string list_what;
  auto* list =
      app.add_subcommand("list", "List the shipped devices, clusters, models or experiments");
  list->add_option("what", list_what, "devices, clusters, models or experiments")
      ->required()
      ->check(CLI::IsMember({"devices", "clusters", "models", "experiments"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }
  try {
    if (simulate->parsed()) return simulate_command(sim_args);
    if (memory->parsed()) return memory_command(sim_args);
    if (partition->parsed()) return partition_command(sim_args);
    if (schedules->parsed()) return schedules_command(sim_args, schedule_micro_batches);
    if (list->parsed()) return list_command(list_what);
  } catch (const config::ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const BadInput& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const InvalidProgram& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitSimulationFailed;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
