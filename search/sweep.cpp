// Sweeps: the grid, the evaluation of one combination (load, lower, simulate, report), the CSV
// rows and the ordered, resumable parallel run.
#include "search/sweep.hpp"

#include <algorithm>
#include <charconv>
#include <exception>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "study/errors.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

namespace stratasim::search {

namespace fs = std::filesystem;

std::string_view name_of(Status s) {
  switch (s) {
    case Status::ok:
      return "ok";
    case Status::oom:
      return "oom";
    case Status::invalid:
      return "invalid";
    case Status::failed:
      return "failed";
  }
  return "?";
}

std::vector<Combination> enumerate(const Grid& g) {
  // An empty optional axis is one "keep the experiment's value" entry.
  const std::vector<int> dps = g.dp.empty() ? std::vector<int>{0} : g.dp;
  const std::vector<std::string> schedules =
      g.schedule.empty() ? std::vector<std::string>{""} : g.schedule;
  const std::vector<int> sps =
      g.sequence_parallel.empty() ? std::vector<int>{-1} : g.sequence_parallel;
  std::vector<Combination> out;
  for (int tp : g.tp) {
    for (int pp : g.pp) {
      for (int dp : dps) {
        for (int zero : g.zero) {
          for (const auto& recompute : g.recompute) {
            for (int mb : g.micro_batch) {
              for (const auto& schedule : schedules) {
                for (int sp : sps) {
                  out.push_back({.tp = tp,
                                 .pp = pp,
                                 .dp = dp,
                                 .zero = zero,
                                 .recompute = recompute,
                                 .micro_batch = mb,
                                 .schedule = schedule,
                                 .sequence_parallel = sp});
                }
              }
            }
          }
        }
      }
    }
  }
  // The setting axes, each faster than the ones before it.
  for (const SettingAxis& axis : g.settings) {
    std::vector<Combination> expanded;
    expanded.reserve(out.size() * axis.values.size());
    for (const Combination& c : out) {
      for (const std::string& value : axis.values) {
        expanded.push_back(c);
        expanded.back().settings.emplace_back(axis.path, value);
      }
    }
    out = std::move(expanded);
  }
  return out;
}

std::vector<strategies::Override> overrides_of(const Combination& c,
                                               const hw::ClusterSpec& base_cluster) {
  std::vector<strategies::Override> o;
  if (c.gpus > 0) o = resize_overrides(base_cluster, c.gpus);
  auto flag = [&](const char* name, const char* path, nlohmann::json value) {
    o.push_back({path, value, "sweep (" + std::string(name) + " " + value.dump() + ")"});
  };
  flag("--tp", "parallelism.tp", c.tp);
  flag("--pp", "parallelism.pp", c.pp);
  if (c.dp > 0) {
    flag("--dp", "parallelism.dp", c.dp);
  } else {
    o.push_back({"parallelism.dp", nullptr, "sweep (dp from the cluster)"});
  }
  flag("--zero", "parallelism.zero", c.zero);
  flag("--recompute", "parallelism.recompute", c.recompute);
  flag("--micro-batch", "parallelism.micro_batch", c.micro_batch);
  if (!c.schedule.empty()) flag("--schedule", "parallelism.schedule", c.schedule);
  if (c.sequence_parallel >= 0) {
    flag("--sequence-parallel", "parallelism.sequence_parallel", c.sequence_parallel == 1);
  }
  if (c.virtual_stages > 0)
    flag("--virtual-stages", "parallelism.virtual_stages", c.virtual_stages);
  if (c.sequence_slices > 0) {
    flag("sequence_slices", "parallelism.sequence_slices", c.sequence_slices);
  }
  if (!c.framework.empty()) flag("--try-fsdp", "training.framework", c.framework);
  if (c.cp > 0) flag("--cp", "parallelism.cp", c.cp);
  for (const auto& [path, text] : c.settings) {
    o.push_back(
        {path, config::parse_override_value(text), "sweep (--axis " + path + "=" + text + ")"});
  }
  return o;
}

namespace {

// A ConfigError as a CSV reason: the JSON path and what was expected. The file is the base
// experiment's (the same on every row), so it is left out unless the error is an override's.
std::string reason_of(const config::ConfigError& e) {
  std::string text;
  if (e.source().rfind("sweep", 0) == 0 || e.source().rfind("search", 0) == 0 ||
      e.source().rfind("command line", 0) == 0) {
    text = e.source() + ": ";
  }
  if (!e.path().empty()) text += e.path() + ": ";
  return text + e.message();
}

std::string gib_text(std::int64_t bytes) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(bytes) / (1LL << 30) << " GiB";
  return out.str();
}

}  // namespace

