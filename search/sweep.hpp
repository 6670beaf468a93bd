// Parallel-strategy sweeps: a grid of tensor-, pipeline- and data-parallel degrees, ZeRO stages,
// recomputation, micro-batch sizes (and optionally schedules and sequence parallelism) over one
// base experiment. Every combination is checked (the experiment's own validation says why one
// is invalid), lowered, simulated and reported as one CSV row. Rows come out in the grid's fixed
// order whatever the number of threads, so the file is deterministic and an interrupted sweep
// keeps a prefix of it that --resume continues (docs/sweep.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "study/catalog.hpp"

namespace stratasim::search {

/// One point of the grid. Fields left at their "unset" value keep the base experiment's.
struct Combination {
  int tp = 1;
  int pp = 1;
  int dp = 0;  // 0: what the cluster leaves (devices / (tp * pp))
  int zero = 0;
  std::string recompute = "none";  // none, selective, full (or stage_aware)
  int micro_batch = 1;
  std::string schedule;        // empty: the experiment's
  int sequence_parallel = -1;  // -1: the experiment's; 0 or 1
  /// The search's GPU count: the cluster is resized to this many devices (resize_overrides);
  /// 0 keeps the experiment's cluster.
  int gpus = 0;
  /// The schedule's own knobs (the schedules study sets them; 0: the experiment's):
  /// interleaved's model chunks per device and TeraPipe's sequence slices.
  int virtual_stages = 0;
  int sequence_slices = 0;
  /// training.framework (the search's FSDP axis sets "fsdp"); empty: the experiment's.
  std::string framework = {};
  /// Context-parallel degree (parallelism.cp; the search's opt-in cp axis); 0: the experiment's.
  int cp = 0;
  /// The setting axes' values (Grid::settings), one per axis in its order: (config path, value
  /// text), applied as `--set path=value` would be.
  std::vector<std::pair<std::string, std::string>> settings = {};
};

/// A sweep axis over any config value (`--axis PATH=V1,V2,...`): each value is applied to the
/// experiment as `--set PATH=VALUE` applies it (JSON when it parses, else the text: "1.5%",
/// "row", "0.01"); the CSV gets a column named PATH holding the value's text. Values contain no
/// commas.
struct SettingAxis {
  std::string path;
  std::vector<std::string> values;
};

/// Lists of values per axis. Empty optional axes (dp, schedule, sequence_parallel) keep the
/// experiment's value.
struct Grid {
  std::vector<int> tp, pp, dp, zero, micro_batch;
  std::vector<std::string> recompute, schedule;
  std::vector<int> sequence_parallel;  // 0, 1
  /// Setting axes (fastest, after sequence_parallel, the first given slowest).
  std::vector<SettingAxis> settings;
};

/// Every combination of `grid` in a fixed order: tp slowest, then pp, dp, zero, recompute,
/// micro_batch, schedule, sequence_parallel and the setting axes (fastest), each axis in the
/// order given.
std::vector<Combination> enumerate(const Grid& grid);

/// The overrides that turn the base experiment into combination `c` (dp: null, re-derived
/// from the cluster, when c.dp is 0).
std::vector<strategies::Override> overrides_of(const Combination& c,
                                               const hw::ClusterSpec& base_cluster);

/// The cluster resized to a GPU count: study::resize_overrides (study/catalog.hpp), which the
/// cluster simulator (cluster/throughput.hpp) uses too.
using study::resize_overrides;

enum class Status { ok, oom, invalid, failed };
std::string_view name_of(Status s);

/// What one combination gave. Times in seconds, memory in bytes.
struct Result {
  Status status = Status::ok;
  std::string reason;    // why invalid, failed, pruned or out of memory
  bool loaded = false;   // the combination's experiment was read (dp, schedule, ... resolved)
  int dp = 0;            // resolved data-parallel degree
  std::string schedule;  // resolved schedule name
  bool sequence_parallel = false;
  bool simulated = false;  // a full simulation ran to completion (false: invalid, pruned, failed)
  double iteration_time_s = 0;
  double tokens_per_s = 0;
  double samples_per_s = 0;
  double tflops_per_device = 0;  // model TFLOP/s per device
  double mfu = 0, hfu = 0;
  double bubble_fraction = 0;
  double exposed_comm_s = 0;
  std::int64_t peak_memory_bytes = 0;  // device tier, max over ranks
  std::int64_t capacity_bytes = 0;     // device memory of one device
  bool fits = false;
  int gpus = 0;  // tp * pp * dp
  /// Peak device memory per pipeline stage (max over the stage's ranks), when simulated.
  std::vector<std::int64_t> stage_peak_bytes;
  /// The base experiment's model-specific figures (traces::ReportContext::figures: a DLRM's
  /// embedding cache), by name in the base's order, whatever the row's status; a value where
  /// the combination was simulated and has the figure.
  std::vector<std::pair<std::string, std::optional<double>>> figures;
};

/// How combinations are evaluated.
struct EvalOptions {
  /// Simulate every replica (no data- or tensor-parallel mirroring); mirroring applies only on
  /// the analytical network with a homogeneous cluster, as in `stratasim simulate`.
  bool exact = false;
  /// Where mirroring applies, also mirror tensor-parallel ranks (PipelineSpec::
  /// mirror_tensor_parallel; exact, tests/search checks it); false mirrors data-parallel
  /// replicas only, as `stratasim simulate` does (the benchmark compares the two).
  bool mirror_tensor_parallel = true;
  /// Search: before lowering, drop combinations whose model states alone (parameters,
  /// gradients and optimizer states of the heaviest stage) exceed a device; after lowering,
  /// drop those whose memory estimate (sim::estimate_memory, which never exceeds the
  /// simulated peak) exceeds it. Both are lower bounds of the simulated peak, so a pruned
  /// combination would not fit when simulated either. The sweep simulates everything.
  bool prune = false;
};

/// Evaluates combinations over one base experiment. The base document (model, cluster and
/// device files inlined, the user's overrides applied) is read once; each combination copies
/// it and applies its own overrides. evaluate() is safe to call from many threads.
class Evaluator {
 public:
  Evaluator(const std::filesystem::path& experiment, std::vector<strategies::Override> base,
            EvalOptions options = {});
  /// The base experiment (with the user's overrides) as loaded.
  const strategies::Experiment& base() const { return base_; }
  /// The names of the base experiment's model-specific figures (Result::figures), in order.
  const std::vector<std::string>& figure_columns() const { return figure_columns_; }
  /// The experiment of combination `c`; throws config::ConfigError when invalid.
  strategies::Experiment experiment(const Combination& c) const;
  Result evaluate(const Combination& c) const;

