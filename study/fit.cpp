#include "study/fit.hpp"

#include "study/nelder_mead.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "sim/cost.hpp"
#include "study/accuracy.hpp"

namespace stratasim::study {

namespace {

/// GEMM cases (over at least 3 values of k) needed to fit a dtype's k_overhead, wave_loss and
/// latency rather than keep their defaults.
constexpr std::size_t kMinShapeCases = 8;
/// k_overhead where the cases cannot tell: the prologue and epilogue of a 128 x 128 output tile
/// taken as two 64-deep k stages of the main loop (one filling the pipeline, one draining it
/// and writing C). A documented assumption, not a fit.
constexpr double kDefaultKOverhead = 128;

/// The GEMM kernel class costed as DeepGEMM runs it (hw::DeepGemmModel): block-scaled FP8.
bool deepgemm_class(const hw::GemmClass& cls) {
  return cls == hw::GemmClass{DType::fp8, hw::GemmScaling::block};
}
/// DeepGEMM's parameters where the cases cannot tell them (fewer than kMinShapeCases, or fewer
/// than 3 values of k): round figures of the fitted H100 model (docs/gemm-efficiency.md), a
/// documented assumption for a device measured at a few shapes only; its peak_fraction and
/// memory_fraction are still fitted.
constexpr hw::DeepGemmModel kDefaultDeepGemm{.memory_fraction = 0.9,
                                             .overlap = 1.8,
                                             .load_latency = 0.85e-6,
                                             .tile_latency = 1.3e-6,
                                             .predicated_promotion = 0.87};
constexpr double kDefaultDeepGemmLatency = 0.8e-6;

/// A fitted parameter: an unconstrained x mapped to its value (a fraction in (0, 1) through the
/// logistic function, a positive number through exp) and applied to the models.
struct Param {
  std::string name;
  bool fraction = false;
  double initial = 0;  // the value to start from
  std::function<void(std::vector<hw::KernelModel>&, double)> apply;