Evaluator::Evaluator(const fs::path& experiment, std::vector<strategies::Override> base,
                     EvalOptions options)
    : document_(config::Document::load(experiment)),
      base_overrides_(std::move(base)),
      options_(options) {
  // Reading inlines the model, cluster and device files and applies the user's overrides into
  // the document once; combinations then start from this copy with no file access.
  config::Document doc = document_;
  base_ = strategies::read_experiment(doc, base_overrides_);
  document_ = std::move(doc);
  for (const auto& figure : traces::report_context(base_).figures) {
    figure_columns_.push_back(figure.first);
  }
}

strategies::Experiment Evaluator::experiment(const Combination& c) const {
  config::Document doc = document_;
  return strategies::read_experiment(doc, overrides_of(c, base_.cluster));
}

Result Evaluator::evaluate(const Combination& c) const {
  Result r;
  for (const std::string& name : figure_columns_) r.figures.emplace_back(name, std::nullopt);
  r.capacity_bytes = base_.cluster.device.memory_capacity.count();
  std::optional<strategies::Experiment> loaded;
  try {
    loaded = experiment(c);
  } catch (const config::ConfigError& e) {
    r.status = Status::invalid;
    r.reason = reason_of(e);
    return r;
  } catch (const std::invalid_argument& e) {
    r.status = Status::invalid;
    r.reason = e.what();
    return r;
  }
  const strategies::Experiment& e = *loaded;
  const auto context = traces::report_context(e);
  r.loaded = true;
  r.dp = e.parallelism.dp;
  r.schedule = std::string(strategies::name_of(e.parallelism.schedule));
  r.sequence_parallel = e.parallelism.sequence_parallel;
  r.gpus = e.parallelism.tp * e.parallelism.cp * e.parallelism.pp * e.parallelism.dp;
  r.capacity_bytes = context.device_capacity.count();
  const std::int64_t capacity = r.capacity_bytes;
  try {
    if (options_.prune && !e.dlrm && !e.rnn) {
      // Model states alone: every device holds at least one part's parameters, gradients and
      // optimizer states (as ZeRO and offload leave them) plus the reserved overhead. (A DLRM's
      // or an RNN's lowering is not the pipeline's: the estimate below prunes them.)
      const auto layers = study::partition_layers(e);
      const auto spec = strategies::pipeline_spec(e, layers);
      std::int64_t parameters = 0;
      for (const auto& plan : spec.stages) parameters = std::max(parameters, plan.parameters);
      const auto states = strategies::device_model_states(spec.zero, spec.state_format(),
                                                          parameters, spec.layout.dp);
      const std::int64_t need = states.total().count() + strategies::held_back_estimate(e).count();
      if (capacity > 0 && need > capacity) {
        r.status = Status::oom;
        r.reason =
            "pruned: model states alone need " + gib_text(need) + " of " + gib_text(capacity);
        r.peak_memory_bytes = need;
        return r;
      }
    }
    const bool mirror = study::mirrors(e, options_.exact);
    // As `stratasim simulate` does: a lowering bug is a failed row naming the op, not a
    // simulation of a malformed program.
    std::optional<strategies::Program> lowered;
    try {
      lowered =
          study::lower(e, {.mirror_data_parallel = mirror,
                           .mirror_tensor_parallel = mirror && options_.mirror_tensor_parallel});
    } catch (const study::InvalidProgram& error) {
      r.status = Status::failed;
      r.reason = error.what();
      return r;
    }
    const strategies::Program& program = *lowered;
    const sim::MemoryOverheads overheads = study::memory_overheads(e);
    if (options_.prune) {
      const auto estimate = sim::estimate_memory(program, e.cluster, overheads);
      if (!estimate.out_of_memory.empty()) {
        std::int64_t peak = 0;
        for (const auto& o : estimate.out_of_memory) {
          if (o.tier == strategies::MemoryTier::device) peak = std::max(peak, o.peak.count());
        }
        if (peak > 0) {
          r.status = Status::oom;
          r.reason =
              "pruned: the memory estimate needs " + gib_text(peak) + " of " + gib_text(capacity);
          r.peak_memory_bytes = peak;
          return r;
        }
      }
    }
    sim::SimOptions options;
    options.overheads = overheads;
    options.record_memory = false;  // peaks and verdicts are kept without the samples
    options.transport = e.transport;
    const auto timeline = sim::simulate(program, e.cluster, options);
    const auto report = traces::make_report(program, timeline, context);
    if (!report.completed) {  // no figures: the columns stay empty, as for invalid rows
      r.status = Status::failed;
      r.reason = "the simulation did not complete: " + report.problem;
      return r;
    }
    r.simulated = true;
    for (auto& [name, value] : r.figures) {
      for (const auto& figure : context.figures) {
        if (figure.first == name) value = figure.second;
      }
    }
    r.iteration_time_s = report.iteration_time_s;
    r.tokens_per_s = report.tokens_per_s;
    r.samples_per_s = report.samples_per_s;
    r.tflops_per_device = report.model_tflops_per_device;
    r.mfu = report.mfu;
    r.hfu = report.hfu;
    r.bubble_fraction = report.bubble_fraction;
    r.exposed_comm_s = report.exposed_comm_s;
    r.peak_memory_bytes = report.peak_memory.count();
    r.fits = report.fits;
    r.status = report.fits ? Status::ok : Status::oom;
    r.stage_peak_bytes.assign(static_cast<std::size_t>(e.parallelism.pp), 0);
    for (const auto& rank : report.ranks) {
      auto& peak = r.stage_peak_bytes[static_cast<std::size_t>(rank.stage)];
      peak = std::max(peak, rank.peak_memory.count());
    }
    if (!report.fits && !report.out_of_memory.empty()) {
      const auto& o = report.out_of_memory.front();
      r.reason = "rank " + std::to_string(o.rank) + " needs " + gib_text(o.peak.count()) + " of " +
                 gib_text(o.capacity.count()) + " (" + std::string(strategies::name_of(o.tier)) +
                 ")";
    }
  } catch (const config::ConfigError& e2) {
    r.status = Status::invalid;
    r.reason = reason_of(e2);
  } catch (const std::invalid_argument& e2) {
    r.status = Status::invalid;
    r.reason = e2.what();
  } catch (const std::exception& e2) {
    r.status = Status::failed;
    r.reason = e2.what();
  }
  return r;
}