 private:
  config::Document document_;
  std::vector<strategies::Override> base_overrides_;
  strategies::Experiment base_;
  std::vector<std::string> figure_columns_;
  EvalOptions options_;
};

/// The CSV header line (with '\n'), and one row. A row's setting values (Combination::settings)
/// follow the standard columns, then its figures (Result::figures), then `extra` columns (the
/// search's "pareto"); the header's `extra` names all three (setting_columns(grid), then
/// Evaluator::figure_columns()).
std::string csv_header(const std::vector<std::string>& extra = {});
/// The CSV columns of the grid's setting axes: their paths.
std::vector<std::string> setting_columns(const Grid& grid);
class Evaluator;
/// A sweep's columns after the standard ones: setting_columns(grid), then the evaluator's
/// figure_columns() (csv_header(sweep_columns(...)) is the header of its rows).
std::vector<std::string> sweep_columns(const Grid& grid, const Evaluator& evaluator);
std::string csv_row(const Combination& c, const Result& r,
                    const std::vector<std::string>& extra = {});
/// Evaluates items [first, count) of a list in `jobs` threads. `work(i)` computes item i (in
/// any thread); `emit(i, line)` is called for each item in index order, as soon as items
/// [first, i] are all done, one call at a time. When `stop` becomes true no further items are
/// started; those in progress finish and the contiguous prefix is emitted. `indices`, when not
/// empty, restricts the work to those indices (ascending; MPI ranks take a share) and emit is
/// called in their order. Returns how many items were emitted.
std::size_t run_ordered(std::size_t first, std::size_t count, int jobs,
                        const std::function<std::string(std::size_t)>& work,
                        const std::function<void(std::size_t, std::string&&)>& emit,
                        const std::atomic<bool>* stop,
                        const std::vector<std::size_t>& indices = {});

/// The rows an existing CSV holds for `combos`: checks that its header is `header` and that row
/// k is the row of combos[k] (its tp, pp, zero, recompute and micro_batch, and dp, schedule and
/// sequence_parallel where the grid sets them), and returns the number of complete rows; a last
/// line without its newline (a write cut short) is dropped from the file. Throws std::runtime_error
/// naming the file, line and what differs.
std::size_t resume(const std::filesystem::path& csv, const std::string& header,
                   const std::vector<Combination>& combos);

/// The fields of one CSV line as csv_row writes them (quoted fields unquoted).
std::vector<std::string> csv_fields(std::string_view line);
/// The rows of a CSV file (the header left out), each split into fields.
std::vector<std::vector<std::string>> read_csv_rows(const std::filesystem::path& csv);
/// The index of column `name` in csv_header(); throws std::out_of_range for an unknown name.
std::size_t column(std::string_view name);

/// What a sweep's CSV holds (rows resumed or gathered from other processes included): rows
/// per status, the best row that fits (most tokens/s, then most samples/s — all a DLRM has;
/// the first of equals), the invalid rows.
struct SweepSummary {
  std::vector<std::vector<std::string>> rows;  // read_csv_rows
  std::size_t ok = 0, oom = 0, invalid = 0, failed = 0;
  std::optional<std::size_t> best;
  std::vector<std::size_t> invalid_rows;
};
SweepSummary summarize_sweep(const std::filesystem::path& csv);

/// --resume's check that an existing CSV was written by the same experiment and flags: the
/// first and the last of its `rows` complete rows must be what `evaluator` gives now for their
/// combinations. Throws std::runtime_error naming the file and line otherwise.
void check_resumed_rows(const std::filesystem::path& csv, std::size_t rows,
                        const std::vector<Combination>& combos, const Evaluator& evaluator);

/// The grid as the CLI's flags write it ("1,2,4", "0..3", "none,full"), with the CLI's
/// defaults; empty optional axes (dp, schedule, sequence_parallel) keep the experiment's.
struct GridText {
  std::string tp = "1,2,4,8";
  std::string pp = "1,2,4,8,16";
  std::string dp;
  std::string zero = "0..3";
  std::string recompute = "none,selective,full";
  std::string micro_batch = "1,2,4";
  std::string schedule;
  std::string sequence_parallel;
  /// `--axis PATH=V1,V2,...` (repeatable): setting axes, in the order given.
  std::vector<std::string> settings = {};
};
/// Parses and checks a grid (degrees and micro batches positive, ZeRO stages 0 to 3, known
/// recomputation modes and schedules, sequence parallelism 0 or 1); std::invalid_argument
/// naming the flag (--tp, --zero, ...) otherwise. The sweep's and search's flags, and the
/// Python module's arguments, are read by these.
Grid parse_grid(const GridText& text);
/// `text` for the base experiment: a model that is not a transformer (DLRM, RNN: no tensor or
/// pipeline parallelism, ZeRO or recomputation) takes its own tp, pp, zero, recompute and micro
/// batch where `text` leaves the CLI's defaults, so that a sweep over its settings
/// (`--axis`) is not a grid of refused combinations.
GridText for_experiment(GridText text, const strategies::Experiment& base);
std::vector<int> parse_positive_list(std::string_view text, std::string_view flag);
std::vector<int> parse_zero_stages(std::string_view text, std::string_view flag = "--zero");
std::vector<std::string> parse_recompute_modes(std::string_view text,
                                               std::string_view flag = "--recompute");
/// Pipeline schedule names (strategies::kAllSchedules), sequence parallelism (0 and/or 1) and
/// interleaved virtual stages (each >= 2); std::invalid_argument naming `flag` otherwise.
std::vector<std::string> parse_schedules(std::string_view text, std::string_view flag);
std::vector<int> parse_sequence_parallel(std::string_view text, std::string_view flag);
std::vector<int> parse_virtual_stages(std::string_view text, std::string_view flag);
/// "PATH=V1,V2,..." (`--axis`): a setting axis; std::invalid_argument naming `flag` when the
/// path or a value is empty, a path repeats an earlier axis's (`earlier`), or it names a grid
/// axis's own key (parallelism.tp: use --tp).
SettingAxis parse_setting_axis(std::string_view text, std::string_view flag,
                               const std::vector<SettingAxis>& earlier = {});

/// Parses "1,2,4", "0..3" or "1,2,8..16" (ranges step by one) for flag `flag`; throws
/// std::invalid_argument naming the flag and the item.
std::vector<int> parse_int_list(std::string_view text, std::string_view flag);
/// Splits "none,selective" and checks each item is one of `allowed`.
std::vector<std::string> parse_name_list(std::string_view text, std::string_view flag,
                                         const std::vector<std::string>& allowed);

}  // namespace stratasim::search
