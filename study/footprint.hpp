// Host memory of a simulation, estimated before it runs ("know before you run out", issue 19).
//
// Semantics: the peak resident memory (RSS) of `stratasim simulate` for one experiment, split
// into the parts that grow with the run's shape. A pure function of counts: it allocates nothing
// in proportion to the run, so it can refuse a run that would end in std::bad_alloc.
//
// Inputs (RunShape): the ops the simulated Program will hold and their dependencies and memory
// effects, the spans kept, and on the flow-level network the devices and topology vertices. The
// counts come from a sample Program lowered with data-parallel mirroring (cheap: one replica's
// ops) scaled by the ranks that issue ops in the real run (study::run_shape), so an --exact run
// of 98,304 ranks is estimated without lowering 98,304 ranks.
//
// Parts (bytes):
// - program: ops × sizeof(Op) + dependency ids × sizeof(OpId) + memory effects ×
//   sizeof(MemoryEffect) (lowering reserves the vectors: no growth beyond their size);
// - simulation: ops × kSimulatorBytesPerOp (the simulator's per-op state: remaining deps, ready
//   queues, event heap, per-rank memory bookkeeping, the report's figures gathered while the run
//   goes) plus spans × sizeof(Span) (every op's, or the traced ranks' only where
//   study::Options::spans_of_traced_ranks_only: `stratasim simulate`) plus memory samples ×
//   sizeof(MemorySample) (the samples of the traced ranks: --trace-ranks);
// - network: on the flow network, ops × kFlowBytesPerOp (transfers, their routes and rates)
//   plus, where hw::Topology::route falls back to its tables (explicit graphs, single-node
//   clusters: Topology::routes_in_closed_form() false), one next-hop table per destination
//   device, about 3 ints per vertex each (devices × vertices × 12 B; hw_models/topology.cpp),
//   at most the topology's table limit (Topology::kDefaultRoutingTableLimit ints, 128 MiB).
//   The structured builders route in closed form and keep no tables;
// - base: the executable, configs and report (kBaseBytes).
//
// Calibration (peak RSS from /usr/bin/time -v, Release build, 2026-11-26; see docs/inputs.md
// "Host memory"): the constants are the measured per-op slopes rounded up, so the estimate errs
// on the high side, within about 30% of the measured peak on the calibration runs.
#pragma once

#include <cstdint>
#include <string>

#include "hw_models/units.hpp"
#include "strategies/program.hpp"

namespace stratasim::study {

/// The counts that drive a run's host memory.
struct RunShape {
  std::int64_t ops = 0;             // ops of the simulated Program (every issuing rank)
  std::int64_t deps = 0;            // dependency ids of those ops
  std::int64_t effects = 0;         // memory effects of those ops
  std::int64_t spans = 0;           // spans the timeline keeps (one per op when spans are recorded)
  std::int64_t memory_samples = 0;  // memory samples kept: the effects of the traced ranks
  bool flow_network = false;
  std::int64_t devices = 0;    // flow network: devices (destinations of routing tables)
  std::int64_t vertices = 0;   // flow network: topology vertices
  bool routing_tables = true;  // flow network: routes found by per-destination tables
  bool mirrored = false;       // data-parallel replicas mirrored in the run
};

/// A run's estimated peak host memory, by part (see the top of this file).
struct HostMemoryEstimate {
  RunShape shape;
  Bytes program;
  Bytes simulation;
  Bytes network;
  Bytes base;
  Bytes total() const { return program + simulation + network + base; }
};

/// Simulator state per op beyond the Program and the spans kept (calibrated, rounded up): the
/// 16-byte OpState, successor lists and their build-time scratch, the rendezvous, the memory
/// bookkeeping, and the report's span figures gathered during the run (per rank the unions of
/// its compute and communication spans: traces/span_statistics.hpp). Measured 61 B per op on
/// gpt3-175b-a100-1024 --exact (1,024 and 98,304 GPUs; docs/inputs.md).
constexpr std::int64_t kSimulatorBytesPerOp = 64;
/// Flow-network state per op (transfers, routes, rates; calibrated, rounded up).
constexpr std::int64_t kFlowBytesPerOp = 16;
/// Bytes per (destination device, vertex) of a routing table: an offset and at least one next
/// hop, 4 B each, and the ECMP alternatives (calibrated on issue 19's 16,384-GPU flow run).
constexpr std::int64_t kRoutingBytesPerEntry = 12;
/// The process before any ops: executable, configs, report.
constexpr std::int64_t kBaseBytes = std::int64_t{16} << 20;

/// The shape of a run whose Program would issue ops on `issuing_ranks` ranks, from `sample`, a
/// Program of the same experiment (usually lowered with mirroring): its op, dependency and
/// effect counts scaled by issuing_ranks / (ranks issuing ops in `sample`).
/// `traced_ranks` ranks keep memory samples (0: every issuing rank), and spans too when
/// `spans_of_traced_only` (study::Options::spans_of_traced_ranks_only), else every op's.
RunShape run_shape(const strategies::Program& sample, std::int64_t issuing_ranks, bool record_spans,
                   std::int64_t traced_ranks, bool spans_of_traced_only = false);

/// The estimate for `shape` (a pure function).
HostMemoryEstimate estimate_host_memory(const RunShape& shape);

/// Memory this process may still use: MemAvailable of /proc/meminfo, else sysconf's available
/// physical pages × page size; 0 when neither is known.
Bytes available_host_memory();

/// "needs about 10.6 GiB (program 3.2 GiB, simulation 5.1 GiB, ...) for 85,800,000 ops".
std::string describe(const HostMemoryEstimate& estimate);

/// What would make a run fit: mirroring instead of --exact, fewer --trace-ranks, the analytical
/// network instead of the flow network, as apply to `shape` and the options given.
std::string advice(const RunShape& shape, bool exact, const std::string& trace_ranks);

}  // namespace stratasim::study
