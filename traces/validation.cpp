#include "traces/validation.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>

namespace stratasim::traces {

using namespace strategies;

namespace {

// The order classes are listed in.
const char* const kClassOrder[] = {
    "gemm",       "attention",      "elementwise", "optimizer", "copy",   "measured",   "roofline",
    "all-reduce", "reduce-scatter", "all-gather",  "broadcast", "reduce", "all-to-all", "p2p"};

std::string class_of(const Kernel& k) {
  switch (k.work.index()) {
    case 0:
      return "gemm";
    case 1:
      return "attention";
    case 2:
      return "elementwise";
    case 3:
      return "optimizer";
    case 4:
      return "copy";
    case 5:
      return "measured";
    default:
      return "roofline";
  }
}

double error_of(double predicted, double measured) {
  return measured > 0 ? (predicted - measured) / measured : 0.0;
}

struct Tally {
  std::int64_t count = 0;
  double predicted = 0, measured = 0, abs_error = 0;
  void add(double p, double m) {
    ++count;
    predicted += p;
    measured += m;
    abs_error += std::abs(error_of(p, m));
  }
  ValidationRow row(std::string name) const {
    return {std::move(name),
            count,
            predicted,
            measured,
            error_of(predicted, measured),
            count > 0 ? abs_error / static_cast<double>(count) : 0.0};
  }
};

std::string percent(double x) {
  std::ostringstream s;
  s << std::showpos << std::fixed << std::setprecision(1) << 100 * x << "%";
  return s.str();
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << std::setprecision(4);
  if (s >= 1) {
    out << s << " s";
  } else if (s >= 1e-3) {
    out << s * 1e3 << " ms";
  } else {
    out << s * 1e6 << " us";
  }
  return out.str();
}

nlohmann::json row_json(const ValidationRow& r) {
  return {{"name", r.name},
          {"count", r.count},
          {"predicted_s", r.predicted_s},
          {"measured_s", r.measured_s},
          {"error", r.error},
          {"mean_abs_error", r.mean_abs_error}};
}

}  // namespace

Validation compare(const Program& program, const Timeline& predicted, const Timeline& measured,
                   const std::vector<KernelDuration>& predicted_kernels,
                   const std::vector<KernelDuration>& measured_kernels,
                   const std::vector<int>& stage_of_rank) {
  Validation v;
  std::map<std::string, Tally> classes;
  // Kernels: matched by (op, index).
  std::map<std::pair<OpId, std::uint32_t>, Time> predicted_by_kernel;
  for (const auto& k : predicted_kernels) predicted_by_kernel[{k.op, k.index}] = k.duration;
  auto sorted = measured_kernels;
  std::sort(sorted.begin(), sorted.end(), [](const KernelDuration& a, const KernelDuration& b) {
    return std::tie(a.op, a.index) < std::tie(b.op, b.index);
  });
  for (const auto& k : sorted) {
    const auto it = predicted_by_kernel.find({k.op, k.index});
    if (it == predicted_by_kernel.end() || k.op >= program.op_count()) continue;
    const Op& op = program.op(k.op);
    const auto* c = std::get_if<Compute>(&op.work);
    if (!c || k.index >= program.kernels_of(*c).size()) continue;
    const Kernel& kernel = program.kernels_of(*c)[k.index];
    const std::string cls = class_of(kernel);
    const double p = it->second.seconds(), m = k.duration.seconds();
    classes[cls].add(p, m);
    v.items.push_back({k.op, static_cast<std::int32_t>(k.index), op.rank, cls,
                       kernel.name.empty() ? program.label_of(op) : kernel.name, p, m});
  }
  // Communication ops: matched by op id.
  const bool indexed =
      predicted.spans.size() == program.op_count() && measured.spans.size() == program.op_count();
  if (indexed) {
    for (OpId id = 0; id < program.op_count(); ++id) {
      const Op& op = program.op(id);
      std::string cls;
      if (const auto* c = std::get_if<Collective>(&op.work)) {
        cls = std::string(name_of(c->kind));
      } else if (std::holds_alternative<Send>(op.work) || std::holds_alternative<Recv>(op.work)) {
        cls = "p2p";
      } else {
        continue;
      }
      const double p = (predicted.spans[id].end - predicted.spans[id].start).seconds();
      const double m = (measured.spans[id].end - measured.spans[id].start).seconds();
      classes[cls].add(p, m);
      v.items.push_back({id, -1, op.rank, cls, program.label_of(op), p, m});
    }
  }
  for (const char* name : kClassOrder) {
    const auto it = classes.find(name);
    if (it != classes.end()) v.classes.push_back(it->second.row(name));
  }
  // Stages: the longest span (first op start to last op end) of a rank of the stage.
  if (indexed) {
    int stages = 0;
    for (int s : stage_of_rank) stages = std::max(stages, s + 1);
    std::vector<double> p_stage(static_cast<std::size_t>(stages)),
        m_stage(static_cast<std::size_t>(stages));
    std::vector<std::int64_t> ranks(static_cast<std::size_t>(stages));
    for (int r = 0; r < program.world_size(); ++r) {
      if (static_cast<std::size_t>(r) >= stage_of_rank.size()) break;
      const auto ops = program.ops_of(r);
      if (ops.empty()) continue;
      auto span_of = [&](const Timeline& t) {
        Time first = Time::infinity(), last;
        for (std::size_t i = 0; i < ops.size(); ++i) {
          const auto& s = t.spans[program.first_op(r) + i];
          first = std::min(first, s.start);
          last = std::max(last, s.end);
        }
        return (last - first).seconds();
      };
      const auto s = static_cast<std::size_t>(stage_of_rank[static_cast<std::size_t>(r)]);
      p_stage[s] = std::max(p_stage[s], span_of(predicted));
      m_stage[s] = std::max(m_stage[s], span_of(measured));
      ++ranks[s];
    }
    for (std::size_t s = 0; s < p_stage.size(); ++s) {
      const double e = error_of(p_stage[s], m_stage[s]);
      v.stages.push_back(
          {"stage " + std::to_string(s), ranks[s], p_stage[s], m_stage[s], e, std::abs(e)});
    }
  }
  Time p_end, m_end;
  for (const auto& s : predicted.spans) p_end = std::max(p_end, s.end);
  for (const auto& s : measured.spans) m_end = std::max(m_end, s.end);
  const double e = error_of(p_end.seconds(), m_end.seconds());
  v.iteration = {"iteration", 1, p_end.seconds(), m_end.seconds(), e, std::abs(e)};
  // Memory: the rank with the largest measured device peak.
  for (std::size_t r = 0; r < measured.ranks.size(); ++r) {
    const Bytes m = measured.ranks[r].tiers[0].peak;
    if (r == 0 || m > v.memory.measured) {
      v.memory.rank = static_cast<std::int32_t>(r);
      v.memory.measured = m;
      v.memory.predicted = r < predicted.ranks.size() ? predicted.ranks[r].tiers[0].peak : Bytes();
    }
  }
  v.memory.error = error_of(static_cast<double>(v.memory.predicted.count()),
                            static_cast<double>(v.memory.measured.count()));
  return v;
}

nlohmann::json to_json(const Validation& v) {
  nlohmann::json j;
  j["classes"] = nlohmann::json::array();
  for (const auto& r : v.classes) j["classes"].push_back(row_json(r));
  j["stages"] = nlohmann::json::array();
  for (const auto& r : v.stages) j["stages"].push_back(row_json(r));
  j["iteration"] = row_json(v.iteration);
  j["memory"] = {{"rank", v.memory.rank},
                 {"predicted_bytes", v.memory.predicted.count()},
                 {"measured_bytes", v.memory.measured.count()},
                 {"error", v.memory.error}};
  return j;
}

void print_validation(std::ostream& out, const Validation& v) {
  auto line = [&](const ValidationRow& r, bool mean) {
    out << "  " << std::left << std::setw(16) << r.name << std::right << std::setw(7) << r.count
        << std::setw(13) << seconds_text(r.predicted_s) << std::setw(13)
        << seconds_text(r.measured_s) << std::setw(10) << percent(r.error);
    if (mean) out << std::setw(12) << percent(r.mean_abs_error).substr(1);
    out << "\n";
  };
  out << "  " << std::left << std::setw(16) << "class" << std::right << std::setw(7) << "count"
      << std::setw(13) << "predicted" << std::setw(13) << "measured" << std::setw(10) << "error"
      << std::setw(12) << "mean |err|"
      << "\n";
  for (const auto& r : v.classes) line(r, true);
  if (!v.stages.empty()) out << "\n";
  for (const auto& r : v.stages) line(r, false);
  out << "\n";
  line(v.iteration, false);
  out << "  " << std::left << std::setw(16) << "memory peak" << std::right << std::setw(7)
      << ("r" + std::to_string(v.memory.rank)) << std::setw(13) << to_string(v.memory.predicted)
      << std::setw(13) << to_string(v.memory.measured) << std::setw(10) << percent(v.memory.error)
      << "\n";
}

void write_validation_csv(std::ostream& out, const Validation& v) {
  out << "op,kernel,rank,class,label,predicted_s,measured_s\n";
  out << std::setprecision(9);
  for (const auto& i : v.items) {
    std::string label = i.label;
    std::replace(label.begin(), label.end(), '"', '\'');
    out << i.op << ',' << i.kernel << ',' << i.rank << ',' << i.cls << ",\"" << label << "\","
        << i.predicted_s << ',' << i.measured_s << '\n';
  }
}

}  // namespace stratasim::traces
