#include "study/collective_fit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "hw_models/files.hpp"
#include "sim/collective_bench.hpp"
#include "sim/nccl_model.hpp"
#include "sim/network.hpp"
#include "study/accuracy.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"
#include "study/nelder_mead.hpp"
#include "traces/bus_bandwidth.hpp"

namespace stratasim::study {

namespace fs = std::filesystem;
using json = nlohmann::json;
using hw::CollectiveAlgorithm;
using strategies::CollectiveKind;

namespace {

/// Which shipped cluster a case's system runs on: every word of `system` (case-insensitive)
/// in hardware.system + " " + hardware.gpu, and the case's node count.
struct SystemMapping {
  std::vector<std::string> words;
  int nodes;
  const char* cluster;
};
const SystemMapping kCollectiveSystems[] = {
    {{"dgx h100"}, 1, "dgx-h100-1"},       {{"h200", "hgx"}, 1, "dgx-h200-1"},
    {{"b200", "p6-b200"}, 1, "p6-b200-1"}, {{"b200", "p6-b200"}, 4, "p6-b200-4"},
    {{"a3 mega"}, 2, "a3-mega-2"},         {{"a100", "nvlink3"}, 1, "dgx-a100-1"},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// NCCL's NVLink ring step latencies and NET ring step latencies (us), LL, LL128, Simple
// (src/graph/tuning.cc hwLat): the proportions the fit keeps.
constexpr const double (&kNetStep)[3] = sim::kNcclNetRingStepUs;

const json* at(const config::Document& doc, const std::string& path) {
  return doc.find(path);
}

double number_at(const config::Document& doc, const std::string& path) {
  const json* v = at(doc, path);
  if (v == nullptr || !v->is_number()) doc.fail(path, "expected a number");
  return v->get<double>();
}

std::string string_at(const config::Document& doc, const std::string& path) {
  const json* v = at(doc, path);
  if (v == nullptr || !v->is_string()) doc.fail(path, "expected a string");
  return v->get<std::string>();
}

Time seconds(double s) {
  return Time::from_seconds(s);
}

/// A tool's key in tools.json: its config.tool with '.' written '_' (config paths use dots).
std::string tool_key(std::string tool) {
  std::replace(tool.begin(), tool.end(), '.', '_');
  return tool;
}

std::string us_text(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g us", seconds * 1e6);
  return buf;
}

double round_to(double x, double step) {
  return std::round(x / step) * step;
}

}  // namespace

std::vector<CollectivePoint> collective_points(const fs::path& calibration) {
  const config::Document doc = config::Document::load(calibration);
  const json* cases = doc.find("cases");
  if (cases == nullptr || !cases->is_array()) doc.fail("cases", "expected a list of cases");
  std::vector<CollectivePoint> out;
  for (std::size_t i = 0; i < cases->size(); ++i) {
    const std::string path = "cases." + std::to_string(i);
    const json& c = (*cases)[i];
    if (!c.is_object() || c.value("category", "") != "collective") continue;
    CollectivePoint base;
    base.case_id = string_at(doc, path + ".id");
    base.source = string_at(doc, path + ".source.ref");
    base.series = base.case_id;
    const std::string gpu = string_at(doc, path + ".hardware.gpu");
    const json* sys = at(doc, path + ".hardware.system");
    base.system = sys != nullptr && sys->is_string() ? sys->get<std::string>() : gpu;
    const int nodes = static_cast<int>(number_at(doc, path + ".hardware.nodes"));
    base.ranks = static_cast<int>(number_at(doc, path + ".config.ranks"));
    base.tool = tool_key(string_at(doc, path + ".config.tool"));
    const std::string op = string_at(doc, path + ".config.collective");
    if (op == "sendrecv") {
      base.p2p = true;
    } else if (const auto kind = strategies::collective_kind_from_config_name(op)) {
      base.kind = *kind;
    } else {
      doc.fail(path + ".config.collective",
               "expected all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all or "
               "sendrecv");
    }
    const json* variant = at(doc, path + ".config.variant");
    if (variant != nullptr && variant->is_string() &&
        variant->get<std::string>().find("NCCL_NVLS_ENABLE=0") != std::string::npos) {
      base.fixed = CollectiveAlgorithm::ring;
    }
    const std::string haystack = lower(base.system + " " + gpu);
    for (const auto& m : kCollectiveSystems) {
      if (m.nodes != nodes) continue;
      if (std::all_of(m.words.begin(), m.words.end(), [&](const std::string& w) {
            return haystack.find(w) != std::string::npos;
          })) {
        base.cluster = m.cluster;
        break;
      }
    }
    const double factor = base.p2p ? 1.0 : traces::busbw_factor(base.kind, base.ranks);
    auto add = [&](Bytes bytes, double time_s, double busbw, const std::string& suffix,
                   CollectiveAlgorithm fixed) {
      CollectivePoint p = base;
      p.bytes = bytes;
      p.fixed = fixed;
      if (time_s > 0) {
        p.published_seconds = time_s;
        p.published_busbw = static_cast<double>(bytes.count()) / time_s * factor;
      } else {
        p.published_busbw = busbw;
        p.published_seconds = busbw > 0 ? static_cast<double>(bytes.count()) * factor / busbw : 0;
      }
      p.id = base.case_id + "/" + std::to_string(bytes.count()) + suffix;
      if (fixed != base.fixed) p.series = base.case_id + " ring";
      out.push_back(std::move(p));
    };
    const std::string m = path + ".measured";
    if (const json* sweep = at(doc, m + ".sweep"); sweep != nullptr) {
      if (!sweep->is_array()) doc.fail(m + ".sweep", "expected a list of sizes");
      const std::size_t first = out.size();
      for (std::size_t r = 0; r < sweep->size(); ++r) {
        const std::string rp = m + ".sweep." + std::to_string(r);
        const Bytes bytes(static_cast<std::int64_t>(number_at(doc, rp + ".size_bytes")));
        double t = 0;
        for (const char* key : {"oop_time_us", "ip_time_us", "time_us"}) {
          const json* v = at(doc, rp + "." + key);
          if (v != nullptr && v->is_number() && v->get<double>() > 0) {
            t = t > 0 ? std::min(t, v->get<double>() * 1e-6) : v->get<double>() * 1e-6;
          }
        }
        double busbw = 0;
        if (t <= 0) busbw = number_at(doc, rp + ".busbw_GBps") * 1e9;
        add(bytes, t, busbw, "", base.fixed);
      }
      // Disturbed points: slower than a larger size of the same sweep by kDisturbedFactor.
      for (std::size_t a = first; a < out.size(); ++a) {
        for (std::size_t b = first; b < out.size(); ++b) {
          if (out[b].bytes > out[a].bytes &&
              out[a].published_seconds > kDisturbedFactor * out[b].published_seconds) {
            char buf[200];
            std::snprintf(buf, sizeof buf,
                          "disturbed: %.4g us, more than %.2f times the %.4g us of %lld bytes",
                          out[a].published_seconds * 1e6, kDisturbedFactor,
                          out[b].published_seconds * 1e6,
                          static_cast<long long>(out[b].bytes.count()));
            out[a].excluded = buf;
            break;
          }
        }
      }
    } else {
      const Bytes bytes(static_cast<std::int64_t>(number_at(doc, path + ".config.size_bytes")));
      add(bytes, 0, number_at(doc, m + ".busbw_GBps") * 1e9, "", base.fixed);
      if (const json* off = at(doc, m + ".busbw_nvls_off_GBps"); off != nullptr) {
        if (!off->is_number()) doc.fail(m + ".busbw_nvls_off_GBps", "expected a number");
        add(bytes, 0, off->get<double>() * 1e9, "+ring", CollectiveAlgorithm::ring);
      }
    }
    for (auto& p : out) {
      if (p.case_id == base.case_id && p.cluster.empty() && p.excluded.empty()) {
        p.excluded =
            "no shipped cluster for \"" + p.system + "\" on " + std::to_string(nodes) + " node(s)";
      }
    }
  }
  return out;
}

std::map<std::string, Time> tool_overheads(const fs::path& fabrics_dir) {
  std::map<std::string, Time> out;
  const fs::path file = fabrics_dir / "tools.json";
  std::error_code ec;
  if (!fs::exists(file, ec)) return out;
  auto doc = config::Document::load(file);
  config::ObjectReader r(doc, "", "the measuring tools' overheads");
  r.string_or("source", "");
  auto tools = r.object("tools", "tools by name");
  const json* all = doc.find("tools");
  for (auto it = all->begin(); it != all->end(); ++it) {
    auto t = tools.object(it.key(), "a tool");
    out[it.key()] = t.time("overhead");
    t.has("fitted_to");
    t.has("fit");
    t.finish();
  }
  tools.finish();
  r.finish();
  return out;
}

CollectivePrediction predict(const CollectivePoint& point, const hw::ClusterSpec& cluster,
                             Time overhead) {
  std::vector<std::int32_t> ranks;
  for (int r = 0; r < point.ranks; ++r) ranks.push_back(r);
  CollectivePrediction out;
  if (point.p2p) {
    out.time =
        (cluster.collectives.nccl ? sim::nccl_p2p_time(0, 1, point.bytes, cluster)
                                  : sim::AnalyticalNetwork(cluster).p2p_time(0, 1, point.bytes)) +
        overhead;
    out.busbw = traces::algbw(point.bytes, out.time);
    return out;
  }
  const Bytes sizes[] = {point.bytes};
  std::optional<CollectiveAlgorithm> fixed;
  if (point.fixed != CollectiveAlgorithm::automatic) fixed = point.fixed;
  const auto m = sim::measure_collective(cluster, point.kind, ranks, sizes, fixed);
  out.time = m.front().time + overhead;
  out.busbw = traces::busbw(point.kind, point.ranks, point.bytes, out.time);
  out.algorithm = m.front().algorithm;
  out.protocol = m.front().protocol;
  return out;
}

namespace {

/// The fit's state: the fabrics by name (numbers only) and the tools' overheads.
struct Model {
  std::map<std::string, hw::NcclFabric> fabrics;
  std::map<std::string, double> overhead;  // seconds
};

struct Param {
  std::string owner;  // fabric or tool
  std::string field;  // "efficiency", "latency_scale", ...
  bool fraction = false;
  double initial = 0;
  std::function<void(Model&, double)> apply;
  double prior = 0;  // > 0: NCCL's own figure, which the objective prefers faintly (kPriorWeight)
  double value(double x) const { return fraction ? 1 / (1 + std::exp(-x)) : std::exp(x); }
  double start() const { return fraction ? std::log(initial / (1 - initial)) : std::log(initial); }
};

/// A point as the objective evaluates it.
struct FitPoint {
  const CollectivePoint* point;
  std::string intra, network;  // fabric names
  sim::NcclGroup group;
  hw::ClusterSpec cluster;  // for point to point
  double published_busbw;
};

void set_hop_latency(hw::NcclFabric& f, double hop) {
  for (std::size_t p = 0; p < 2; ++p) f.step_latency[p] = seconds(kNetStep[p] * 1e-6 + hop);
}
void set_simple_hop_latency(hw::NcclFabric& f, double hop) {
  f.step_latency[2] = seconds(kNetStep[2] * 1e-6 + 2 * hop);
}

double predicted_busbw(const FitPoint& fp, const Model& model) {
  const hw::NcclSettings s{model.fabrics.at(fp.intra), model.fabrics.at(fp.network)};
  const auto tool = model.overhead.find(fp.point->tool);
  const Time overhead = tool == model.overhead.end() ? Time::zero() : seconds(tool->second);
  const CollectivePoint& p = *fp.point;
  if (p.p2p) {
    hw::ClusterSpec c = fp.cluster;
    c.collectives.nccl = s;
    return traces::algbw(p.bytes, sim::nccl_p2p_time(0, 1, p.bytes, c) + overhead);
  }
  const Time t = sim::nccl_choose(p.kind, fp.group, p.bytes, s, p.fixed).time + overhead;
  return traces::busbw(p.kind, p.ranks, p.bytes, t);
}

}  // namespace

std::vector<FabricFit> fit_collectives(const fs::path& calibration, const fs::path& fabrics_dir,
                                       int max_evaluations) {
  const auto points = collective_points(calibration);
  std::map<std::string, hw::ClusterSpec> clusters;
  Model model;
  std::vector<FitPoint> fit_points;
  for (const auto& p : points) {
    if (!p.excluded.empty()) continue;
    auto it = clusters.find(p.cluster);
    if (it == clusters.end()) {
      it = clusters.emplace(p.cluster, hw::load_cluster(resolve_cluster(p.cluster))).first;
    }
    const hw::ClusterSpec& c = it->second;
    if (!c.collectives.nccl) {
      throw BadInput("fit --collectives: cluster " + p.cluster + " (case " + p.case_id +
                     ") has no NCCL model: give its collectives an intra_fabric and a "
                     "network_fabric");
    }
    for (const auto* f : {&c.collectives.nccl->intra, &c.collectives.nccl->network}) {
      hw::NcclFabric numbers = *f;
      numbers.source.clear();
      numbers.fitted_to.clear();
      model.fabrics.emplace(f->name, numbers);
    }
    std::vector<std::int32_t> ranks;
    for (int r = 0; r < p.ranks; ++r) ranks.push_back(r);
    FitPoint fp{&p,
                c.collectives.nccl->intra.name,
                c.collectives.nccl->network.name,
                sim::nccl_group(ranks, c),
                p.p2p ? c : hw::ClusterSpec{},
                p.published_busbw};
    fit_points.push_back(std::move(fp));
  }
  const auto overheads = tool_overheads(fabrics_dir);
  // Which parameters the points determine.
  std::vector<Param> params;
  std::map<std::string, std::set<std::string>> cases_of;  // owner -> cases
  auto add = [&](const std::string& owner, const std::string& field, bool fraction, double initial,
                 std::function<void(Model&, double)> apply, double prior = 0) {
    for (const auto& p : params) {
      if (p.owner == owner && p.field == field) return;
    }
    initial = fraction ? std::clamp(initial, 0.05, 0.98) : std::max(initial, 1e-9);
    params.push_back({owner, field, fraction, initial, std::move(apply), prior});
  };
  for (const auto& fp : fit_points) {
    const CollectivePoint& p = *fp.point;
    const hw::NcclFabric& in = model.fabrics.at(fp.intra);
    cases_of[fp.intra].insert(p.case_id);
    const std::string i = fp.intra;
    if (p.p2p) {
      add(i, "p2p_efficiency", true, in.p2p_efficiency,
          [i](Model& m, double v) { m.fabrics.at(i).p2p_efficiency = v; });
      if (in.p2p_channel_bandwidth.bytes_per_second() > 0) {
        add(i, "p2p_channel_bandwidth", false, in.p2p_channel_bandwidth.bytes_per_second() / 1e9,
            [i](Model& m, double v) {
              m.fabrics.at(i).p2p_channel_bandwidth = Bandwidth(v * 1e9);
            });
      }
    } else {
      add(i, "efficiency", true, in.efficiency,
          [i](Model& m, double v) { m.fabrics.at(i).efficiency = v; });
      add(i, "channel_busbw", false, in.channel_busbw.bytes_per_second() / 1e9,
          [i](Model& m, double v) { m.fabrics.at(i).channel_busbw = Bandwidth(v * 1e9); });
      for (std::size_t q = 0; q < 3; ++q) {
        add(
            i, "step_latency." + std::string(hw::kNcclProtocolNames[q]), false,
            in.step_latency[q].seconds() * 1e6,
            [i, q](Model& m, double v) { m.fabrics.at(i).step_latency[q] = seconds(v * 1e-6); },
            sim::kNcclNvlinkRingStepUs[q]);
      }
      if (in.nvls_efficiency > 0 && fp.group.nodes == 1) {
        add(i, "nvls.efficiency", true, in.nvls_efficiency,
            [i](Model& m, double v) { m.fabrics.at(i).nvls_efficiency = v; });
        add(i, "nvls.latency", false, in.nvls_latency.seconds() * 1e6,
            [i](Model& m, double v) { m.fabrics.at(i).nvls_latency = seconds(v * 1e-6); });
        if (in.nvls_channels > 0) {
          add(i, "nvls.loop_latency", false, std::max(1.0, in.nvls_loop_latency.seconds() * 1e6),
              [i](Model& m, double v) { m.fabrics.at(i).nvls_loop_latency = seconds(v * 1e-6); });
        }
      }
    }
    if (fp.group.nodes > 1) {
      const std::string n = fp.network;
      const hw::NcclFabric& net = model.fabrics.at(n);
      cases_of[n].insert(p.case_id);
      add(n, "efficiency", true, net.efficiency,
          [n](Model& m, double v) { m.fabrics.at(n).efficiency = v; });
      if (net.ll || net.ll128) {  // else no point pays it
        add(n, "hop_latency", false,
            std::max(1.0, net.step_latency[0].seconds() * 1e6 - kNetStep[0]),
            [n](Model& m, double v) { set_hop_latency(m.fabrics.at(n), v * 1e-6); });
      }
      add(n, "simple_hop_latency", false,
          std::max(1.0, (net.step_latency[2].seconds() * 1e6 - kNetStep[2]) / 2),
          [n](Model& m, double v) { set_simple_hop_latency(m.fabrics.at(n), v * 1e-6); });
    }
    if (p.tool.find("nccl-tests") == std::string::npos) {
      const std::string t = p.tool;
      cases_of[t].insert(p.case_id);
      const auto known = overheads.find(t);
      add(t, "overhead", false, known == overheads.end() ? 20.0 : known->second.seconds() * 1e6,
          [t](Model& m, double v) { m.overhead[t] = v * 1e-6; });
    }
  }
  auto apply = [&](const std::vector<double>& x) {
    Model m = model;
    for (std::size_t k = 0; k < params.size(); ++k) params[k].apply(m, params[k].value(x[k]));
    return m;
  };
  auto objective = [&](const std::vector<double>& x) {
    const Model m = apply(x);
    double sum = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (params[k].prior > 0 && !params[k].fraction) {
        sum += kPriorWeight * std::abs(x[k] - std::log(params[k].prior));
      }
    }
    for (const auto& fp : fit_points) {
      const double ratio = predicted_busbw(fp, m) / fp.published_busbw;
      sum += std::abs(std::log(ratio));
      // The gate's bound as a soft constraint: LAD alone is indifferent between points it
      // cannot all meet, the penalty prefers a fit that keeps every point within its bound.
      const double excess =
          std::abs(ratio - 1) - kGateMargin * collective_bound(fp.point->bytes.count());
      if (excess > 0) sum += kGatePenalty * excess;
    }
    return sum;
  };
  std::vector<double> x;
  for (const auto& p : params) x.push_back(p.start());
  Minimum best{x, objective(x), false};
  for (int restart = 0; restart < 8; ++restart) {
    const Minimum next = nelder_mead(objective, best.x, 0.3, max_evaluations, 1e-10);
    const bool improved = next.f < best.f - 1e-9;
    if (next.f <= best.f) best = next;
    if (!improved && next.converged) break;
  }
  if (!best.converged) {
    throw BadInput("fit --collectives: Nelder-Mead did not converge within " +
                   std::to_string(max_evaluations) + " evaluations per run (objective " +
                   std::to_string(best.f) + ")");
  }
  const Model fitted = apply(best.x);