// ---- CSV.

namespace {

const char* const kColumns[] = {"tp",
                                "pp",
                                "dp",
                                "zero",
                                "recompute",
                                "micro_batch",
                                "schedule",
                                "sequence_parallel",
                                "status",
                                "reason",
                                "iteration_time_s",
                                "tokens_per_s",
                                "samples_per_s",
                                "tflops_per_device",
                                "mfu",
                                "hfu",
                                "bubble_fraction",
                                "exposed_comm_s",
                                "peak_memory_bytes",
                                "capacity_bytes",
                                "fits"};
constexpr std::size_t kKeyColumns = 8;  // tp .. sequence_parallel

// Shortest text that reads back as the same double (locale-independent, so the same on every
// machine and for every --jobs).
std::string number(double v) {
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  (void)ec;
  return std::string(buffer, end);
}

std::string csv_quoted(std::string_view text) {
  if (text.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"') out += '"';
    out += (ch == '\n' || ch == '\r') ? ' ' : ch;
  }
  return out + "\"";
}

// Splits one CSV line into fields (quotes as csv_quoted() writes them).
}  // namespace

std::vector<std::string> csv_fields(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  std::vector<std::string> out(1);
  bool in_quotes = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (in_quotes) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (ch == '"') {
        in_quotes = false;
      } else {
        out.back() += ch;
      }
    } else if (ch == '"') {
      in_quotes = true;
    } else if (ch == ',') {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

std::vector<std::vector<std::string>> read_csv_rows(const fs::path& csv) {
  std::ifstream in(csv, std::ios::binary);
  if (!in) throw std::runtime_error(csv.string() + ": cannot read");
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      header = false;
      continue;
    }
    rows.push_back(csv_fields(line));
  }
  return rows;
}

