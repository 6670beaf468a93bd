// Writers of a run's files: the Chrome trace (opens in Perfetto and chrome://tracing),
// memory.csv, and the atomic writing of an output folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "strategies/program.hpp"
#include "traces/report.hpp"
#include "traces/timeline.hpp"

namespace stratasim::traces {

/// Which ranks the timeline and memory files cover (the report always covers all): a run of
/// thousands of ranks makes gigabytes of trace that Perfetto cannot open, so large runs write
/// a representative subset.
struct ExportOptions {
  std::vector<std::int32_t> ranks;  // empty: every rank
  /// The cluster the run was simulated on (a catalog name or a path), recorded so that a
  /// replay finds it; empty: the name at the start of the context's "cluster" setup line.
  std::string cluster;
  /// The report's context (batch, tokens, peak rate, setup lines), recorded so that a replay
  /// reports throughput and MFU like the original; write_outputs passes its own.
  const ReportContext* context = nullptr;
};

/// Chrome trace event format: pid = rank, tid = stream, one complete ("X") event per op with
/// its label, phase, microbatch and layers; memory per rank and tier as counter ("C") events;
/// process and thread names as metadata. Timestamps in microseconds with picosecond digits.
/// It is also replayable (`stratasim replay --format stratasim`, docs/replay.md): every X event
/// carries its op's dependencies, kernel list, collective dtype and memory effects, and a
/// top-level "stratasim" object holds the groups, kernel lists, mirroring, initial memory,
/// cluster and report context.
void write_chrome_trace(std::ostream& out, const strategies::Program& program,
                        const Timeline& timeline, const ExportOptions& options = {});

/// memory.csv: rank,tier,time_s,total_bytes,op,label — one row per change of allocation.
void write_memory_csv(std::ostream& out, const strategies::Program& program,
                      const Timeline& timeline, const ExportOptions& options = {});

/// Writes report.json, timeline.json and memory.csv into `dir` (created if needed). Files are
/// written to temporaries beside their targets first and renamed into place only when all are
/// complete (files::StagedWrites, hw_models/files.hpp), so a failure leaves nothing
/// half-written. Throws std::runtime_error on failure.
void write_outputs(const std::filesystem::path& dir, const strategies::Program& program,
                   const Timeline& timeline, const Report& report, const ReportContext& context,
                   const ExportOptions& options = {});

}  // namespace stratasim::traces
