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
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/accuracy_command.hpp"
#include "cli/cluster_command.hpp"
#include "cli/common.hpp"
#include "cli/exec_commands.hpp"
#include "cli/export_command.hpp"
#include "cli/fit_command.hpp"
#include "cli/replay_command.hpp"
#include "cli/sweep_commands.hpp"
#include "hw_models/cluster.hpp"
#include "hw_models/files.hpp"
#include "hw_models/topology.hpp"
#include "search/search.hpp"
#include "search/sweep.hpp"
#include "sim/collective_bench.hpp"
#include "sim/flow_network.hpp"
#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/dlrm.hpp"
#include "strategies/experiment.hpp"
#include "strategies/foreign_inputs.hpp"
#include "strategies/iterations.hpp"
#include "strategies/lowering.hpp"
#include "strategies/program.hpp"
#include "strategies/rnn.hpp"
#include "strategies/schedule.hpp"
#include "study/jobs.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "traces/bus_bandwidth.hpp"
#include "traces/context.hpp"
#include "traces/export.hpp"
#include "traces/import.hpp"
#include "traces/report.hpp"

namespace fs = std::filesystem;
using namespace stratasim;

namespace {

using namespace stratasim::cli;
// Several experiments placed on one cluster, simulated together so that they share its network;
// each gets its own report.
int simulate_jobs_command(const SimulateArgs& args) {
  if (args.cluster.empty()) {
    throw BadInput(
        "simulating several experiments together needs --cluster: the cluster they share "
        "(each experiment's own cluster says what one job asks for)");
  }
  if (!overrides_of(args).empty()) {
    throw BadInput(
        "with several experiments, flags that change an experiment (--tp, --set, ...) would "
        "apply to all of them; write them into the experiment files instead");
  }
  check_out_dir(args.out);
  const hw::ClusterSpec cluster = hw::load_cluster(resolve_cluster(args.cluster));
  std::vector<std::string> files{args.experiment};
  files.insert(files.end(), args.more_experiments.begin(), args.more_experiments.end());
  std::vector<strategies::Experiment> experiments;
  for (const auto& f : files)
    experiments.push_back(strategies::load_experiment(resolve_experiment(f)));
  const auto result =
      study::simulate_jobs(cluster, std::move(experiments), args.placement, args.stop_on_oom);
  for (std::size_t j = 0; j < result.jobs.size(); ++j) {
    const study::Result& job = result.jobs[j];
    if (!args.quiet) {
      std::cout << "job " << j + 1 << " of " << result.jobs.size() << " on cluster " << cluster.name
                << " (" << hw::name_of(cluster.network_model) << " network), devices "
                << ranges_text(result.placements[j].devices) << "\n";
      traces::print_summary(std::cout, job.report, job.context);
      std::cout << "\n";
    }
    if (!args.out.empty()) {
      const fs::path dir =
          fs::path(args.out) / ("job" + std::to_string(j + 1) + "-" + job.experiment.name);
      study::write_outputs(dir, job);
      if (!args.quiet) std::cout << "wrote " << (dir / "report.json").string() << "\n";
    }
  }
  if (!result.merged.completed && !result.merged.stopped_on_oom) {
    std::cerr << "error: the simulation did not complete: " << result.merged.problem << "\n";
    return kExitSimulationFailed;
  }
  return 0;
}

int simulate_command(const SimulateArgs& args) {
  if (!args.more_experiments.empty()) {
    if (args.iterations != 1) {
      throw BadInput("--iterations applies to one experiment; several share the cluster");
    }
    return simulate_jobs_command(args);
  }
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  check_out_dir(args.out);
  study::Options options;
  options.exact = args.exact;
  options.trace_ranks = args.trace_ranks;
  options.spans_of_traced_ranks_only = true;  // the report is computed while the run goes
  options.stop_on_oom = args.stop_on_oom;
  options.max_memory = max_memory_of(args);
  options.iterations = args.iterations;
  const study::Result r = study::simulate(
      strategies::load_experiment(resolve_experiment(args.experiment), overrides_of(args)),
      options);
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  if (!args.quiet) {
    traces::print_summary(std::cout, r.report, r.context);
    std::cout << "simulated "
              << traces::with_commas(static_cast<std::int64_t>(r.program.op_count())) << " ops ("
              << traces::with_commas(static_cast<std::int64_t>(r.timeline.events)) << " events) in "
              << std::fixed << std::setprecision(2) << elapsed << " s\n";
  }
  if (!args.out.empty()) {
    study::write_outputs(args.out, r);
    if (!args.quiet) {
      std::cout << "wrote " << (fs::path(args.out) / "report.json").string() << ", timeline.json"
                << " (open it at https://ui.perfetto.dev) and memory.csv";
      if (!r.traced_ranks.empty()) {
        std::cout << " for ranks";
        for (auto rank : r.traced_ranks) std::cout << ' ' << rank;
        std::cout << " (--trace-ranks all for every rank)";
      }
      std::cout << "\n";
    }
  }
  if (!r.finished()) {
    std::cerr << "error: the simulation did not complete: " << r.timeline.problem << "\n";
    return kExitSimulationFailed;
  }
  return 0;
}

// Peak memory per rank without timing: the schedule's order of memory effects, per rank.
int memory_command(const SimulateArgs& args) {
  study::Options options;
  options.exact = args.exact;
  const study::Result r = study::estimate_memory(
      strategies::load_experiment(resolve_experiment(args.experiment), overrides_of(args)),
      options);
  if (!args.quiet) traces::print_memory_summary(std::cout, r.report, r.context);
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
  if (e.dlrm || e.rnn) {
    throw BadInput("partition: " + e.name + " is a " + (e.rnn ? "recurrent" : "DLRM") +
                   " model, which trains without pipeline stages: there is no partition to plan");
  }
  const auto problem = study::partition_problem(e);
  const auto chosen = study::partition_layers(e);
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

// Every applicable schedule and micro-batch size of the experiment, simulated (a sweep over the
// schedule axis: search::schedule_combinations); best first.
int schedules_command(const SimulateArgs& args, const std::vector<int>& micro_batches) {
  check_out_dir(args.out);
  const search::Evaluator evaluator(resolve_experiment(args.experiment), overrides_of(args),
                                    {.exact = args.exact});
  const auto& base = evaluator.base();
  const auto combos = search::schedule_combinations(base, micro_batches);
  std::vector<search::Result> results(combos.size());
  search::run_ordered(
      0, combos.size(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
      [&](std::size_t i) {
        results[i] = evaluator.evaluate(combos[i]);
        return std::string();
      },
      [](std::size_t, std::string&&) {}, nullptr);
  std::vector<std::string> skipped;
  for (std::size_t i = 0; i < combos.size(); ++i) {
    const auto& r = results[i];
    const auto& c = combos[i];
    if (r.status == search::Status::failed) {
      throw InvalidProgram(c.schedule + " (micro batch " + std::to_string(c.micro_batch) +
                           ") did not complete: " + r.reason);
    }
    const bool first_of_schedule = i == 0 || combos[i - 1].schedule != c.schedule;
    if (r.status == search::Status::invalid && first_of_schedule) {
      skipped.push_back(c.schedule + " (micro batch " + std::to_string(c.micro_batch) +
                        "): " + r.reason);
    }
  }
  const auto order = search::fastest_first(results);
  auto microbatches = [&](const search::Combination& c) {
    return base.training.global_batch / (std::int64_t{base.parallelism.dp} * c.micro_batch);
  };
  std::ostringstream table;
  table << base.name << ": " << order.size() << " schedule and micro-batch choices, best first "
        << "(bubble: idle share of the pipeline time)\n";
  table
      << "  schedule        mb      m  iteration      bubble  fits  peak memory per stage (GiB)\n";
  for (std::size_t i : order) {
    const auto& r = results[i];
    std::ostringstream line;
    line << "  " << std::left << std::setw(14) << combos[i].schedule << std::right << std::setw(4)
         << combos[i].micro_batch << std::setw(7) << microbatches(combos[i]) << std::setw(11)
         << std::fixed << std::setprecision(1) << r.iteration_time_s * 1e3 << " ms" << std::setw(8)
         << std::setprecision(1) << r.bubble_fraction * 100 << "%  " << (r.fits ? "yes " : "no  ")
         << " ";
    for (std::size_t s = 0; s < r.stage_peak_bytes.size(); ++s) {
      line << (s ? " " : "") << gib(Bytes(r.stage_peak_bytes[s]));
    }
    table << line.str() << "\n";
  }
  for (const auto& s : skipped) table << "  not applicable: " << s << "\n";
  if (!args.quiet) std::cout << table.str();
  if (!args.out.empty()) {
    std::ostringstream csv;
    csv << "schedule,micro_batch,microbatches,iteration_time_s,bubble_fraction,fits,"
           "peak_memory_bytes_per_stage\n";
    for (std::size_t i : order) {
      const auto& r = results[i];
      csv << combos[i].schedule << ',' << combos[i].micro_batch << ',' << microbatches(combos[i])
          << ',' << std::setprecision(9) << r.iteration_time_s << ',' << r.bubble_fraction << ','
          << (r.fits ? "true" : "false") << ',';
      for (std::size_t s = 0; s < r.stage_peak_bytes.size(); ++s) {
        csv << (s ? ";" : "") << r.stage_peak_bytes[s];
      }
      csv << "\n";
    }
    fs::create_directories(args.out);
    const fs::path target = fs::path(args.out) / "schedules.csv";
    files::write_atomically(target, csv.str());
    if (!args.quiet) std::cout << "wrote " << target.string() << "\n";
  }
  return 0;
}

struct CollectiveArgs {
  std::string cluster;
  std::string op = "all_reduce";
  std::string ranks;  // "0-7"; default: every device (an empty value is rejected at the flag)
  std::vector<std::string> sizes;
  std::string algorithm;  // empty: the cluster's choice
  std::string network;    // empty: the cluster's model
  std::string out;
};

// "1M" -> 1 MiB, "2G" -> 2 GiB, "512" -> 512 bytes, "64 KiB" -> as units.hpp reads it.
Bytes size_of(const std::string& text) {
  static const std::map<char, std::int64_t> suffix = {
      {'K', 1LL << 10}, {'M', 1LL << 20}, {'G', 1LL << 30}, {'T', 1LL << 40}};
  try {
    std::size_t used = 0;
    const long long n = std::stoll(text, &used);
    if (used == text.size() && n >= 0) return Bytes(n);
    if (used + 1 == text.size() && n >= 0 && suffix.count(text.back())) {
      return Bytes(n * suffix.at(text.back()));
    }
  } catch (const std::logic_error&) {
  }
  try {
    return parse_bytes(text);
  } catch (const std::exception&) {
    throw BadInput("--sizes: expected sizes like 1M, 256M, 4G or \"64 KiB\", got \"" + text + "\"");
  }
}

// One collective alone on a cluster, size by size, printed as nccl-tests prints it.
int collective_command(const CollectiveArgs& args) {
  check_out_dir(args.out);  // before the work: an unwritable --out is bad input
  auto doc = config::Document::load(resolve_cluster(args.cluster));
  if (!args.network.empty()) {
    doc.set("network_model", args.network, "command line (--network " + args.network + ")");
  }
  const auto cluster = hw::read_cluster(doc, "");
  const std::optional<strategies::CollectiveKind> kind =
      strategies::collective_kind_from_config_name(args.op);
  if (!kind) {
    throw BadInput(
        "--op: expected all_reduce, reduce_scatter, all_gather, broadcast, reduce or "
        "all_to_all, got \"" +
        args.op + "\"");
  }
  std::vector<std::int32_t> ranks;
  if (args.ranks.empty()) {
    for (int r = 0; r < cluster.world_size(); ++r) ranks.push_back(r);
  } else {
    try {
      for (int r : hw::parse_device_ranges(args.ranks, cluster.world_size())) ranks.push_back(r);
    } catch (const std::invalid_argument& e) {
      throw BadInput("--ranks: " + std::string(e.what()) + " (cluster " + cluster.name + ")");
    }
  }
  std::vector<Bytes> sizes;
  if (args.sizes.empty()) {
    for (std::int64_t b = 1LL << 20; b <= (8LL << 30); b *= 4) sizes.emplace_back(b);
  }
  for (const auto& text : args.sizes) sizes.push_back(size_of(text));
  std::optional<hw::CollectiveAlgorithm> algorithm;
  if (!args.algorithm.empty()) {
    algorithm = hw::collective_algorithm_from_name(args.algorithm);
    if (!algorithm) {
      throw BadInput(
          "--algorithm: expected auto, ring, tree, halving_doubling, direct, "
          "hierarchical, nvls, collnet_direct, collnet_chain or pat, got \"" +
          args.algorithm + "\"");
    }
  }
  std::vector<sim::CollectiveMeasurement> rows;
  try {
    rows = sim::measure_collective(cluster, *kind, ranks, sizes, algorithm);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  std::ostringstream table;
  table << args.op << " over " << ranks.size() << " devices of " << cluster.name << " ("
        << hw::name_of(cluster.network_model) << " network, ";
  if (cluster.collectives.nccl) {
    table << "NCCL model: " << cluster.collectives.nccl->intra.name << " + "
          << cluster.collectives.nccl->network.name << ")\n";
  } else {
    table << "alpha-beta, protocol efficiency " << cluster.collectives.protocol_efficiency << ")\n";
  }
  // nccl-tests' columns (float32, sum), then what ran.
  table << "#" << std::setw(13) << "size" << std::setw(13) << "count" << std::setw(7) << "type"
        << std::setw(7) << "redop" << std::setw(12) << "time" << std::setw(9) << "algbw"
        << std::setw(9) << "busbw"
        << "  algorithm     protocol  channels\n";
  table << "#" << std::setw(13) << "(B)" << std::setw(13) << "(elements)" << std::setw(7) << ""
        << std::setw(7) << "" << std::setw(12) << "(us)" << std::setw(9) << "(GB/s)" << std::setw(9)
        << "(GB/s)"
        << "\n";
  for (const auto& row : rows) {
    std::string protocol = row.protocol ? std::string(hw::name_of(*row.protocol)) : "-";
    table << " " << std::setw(13) << row.bytes.count() << std::setw(13) << row.bytes.count() / 4
          << std::setw(7) << "float" << std::setw(7) << "sum" << std::setw(12) << std::fixed
          << std::setprecision(2) << row.time.seconds() * 1e6 << std::setw(9) << row.algbw / 1e9
          << std::setw(9) << row.busbw / 1e9 << "  " << std::left << std::setw(14)
          << hw::name_of(row.algorithm) << std::setw(10) << protocol << std::right
          << (row.protocol ? std::to_string(row.channels) : std::string("-")) << "\n";
  }
  std::cout << table.str();
  if (!args.out.empty()) {
    check_out_dir(args.out);
    std::ostringstream csv;
    csv << "op,ranks,bytes,time_s,algbw_bytes_per_s,busbw_bytes_per_s,algorithm,protocol,"
           "channels\n";
    for (const auto& row : rows) {
      csv << args.op << ',' << ranks.size() << ',' << row.bytes.count() << ','
          << std::setprecision(9) << row.time.seconds() << ',' << row.algbw << ',' << row.busbw
          << ',' << hw::name_of(row.algorithm) << ','
          << (row.protocol ? std::string(hw::name_of(*row.protocol)) : std::string()) << ','
          << (row.protocol ? std::to_string(row.channels) : std::string()) << "\n";
    }
    fs::create_directories(args.out);
    const fs::path target = fs::path(args.out) / "collective.csv";
    files::write_atomically(target, csv.str());
    std::cout << "wrote " << target.string() << "\n";
  }
  return 0;
}

// A model file's model.type ("rnn", "dlrm", ...; empty when not given and for Hugging Face
// config files, which strategies/foreign_inputs.hpp reads).
std::string model_type_of(const fs::path& f) {
  if (f.parent_path().filename() == "hf") return "";
  const auto doc = config::Document::load(f);
  const nlohmann::json* type = doc.find("type");
  return type != nullptr && type->is_string() ? type->get<std::string>() : "";
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
  if (what == "models") {  // Hugging Face config.json files ship in models/hf/
    for (const auto& entry : fs::directory_iterator(folder / "hf", ec)) {
      if (entry.path().extension() == ".json") files.push_back(entry.path());
    }
  }
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
    } else if (what == "models" && model_type_of(f) == "rnn") {
      auto doc = config::Document::load(f);
      const strategies::RnnModel m = strategies::read_rnn_model(doc, "");
      line << f.stem().string() << "  " << traces::billions(m.parameters()) << " parameters, "
           << m.layers << " layers, hidden " << m.hidden << " (" << strategies::name_of(m.cell)
           << " RNN)";
    } else if (what == "models" && model_type_of(f) == "dlrm") {
      auto doc = config::Document::load(f);
      const strategies::DlrmModel m = strategies::read_dlrm_model(doc, "");
      line << f.stem().string() << "  "
           << traces::billions(strategies::embedding_parameters(m) +
                               strategies::dense_parameters(m))
           << " parameters, DLRM: " << m.tables.size() << " embedding tables";
    } else if (what == "models") {
      std::ifstream in(f, std::ios::binary);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      std::vector<std::string> notes;
      auto m = f.parent_path().filename() == "hf"
                   ? strategies::hf_model_from_text(text, f.string(), notes)
                   : [&] {
                       auto doc = config::Document::load(f);
                       return strategies::read_model(doc, "");
                     }();
      // The name --model and --set model= take: the file's, "hf/" before it where a stratasim
      // model of that name comes first (configs/models/llama2-7b.json, hf/llama2-7b.json).
      const std::string stem = f.stem().string();
      line << (study::resolve_model(stem) == f ? stem : "hf/" + stem) << "  "
           << traces::billions(m.parameters()) << " parameters, " << m.layers << " layers, hidden "
           << m.hidden;
    } else {
      auto e = strategies::load_experiment(f);
      line << e.name << "  " << e.description;
    }
    std::cout << line.str() << "\n    " << f.string() << "\n";
  }
  return 0;
}

// Every command's arguments and its subcommand, filled by CLI11 as it parses.
struct Commands {
  SimulateArgs sim_args;
  std::vector<int> schedule_micro_batches;
  CollectiveArgs coll_args;
  cli::RealRunArgs real_args;
  cli::CalibrateArgs cal_args;
  cli::SweepArgs sweep_args;
  cli::ReplayArgs replay_args;
  cli::ExportArgs export_args;
  cli::FitArgs fit_args;
  cli::AccuracyArgs accuracy_args;
  cli::ClusterArgs cluster_args;
  cli::ClusterTraceArgs cluster_trace_args;
  std::string list_what;
  CLI::App *simulate = nullptr, *memory = nullptr, *partition = nullptr, *schedules = nullptr,
           *collective = nullptr, *run = nullptr, *validate = nullptr, *calibrate = nullptr,
           *sweep = nullptr, *search = nullptr, *replay = nullptr, *export_cmd = nullptr,
           *accuracy = nullptr, *list = nullptr, *fit = nullptr, *cluster = nullptr,
           *cluster_trace_generate = nullptr;
};

// simulate, memory, partition and schedules: one experiment, simulated.
void add_simulation_commands(CLI::App& app, Commands& c) {
  c.simulate = app.add_subcommand("simulate", "Simulate one training iteration of an experiment");
  cli::add_experiment_options(c.simulate, c.sim_args);
  c.simulate->add_option(
      "--out", c.sim_args.out,
      "Write report.json, timeline.json (Chrome trace for Perfetto) and memory.csv here");
  c.simulate->add_option("--trace-ranks", c.sim_args.trace_ranks,
                         "Ranks in timeline.json and memory.csv: all, stages (rank 0 of each "
                         "pipeline stage), or a list like 0,8,16; default all up to 256 ranks, "
                         "else stages. Only these ranks' spans are kept (the report is computed "
                         "during the run); naming a tensor-parallel rank other than 0 simulates "
                         "the tensor-parallel ranks instead of mirroring them");
  c.simulate->add_option("more", c.sim_args.more_experiments,
                         "Further experiments to run at the same time on the cluster given by "
                         "--cluster, sharing its network (each gets its own report)");
  c.simulate->add_option("--cluster", c.sim_args.cluster,
                         "With several experiments: the cluster they share (file or catalog name)");
  c.simulate->add_option("--placement", c.sim_args.placement,
                         "With several experiments: packed (one after the other), interleaved "
                         "(nodes dealt round-robin) or device ranges per job like \"0-15;16-31\"");
  cli::add_max_memory_option(c.simulate, c.sim_args);
  c.simulate
      ->add_option("--iterations", c.sim_args.iterations,
                   "Training iterations back to back (default 1): each forward waits for its "
                   "layers' updated parameters of the previous iteration; the report gives the "
                   "mean iteration, the total and each iteration's end (docs/lowering.md)")
      ->check(CLI::Range(1, strategies::kMaxIterations));
  c.simulate->add_flag(
      "--stop-on-oom", c.sim_args.stop_on_oom,
      "End the simulation at the first out-of-memory (default: finish and report)");
  c.memory = app.add_subcommand(
      "memory", "Peak memory per rank and its breakdown, without timing the iteration (fast)");
  cli::add_experiment_options(c.memory, c.sim_args);

  c.partition = app.add_subcommand(
      "partition",
      "The stage partition (even, explicit or BaPipe's balanced) with predicted stage "
      "times and memory");
  cli::add_experiment_options(c.partition, c.sim_args);
  c.schedules = app.add_subcommand(
      "schedules", "Simulate every applicable pipeline schedule and micro-batch size; best first");
  cli::add_experiment_options(c.schedules, c.sim_args);
  c.schedules
      ->add_option("--micro-batches", c.schedule_micro_batches,
                   "Micro-batch sizes to try (default 1 2 4 ... 64 that divide the batch)")
      ->delimiter(',')
      ->check(cli::positive_integer());
  c.schedules->add_option("--out", c.sim_args.out, "Write schedules.csv here");
}

// collective: one collective alone on a cluster.
void add_collective_command(CLI::App& app, Commands& c) {
  c.collective = app.add_subcommand(
      "collective",
      "Time one collective alone on a cluster's network, size by size, with algbw and busbw as "
      "nccl-tests reports them");
  c.collective->add_option("cluster", c.coll_args.cluster, "Cluster JSON file, or a catalog name")
      ->required();
  c.collective->add_option("--op", c.coll_args.op,
                           "all_reduce (default), reduce_scatter, all_gather, broadcast, reduce or "
                           "all_to_all");
  c.collective
      ->add_option("--ranks", c.coll_args.ranks, "Devices in the group, e.g. 0-7 (default all)")
      ->check(cli::non_empty("device ranges like \"0-7,16\""));
  c.collective->add_option("--sizes", c.coll_args.sizes, "Sizes, e.g. 1M,64M,1G (default 1M to 4G)")
      ->delimiter(',');
  c.collective->add_option("--algorithm", c.coll_args.algorithm,
                           "ring, tree, halving_doubling, direct, hierarchical, nvls, "
                           "collnet_direct, collnet_chain or pat (default: the cluster's rule)");
  c.collective->add_option("--network", c.coll_args.network,
                           "analytical or flow (default: the cluster's)");
  c.collective->add_option("--out", c.coll_args.out, "Write collective.csv here");
}

// run, validate and calibrate: the real back end.
void add_real_run_commands(CLI::App& app, Commands& c) {
  // Real runs (exec/): the experiment's Program on GPUs (or CPU threads with --device host).
  auto add_real_run_options = [&c](CLI::App* cmd) {
    cmd->add_option("--device", c.real_args.device,
                    "cuda (GPUs, the default) or host (CPU threads: small models, for testing)");
    cmd->add_option("--warmup", c.real_args.warmup, "Warm-up iterations (default 1)")
        ->check(cli::integer_at_least(0));
    cmd->add_option("--iterations", c.real_args.iterations,
                    "Measured iterations; the median is reported (default 5)")
        ->check(cli::positive_integer());
    cmd->add_option("--watchdog", c.real_args.watchdog_s,
                    "Seconds with no op finishing before a run is declared hung (default 60)");
    cmd->add_flag("--verify", c.real_args.verify,
                  "Host device: check every collective's sums and every transferred byte");
    cmd->add_option("--capacity", c.real_args.capacity,
                    "Device memory pool limit per rank, e.g. \"2 GiB\" (default: the GPU's "
                    "memory; 4 GiB on the host device)");
    cmd->add_option("--launch", c.real_args.launch,
                    "auto (MPI under mpirun, else one process), single (one process drives every "
                    "GPU) or mpi (one process per GPU)");
    cmd->add_option("--out", c.real_args.out, "Write the outputs here");
  };
  c.run = app.add_subcommand(
      "run", "Run the experiment's Program for real (CUDA + NCCL, or CPU threads) and report it");
  cli::add_experiment_options(c.run, c.sim_args);
  add_real_run_options(c.run);
  c.validate = app.add_subcommand(
      "validate",
      "Simulate and run the same Program; the error per op class, stage, iteration and memory");
  cli::add_experiment_options(c.validate, c.sim_args);
  add_real_run_options(c.validate);
  c.validate->add_option("--profile", c.real_args.profile,
                         "A device profile (stratasim calibrate) for the prediction instead of the "
                         "device's own");
  c.calibrate = app.add_subcommand(
      "calibrate",
      "Measure the present device(s), or fit from a PyTorch profiler trace, and write a device "
      "profile for the simulator");
  c.calibrate->add_option("--out", c.cal_args.out,
                          "The profile file to write (required unless --from-trace)");
  c.calibrate->add_option("--device", c.cal_args.device,
                          "cuda (default) or host; with --from-trace the device the trace was "
                          "recorded on (a device config file or catalog name)");
  c.calibrate->add_option("--from-trace", c.cal_args.from_trace,
                          "Fit the profile from this PyTorch profiler (Kineto) trace, recorded "
                          "with record_shapes=True, instead of measuring (docs/calibration.md)");
  c.calibrate
      ->add_option("--ranks", c.cal_args.ranks,
                   "Devices for collective bandwidth (default 1: no collectives)")
      ->check(cli::positive_integer());
  c.calibrate
      ->add_option("--repetitions", c.cal_args.repetitions,
                   "Timed repetitions per measurement (median)")
      ->check(cli::positive_integer());
  c.calibrate->add_flag("--quick", c.cal_args.quick, "Fewer shapes and sizes");
  c.calibrate->add_option("--name", c.cal_args.name,
                          "Device name written in the profile (default: the GPU's name)");
  c.calibrate->add_flag("--quiet", c.cal_args.quiet, "Print nothing on success");
  c.fit =
      app.add_subcommand("fit",
                         "Fit calibrated kernel models (GEMM, attention) of devices to published "
                         "kernel measurements (docs/gemm-efficiency.md)");
  cli::add_fit_options(c.fit, c.fit_args);
}

// sweep, search, replay, export and list.
void add_other_commands(CLI::App& app, Commands& c) {
  c.sweep = app.add_subcommand(
      "sweep",
      "Simulate every combination of a grid of strategies (--tp 1,2,4,8 --pp 1,2,4 --zero 0..3 "
      "...) in parallel, streaming a resumable CSV (docs/sweep.md)");
  cli::add_sweep_options(c.sweep, c.sweep_args);
  c.search = app.add_subcommand(
      "search",
      "The best feasible strategies for a GPU budget (--gpus N): memory pruning, top-k by an "
      "objective and the Pareto frontier of time vs memory (docs/sweep.md)");
  cli::add_search_options(c.search, c.sweep_args);

  c.replay = app.add_subcommand(
      "replay",
      "Re-simulate a trace (Chakra, Kineto or stratasim's timeline.json) on other hardware, "
      "with faster compute or at another data-parallel width");
  cli::add_replay_options(c.replay, c.replay_args);

  c.export_cmd = app.add_subcommand(
      "export", "Write the program an experiment lowers to as a Chakra execution trace");
  cli::add_export_options(c.export_cmd, c.export_args);

  c.accuracy = app.add_subcommand(
      "accuracy",
      "Predicted vs published for every case of the calibration set the project can express "
      "(end to end; GEMM and FlashAttention with --kernels), with the errors (docs/accuracy.md)");
  cli::add_accuracy_options(c.accuracy, c.accuracy_args);

  c.cluster = app.add_subcommand(
      "cluster",
      "Many jobs arriving on a shared cluster under a scheduler (fifo, srtf, tiresias, pollux, "
      "ones): JCTs, queueing, makespan, utilisation, a timeline (docs/cluster.md)");
  cli::add_cluster_options(c.cluster, c.cluster_args);
  c.cluster_trace_generate = cli::add_cluster_trace_options(
      app.add_subcommand("cluster-trace", "Job traces for `stratasim cluster` (docs/cluster.md)"),
      c.cluster_trace_args);

  c.list = app.add_subcommand("list", "List the shipped devices, clusters, models or experiments");
  c.list->add_option("what", c.list_what, "devices, clusters, models or experiments")
      ->required()
      ->check(CLI::IsMember({"devices", "clusters", "models", "experiments"}));
}

// Runs the parsed command; its exit code.
int dispatch(Commands& c) {
  if (c.simulate->parsed()) return simulate_command(c.sim_args);
  if (c.memory->parsed()) return memory_command(c.sim_args);
  if (c.partition->parsed()) return partition_command(c.sim_args);
  if (c.schedules->parsed()) return schedules_command(c.sim_args, c.schedule_micro_batches);
  if (c.list->parsed()) return list_command(c.list_what);
  if (c.collective->parsed()) return collective_command(c.coll_args);
  if (c.run->parsed() || c.validate->parsed()) {
    c.real_args.quiet = c.sim_args.quiet;
    c.real_args.out = c.real_args.out.empty() ? c.sim_args.out : c.real_args.out;
    check_out_dir(c.real_args.out);
    auto experiment = strategies::load_experiment(resolve_experiment(c.sim_args.experiment),
                                                  overrides_of(c.sim_args));
    return c.run->parsed() ? cli::run_command(experiment, c.real_args)
                           : cli::validate_command(std::move(experiment), c.real_args);
  }
  if (c.calibrate->parsed()) return cli::calibrate_command(c.cal_args);
  if (c.fit->parsed()) return cli::fit_command(c.fit_args);
  if (c.replay->parsed()) return cli::replay_command(c.replay_args);
  if (c.export_cmd->parsed()) return cli::export_command(c.export_args);
  if (c.sweep->parsed()) return cli::sweep_command(c.sweep_args);
  if (c.search->parsed()) return cli::search_command(c.sweep_args);
  if (c.accuracy->parsed()) return cli::accuracy_command(c.accuracy_args);
  if (c.cluster->parsed()) return cli::cluster_command(c.cluster_args);
  if (c.cluster_trace_generate->parsed()) {
    return cli::cluster_trace_command(c.cluster_trace_args);
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
      "  stratasim simulate gpt3-175b-a100-1024-fat-tree --out out/\n"
      "  stratasim simulate configs/jobs/gpt3-1.7b-dp16.json configs/jobs/llama2-7b-tp8-dp2.json\n"
      "      --cluster dgx-a100-32-oversubscribed --placement interleaved\n"
      "  stratasim collective dgx-h100-1-nvls --op all_reduce --algorithm ring --sizes 1G,4G\n"
      "  stratasim run gpt-tiny-3d-8 --device host --out out/run\n"
      "  stratasim validate gpt-tiny-3d-8 --device host --out out/validation\n"
      "  stratasim calibrate --device cuda --out configs/hardware/profiles/h100.json\n"
      "  stratasim calibrate --from-trace rank0.pt.trace.json --device h100-sxm5-80gb --out "
      "h.json\n"
      "  stratasim sweep gpt3-175b-a100-1024 --tp 1,2,4,8 --pp 1,2,4,8,16 --zero 0..3 --out s.csv\n"
      "  stratasim search gpt3-175b-a100-1024 --gpus 1024 --objective cost\n"
      "  stratasim accuracy --kernels\n"
      "  stratasim cluster configs/cluster/sample-trace.jsonl --cluster dgx-a100-32 --scheduler "
      "tiresias\n"
      "  stratasim list models");

  Commands c;
  add_simulation_commands(app, c);
  add_collective_command(app, c);
  add_real_run_commands(app, c);
  add_other_commands(app, c);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }
  try {
    return dispatch(c);
  } catch (const config::ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const BadInput& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const files::WriteError& e) {  // an output path that cannot be written
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const traces::TraceError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const cli::ExecSetupError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const InvalidProgram& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitSimulationFailed;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of host memory (std::bad_alloc): the simulation needs more memory "
                 "than this machine gives it. Simulate fewer ranks: drop --exact (data-parallel "
                 "replicas are mirrored), use smaller --trace-ranks, or ask `stratasim memory` "
                 "(no timing)\n";
    return kExitSimulationFailed;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