std::size_t column(std::string_view name) {
  for (std::size_t k = 0; k < std::size(kColumns); ++k) {
    if (name == kColumns[k]) return k;
  }
  throw std::out_of_range("no CSV column " + std::string(name));
}

std::string csv_header(const std::vector<std::string>& extra) {
  std::string out;
  for (const char* c : kColumns) out += (out.empty() ? "" : ",") + std::string(c);
  for (const auto& c : extra) out += "," + c;
  return out + "\n";
}

std::vector<std::string> setting_columns(const Grid& grid) {
  std::vector<std::string> columns;
  for (const SettingAxis& axis : grid.settings) columns.push_back(axis.path);
  return columns;
}

std::vector<std::string> sweep_columns(const Grid& grid, const Evaluator& evaluator) {
  std::vector<std::string> columns = setting_columns(grid);
  for (const std::string& name : evaluator.figure_columns()) columns.push_back(name);
  return columns;
}

std::string csv_row(const Combination& c, const Result& r, const std::vector<std::string>& extra) {
  std::string out;
  auto add = [&out](std::string_view field) {
    if (!out.empty()) out += ',';
    out += field;
  };
  add(std::to_string(c.tp));
  add(std::to_string(c.pp));
  add(r.loaded ? std::to_string(r.dp) : (c.dp > 0 ? std::to_string(c.dp) : ""));
  add(std::to_string(c.zero));
  add(c.recompute);
  add(std::to_string(c.micro_batch));
  add(r.loaded ? r.schedule : c.schedule);
  const int sp = r.loaded ? (r.sequence_parallel ? 1 : 0) : c.sequence_parallel;
  add(sp < 0 ? "" : (sp == 1 ? "true" : "false"));
  add(name_of(r.status));
  add(csv_quoted(r.reason));
  if (r.simulated) {
    add(number(r.iteration_time_s));
    add(number(r.tokens_per_s));
    add(number(r.samples_per_s));
    add(number(r.tflops_per_device));
    add(number(r.mfu));
    add(number(r.hfu));
    add(number(r.bubble_fraction));
    add(number(r.exposed_comm_s));
  } else {
    for (int k = 0; k < 8; ++k) add("");
  }
  add(r.peak_memory_bytes > 0 ? std::to_string(r.peak_memory_bytes) : "");
  add(std::to_string(r.capacity_bytes));
  add(r.simulated ? (r.fits ? "true" : "false") : (r.status == Status::oom ? "false" : ""));
  for (const auto& setting : c.settings) add(csv_quoted(setting.second));
  for (const auto& figure : r.figures) add(figure.second ? number(*figure.second) : "");
  for (const auto& e : extra) add(csv_quoted(e));
  return out + "\n";
}

