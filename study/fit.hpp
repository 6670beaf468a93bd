// Fitting calibrated kernel models (hw_models/kernel_model.hpp) to published kernel measurements
// (study/calibration_set.hpp): what `stratasim calibrate --fit` runs and scripts/fit-profiles
// re-runs for the shipped devices. docs/gemm-efficiency.md explains the parameters.
//
// Which parameter is a property of what (no parameter belongs to one case, one model or one run):
// - GEMM k_overhead: of the kernel class (tiled tensor-core GEMMs), shared by every device and
//   dtype fitted together;
// - GEMM peak_fraction: of a device and dtype;
// - block-scaled FP8 (DeepGEMM, hw::DeepGemmModel): memory_fraction of a device, like
//   peak_fraction; latency, overlap, load_latency, tile_latency and predicated_promotion of the
//   kernel class (it has no k_overhead or wave_loss: DeepGEMM's own tiles and waves are run);
// - attention forward fraction: of a device and an implementation;
// - attention backward/forward ratio, seq_half, causal_seq_half and the head-dim factors: of an
//   implementation (the kernel class), shared by the devices. An implementation whose cases
//   cannot separate forward from backward (only forward + backward sweeps) takes
//   FlashAttention-2's ratio; one with no cases at some head dimension keeps the factor 1.
//   causal_seq_half is fitted at head dimension 128; how the causal excess scales with the head
//   dimension is the kernel's tile (hw::causal_diagonal_span), not a fitted parameter.
//   FlashAttention in Triton, measured on the A100 only, reaches the other devices through
//   FlashAttention (v1): its forward fraction relative to v1's is taken as the kernel class's
//   (the fitted model then lists the cases of both series it came from).
// - training frameworks (fit_frameworks): compute_efficiency, elementwise_traffic and
//   attention_efficiency of a framework, shared by all its runs and devices.
// Objective: the sum over cases of ln(predicted / measured)^2, predicted = the summed work time
// of the case's kernels under DeviceCostModel (launch overhead excluded, as the sources time
// kernels back to back). Minimised by Nelder-Mead over unconstrained transforms of the
// parameters (logit of fractions, ln of positive numbers), restarted until it stops improving.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hw_models/device.hpp"
#include "hw_models/kernel_model.hpp"
#include "study/calibration_set.hpp"
#include "study/errors.hpp"

namespace stratasim::study {

/// One case's prediction under the fitted models.
struct FitResidual {
  std::string device;  // DeviceSpec::name
  std::string case_id;
  std::string series;
  double measured_seconds = 0;
  double predicted_seconds = 0;
  double error() const { return predicted_seconds / measured_seconds - 1; }
};

struct FitResult {
  std::vector<hw::KernelModel> models;  // one per device, in the order given
  std::vector<FitResidual> residuals;
};

/// The fits' budget: objective evaluations per Nelder-Mead run (each fit restarts from its best
/// point until a restart stops improving, at most 8 times for a kernel block, 4 for a
/// framework). A fit that has not converged within it is an error (BadInput), never a result.
struct FitOptions {
  int max_evaluations = 20000;           // per run of a kernel block
  int max_framework_evaluations = 2000;  // per run of the frameworks' fit (each runs the e2e rows)
};

/// Fits one kernel model per device to the cases measured on it (cases_for). `source` goes into
/// each model's "source". Throws BadInput when a device has no cases, or when a fit does not
/// converge (the message says which block, its budget and its last error).
FitResult fit_kernel_models(const std::vector<hw::DeviceSpec>& devices,
                            const std::vector<KernelCase>& cases, const std::string& source,
                            const FitOptions& options = {});

/// A training framework's kernel efficiency (strategies::TrainingSpec::compute_efficiency,
/// elementwise_traffic and attention_efficiency), fitted to the end-to-end runs of the
/// calibration set that used it (study::accuracy's rows of that framework): the share of the
/// devices' calibrated GEMM and attention rates its kernels reach inside a training step, the
/// multiple of the modelled memory-bound bytes its (unfused) operations move, and how much
/// faster its fused attention runs than the kernel class it is costed as (the runs' attention
/// share grows with the sequence length, which tells it apart from compute_efficiency). All are
/// shared by every device and run of the framework; the kernel models stay as fitted.
/// Objective: the sum over the rows of ln(predicted / published)^2, by Nelder-Mead over
/// logit(compute_efficiency), ln(elementwise_traffic - 1) and ln(attention_efficiency).
struct FrameworkFit {
  std::string framework;
  double compute_efficiency = 1;
  double elementwise_traffic = 1;
  double attention_efficiency = 1;
  std::vector<std::string> cases;  // the rows it was fitted to
  double mean_abs_error = 0;       // over them, after the fit
  double max_abs_error = 0;
};

/// A GPU die's factors (strategies::DieTraining), fitted with the frameworks: the share of its
/// calibrated kernel model's GEMM and fused-attention rates its kernels hold inside training
/// steps, relative to the reference die (the die with the most runs, which keeps 1: a framework
/// factor multiplies every die alike, so the runs tell only dies apart).
struct DieFit {
  std::string die;
  double gemm = 1;
  double attention = 1;
  std::vector<std::string> cases;  // the runs on it (of the fitted frameworks)
  double mean_abs_error = 0;       // over them, after the fit
  double max_abs_error = 0;
};

struct TrainingFit {
  std::vector<FrameworkFit> frameworks;
  std::vector<DieFit> dies;  // the reference die first
  std::string reference_die;
};

/// Fits every framework with at least kMinFrameworkRows expressible end-to-end rows in
/// `calibration`, and every die other than the reference with at least kMinDieRows of their
/// rows, together: one Nelder-Mead over all parameters (FrameworkFit's, and ln of each die's
/// two factors), minimising the sum over those rows of ln(predicted / published)^2. Throws
/// BadInput when the fit does not converge.
TrainingFit fit_frameworks(const std::filesystem::path& calibration,
                           const FitOptions& options = {});
inline constexpr int kMinFrameworkRows = 5;
inline constexpr int kMinDieRows = 20;
/// attention_efficiency is fitted only when the framework's runs have at least
/// kMinAttentionSeqLens sequence lengths, the longest kMinAttentionSeqSpan times the shortest;
/// otherwise it stays 1 (the kernel class as calibrated).
inline constexpr int kMinAttentionSeqLens = 3;
inline constexpr std::int64_t kMinAttentionSeqSpan = 4;

/// The fit as JSON (configs/frameworks.json): {"source", "frameworks": {name: {...}},
/// "dies": {name: {"gemm", "attention", "reference", "runs", ...}}}.
nlohmann::json to_json(const TrainingFit& fit);

/// The predicted duration of a case on `device` (its kernel model, profile and efficiency as
/// they are): the work time of its kernels, launch overhead excluded.
double predicted_seconds(const hw::DeviceSpec& device, const KernelCase& c);

}  // namespace stratasim::study
