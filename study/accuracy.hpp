// The accuracy table: the simulator's predictions against the published measurements of the
// calibration set (tests/reference/calibration.json: its "conventions", "sources" and, per case,
// config / measured / units / notes), row by row. docs/accuracy.md says what is compared and
// how each case is mapped.
//
// - End to end (category "e2e_training"): each case the project can express becomes an
//   Experiment (a JSON document through study::from_json, so the loader validates it) and goes
//   through study::simulate. The compared quantity is tokens/s per GPU when the case gives it
//   (measured or derived by the collector), else the step time in seconds. Cases it cannot
//   express (a device not modelled, a model with no shape given or in the catalog, LoRA, a
//   precision or an expert layout not printed, ...) are listed with every reason that applies,
//   decided by explicit rules.
// - Kernel level (with AccuracyOptions::kernels): the kernel cases of study/calibration_set.hpp
//   (GEMMs at their shapes and dtypes, every point of the fused-attention series:
//   FlashAttention 1, 2, 3 and cuDNN), costed by study::predicted_seconds (work time, launch
//   excluded) on the first shipped GPU whose published_names list the case's GPU. Published
//   TFLOP/s count FLOPs as the source does (KernelCase::flops).
// - Collectives (with AccuracyOptions::collectives): every point of the calibration set's
//   collective sweeps (study/collective_fit.hpp says how cases map to shipped clusters and
//   points), the bus bandwidth the cluster's network model predicts (the NCCL model where the
//   cluster opts in) plus the measuring tool's fitted overhead, against the published busbw
//   (GB/s). Disturbed points and unmapped systems are listed as not compared.
// - MoE all-to-all (with AccuracyOptions::collectives; category "moe_all_to_all"): DeepEP's
//   dispatch and combine on H800s, each a row (docs/moe.md): the normal kernels' bottleneck
//   bandwidth from the NCCL model's all-to-all on configs/hardware/clusters/dgx-h800-2048.json,
//   the low-latency kernels' latency from the network fabric's p2p rate; nothing fitted per row.
//   Held to kMoeMaxError by a ratchet (tests/study/accuracy_test.cpp).
//
// Error: signed, (predicted - published) / published; summaries use |error|.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/framework.hpp"