std::size_t resume(const fs::path& csv, const std::string& header,
                   const std::vector<Combination>& combos) {
  std::ifstream in(csv, std::ios::binary);
  if (!in) throw std::runtime_error(csv.string() + ": cannot read the sweep to resume");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::size_t last_newline = text.rfind('\n');
  const std::size_t complete = last_newline == std::string::npos ? 0 : last_newline + 1;
  if (complete < header.size() || text.compare(0, header.size(), header) != 0) {
    throw std::runtime_error(csv.string() +
                             ": line 1 is not this sweep's header (another tool's file, or "
                             "columns from another version); expected " +
                             header.substr(0, header.size() - 1));
  }
  std::size_t rows = 0;
  std::size_t pos = header.size();
  while (pos < complete) {
    const std::size_t end = text.find('\n', pos);
    const std::string_view line(text.data() + pos, end - pos);
    const auto f = csv_fields(line);
    const std::string where = csv.string() + ": line " + std::to_string(rows + 2);
    if (rows >= combos.size()) {
      throw std::runtime_error(where + ": more rows than this grid has combinations (" +
                               std::to_string(combos.size()) + ")");
    }
    const Combination& c = combos[rows];
    if (f.size() < kKeyColumns) throw std::runtime_error(where + ": too few columns");
    std::string differs;
    auto check = [&](std::size_t k, const std::string& expected) {
      if (differs.empty() && f[k] != expected) {
        differs = std::string(kColumns[k]) + " is " + f[k] + ", this grid has " + expected;
      }
    };
    check(0, std::to_string(c.tp));
    check(1, std::to_string(c.pp));
    if (c.dp > 0) check(2, std::to_string(c.dp));
    check(3, std::to_string(c.zero));
    check(4, c.recompute);
    check(5, std::to_string(c.micro_batch));
    if (!c.schedule.empty()) check(6, c.schedule);
    if (c.sequence_parallel >= 0) check(7, c.sequence_parallel == 1 ? "true" : "false");
    for (std::size_t k = 0; k < c.settings.size() && differs.empty(); ++k) {
      const std::size_t column = std::size(kColumns) + k;
      if (column >= f.size()) {
        differs = "its " + c.settings[k].first + " column is missing";
      } else if (f[column] != c.settings[k].second) {
        differs =
            c.settings[k].first + " is " + f[column] + ", this grid has " + c.settings[k].second;
      }
    }
    if (!differs.empty()) {
      throw std::runtime_error(where + ": not the row of combination " + std::to_string(rows + 1) +
                               " of this grid (" + differs +
                               "); resume with the same grid and flags, or start afresh");
    }
    ++rows;
    pos = end + 1;
  }
  if (complete != text.size()) {
    // The last row was cut short (interrupted mid-write): drop it; it is evaluated again.
    fs::resize_file(csv, complete);
  }
  return rows;
}

// ---- The ordered parallel run.

std::size_t run_ordered(std::size_t first, std::size_t count, int jobs,
                        const std::function<std::string(std::size_t)>& work,
                        const std::function<void(std::size_t, std::string&&)>& emit,
                        const std::atomic<bool>* stop, const std::vector<std::size_t>& indices) {
  std::vector<std::size_t> order = indices;
  if (order.empty()) {
    for (std::size_t i = first; i < count; ++i) order.push_back(i);
  }
  const std::size_t n = order.size();
  std::vector<std::optional<std::string>> done(n);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mutex;
  std::size_t emitted = 0;
  auto worker = [&] {
    for (;;) {
      if ((stop != nullptr && stop->load()) || failed.load()) return;
      const std::size_t k = next.fetch_add(1);
      if (k >= n) return;
      std::string line;
      try {
        line = work(order[k]);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
        failed = true;
        return;
      }
      std::lock_guard lock(mutex);
      done[k] = std::move(line);
      // Emit the contiguous prefix: rows leave in index order whatever finished first.
      while (emitted < n && done[emitted]) {
        emit(order[emitted], std::move(*done[emitted]));
        done[emitted].reset();
        ++emitted;
      }
    }
  };
  const auto threads = static_cast<std::size_t>(std::max(1, jobs));
  if (threads == 1 || n <= 1) {
    worker();
  } else {
    std::vector<std::jthread> pool;
    for (std::size_t t = 0; t < std::min(threads, n); ++t) pool.emplace_back(worker);
  }
  if (error) std::rethrow_exception(error);
  return emitted;
}

// ---- Lists on the command line.

