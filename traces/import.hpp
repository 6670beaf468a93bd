// Trace importers: turn a recorded run (MLCommons Chakra execution traces, PyTorch profiler /
// Kineto Chrome traces, stratasim's own timeline.json) into a Program that the simulator can
// replay on other hardware. Compute keeps its measured duration (or FLOPs/bytes, or kernel
// shapes, when the trace has them); communication becomes collectives over groups and
// sends/receives, so the network is simulated again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::traces {

/// Bounds every importer puts on the numbers it reads, so that a small malformed file cannot
/// ask for absurd work or memory: ranks per trace, bytes of one transfer or allocation, one
/// kernel dimension, one measured duration (2^56 ps, about 20 hours).
inline constexpr int kMaxTraceRanks = 1 << 20;
inline constexpr std::int64_t kMaxTraceBytes = std::int64_t{1} << 56;
inline constexpr std::int64_t kMaxTraceDim = std::int64_t{1} << 40;
inline constexpr std::int64_t kMaxTraceDurationPs = std::int64_t{1} << 56;

enum class TraceFormat {
  chakra,     // Chakra ET: one protobuf file per rank (or its JSON form), plus comm groups
  kineto,     // PyTorch profiler / Kineto Chrome-trace JSON, one file per rank
  stratasim,  // our own timeline.json
};
std::string_view name_of(TraceFormat f);
/// "chakra", "kineto" or "stratasim".
std::optional<TraceFormat> trace_format_from_name(std::string_view name);

/// A malformed or unusable trace. The message names the file, where in it (a JSON path such as
/// "traceEvents[12].args.Group size", or "node 41" / "byte 1032" in a protobuf), and what was
/// expected: "trace.0.et: node 7: data_deps names node 99, which the trace does not have".
class TraceError : public std::runtime_error {
 public:
  TraceError(std::string file, std::string where, std::string message);
  const std::string& file() const { return file_; }
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_, where_, message_;
};

struct ImportedTrace {
  strategies::Program program;
  /// What the importer approximated or skipped, one line each ("rank 3: 12 CPU ops without a
  /// device kernel ignored"), for the user to read.
  std::vector<std::string> notes;
  /// The cluster the trace was recorded (or simulated) on, when the trace says so (stratasim
  /// traces name it): a path or a shipped cluster name.
  std::optional<std::string> cluster;
  /// Lines for the report's setup (traces::ReportContext::setup) that describe what was
  /// recorded, e.g. {"recorded steps", "5 ProfilerStep spans: ..."} (Kineto).
  std::vector<std::pair<std::string, std::string>> setup{};
  /// The trace is some ranks of a larger job, replayed with their communication as measured
  /// (fixed durations, not simulated): it cannot be re-targeted to another width.
  bool measured_communication = false;
};

/// Imports `path` as `format`. What `path` is depends on the format: a Chakra trace is a
/// folder or a file prefix whose per-rank files are "<prefix>.<rank>.et" (or ".json"); a
/// Kineto trace is one file per rank (a folder of them, or a single file for one rank); a
/// stratasim trace is a timeline.json (or the output folder holding one). Throws TraceError.
ImportedTrace import_trace(const std::filesystem::path& path, TraceFormat format);

}  // namespace stratasim::traces