namespace stratasim::study {

/// The bounds the accuracy gate (tests/accuracy/, ctest label "accuracy") holds the table to:
/// over the expressible end-to-end rows, mean |error| and the largest |error|; every compared
/// GEMM case and FlashAttention point within kKernelMaxError.
inline constexpr double kE2eMeanErrorBound = 0.05;
inline constexpr double kE2eMaxErrorBound = 0.15;
inline constexpr double kKernelMaxError = 0.10;
/// Collective points (bus bandwidth): within kCollectiveLargeMaxError from kCollectiveLargeFrom
/// bytes up, within kCollectiveSmallMaxError below.
inline constexpr double kCollectiveLargeMaxError = 0.10;
inline constexpr double kCollectiveSmallMaxError = 0.25;
inline constexpr std::int64_t kCollectiveLargeFrom = 1 << 20;
/// MoE all-to-all rows (DeepEP): the bound the ratchet counts rows within.
inline constexpr double kMoeMaxError = 0.15;
/// The bound a collective row of `bytes` is held to.
constexpr double collective_bound(std::int64_t bytes) {
  return bytes >= kCollectiveLargeFrom ? kCollectiveLargeMaxError : kCollectiveSmallMaxError;
}

enum class AccuracyLevel { e2e, gemm, attention, collective, moe };
/// "e2e", "gemm", "attention", "collective", "moe"
std::string_view name_of(AccuracyLevel level);

/// One compared row: a case (end to end, GEMM) or one point of an attention series.
struct AccuracyRow {
  AccuracyLevel level = AccuracyLevel::e2e;
  std::string id;         // the case id; an attention point: "<case id>/s<seqlen>"
  std::string source;     // the case's source.ref
  std::string framework;  // end to end: the training framework the source used ("fsdp", ...)
  /// What rows are grouped and plotted by: the source (end to end, GEMM) or the attention
  /// series ("FlashAttention-2 on A100-SXM4-80GB, fwd+bwd, causal, head dim 64").
  std::string series;
  std::string device;     // the GPU as the case names it
  std::string die;        // end to end: the die of the device it was costed on (hw::DeviceSpec)
  std::string mapped_to;  // the catalog cluster (end to end) or device (kernels) simulated
  std::string quantity;   // "tokens/s per GPU", "step time (s)" or "TFLOP/s"
  double published = 0;
  double predicted = 0;
  double error = 0;  // (predicted - published) / published
  /// What else the reader should know: a predicted out-of-memory, a device stood in for
  /// another ("H800 costed as H100"), ... Empty when nothing.
  std::string note;
  /// End to end: the predicted peak memory of the fullest device over its capacity (above 1:
  /// predicted out of memory); 0 for kernel rows.
  double peak_memory_fraction = 0;
  /// Collective rows: the message size (bytes), which sets the row's bound (collective_bound).
  std::int64_t bytes = 0;
  /// End to end: the experiment the case was mapped to (the document study::from_json read),
  /// so a reader can simulate it alone; null for kernel rows.
  nlohmann::json experiment;
};

/// A case (or an attention point) not compared, and why.
struct Unexpressed {
  AccuracyLevel level = AccuracyLevel::e2e;
  std::string id;
  std::string source;
  std::string reason;  // every reason that applies, joined by "; "
};

struct AccuracyOptions {
  bool e2e = true;           // the end-to-end table
  bool kernels = false;      // the GEMM and attention tables
  bool collectives = false;  // the collective table and the MoE all-to-all table
};

struct AccuracyReport {
  std::filesystem::path calibration;  // the file read
  int cases = 0;                      // cases in the file
  std::vector<AccuracyRow> rows;
  std::vector<Unexpressed> unexpressed;
  /// Cases of the categories no table covers (collective, moe_all_to_all): category and count.
  std::vector<std::pair<std::string, int>> other_categories;
};

/// |error| statistics of a group of rows.
struct ErrorSummary {
  std::string group;  // "all", a source or a series
  int rows = 0;
  double mean_abs_error = 0;
  double max_abs_error = 0;
  int within_5 = 0;   // rows with |error| <= 5%
  int within_10 = 0;  // rows with |error| <= 10%
};

/// What the framework fit (study/fit.hpp) varies, set on the end-to-end experiments.
struct TrainingOverrides {
  /// Training settings set on the experiments of a framework ("fsdp", "generic", "megatron":
  /// AccuracyRow::framework) before they are loaded, e.g. {"fsdp": {"compute_efficiency": 0.9}}.
  std::map<std::string, nlohmann::json> by_framework;
  /// The die factors (strategies::DieTraining) of the devices of a die ("GH100"), in place of
  /// the fitted ones, once the experiments are loaded.
  std::map<std::string, strategies::DieTraining> by_die;
};

/// Reads `calibration` and compares what `options` asks for, end-to-end experiments changed as
/// `overrides` says. Throws config::ConfigError naming the file and the JSON path of anything
/// malformed (a missing or mistyped field the mapping needs, a shape that does not parse).
AccuracyReport accuracy(const std::filesystem::path& calibration,
                        const AccuracyOptions& options = {},
                        const TrainingOverrides& overrides = {});

/// The rows of `level`: "all" first, then one summary per group (the source for end to end and
/// GEMM, the series for attention), in order of first appearance.
std::vector<ErrorSummary> summaries(const AccuracyReport& report, AccuracyLevel level);

/// The report as JSON: {"calibration", "cases", "bounds", "rows", "unexpressed",
/// "other_categories", "summary": {"e2e": [...], "gemm": [...], "attention": [...],
/// "collective": [...]}}; field
/// names as the structs above. The notebook (notebooks/accuracy.ipynb) reads this.
nlohmann::json to_json(const AccuracyReport& report);

}  // namespace stratasim::study