std::vector<int> parse_int_list(std::string_view text, std::string_view flag) {
  std::vector<int> out;
  auto bad = [&](std::string_view item) {
    return std::invalid_argument(std::string(flag) +
                                 " expects integers separated by commas or ranges like 0..3, got "
                                 "\"" +
                                 std::string(item) + "\" in \"" + std::string(text) + "\"");
  };
  auto integer = [&](std::string_view item, std::string_view whole) {
    int v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0) {
      throw bad(whole);
    }
    return v;
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(pos, comma - pos);
    if (const auto dots = item.find(".."); dots != std::string_view::npos) {
      const int lo = integer(item.substr(0, dots), item);
      const int hi = integer(item.substr(dots + 2), item);
      if (hi < lo || hi - lo > 4096) throw bad(item);
      for (long long v = lo; v <= hi; ++v) out.push_back(static_cast<int>(v));  // hi may be INT_MAX
    } else {
      out.push_back(integer(item, item));
    }
    pos = comma + 1;
  }
  // Repeated values would give repeated rows: keep the first of each.
  std::vector<int> unique;
  for (int v : out) {
    if (std::find(unique.begin(), unique.end(), v) == unique.end()) unique.push_back(v);
  }
  return unique;
}

std::vector<std::string> parse_name_list(std::string_view text, std::string_view flag,
                                         const std::vector<std::string>& allowed) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string item(text.substr(pos, comma - pos));
    if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
      std::string names;
      for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
      throw std::invalid_argument(std::string(flag) + " expects names from " + names +
                                  " separated by commas, got \"" + item + "\"");
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    pos = comma + 1;
  }
  return out;
}

SweepSummary summarize_sweep(const fs::path& csv) {
  SweepSummary s;
  s.rows = read_csv_rows(csv);
  const std::size_t status = column("status"), tokens = column("tokens_per_s"),
                    samples = column("samples_per_s"), peak = column("peak_memory_bytes");
  // Most tokens/s; samples/s between equals (a model without sequences, DLRM, has 0 tokens).
  auto better = [&](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    const double ta = std::stod(a[tokens]), tb = std::stod(b[tokens]);
    return ta != tb ? ta > tb : std::stod(a[samples]) > std::stod(b[samples]);
  };
  for (std::size_t i = 0; i < s.rows.size(); ++i) {
    const auto& f = s.rows[i];
    if (f.size() <= peak) continue;
    const std::string& st = f[status];
    if (st == "ok") {
      ++s.ok;
      if (!s.best || better(f, s.rows[*s.best])) s.best = i;
    } else if (st == "oom") {
      ++s.oom;
    } else if (st == "invalid") {
      ++s.invalid;
      s.invalid_rows.push_back(i);
    } else if (st == "failed") {
      ++s.failed;
    }
  }
  return s;
}

void check_resumed_rows(const fs::path& csv, std::size_t rows,
                        const std::vector<Combination>& combos, const Evaluator& evaluator) {
  if (rows == 0) return;
  std::ifstream in(csv, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line + "\n");
  for (std::size_t row : {std::size_t{0}, rows - 1}) {
    if (row + 1 >= lines.size()) break;
    const std::string again = csv_row(combos[row], evaluator.evaluate(combos[row]));
    if (again != lines[row + 1]) {
      throw std::runtime_error(csv.string() + ": line " + std::to_string(row + 2) +
                               " was written by another experiment or other flags (it evaluates "
                               "differently now); resume with the same experiment and flags, or "
                               "start afresh without --resume");
    }
  }
}

std::vector<int> parse_positive_list(std::string_view text, std::string_view flag) {
  auto values = parse_int_list(text, flag);
  for (int v : values) {
    if (v < 1) {
      throw std::invalid_argument(std::string(flag) + " expects positive integers, got " +
                                  std::to_string(v));
    }
  }
  return values;
}

std::vector<int> parse_zero_stages(std::string_view text, std::string_view flag) {
  auto values = parse_int_list(text, flag);
  for (int z : values) {
    if (z < 0 || z > 3) {
      throw std::invalid_argument(std::string(flag) + " expects ZeRO stages 0 to 3, got " +
                                  std::to_string(z));
    }
  }
  return values;
}

std::vector<std::string> parse_recompute_modes(std::string_view text, std::string_view flag) {
  return parse_name_list(text, flag, {"none", "selective", "full", "stage_aware"});
}

