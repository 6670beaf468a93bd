// `stratasim sweep` and `stratasim search` (see sweep_commands.hpp and docs/sweep.md).
#include "cli/sweep_commands.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "hw_models/files.hpp"
#include "search/distributed.hpp"
#include "search/search.hpp"
#include "search/sweep.hpp"
#include "traces/context.hpp"

namespace stratasim::cli {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Set by SIGINT and SIGTERM: workers take no further combinations, the finished prefix is
// kept. A lock-free atomic is safe to store from a signal handler.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

// Installs the handlers for the lifetime of a sweep and restores the old ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop = false;
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*old_int_)(int) = nullptr;
  void (*old_term_)(int) = nullptr;
};

std::string seconds_text(double s) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(s < 10 ? 1 : 0) << s << " s";
  return out.str();
}

// Progress on stderr: on a terminal a bar redrawn in place (percent, configurations per
// second, ETA) at most 10 times a second; otherwise a plain line at every 10%.
class Progress {
 public:
  Progress(std::string label, std::size_t total, std::size_t already, bool enabled)
      : label_(std::move(label)),
        total_(total),
        already_(already),
        done_(already),
        enabled_(enabled && total > already),
        tty_(isatty(STDERR_FILENO) == 1),
        start_(Clock::now()),
        next_percent_(10) {}

  void tick() {
    const std::size_t done = ++done_;
    if (!enabled_) return;
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() && done != total_) return;  // someone is drawing; the next tick will
    if (!lock.owns_lock()) lock.lock();
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(done - already_) / elapsed : 0;
    const double left = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
    const int percent = static_cast<int>(100.0 * static_cast<double>(done) /
                                         static_cast<double>(std::max<std::size_t>(total_, 1)));
    std::ostringstream line;
    if (tty_) {
      if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      constexpr int kWidth = 30;
      const int filled = percent * kWidth / 100;
      line << "\r[" << std::string(static_cast<std::size_t>(filled), '#')
           << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << std::setw(3)
           << percent << "%  " << done << "/" << total_ << "  " << std::fixed
           << std::setprecision(1) << rate << " configurations/s  ETA " << seconds_text(left)
           << "   ";
      if (done == total_) line << "\n";
    } else {
      if (percent < next_percent_ && done != total_) return;
      while (next_percent_ <= percent) next_percent_ += 10;
      line << label_ << ": " << percent << "% (" << done << " of " << total_ << "), " << std::fixed
           << std::setprecision(1) << rate << " configurations/s, ETA " << seconds_text(left)
           << "\n";
    }
    std::cerr << line.str() << std::flush;
  }

  // Ends a bar left mid-line (an interrupted sweep).
  void finish() {
    std::lock_guard lock(mutex_);
    if (enabled_ && tty_ && done_.load() != total_) std::cerr << "\n";
  }

 private:
  std::string label_;
  std::size_t total_, already_;
  std::atomic<std::size_t> done_;
  bool enabled_, tty_;
  Clock::time_point start_;
  Clock::time_point last_draw_{};
  int next_percent_;
  std::mutex mutex_;
};