  // Errors per owner, over the points it touches.
  std::vector<FabricFit> out;
  for (const auto& [owner, cases] : cases_of) {
    FabricFit f;
    f.name = owner;
    f.cases.assign(cases.begin(), cases.end());
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (params[k].owner == owner) f.values[params[k].field] = params[k].value(best.x[k]);
    }
    double sum = 0;
    for (const auto& fp : fit_points) {
      const CollectivePoint& p = *fp.point;
      const bool touches =
          fp.intra == owner || (fp.network == owner && fp.group.nodes > 1) || p.tool == owner;
      if (!touches) continue;
      const double e = std::abs(predicted_busbw(fp, fitted) / fp.published_busbw - 1);
      sum += e;
      f.max_abs_error = std::max(f.max_abs_error, e);
      ++f.points;
    }
    f.mean_abs_error = f.points > 0 ? sum / f.points : 0;
    out.push_back(std::move(f));
  }

  // Write the fabric files and tools.json.
  json tools = json::object();
  for (const auto& f : out) {
    const json fit_summary = {{"points", f.points},
                              {"mean_abs_error", round_to(f.mean_abs_error, 1e-4)},
                              {"max_abs_error", round_to(f.max_abs_error, 1e-4)}};
    if (f.values.contains("overhead")) {
      tools[f.name] = {{"overhead", us_text(f.values.at("overhead") * 1e-6)},
                       {"fitted_to", f.cases},
                       {"fit", fit_summary}};
      continue;
    }
    const fs::path file = fabrics_dir / (f.name + ".json");
    auto doc = config::Document::load(file);
    json j = doc.root();
    const hw::NcclFabric& v = fitted.fabrics.at(f.name);
    for (const auto& [field, value] : f.values) {
      if (field == "efficiency") j["efficiency"] = round_to(value, 1e-4);
      if (field == "p2p_efficiency") j["p2p_efficiency"] = round_to(value, 1e-4);
      if (field == "channel_busbw") {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.4g GB/s", value);
        j["channel_busbw"] = buf;
      }
      if (field == "p2p_channel_bandwidth") {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.4g GB/s", value);
        j["p2p_channel_bandwidth"] = buf;
      }
      if (field == "nvls.efficiency") j["nvls"]["efficiency"] = round_to(value, 1e-4);
      if (field == "nvls.latency") j["nvls"]["latency"] = us_text(value * 1e-6);
      if (field == "nvls.loop_latency") j["nvls"]["loop_latency"] = us_text(value * 1e-6);
      if (field.starts_with("step_latency.") || field == "hop_latency" ||
          field == "simple_hop_latency") {
        j["step_latency"] = {{"LL", us_text(v.step_latency[0].seconds())},
                             {"LL128", us_text(v.step_latency[1].seconds())},
                             {"Simple", us_text(v.step_latency[2].seconds())}};
      }
    }
    j["fitted_to"] = f.cases;
    j["fit"] = fit_summary;
    files::write_atomically(file, j.dump(2) + "\n");
  }
  if (!tools.empty()) {
    json t = {{"source",
               "The fixed time a measuring tool adds to every call it times (all_reduce_bench.py: "
               "torch.distributed from Python), fitted by stratasim fit --collectives "
               "(study/collective_fit.hpp) to the cases in fitted_to; nccl-tests adds none."},
              {"tools", tools}};
    files::write_atomically(fabrics_dir / "tools.json", t.dump(2) + "\n");
  }
  return out;
}

}  // namespace stratasim::study