Grid parse_grid(const GridText& t) {
  Grid g;
  g.tp = parse_positive_list(t.tp, "--tp");
  g.pp = parse_positive_list(t.pp, "--pp");
  if (!t.dp.empty()) g.dp = parse_positive_list(t.dp, "--dp");
  g.zero = parse_zero_stages(t.zero);
  g.recompute = parse_recompute_modes(t.recompute);
  g.micro_batch = parse_positive_list(t.micro_batch, "--micro-batch");
  if (!t.schedule.empty()) g.schedule = parse_schedules(t.schedule, "--schedule");
  if (!t.sequence_parallel.empty()) {
    g.sequence_parallel = parse_sequence_parallel(t.sequence_parallel, "--sequence-parallel");
  }
  for (const std::string& axis : t.settings) {
    g.settings.push_back(parse_setting_axis(axis, "--axis", g.settings));
  }
  return g;
}

GridText for_experiment(GridText text, const strategies::Experiment& base) {
  if (!base.dlrm && !base.rnn) return text;
  const GridText defaults;
  const auto& p = base.parallelism;
  if (text.tp == defaults.tp) text.tp = std::to_string(p.tp);
  if (text.pp == defaults.pp) text.pp = std::to_string(p.pp);
  if (text.zero == defaults.zero) text.zero = std::to_string(p.zero);
  if (text.recompute == defaults.recompute) {
    text.recompute = std::string(strategies::name_of(p.recompute));
  }
  if (text.micro_batch == defaults.micro_batch) text.micro_batch = std::to_string(p.micro_batch);
  return text;
}

SettingAxis parse_setting_axis(std::string_view text, std::string_view flag,
                               const std::vector<SettingAxis>& earlier) {
  const std::string f(flag);
  const std::size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw std::invalid_argument(f + " expects PATH=V1,V2,... (e.g. embedding_cache.capacity=" +
                                "0.01,0.1,1), got \"" + std::string(text) + "\"");
  }
  SettingAxis axis;
  axis.path = std::string(text.substr(0, eq));
  // The grid's own axes have their flags (and their columns): one place sets each key.
  static const std::pair<const char*, const char*> kOwnFlags[] = {
      {"parallelism.tp", "--tp"},
      {"parallelism.pp", "--pp"},
      {"parallelism.dp", "--dp"},
      {"parallelism.zero", "--zero"},
      {"parallelism.recompute", "--recompute"},
      {"parallelism.micro_batch", "--micro-batch"},
      {"parallelism.schedule", "--schedule"},
      {"parallelism.sequence_parallel", "--sequence-parallel"}};
  for (const auto& [path, own] : kOwnFlags) {
    if (axis.path == path) {
      throw std::invalid_argument(f + " " + axis.path + ": the sweep's " + own +
                                  " sets this key; use " + own);
    }
  }
  for (const SettingAxis& other : earlier) {
    if (other.path == axis.path) {
      throw std::invalid_argument(f + " " + axis.path +
                                  ": given twice; list all its values in one " + f);
    }
  }
  std::string_view list = text.substr(eq + 1);
  for (std::size_t start = 0;;) {
    const std::size_t comma = list.find(',', start);
    const std::string_view item = list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) {
      throw std::invalid_argument(f + " " + axis.path + ": expects values separated by commas, " +
                                  "got an empty one in \"" + std::string(list) + "\"");
    }
    axis.values.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return axis;
}

std::vector<std::string> parse_schedules(std::string_view text, std::string_view flag) {
  std::vector<std::string> names;
  for (auto kind : strategies::kAllSchedules) names.emplace_back(strategies::name_of(kind));
  return parse_name_list(text, flag, names);
}

std::vector<int> parse_sequence_parallel(std::string_view text, std::string_view flag) {
  auto values = parse_int_list(text, flag);
  for (int v : values) {
    if (v < 0 || v > 1) {
      throw std::invalid_argument(std::string(flag) + " expects 0 (off) and/or 1 (on), got " +
                                  std::to_string(v));
    }
  }
  return values;
}

std::vector<int> parse_virtual_stages(std::string_view text, std::string_view flag) {
  auto values = parse_int_list(text, flag);
  for (int v : values) {
    if (v < 2) {
      throw std::invalid_argument(std::string(flag) +
                                  " expects model chunks per device of 2 or more (1 is the "
                                  "plain 1F1B schedule), got " +
                                  std::to_string(v));
    }
  }
  return values;
}

}  // namespace stratasim::search
