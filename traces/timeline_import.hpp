// Import of stratasim's own timeline.json (traces/export.hpp writes it) as a Program, for
// `stratasim replay --format stratasim` (docs/replay.md).
//
// A timeline written by this version carries everything the Program had: per X event the op's
// dependencies, kernel list, collective group and dtype, and memory effects; a top-level
// "stratasim" object with the groups, kernel lists, mirroring, initial memory, the cluster and
// the report context. Such a trace imports exactly: replaying it on the same cluster gives the
// same iteration time. Compute ops keep their kernels (so another cluster re-costs the real
// shapes); an op whose kernel list the trace lacks becomes Measured work of its span.
//
// An older timeline (no "stratasim" object) imports approximately: compute ops become Measured
// work of their spans, ops of a (rank, stream) run in time order, an op waits for the last op
// of each other stream of its rank that ended before it started, and a group's members are
// the ranks that issue collectives on it. A note says so.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "traces/import.hpp"
#include "traces/report.hpp"

namespace stratasim::traces {

struct TimelineTrace {
  ImportedTrace trace;
  /// The report context recorded with the run (batch, tokens, peak rate, setup lines), when
  /// the timeline has one: a replay then reports throughput and MFU like the original.
  std::optional<ReportContext> context;
};

/// Imports a timeline.json, or the output folder holding one. Throws TraceError naming the
/// file, where in it (a JSON path such as "traceEvents[12].args.deps[0]", or "byte 1032" for
/// JSON that does not parse) and what was expected.
TimelineTrace import_timeline(const std::filesystem::path& path);

/// The same from text in memory; `source` names it in errors (fuzzing, tests).
TimelineTrace import_timeline_text(std::string_view text, const std::string& source);

}  // namespace stratasim::traces