int jobs_of(int jobs) {
  if (jobs > 0) return jobs;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// A parse of the search library; its std::invalid_argument (naming the flag) is bad input.
template <class Parse>
auto parsed(Parse&& parse) {
  try {
    return parse();
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
}

search::Grid grid_of(const SweepArgs& a, const strategies::Experiment& base) {
  return parsed([&] {
    return search::parse_grid(
        search::for_experiment({a.tp, a.pp, a.dp, a.zero, a.recompute, a.micro_batch, a.schedule,
                                a.sequence_parallel, a.axes},
                               base));
  });
}

std::string describe(const search::Combination& c, const std::string& dp) {
  std::ostringstream out;
  out << "tp " << c.tp << " pp " << c.pp;
  if (!dp.empty()) out << " dp " << dp;
  out << " zero " << c.zero << " recompute " << c.recompute << " micro batch " << c.micro_batch;
  if (!c.schedule.empty()) out << " " << c.schedule;
  if (c.sequence_parallel >= 0) out << (c.sequence_parallel ? " sp" : " no-sp");
  for (const auto& [path, value] : c.settings) out << " " << path << "=" << value;
  return out.str();
}

std::string with_commas(double v) {
  return traces::with_commas(static_cast<std::int64_t>(v));
}

std::string gib(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << bytes / (1LL << 30);
  return out.str();
}

// The sweep's summary, from the whole CSV (rows resumed or gathered from other processes
// included): counts, the best configuration that fits, the invalid combinations.
void print_sweep_summary(const fs::path& csv, const std::vector<search::Combination>& combos,
                         const std::string& name) {
  const auto summary = search::summarize_sweep(csv);
  const auto& rows = summary.rows;
  const std::size_t reason = search::column("reason"), tokens = search::column("tokens_per_s"),
                    samples = search::column("samples_per_s"),
                    iteration = search::column("iteration_time_s"), mfu = search::column("mfu"),
                    peak = search::column("peak_memory_bytes"), dp = search::column("dp");
  const auto& best = summary.best;
  const auto& invalid = summary.invalid_rows;
  std::ostringstream out;
  out << "sweep of " << name << ": " << rows.size() << " of " << combos.size() << " combinations; "
      << summary.ok << " fit, " << summary.oom << " out of memory, " << summary.invalid
      << " invalid, " << summary.failed << " failed\n";
  if (best) {
    const auto& f = rows[*best];
    const bool tokens_known = std::stod(f[tokens]) > 0;
    out << "best that fits (" << (tokens_known ? "tokens/s" : "samples/s")
        << "): " << describe(combos[*best], f[dp]) << ": " << std::setprecision(4)
        << std::stod(f[iteration]) << " s per iteration, "
        << with_commas(std::stod(f[tokens_known ? tokens : samples]))
        << (tokens_known ? " tokens/s" : " samples/s") << ", MFU " << std::fixed
        << std::setprecision(1) << 100 * std::stod(f[mfu]) << "%, peak " << gib(std::stod(f[peak]))
        << " GiB\n";
  } else {
    out << "no combination fits in memory\n";
  }
  constexpr std::size_t kListed = 12;
  if (!invalid.empty()) {
    out << invalid.size() << " invalid combination" << (invalid.size() == 1 ? "" : "s");
    if (invalid.size() > kListed) {
      out << " (status invalid in " << csv.string() << "); the first " << kListed;
    }
    out << ":\n";
    for (std::size_t k = 0; k < std::min(kListed, invalid.size()); ++k) {
      const auto& f = rows[invalid[k]];
      out << "  " << describe(combos[invalid[k]], f[dp]) << ": " << f[reason] << "\n";
    }
  }
  std::cout << out.str();
}

}  // namespace

void add_sweep_experiment_options(CLI::App* cmd, SweepArgs& args) {
  SimulateArgs& s = args.experiment;
  cmd->add_option("experiment", s.experiment,
                  "Experiment JSON file, or the name of one in configs/experiments")
      ->required();
  cmd->add_option("--global-batch", s.global_batch, "Samples per iteration")
      ->check(integer_at_least(1, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--seq-len", s.seq_len, "Tokens per sample")->check(positive_integer());
  cmd->add_option("--virtual-stages", s.virtual_stages,
                  "Model chunks per device with the interleaved schedule")
      ->check(positive_integer());
  cmd->add_option("--partition", s.partition, "Layers per stage: even or balanced (BaPipe)");
  cmd->add_option("--tp-mode", s.tp_mode, "Tensor parallelism: 1d, 2d, 2.5d or 3d");
  cmd->add_option("--grad-compression", s.grad_compression,
                  "Data-parallel gradients: none, fp16, int8, topk or s2-reducer");
  cmd->add_option("--recompute-num-layers", s.recompute_num_layers,
                  "Layers per checkpoint (uniform) or recomputed per stage (block)");
  cmd->add_option("--offload", s.offload,
                  "Offload to the host: optimizer, params, nvme, activations (comma-separated)");
  cmd->add_option("--set", s.sets, "Override any config value: dotted.key=value (repeatable)");
  cmd->add_flag("--quiet", s.quiet, "Print nothing but errors");
  cli::add_foreign_input_options(cmd, s);  // --deepspeed, --megatron-args, --model
  cmd->add_flag("--exact", s.exact,
                "Simulate every tensor- and data-parallel rank instead of mirroring them (the "
                "same results; much slower)");
  cmd->add_option("--jobs,-j", args.jobs, "Worker threads (default: the hardware's threads)")
      ->check(positive_integer());
  cmd->add_option("--zero", args.zero, "ZeRO stages, e.g. 0..3 or 1,3 (default 0..3)");
  cmd->add_option("--recompute", args.recompute,
                  "Recomputation: none, selective, full, stage_aware (default "
                  "none,selective,full)");
  cmd->add_option("--micro-batch", args.micro_batch, "Micro-batch sizes (default 1,2,4)");
}

void add_sweep_options(CLI::App* cmd, SweepArgs& args) {
  add_sweep_experiment_options(cmd, args);
  cmd->add_option("--tp", args.tp, "Tensor-parallel degrees, e.g. 1,2,4,8 (default)");
  cmd->add_option("--pp", args.pp, "Pipeline stages, e.g. 1,2,4,8,16 (default)");
  cmd->add_option("--dp", args.dp,
                  "Data-parallel degrees (default: the devices left, cluster / (tp * pp))");
  cmd->add_option("--schedule", args.schedule,
                  "Pipeline schedules, e.g. 1f1b,interleaved,zb-h1 (default: the experiment's)");
  cmd->add_option("--sequence-parallel", args.sequence_parallel,
                  "Sequence parallelism: 0 (off), 1 (on) or 0,1 (default: the experiment's)");
  cmd->add_option("--axis", args.axes,
                  "A setting axis over any config value: PATH=V1,V2,... (repeatable; e.g. "
                  "embedding_cache.capacity=0.001,0.015,1)");
  cmd->add_option("--out", args.out, "The CSV to write (rows stream in as they finish)")
      ->required();
  cmd->add_flag("--resume", args.resume,
                "Continue an interrupted sweep: keep the rows --out already holds (the same "
                "grid and flags) and evaluate the rest");
}

void add_search_options(CLI::App* cmd, SweepArgs& args) {
  add_sweep_experiment_options(cmd, args);
  cmd->add_option("--gpus", args.gpus, "The GPU budget N: strategies with tp * pp * dp <= N")
      ->required()
      ->check(positive_integer());
  cmd->add_option("--objective", args.objective,
                  "throughput (tokens/s, default), memory (lowest peak) or cost (GPU-seconds "
                  "per token: fewer GPUs may win)");
  cmd->add_option("--min-gpus", args.min_gpus,
                  "With --objective cost: the fewest GPUs tried, halving from N (default N/4)")
      ->check(positive_integer());
  cmd->add_option("--top", args.top, "How many of the best to print (default 10)")
      ->check(positive_integer());
  cmd->add_option("--out", args.out,
                  "Write every combination to this CSV, with rank and pareto columns");
  cmd->add_option("--schedules", args.schedules,
                  "Pipeline schedules tried, e.g. 1f1b,interleaved (default: the experiment's)");
  cmd->add_option("--interleave", args.interleave,
                  "Virtual stages (model chunks per device) tried with the interleaved "
                  "schedule, e.g. 2,4 (default 2)");
  cmd->add_option("--sequence-parallel", args.search_sp,
                  "Sequence parallelism tried: 0, 1 or 0,1 (with tp > 1; default: the "
                  "experiment's)");
  cmd->add_flag("--try-fsdp", args.try_fsdp,
                "Also try PyTorch FSDP (training.framework fsdp, FULL_SHARD) where pp is 1");
  cmd->add_option("--cp", args.search_cp,
                  "Context-parallel degrees tried, e.g. 1,2,4 (dp = GPUs / (tp x cp x pp); "
                  "default: the experiment's)");
}

// --resume trusts a file only if it was written by this experiment with these flags: the grid
// columns are checked by search::resume, and the first and last kept rows are evaluated again
// and must come out byte for byte the same (evaluation is deterministic), which catches another
// experiment, another cluster or another --global-batch.
int sweep_command(const SweepArgs& args) {
  const auto started = Clock::now();

  std::optional<search::MpiWorld> world;
  if (search::launcher_world_size() > 0) {
    try {
      world.emplace();
    } catch (const std::runtime_error& e) {
      throw BadInput(e.what());
    }
  }
  const bool root = !world || world->rank() == 0;
  const bool quiet = args.experiment.quiet || !root;

  const search::Evaluator evaluator(resolve_experiment(args.experiment.experiment),
                                    overrides_of(args.experiment),
                                    {.exact = args.experiment.exact});
  const search::Grid grid = grid_of(args, evaluator.base());
  const auto combos = search::enumerate(grid);
  if (combos.empty()) throw BadInput("the grid is empty");
  const fs::path out(args.out);
  const std::string header = search::csv_header(search::sweep_columns(grid, evaluator));

  // Rank 0 decides where to start (a resumed prefix or a fresh file) and tells the others;
  // -1 says it failed and every process stops.
  long long first = 0;
  std::optional<BadInput> error;
  if (root) {
    try {
      std::error_code ec;
      // An empty file (killed before its header was written) starts afresh.
      if (args.resume && fs::exists(out, ec) && fs::file_size(out, ec) > 0) {
        try {
          first = static_cast<long long>(search::resume(out, header, combos));
        } catch (const std::runtime_error& e) {
          throw BadInput(std::string("--resume: ") + e.what());
        }
        try {
          search::check_resumed_rows(out, static_cast<std::size_t>(first), combos, evaluator);
        } catch (const std::runtime_error& e) {
          throw BadInput(std::string("--resume: ") + e.what());
        }
        if (!quiet) {
          std::cout << "resuming: " << first << " of " << combos.size() << " rows already in "
                    << out.string() << "\n";
        }
      } else {
        if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
        std::ofstream file(out, std::ios::binary | std::ios::trunc);
        file << header;
        file.flush();
        if (!file) throw BadInput("--out " + out.string() + ": cannot write");
      }
    } catch (const BadInput& e) {
      error = e;
      first = -1;
    }
  }
  if (world) first = world->broadcast(first);
  if (first < 0) {
    if (error) throw *error;
    return kExitBadInput;
  }

  const int jobs = jobs_of(args.jobs);
  const StopSignals signals;
  std::ofstream file;
  if (root) {
    file.open(out, std::ios::binary | std::ios::app);
    if (!file) throw BadInput("--out " + out.string() + ": cannot write");
  }
  const auto start_index = static_cast<std::size_t>(first);
  Progress progress("sweep", combos.size(), start_index, !quiet);
  auto work = [&](std::size_t i) {
    std::string line = search::csv_row(combos[i], evaluator.evaluate(combos[i]));
    return line;
  };
  // Each row is flushed as it is written, so an interruption keeps every finished row; a write
  // that fails (a full disk) stops the sweep at once rather than after the whole grid.
  bool write_failed = false;
  auto emit = [&](std::size_t, std::string&& line) {
    file << line;
    file.flush();
    if (!file && !write_failed) {
      write_failed = true;
      g_stop = 1;
    }
  };
  std::size_t emitted = 0;
  if (world && world->size() > 1) {
    emitted = world->run(
        start_index, combos.size(), jobs, work, emit, [&progress] { progress.tick(); }, &g_stop);
  } else {
    emitted = search::run_ordered(
        start_index, combos.size(), jobs,
        [&](std::size_t i) {
          std::string line = work(i);
          progress.tick();
          return line;
        },
        emit, &g_stop);
  }
  progress.finish();
  if (!root) return g_stop ? kExitInterrupted : 0;
  file.close();
  if (!file || write_failed) {
    throw BadInput("--out " + out.string() + ": writing failed (disk full?); the rows written " +
                   "so far are kept, --resume continues");
  }
  const std::size_t done = start_index + emitted;
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  if (done < combos.size()) {
    std::cerr << "interrupted after " << done << " of " << combos.size()
              << " combinations (kept in " << out.string() << "); --resume continues\n";
    return kExitInterrupted;
  }
  if (!quiet) {
    print_sweep_summary(out, combos, evaluator.base().name);
    std::ostringstream line;
    line << "evaluated " << emitted << " combinations in " << std::fixed << std::setprecision(2)
         << wall << " s (" << std::setprecision(1)
         << static_cast<double>(emitted) / std::max(wall, 1e-9) << " configurations/s, " << jobs
         << " thread" << (jobs == 1 ? "" : "s");
    if (world && world->size() > 1) line << " in each of " << world->size() << " processes";
    line << ")\nwrote " << out.string() << "\n";
    std::cout << line.str();
  }
  for (const auto& f : search::read_csv_rows(out)) {
    if (f.size() > search::column("status") && f[search::column("status")] == "failed") {
      std::cerr << "error: some simulations did not complete (status failed in " << out.string()
                << ")\n";
      return kExitSimulationFailed;
    }
  }
  return 0;
}

int search_command(const SweepArgs& args) {
  const auto started = Clock::now();
  const auto objective = search::objective_from_name(args.objective);
  if (!objective) {
    throw BadInput("--objective expects throughput, memory or cost, got \"" + args.objective +
                   "\"");
  }
  if (search::launcher_world_size() > 1) {
    throw BadInput("search runs in one process (threads: --jobs); run it without mpirun");
  }
  search::SearchSpace space;
  space.gpus = args.gpus;
  space.zero = parsed([&] { return search::parse_zero_stages(args.zero); });
  space.recompute = parsed([&] { return search::parse_recompute_modes(args.recompute); });
  space.micro_batch =
      parsed([&] { return search::parse_positive_list(args.micro_batch, "--micro-batch"); });
  space.fewer_gpus = *objective == search::Objective::cost;
  space.min_gpus = args.min_gpus;
  if (!args.schedules.empty()) {
    space.schedules =
        parsed([&] { return search::parse_schedules(args.schedules, "--schedules"); });
  }
  space.virtual_stages =
      parsed([&] { return search::parse_virtual_stages(args.interleave, "--interleave"); });
  if (!args.search_sp.empty()) {
    space.sequence_parallel = parsed(
        [&] { return search::parse_sequence_parallel(args.search_sp, "--sequence-parallel"); });
  }
  space.fsdp = args.try_fsdp;
  if (!args.search_cp.empty()) {
    space.cp = parsed([&] { return search::parse_positive_list(args.search_cp, "--cp"); });
  }
  if (args.min_gpus > args.gpus) {
    throw BadInput("--min-gpus " + std::to_string(args.min_gpus) + ": more than --gpus " +
                   std::to_string(args.gpus));
  }
  if (!args.out.empty()) {
    std::error_code ec;
    if (fs::is_directory(args.out, ec) || args.out.back() == '/') {
      throw BadInput("--out " + args.out + ": expected a CSV file name, got a folder");
    }
    check_out_dir(fs::path(args.out).parent_path().string());
  }

  const search::Evaluator evaluator(resolve_experiment(args.experiment.experiment),
                                    overrides_of(args.experiment),
                                    {.exact = args.experiment.exact, .prune = true});
  std::vector<search::Combination> combos;
  try {
    combos = search::search_space(evaluator.base(), space);
  } catch (const std::invalid_argument& e) {
    throw BadInput("--gpus " + std::to_string(args.gpus) + ": " + e.what());
  }
  const bool quiet = args.experiment.quiet;
  const int jobs = jobs_of(args.jobs);
  std::vector<search::Result> results(combos.size());
  const StopSignals signals;
  Progress progress("search", combos.size(), 0, !quiet);
  const std::size_t emitted = search::run_ordered(
      0, combos.size(), jobs,
      [&](std::size_t i) {
        results[i] = evaluator.evaluate(combos[i]);
        progress.tick();
        return std::string();
      },
      [](std::size_t, std::string&&) {}, &g_stop);
  progress.finish();
  if (emitted < combos.size()) {
    std::cerr << "interrupted after " << emitted << " of " << combos.size()
              << " combinations; nothing written\n";
    return kExitInterrupted;
  }

  std::size_t invalid = 0, by_states = 0, by_estimate = 0, simulated = 0, fit = 0, failed = 0;
  for (const auto& r : results) {
    invalid += r.status == search::Status::invalid ? 1 : 0;
    failed += r.status == search::Status::failed ? 1 : 0;
    simulated += r.simulated ? 1 : 0;
    fit += r.status == search::Status::ok ? 1 : 0;
    if (!r.simulated && r.status == search::Status::oom) {
      (r.reason.find("model states") != std::string::npos ? by_states : by_estimate) += 1;
    }
  }
  if (!combos.empty() && invalid == combos.size()) {
    // Nothing to rank: the budget itself is the bad input, not "no strategy fits in memory".
    throw BadInput("--gpus " + std::to_string(args.gpus) + ": all " +
                   std::to_string(combos.size()) + " combinations are invalid, e.g. tp " +
                   std::to_string(combos.front().tp) + " x pp " +
                   std::to_string(combos.front().pp) + ": " + results.front().reason);
  }
  const search::Ranking ranked = search::rank_results(*objective, results);
  const auto& ranking = ranked.order;
  const auto& frontier = ranked.frontier;
  const auto& rank_of = ranked.rank_of;

  if (!quiet) {
    std::ostringstream out;
    const double wall = std::chrono::duration<double>(Clock::now() - started).count();
    out << "search of " << evaluator.base().name << " on up to " << args.gpus << " GPUs ("
        << evaluator.base().cluster.name << " resized), objective " << args.objective << "\n"
        << "  " << combos.size() << " combinations: " << invalid << " invalid, " << by_states
        << " pruned (model states alone exceed a device), " << by_estimate
        << " pruned (memory estimate exceeds a device), " << simulated << " simulated, " << fit
        << " fit";
    if (failed > 0) out << ", " << failed << " failed";
    out << "; " << std::fixed << std::setprecision(1) << wall << " s\n";
    // A cp column when context parallelism is searched or the experiment has it.
    const int base_cp = evaluator.base().parallelism.cp;
    const bool show_cp = !space.cp.empty() || base_cp > 1;
    auto table = [&](const std::vector<std::size_t>& which) {
      out << "  rank  gpus   tp  pp" << (show_cp ? "  cp" : "")
          << "    dp  zero  sharding  schedule     v  sp  recompute   mb  "
             "iteration s     tokens/s    MFU  peak GiB  GPU-h/Btok  pareto\n";
      for (std::size_t i : which) {
        const auto& c = combos[i];
        const auto& r = results[i];
        out << "  " << std::setw(4) << rank_of[i] << std::setw(6) << r.gpus << std::setw(5) << c.tp
            << std::setw(4) << c.pp;
        if (show_cp) out << std::setw(4) << (c.cp > 0 ? c.cp : base_cp);
        out << std::setw(6) << r.dp << std::setw(6) << c.zero << "  " << std::left << std::setw(10)
            << (c.framework == "fsdp" ? "fsdp" : "zero") << std::setw(11) << r.schedule
            << std::right << std::setw(3)
            << (c.virtual_stages > 0 ? c.virtual_stages
                                     : evaluator.base().parallelism.virtual_stages)
            << std::setw(4) << (r.sequence_parallel ? "yes" : "no") << "  " << std::left
            << std::setw(10) << c.recompute << std::right << std::setw(4) << c.micro_batch
            << std::setw(13) << std::setprecision(3) << r.iteration_time_s << std::setw(13)
            << with_commas(r.tokens_per_s) << std::setw(6) << std::setprecision(1) << 100 * r.mfu
            << "%" << std::setw(10) << gib(static_cast<double>(r.peak_memory_bytes))
            << std::setw(12) << std::setprecision(2)
            << search::objective_value(search::Objective::cost, r) * 1e9 / 3600 << "  "
            << (frontier[i] ? "yes" : "") << "\n";
      }
    };
    if (ranking.empty()) {
      out << "no strategy fits in memory\n";
    } else {
      const auto top = std::min<std::size_t>(static_cast<std::size_t>(args.top), ranking.size());
      out << "top " << top << " by " << args.objective << ":\n";
      table({ranking.begin(), ranking.begin() + static_cast<std::ptrdiff_t>(top)});
      const auto& pareto = ranked.pareto;
      out << "Pareto frontier of iteration time vs peak memory (" << pareto.size()
          << " strategies, fastest first):\n";
      table(pareto);
    }
    std::cout << out.str();
  }
  if (!args.out.empty()) {
    const std::string text = search::search_csv(combos, results, ranked);
    const fs::path target(args.out);
    files::write_atomically(target, text);
    if (!quiet) std::cout << "wrote " << target.string() << "\n";
  }
  return failed > 0 ? kExitSimulationFailed : 0;
}

}  // namespace stratasim::cli