  double value(double x) const { return fraction ? 1 / (1 + std::exp(-x)) : std::exp(x); }
  double start() const { return fraction ? std::log(initial / (1 - initial)) : std::log(initial); }
};

struct Block {
  std::string name;  // "gemm", "attention flash-attention-2"
  std::vector<Param> params;
  std::vector<std::pair<std::size_t, const KernelCase*>> cases;  // (device index, case)
};

/// DeepGEMM's shape parameters, shared by the devices of `gemm` (the kernel class's): the
/// kernel's latency, the compute/memory overlap exponent, the pipeline round trip, the per-tile
/// epilogue and the predicated promotion's rate. Started from kDefaultDeepGemm.
void add_deepgemm_params(Block& gemm, const hw::GemmClass& cls) {
  auto shared = [cls](auto set) {
    return [cls, set](std::vector<hw::KernelModel>& ms, double v) {
      for (auto& m : ms) {
        if (auto& g = m.gemm_slot(cls.dtype, cls.scaling)) set(*g, v);
      }
    };
  };
  const hw::DeepGemmModel& d = kDefaultDeepGemm;
  gemm.params.push_back({"latency", false, kDefaultDeepGemmLatency,
                         shared([](hw::GemmModel& g, double v) { g.latency = v; })});
  // overlap - 1 > 0: the exponent is at least 1 (no overlap).
  gemm.params.push_back({"overlap - 1", false, d.overlap - 1,
                         shared([](hw::GemmModel& g, double v) { g.deepgemm->overlap = 1 + v; })});
  gemm.params.push_back({"load_latency", false, d.load_latency,
                         shared([](hw::GemmModel& g, double v) { g.deepgemm->load_latency = v; })});
  gemm.params.push_back({"tile_latency", false, d.tile_latency,
                         shared([](hw::GemmModel& g, double v) { g.deepgemm->tile_latency = v; })});
  gemm.params.push_back(
      {"predicated_promotion", true, d.predicated_promotion,
       shared([](hw::GemmModel& g, double v) { g.deepgemm->predicated_promotion = v; })});
}

double squared_log_error(const std::vector<hw::DeviceSpec>& devices,
                         const std::vector<hw::KernelModel>& models, const Block& block) {
  double sum = 0;
  std::map<std::size_t, hw::DeviceSpec> with_model;
  for (const auto& [d, c] : block.cases) {
    auto it = with_model.find(d);
    if (it == with_model.end()) {
      hw::DeviceSpec spec = devices[d];
      spec.kernel_model = std::make_shared<const hw::KernelModel>(models[d]);
      it = with_model.emplace(d, std::move(spec)).first;
    }
    const double e = std::log(predicted_seconds(it->second, *c) / c->measured_seconds);
    sum += e * e;
  }
  return sum;
}

/// Fits `block`'s parameters, applying them to `models`.
void fit_block(const std::vector<hw::DeviceSpec>& devices, std::vector<hw::KernelModel>& models,
               const Block& block, int max_evaluations) {
  if (block.params.empty() || block.cases.empty()) return;
  auto objective = [&](const std::vector<double>& x) {
    std::vector<hw::KernelModel> trial = models;
    for (std::size_t i = 0; i < x.size(); ++i)
      block.params[i].apply(trial, block.params[i].value(x[i]));
    return squared_log_error(devices, trial, block);
  };
  std::vector<double> x(block.params.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = block.params[i].start();
  Minimum m{x, objective(x), false};
  // Restart from the best point until a restart no longer improves it.
  for (int restart = 0; restart < 8; ++restart) {
    const Minimum next = nelder_mead(objective, m.x, 0.3, max_evaluations, 1e-12);
    const bool improved = next.f < m.f - 1e-10;
    m = next.f <= m.f ? next : m;
    m.converged = next.converged;
    if (!improved && next.converged) break;
  }
  if (!m.converged) {
    throw BadInput("the fit of " + block.name + " did not converge within " +
                   std::to_string(max_evaluations) + " evaluations per run (" +
                   std::to_string(block.params.size()) + " parameters, " +
                   std::to_string(block.cases.size()) + " cases, last rms error of ln(time) " +
                   std::to_string(std::sqrt(m.f / static_cast<double>(block.cases.size()))) +
                   "): check its cases, or give it more evaluations (--max-evaluations)");
  }
  for (std::size_t i = 0; i < m.x.size(); ++i)
    block.params[i].apply(models, block.params[i].value(m.x[i]));
}

bool forward_only(const KernelCase& c) {
  return std::none_of(c.kernels.begin(), c.kernels.end(), [](const strategies::Kernel& k) {
    return std::get<strategies::Attention>(k.work).backward;
  });
}

bool has_backward(const KernelCase& c) {
  return !forward_only(c);
}

hw::AttentionImpl impl_of(const KernelCase& c) {
  return std::get<strategies::Attention>(c.kernels.front().work).impl;
}

/// The GEMM kernel class of a GEMM case (its dtype, and for FP8 its scaling).
bool in_class(const KernelCase& c, const hw::GemmClass& cls) {
  if (c.attention) return false;
  const auto& g = std::get<strategies::Gemm>(c.kernels.front().work);
  return hw::gemm_class_of(g.dtype, g.scaling) == cls;
}

std::string gemm_class_name(const KernelCase& c) {
  const auto& g = std::get<strategies::Gemm>(c.kernels.front().work);
  return hw::KernelModel::gemm_key(g.dtype, g.scaling);
}

// A kernel class `impl` measured on some devices only, carried to a device without its
// measurements through a class `via` measured there: its forward rate relative to `via` (the
// geometric mean over the devices that measured both) is taken as a property of the kernel
// class, as are its backward/forward ratio, sequence fall-off and head-dimension factors. The
// borrowed model lists the cases of both classes it came from.
void borrow_attention(std::vector<hw::KernelModel>& models, hw::AttentionImpl impl,
                      hw::AttentionImpl via) {
  const auto i = static_cast<std::size_t>(impl);
  const auto v = static_cast<std::size_t>(via);
  double log_ratio = 0;
  int measured = 0;
  std::optional<hw::AttentionModel> shape;
  std::vector<std::string> donor_cases;
  for (const auto& m : models) {
    if (!m.attention[i] || !m.attention[v] || m.attention[i]->cases.empty()) continue;
    log_ratio += std::log(m.attention[i]->forward / m.attention[v]->forward);
    ++measured;
    if (!shape) shape = m.attention[i];
    for (const auto& id : m.attention[i]->cases) {
      if (std::find(donor_cases.begin(), donor_cases.end(), id) == donor_cases.end()) {
        donor_cases.push_back(id);
      }
    }
  }
  if (measured == 0) return;
  const double ratio = std::exp(log_ratio / measured);
  const double backward_ratio = shape->backward / shape->forward;
  for (auto& m : models) {
    if (m.attention[i] || !m.attention[v]) continue;
    hw::AttentionModel a = *shape;
    a.forward = std::min(1.0, m.attention[v]->forward * ratio);
    a.backward = std::min(1.0, a.forward * backward_ratio);
    a.cases = donor_cases;
    a.cases.insert(a.cases.end(), m.attention[v]->cases.begin(), m.attention[v]->cases.end());
    m.attention[i] = std::move(a);
  }
}

}  // namespace

double predicted_seconds(const hw::DeviceSpec& device, const KernelCase& c) {
  const sim::DeviceCostModel cost(device);
  Time total;
  for (const auto& k : c.kernels) total += cost.kernel_time(k) - cost.launch_overhead();
  return total.seconds();
}

FitResult fit_kernel_models(const std::vector<hw::DeviceSpec>& devices,
                            const std::vector<KernelCase>& cases, const std::string& source,
                            const FitOptions& options) {
  FitResult result;
  std::vector<std::vector<KernelCase>> per_device;
  for (const auto& d : devices) {
    if (d.is_fpga()) throw BadInput(d.name + ": kernel models are fitted for GPUs only");
    per_device.push_back(cases_for(cases, d));
    if (per_device.back().empty()) {
      std::string names;
      for (const auto& n : d.published_names) names += (names.empty() ? "" : ", ") + n;
      throw BadInput(d.name + ": no calibration case was measured on it (its published_names: " +
                     (names.empty() ? "none" : names) + ")");
    }
    hw::KernelModel m;
    m.device = d.name;
    m.source = source;
    result.models.push_back(std::move(m));
  }
  // The devices as fitted: without a kernel model or a profile of their own.
  std::vector<hw::DeviceSpec> bare = devices;
  for (auto& d : bare) {
    d.kernel_model.reset();
    d.profile.reset();
  }

  // GEMMs, one block per kernel class (a dtype; FP8 tensor- and block-scaled apart):
  // peak_fraction per device; k_overhead, wave_loss and latency shared by the devices (the
  // class's), fitted only when the class's cases vary the shape enough to tell them apart
  // (kMinShapeCases cases over at least 3 values of k), else kept at their documented defaults
  // (GemmModel's; k_overhead kDefaultKOverhead).
  for (const hw::GemmClass& cls : hw::kGemmClasses) {
    Block gemm{"gemm " + hw::KernelModel::gemm_key(cls.dtype, cls.scaling), {}, {}};
    std::set<std::int64_t> ks;
    for (std::size_t d = 0; d < devices.size(); ++d) {
      bool here = false;
      for (const auto& c : per_device[d]) {
        if (!in_class(c, cls)) continue;
        here = true;
        gemm.cases.emplace_back(d, &c);
        ks.insert(std::get<strategies::Gemm>(c.kernels.front().work).k);
      }
      if (!here) continue;
      auto& g = result.models[d].gemm_slot(cls.dtype, cls.scaling);
      g = hw::GemmModel{};
      g->k_overhead = kDefaultKOverhead;
      g->latency = 0;
      for (const auto& c : per_device[d]) {
        if (in_class(c, cls)) g->cases.push_back(c.id);
      }
      gemm.params.push_back({devices[d].name + " peak_fraction", true, 0.8,
                             [d, cls](std::vector<hw::KernelModel>& ms, double v) {
                               ms[d].gemm_slot(cls.dtype, cls.scaling)->peak_fraction = v;
                             }});
      if (deepgemm_class(cls)) {
        g->k_overhead = 0;
        g->deepgemm = kDefaultDeepGemm;
        g->latency = kDefaultDeepGemmLatency;
        gemm.params.push_back(
            {devices[d].name + " memory_fraction", true, 0.9,
             [d, cls](std::vector<hw::KernelModel>& ms, double v) {
               ms[d].gemm_slot(cls.dtype, cls.scaling)->deepgemm->memory_fraction = v;
             }});
      }
    }
    if (gemm.cases.empty()) continue;
    if (deepgemm_class(cls)) {
      if (gemm.cases.size() >= kMinShapeCases && ks.size() >= 3) add_deepgemm_params(gemm, cls);
      fit_block(bare, result.models, gemm, options.max_evaluations);
      continue;
    }
    if (gemm.cases.size() >= kMinShapeCases && ks.size() >= 3) {
      auto shared = [cls](auto member) {
        return [cls, member](std::vector<hw::KernelModel>& ms, double v) {
          for (auto& m : ms) {
            if (auto& g = m.gemm_slot(cls.dtype, cls.scaling)) (*g).*member = v;
          }
        };
      };
      gemm.params.push_back({"k_overhead", false, 128, shared(&hw::GemmModel::k_overhead)});
      gemm.params.push_back({"wave_loss", true, 0.5, shared(&hw::GemmModel::wave_loss)});
      gemm.params.push_back({"latency", false, 2e-6, shared(&hw::GemmModel::latency)});
    }
    fit_block(bare, result.models, gemm, options.max_evaluations);
  }

  // Attention, FlashAttention-2 first: the others may borrow its backward/forward ratio.
  double fa2_ratio = 1;
  for (hw::AttentionImpl impl :
       {hw::AttentionImpl::flash_attention_2, hw::AttentionImpl::flash_attention,
        hw::AttentionImpl::flash_attention_3, hw::AttentionImpl::cudnn,
        hw::AttentionImpl::flash_attention_triton}) {
    const std::size_t i = static_cast<std::size_t>(impl);
    Block block{"attention " + std::string(hw::name_of(impl)), {}, {}};
    bool any_forward_only = false, any_backward = false, any_causal = false, any_plain = false;
    bool any_64 = false, any_256 = false;
    for (std::size_t d = 0; d < devices.size(); ++d) {
      bool here = false;
      for (const auto& c : per_device[d]) {
        if (!c.attention || impl_of(c) != impl) continue;
        here = true;
        block.cases.emplace_back(d, &c);
        any_forward_only |= forward_only(c);
        any_backward |= has_backward(c);
        const auto& a = std::get<strategies::Attention>(c.kernels.front().work);
        (a.causal ? any_causal : any_plain) = true;
        any_64 |= a.head_dim <= 64;
        any_256 |= a.head_dim >= 256;
      }
      if (!here) continue;
      auto& model = result.models[d].attention[i];
      model = hw::AttentionModel{};
      for (const auto& c : per_device[d]) {
        if (c.attention && impl_of(c) == impl) model->cases.push_back(c.id);
      }
      block.params.push_back({devices[d].name + " forward", true, 0.5,
                              [d, i](std::vector<hw::KernelModel>& ms, double v) {
                                auto& a = *ms[d].attention[i];
                                const double ratio = a.forward > 0 ? a.backward / a.forward : 1;
                                a.forward = v;
                                a.backward = std::min(1.0, v * ratio);
                              }});
    }
    if (block.cases.empty()) continue;
    const bool ratio_free = any_forward_only && any_backward;
    const double fixed_ratio = impl == hw::AttentionImpl::flash_attention_2 ? 1 : fa2_ratio;
    for (auto& m : result.models) {
      if (auto& a = m.attention[i]) a->backward = std::min(1.0, a->forward * fixed_ratio);
    }
    auto each = [i](std::vector<hw::KernelModel>& ms, auto&& set) {
      for (auto& m : ms) {
        if (m.attention[i]) set(*m.attention[i]);
      }
    };
    // The ratio is applied after the forward fractions (params are applied in order).
    if (ratio_free) {
      block.params.push_back(
          {"backward/forward", false, 0.8, [each](std::vector<hw::KernelModel>& ms, double v) {
             each(ms, [v](hw::AttentionModel& a) { a.backward = std::min(1.0, a.forward * v); });
           }});
    }
    if (any_plain) {
      block.params.push_back(
          {"seq_half", false, 300, [each](std::vector<hw::KernelModel>& ms, double v) {
             each(ms, [v](hw::AttentionModel& a) { a.seq_half = v; });
           }});
    }
    if (any_causal) {
      block.params.push_back(
          {"causal_seq_half", false, 600, [each](std::vector<hw::KernelModel>& ms, double v) {
             each(ms, [v](hw::AttentionModel& a) { a.causal_seq_half = v; });
           }});
    }
    if (any_64) {
      block.params.push_back(
          {"head_dim_64", false, 0.9, [each](std::vector<hw::KernelModel>& ms, double v) {
             each(ms, [v](hw::AttentionModel& a) { a.head_dim_64 = v; });
           }});
    }
    if (any_256) {
      block.params.push_back(
          {"head_dim_256", false, 1.0, [each](std::vector<hw::KernelModel>& ms, double v) {
             each(ms, [v](hw::AttentionModel& a) { a.head_dim_256 = v; });
           }});
    }
    // The causal asymptote is told apart only where both masks were measured.
    if (any_causal && any_plain) {
      block.params.push_back(
          {"causal_factor", false, 1.0, [each](std::vector<hw::KernelModel>& ms, double v) {
             each(ms, [v](hw::AttentionModel& a) { a.causal_factor = v; });
           }});
    }
    fit_block(bare, result.models, block, options.max_evaluations);
    if (impl == hw::AttentionImpl::flash_attention_2) {
      for (const auto& m : result.models) {
        if (const auto& a = m.attention[i]) {
          fa2_ratio = a->backward / a->forward;
          break;
        }
      }
    }
  }

  // FlashAttention in Triton is measured on the A100 only; the other devices take it through
  // FlashAttention (v1), measured on every GPU fitted (borrow_attention).
  borrow_attention(result.models, hw::AttentionImpl::flash_attention_triton,
                   hw::AttentionImpl::flash_attention);

  // Residuals and per-block statistics, under the fitted models.
  for (std::size_t d = 0; d < devices.size(); ++d) {
    hw::DeviceSpec spec = bare[d];
    spec.kernel_model = std::make_shared<const hw::KernelModel>(result.models[d]);
    std::map<std::string, std::vector<double>> errors;
    for (const auto& c : per_device[d]) {
      FitResidual r{devices[d].name, c.id, c.series, c.measured_seconds,
                    predicted_seconds(spec, c)};
      errors[c.attention ? "attention " + std::string(hw::name_of(impl_of(c)))
                         : "gemm " + gemm_class_name(c)]
          .push_back(std::abs(r.error()));
      result.residuals.push_back(std::move(r));
    }
    nlohmann::json fit = nlohmann::json::object();
    for (const auto& [name, e] : errors) {
      const double mean = std::accumulate(e.begin(), e.end(), 0.0) / static_cast<double>(e.size());
      fit[name] = {
          {"cases", e.size()},
          {"mean_abs_error", std::round(mean * 1e4) / 1e4},
          {"max_abs_error", std::round(*std::max_element(e.begin(), e.end()) * 1e4) / 1e4}};
    }
    result.models[d].fit = fit;
    result.models[d].validate();
  }
  return result;
}

namespace {

double round4(double v) {
  return std::round(v * 1e4) / 1e4;
}

// The parameters of the joint fit, in the order of the vector Nelder-Mead varies: per fitted
// framework logit(compute_efficiency), ln(elementwise_traffic - 1) and (when the runs span
// enough sequence lengths) ln(attention_efficiency); per fitted die ln(gemm), ln(attention).
struct Layout {
  struct FrameworkSlot {
    std::string name;
    std::size_t at = 0;
    bool attention_free = false;
  };
  std::vector<FrameworkSlot> frameworks;
  std::vector<std::pair<std::string, std::size_t>> dies;
  std::size_t size = 0;

