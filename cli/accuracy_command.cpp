// `stratasim accuracy`: parses the flags, runs study::accuracy and prints the rows, the
// summaries per source (or series) and the cases not compared, as a table, CSV or JSON.
#include "cli/accuracy_command.hpp"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "study/accuracy.hpp"
#include "study/catalog.hpp"
#include "traces/context.hpp"

namespace stratasim::cli {

namespace {

using study::AccuracyLevel;

std::string value_text(double v) {
  std::ostringstream out;
  if (std::abs(v) >= 1000) return traces::with_commas(std::llround(v));
  out << std::fixed << std::setprecision(std::abs(v) >= 10 ? 1 : 3) << v;
  return out.str();
}

std::string percent(double fraction, bool sign) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << (sign ? std::showpos : std::noshowpos)
      << fraction * 100 << "%";
  return out.str();
}

std::string title_of(AccuracyLevel level) {
  switch (level) {
    case AccuracyLevel::e2e:
      return "end to end (tokens/s per GPU; the step time where no tokens/s is published)";
    case AccuracyLevel::gemm:
      return "GEMM (TFLOP/s)";
    case AccuracyLevel::attention:
      return "FlashAttention (TFLOP/s, FLOPs as FlashAttention's benchmarks count them)";
    case AccuracyLevel::collective:
      return "collectives (bus bandwidth, GB/s, nccl-tests' definition)";
    case AccuracyLevel::moe:
      return "MoE all-to-all (DeepEP on H800: bottleneck GB/s, latency us)";
  }
  return "";
}

void print_summaries(std::ostream& out, const study::AccuracyReport& report, AccuracyLevel level) {
  const auto groups = study::summaries(report, level);
  std::size_t width = 24;
  for (const auto& s : groups) width = std::max(width, s.group.size() + 2);
  out << "  " << std::left << std::setw(static_cast<int>(width))
      << (level == AccuracyLevel::attention || level == AccuracyLevel::collective ||
                  level == AccuracyLevel::moe
              ? "series"
              : "source")
      << std::right << std::setw(6) << "rows" << std::setw(14) << "mean |error|" << std::setw(13)
      << "max |error|" << std::setw(11) << "within 5%" << std::setw(12) << "within 10%"
      << "\n";
  for (const auto& s : groups) {
    out << "  " << std::left << std::setw(static_cast<int>(width)) << s.group << std::right
        << std::setw(6) << s.rows << std::setw(14) << percent(s.mean_abs_error, false)
        << std::setw(13) << percent(s.max_abs_error, false) << std::setw(11) << s.within_5
        << std::setw(12) << s.within_10 << "\n";
  }
  const auto& all = groups.front();
  if (all.rows == 0) return;
  if (level == AccuracyLevel::e2e) {
    const bool pass = all.mean_abs_error <= study::kE2eMeanErrorBound &&
                      all.max_abs_error <= study::kE2eMaxErrorBound;
    out << "  gate (mean |error| <= " << percent(study::kE2eMeanErrorBound, false)
        << ", every row <= " << percent(study::kE2eMaxErrorBound, false)
        << "): " << (pass ? "passes" : "fails") << "\n";
  } else if (level == AccuracyLevel::collective) {
    bool pass = true;
    for (const auto& r : report.rows) {
      if (r.level == level && std::abs(r.error) > study::collective_bound(r.bytes)) pass = false;
    }
    out << "  gate (every point of 1 MiB and more <= "
        << percent(study::kCollectiveLargeMaxError, false)
        << ", below <= " << percent(study::kCollectiveSmallMaxError, false)
        << "): " << (pass ? "passes" : "fails") << "\n";
  } else if (level == AccuracyLevel::moe) {
    int within = 0;
    for (const auto& r : report.rows) {
      if (r.level == level && std::abs(r.error) <= study::kMoeMaxError) ++within;
    }
    out << "  rows within " << percent(study::kMoeMaxError, false) << ": " << within << " of "
        << all.rows << "\n";
  } else {
    out << "  gate (every " << (level == AccuracyLevel::gemm ? "case" : "point")
        << " <= " << percent(study::kKernelMaxError, false)
        << "): " << (all.max_abs_error <= study::kKernelMaxError ? "passes" : "fails") << "\n";
  }
}

void print_table(std::ostream& out, const study::AccuracyReport& report,
                 const std::vector<AccuracyLevel>& levels) {
  out << "stratasim accuracy: " << report.calibration.string() << " (" << report.cases
      << " cases)\n";
  for (AccuracyLevel level : levels) {
    out << "\n" << title_of(level) << "\n";
    std::size_t id_width = 8, map_width = 10;
    for (const auto& r : report.rows) {
      if (r.level != level) continue;
      id_width = std::max(id_width, r.id.size() + 2);
      map_width = std::max(map_width, r.mapped_to.size() + 2);
    }
    out << "  " << std::left << std::setw(static_cast<int>(id_width)) << "case"
        << std::setw(static_cast<int>(map_width)) << "simulated on" << std::right << std::setw(12)
        << "published" << std::setw(12) << "predicted" << std::setw(9) << "error"
        << "\n";
    for (const auto& r : report.rows) {
      if (r.level != level) continue;
      out << "  " << std::left << std::setw(static_cast<int>(id_width)) << r.id
          << std::setw(static_cast<int>(map_width)) << r.mapped_to << std::right << std::setw(12)
          << value_text(r.published) << std::setw(12) << value_text(r.predicted) << std::setw(9)
          << percent(r.error, true);
      if (r.quantity == "step time (s)") out << "  (step time, s)";
      if (!r.note.empty()) out << "  " << r.note;
      out << "\n";
    }
    print_summaries(out, report, level);
  }
  for (AccuracyLevel level : levels) {
    std::map<std::string, int> reasons;
    std::size_t id_width = 8, n = 0;
    for (const auto& u : report.unexpressed) {
      if (u.level != level) continue;
      id_width = std::max(id_width, u.id.size() + 2);
      ++n;
    }
    if (n == 0) continue;
    out << "\nnot compared (" << study::name_of(level) << "): " << n << "\n";
    for (const auto& u : report.unexpressed) {
      if (u.level != level) continue;
      out << "  " << std::left << std::setw(static_cast<int>(id_width)) << u.id << u.reason << "\n";
    }
  }
  if (!report.other_categories.empty()) {
    out << "\nother categories, not part of these tables:";
    for (const auto& [category, n] : report.other_categories) out << " " << category << " " << n;
    out << "\n";
  }
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void print_csv(std::ostream& out, const study::AccuracyReport& report) {
  out << "level,id,source,series,device,mapped_to,quantity,published,predicted,error,note,"
         "reason\n";
  out << std::setprecision(9);
  for (const auto& r : report.rows) {
    out << study::name_of(r.level) << ',' << csv_field(r.id) << ',' << csv_field(r.source) << ','
        << csv_field(r.series) << ',' << csv_field(r.device) << ',' << csv_field(r.mapped_to) << ','
        << csv_field(r.quantity) << ',' << r.published << ',' << r.predicted << ',' << r.error
        << ',' << csv_field(r.note) << ",\n";
  }
  for (const auto& u : report.unexpressed) {
    out << study::name_of(u.level) << ',' << csv_field(u.id) << ',' << csv_field(u.source)
        << ",,,,,,,,," << csv_field(u.reason) << "\n";
  }
}

}  // namespace

void add_accuracy_options(CLI::App* cmd, AccuracyArgs& args) {
  cmd->add_option("--calibration", args.calibration,
                  "The calibration set (default: tests/reference/calibration.json beside the "
                  "shipped configs)");
  cmd->add_option("--format", args.format, "table (default), csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  cmd->add_flag("--kernels", args.kernels,
                "Also compare the GEMM cases and the FlashAttention series, costed on one device");
  cmd->add_flag("--collectives", args.collectives,
                "Also compare every point of the collective sweeps (busbw) with the cluster's "
                "network model");
}

int accuracy_command(const AccuracyArgs& args) {
  const std::filesystem::path file = args.calibration.empty()
                                         ? study::default_calibration_file()
                                         : std::filesystem::path(args.calibration);
  const study::AccuracyReport report = study::accuracy(
      file, {.e2e = true, .kernels = args.kernels, .collectives = args.collectives});
  std::ostringstream out;
  if (args.format == "json") {
    out << study::to_json(report).dump(2) << "\n";
  } else if (args.format == "csv") {
    print_csv(out, report);
  } else {
    std::vector<AccuracyLevel> levels{AccuracyLevel::e2e};
    if (args.kernels) levels.insert(levels.end(), {AccuracyLevel::gemm, AccuracyLevel::attention});
    if (args.collectives)
      levels.insert(levels.end(), {AccuracyLevel::collective, AccuracyLevel::moe});
    print_table(out, report, levels);
  }
  std::cout << out.str();
  return 0;
}

}  // namespace stratasim::cli
