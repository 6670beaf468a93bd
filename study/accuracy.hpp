// The accuracy table: the simulator's predictions against the published measurements of the
// calibration set (tests/reference/calibration.json: its "conventions", "sources" and, per case,
// config / measured / units / notes), row by row. docs/accuracy.md says what is compared and
// how each case is mapped.
//
// - End to end (category "e2e_training"): each case the project can express becomes an
//   Experiment (a JSON document through study::from_json, so the loader validates it) and goes
//   through study::simulate. The compared quantity is tokens/s per GPU when the case gives it
//   (measured or derived by the collector), else the step time in seconds. Cases it cannot
//   express (a device not modelled, fp8, MoE, context parallelism, LoRA, a precision not
//   printed, ...) are listed with every reason that applies, decided by explicit rules.
// - Kernel level (with AccuracyOptions::kernels): each "gemm" case as one strategies::Gemm of
//   its shape and dtype, and each point of the FlashAttention-2/-3 series of "attention_kernel"
//   as a strategies::Attention (forward, backward, or both: the two times added), costed by
//   sim::DeviceCostModel on the catalog device the case's GPU maps to. Published TFLOP/s count
//   FLOPs as the source does (GEMM: 2 m n k per group; attention: attention_benchmark_flops).
//
// Error: signed, (predicted - published) / published; summaries use |error|.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratasim::study {

/// The bounds the accuracy gate (tests/accuracy/, ctest label "accuracy") holds the table to:
/// over the expressible end-to-end rows, mean |error| and the largest |error|; every compared
/// GEMM case and FlashAttention point within kKernelMaxError.
inline constexpr double kE2eMeanErrorBound = 0.05;
inline constexpr double kE2eMaxErrorBound = 0.15;
inline constexpr double kKernelMaxError = 0.10;

enum class AccuracyLevel { e2e, gemm, attention };
std::string_view name_of(AccuracyLevel level);  // "e2e", "gemm", "attention"

/// One compared row: a case (end to end, GEMM) or one point of an attention series.
struct AccuracyRow {
  AccuracyLevel level = AccuracyLevel::e2e;
  std::string id;      // the case id; an attention point: "<case id>/s<seqlen>"
  std::string source;  // the case's source.ref
  /// What rows are grouped and plotted by: the source (end to end, GEMM) or the attention
  /// series ("FlashAttention-2 on A100-SXM4-80GB, fwd+bwd, causal, head dim 64").
  std::string series;
  std::string device;     // the GPU as the case names it
  std::string mapped_to;  // the catalog cluster (end to end) or device (kernels) simulated
  std::string quantity;   // "tokens/s per GPU", "step time (s)" or "TFLOP/s"
  double published = 0;
  double predicted = 0;
  double error = 0;  // (predicted - published) / published
  /// What else the reader should know: a predicted out-of-memory, a device stood in for
  /// another ("H800 costed as H100"), ... Empty when nothing.
  std::string note;
};

/// A case (or an attention point) not compared, and why.
struct Unexpressed {
  AccuracyLevel level = AccuracyLevel::e2e;
  std::string id;
  std::string source;
  std::string reason;  // every reason that applies, joined by "; "
};

struct AccuracyOptions {
  bool e2e = true;       // the end-to-end table
  bool kernels = false;  // the GEMM and attention tables
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

/// The shipped calibration set: tests/reference/calibration.json next to config_dir() (the
/// source tree's, or STRATASIM_CONFIG_DIR's parent).
std::filesystem::path default_calibration();

/// Reads `calibration` and compares what `options` asks for. Throws config::ConfigError naming
/// the file and the JSON path of anything malformed (a missing or mistyped field the mapping
/// needs, a shape that does not parse).
AccuracyReport accuracy(const std::filesystem::path& calibration,
                        const AccuracyOptions& options = {});

/// The rows of `level`: "all" first, then one summary per group (the source for end to end and
/// GEMM, the series for attention), in order of first appearance.
std::vector<ErrorSummary> summaries(const AccuracyReport& report, AccuracyLevel level);

/// FLOPs of one attention benchmark point as FlashAttention's benchmarks count them
/// (benchmarks/benchmark_flash_attention.py; the calibration source's notes): forward
/// 4 * batch * seqlen^2 * heads * head_dim, halved when causal; backward 2.5 times the forward,
/// forward + backward 3.5 times. `pass` is "fwd", "bwd" or "fwd+bwd".
double attention_benchmark_flops(std::int64_t batch, std::int64_t seqlen, std::int64_t heads,
                                 std::int64_t head_dim, bool causal, std::string_view pass);

/// The report as JSON: {"calibration", "cases", "bounds", "rows", "unexpressed",
/// "other_categories", "summary": {"e2e": [...], "gemm": [...], "attention": [...]}}; field
/// names as the structs above. The notebook (notebooks/accuracy.ipynb) reads this.
nlohmann::json to_json(const AccuracyReport& report);

}  // namespace stratasim::study