  std::tuple<double, double, double> framework(const FrameworkSlot& f,
                                               const std::vector<double>& x) const {
    return {1 / (1 + std::exp(-x[f.at])), 1 + std::exp(x[f.at + 1]),
            f.attention_free ? std::clamp(std::exp(x[f.at + 2]), 0.1, 10.0) : 1.0};
  }
  strategies::DieTraining die(std::size_t at, const std::vector<double>& x) const {
    return {.gemm = std::clamp(std::exp(x[at]), 0.2, 5.0),
            .attention = std::clamp(std::exp(x[at + 1]), 0.2, 5.0)};
  }
  TrainingOverrides overrides(const std::vector<double>& x) const {
    TrainingOverrides o;
    for (const auto& f : frameworks) {
      const auto [compute, traffic, attention] = framework(f, x);
      o.by_framework[f.name] = {{"compute_efficiency", compute},
                                {"elementwise_traffic", traffic},
                                {"attention_efficiency", attention}};
    }
    for (const auto& [name, at] : dies) o.by_die[name] = die(at, x);
    return o;
  }
};

// |error| statistics of the rows `keep` selects.
template <class Keep>
std::tuple<double, double, std::vector<std::string>> errors_of(const AccuracyReport& report,
                                                               Keep keep) {
  double sum = 0, max = 0;
  std::vector<std::string> ids;
  for (const auto& r : report.rows) {
    if (!keep(r)) continue;
    sum += std::abs(r.error);
    max = std::max(max, std::abs(r.error));
    ids.push_back(r.id);
  }
  return {ids.empty() ? 0 : sum / static_cast<double>(ids.size()), max, ids};
}

}  // namespace

TrainingFit fit_frameworks(const std::filesystem::path& calibration, const FitOptions& options) {
  std::map<std::string, int> rows_of;
  std::map<std::string, std::set<std::int64_t>> seq_lens_of;
  const AccuracyReport shipped = accuracy(calibration);  // with the fitted values as shipped
  for (const auto& r : shipped.rows) {
    ++rows_of[r.framework];
    seq_lens_of[r.framework].insert(r.experiment.at("training").at("seq_len").get<std::int64_t>());
  }
  Layout layout;
  std::set<std::string> fitted_frameworks;
  for (const auto& [framework, rows] : rows_of) {
    if (rows < kMinFrameworkRows) continue;
    // attention_efficiency is told apart from compute_efficiency only by how the attention
    // share of a step grows with the sequence: fitted when the runs span enough lengths, else 1.
    const auto& seqs = seq_lens_of[framework];
    const bool attention_free = static_cast<int>(seqs.size()) >= kMinAttentionSeqLens &&
                                *seqs.rbegin() >= kMinAttentionSeqSpan * *seqs.begin();
    layout.frameworks.push_back({framework, layout.size, attention_free});
    layout.size += attention_free ? 3 : 2;
    fitted_frameworks.insert(framework);
  }
  // The dies of the fitted frameworks' runs: the one with the most runs is the reference (ties:
  // the first by name), the others with enough runs get factors of their own.
  std::map<std::string, int> rows_of_die;
  for (const auto& r : shipped.rows) {
    if (fitted_frameworks.count(r.framework) != 0 && !r.die.empty()) ++rows_of_die[r.die];
  }
  TrainingFit out;
  for (const auto& [die, rows] : rows_of_die) {
    if (out.reference_die.empty() || rows > rows_of_die[out.reference_die]) {
      out.reference_die = die;
    }
  }
  for (const auto& [die, rows] : rows_of_die) {
    if (die == out.reference_die || rows < kMinDieRows) continue;
    layout.dies.emplace_back(die, layout.size);
    layout.size += 2;
  }
  if (layout.frameworks.empty()) return out;

  auto objective = [&](const std::vector<double>& x) {
    double sum = 0;
    for (const auto& r : accuracy(calibration, {}, layout.overrides(x)).rows) {
      if (fitted_frameworks.count(r.framework) == 0) continue;
      const double l = std::log(r.predicted / r.published);
      sum += l * l;
    }
    return sum;
  };
  // Start from compute 0.9 (logit 2.2), traffic 2 (ln 1 = 0), attention as costed (ln 1) and
  // every die as the reference (ln 1).
  std::vector<double> start(layout.size, 0.0);
  for (const auto& f : layout.frameworks) start[f.at] = 2.2;
  const int budget = options.max_framework_evaluations;
  Minimum m = nelder_mead(objective, start, 0.5, budget, 1e-8);
  for (int restart = 0; restart < 3 && !m.converged; ++restart) {
    m = nelder_mead(objective, m.x, 0.2, budget, 1e-8);
  }
  if (!m.converged) {
    throw BadInput("the fit of the frameworks and dies did not converge within " +
                   std::to_string(budget) + " evaluations per run (" + std::to_string(layout.size) +
                   " parameters): check the runs, or give it more evaluations "
                   "(--max-framework-evaluations)");
  }
  const AccuracyReport fitted = accuracy(calibration, {}, layout.overrides(m.x));
  for (const auto& slot : layout.frameworks) {
    FrameworkFit f;
    f.framework = slot.name;
    std::tie(f.compute_efficiency, f.elementwise_traffic, f.attention_efficiency) =
        layout.framework(slot, m.x);
    std::tie(f.mean_abs_error, f.max_abs_error, f.cases) =
        errors_of(fitted, [&](const AccuracyRow& r) { return r.framework == slot.name; });
    out.frameworks.push_back(std::move(f));
  }
  auto die_fit = [&](const std::string& name, strategies::DieTraining factors) {
    DieFit d;
    d.die = name;
    d.gemm = factors.gemm;
    d.attention = factors.attention;
    std::tie(d.mean_abs_error, d.max_abs_error, d.cases) =
        errors_of(fitted, [&](const AccuracyRow& r) {
          return r.die == name && fitted_frameworks.count(r.framework) != 0;
        });
    return d;
  };
  out.dies.push_back(die_fit(out.reference_die, {}));
  for (const auto& [name, at] : layout.dies) out.dies.push_back(die_fit(name, layout.die(at, m.x)));
  return out;
}

nlohmann::json to_json(const TrainingFit& fit) {
  nlohmann::json frameworks = nlohmann::json::object();
  for (const auto& f : fit.frameworks) {
    frameworks[f.framework] = {{"compute_efficiency", round4(f.compute_efficiency)},
                               {"elementwise_traffic", round4(f.elementwise_traffic)},
                               {"attention_efficiency", round4(f.attention_efficiency)},
                               {"runs", f.cases.size()},
                               {"mean_abs_error", round4(f.mean_abs_error)},
                               {"max_abs_error", round4(f.max_abs_error)},
                               {"cases", f.cases}};
  }
  nlohmann::json dies = nlohmann::json::object();
  for (const auto& d : fit.dies) {
    dies[d.die] = {{"gemm", round4(d.gemm)},
                   {"attention", round4(d.attention)},
                   {"reference", d.die == fit.reference_die},
                   {"runs", d.cases.size()},
                   {"mean_abs_error", round4(d.mean_abs_error)},
                   {"max_abs_error", round4(d.max_abs_error)},
                   {"cases", d.cases}};
  }
  return {{"source",
           "stratasim fit --frameworks (scripts/fit-profiles): the end-to-end runs of "
           "tests/reference/calibration.json, with the kernel models of "
           "configs/hardware/profiles"},
          {"frameworks", frameworks},
          {"dies", dies}};
}

}  // namespace stratasim::study
