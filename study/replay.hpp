// Replay composed like a simulation (docs/replay.md): an imported trace (Chakra, Kineto or
// stratasim's timeline.json) becomes a Program, is re-targeted to another data-parallel width,
// given faster compute or other hardware, simulated and reported in the recorded context.
//
// --scale-compute X (compute runs X times faster): Measured kernels (durations from a trace)
// take 1/X of their time; kernels with shapes (GEMMs, attention, elementwise, roofline work)
// are costed on the cluster's device given X times its peak FLOP rates and memory bandwidth and
// 1/X of its launch overhead, so their time is divided by X too while their FLOPs still count
// for MFU (reported against the X-times-faster peak). Host optimizer steps and copies over PCIe
// or NVMe are not compute: they keep their cost, and so do Measured kernels on the host stream
// (host time between GPU work in a Kineto trace) and on communication streams (communication
// replayed as measured). A device profile (measured GEMM tables) is set
// aside, since its measurements are of the real device.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"
#include "traces/timeline.hpp"

namespace stratasim::study {

struct ReplayRequest {
  std::string trace;              // a file, folder or prefix as the format reads it
  std::string format;             // chakra, kineto or stratasim
  std::string cluster;            // file or catalog name; empty: the one the trace names
  double scale_compute = 1.0;     // compute runs this many times faster
  std::optional<int> ranks;       // re-target the data-parallel width to this many ranks
  std::string dp_groups;          // regex naming the data-parallel groups; empty: default
  std::vector<std::string> sets;  // cluster.key=value
  bool exact = false;             // with ranks: every new replica simulated
  /// Kineto: the ProfilerStep#N to replay ("7"), "all" (every step back to back); empty: the
  /// median step (traces/kineto.hpp).
  std::string step;
};

struct ReplayResult {
  strategies::Program program;  // as simulated (re-targeted, compute scaled)
  hw::ClusterSpec cluster;      // as simulated (overrides, growth, speed-up applied)
  std::string cluster_given;    // the file or name the cluster came from
  traces::Timeline timeline;
  traces::ReportContext context;  // the recorded one, re-scaled, with a "replay" setup line
  traces::Report report;
  std::vector<std::int32_t> traced_ranks;  // the ranks that issue ops (mirrored runs); empty: all
  std::vector<std::string> notes;          // what the import and re-targeting want said
};

/// Imports, re-targets and simulates. Throws BadInput (and lets traces::TraceError and
/// config::ConfigError through) for bad input, InvalidProgram for a program that cannot run.
ReplayResult replay(const ReplayRequest& request);

}  // namespace stratasim::study
