#include "study/footprint.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "hw_models/topology.hpp"
#include "traces/timeline.hpp"

namespace stratasim::study {

namespace st = strategies;

RunShape run_shape(const st::Program& sample, std::int64_t issuing_ranks, bool record_spans,
                   std::int64_t traced_ranks, bool spans_of_traced_only) {
  std::int64_t sample_ranks = 0;
  for (int r = 0; r < sample.world_size(); ++r) {
    if (sample.issues_ops(r)) ++sample_ranks;
  }
  std::int64_t deps = 0, effects = 0;
  for (const auto& op : sample.ops()) {
    deps += op.deps_count;
    effects += op.effects_count;
  }
  RunShape shape;
  if (sample_ranks == 0) return shape;
  // Replicas issue the same ops as the sample's ranks: scale by the ranks that issue ops.
  auto scaled = [&](std::int64_t n, std::int64_t ranks) {
    return static_cast<std::int64_t>(static_cast<double>(n) * static_cast<double>(ranks) /
                                     static_cast<double>(sample_ranks));
  };
  shape.ops = scaled(static_cast<std::int64_t>(sample.op_count()), issuing_ranks);
  shape.deps = scaled(deps, issuing_ranks);
  shape.effects = scaled(effects, issuing_ranks);
  const bool few_traced = traced_ranks > 0 && traced_ranks < issuing_ranks;
  shape.spans = !record_spans ? 0
                : spans_of_traced_only && few_traced
                    ? scaled(static_cast<std::int64_t>(sample.op_count()), traced_ranks)
                    : shape.ops;
  shape.memory_samples = scaled(effects, few_traced ? traced_ranks : issuing_ranks);
  shape.mirrored = issuing_ranks < sample.world_size();
  return shape;
}

HostMemoryEstimate estimate_host_memory(const RunShape& s) {
  HostMemoryEstimate e;
  e.shape = s;
  const std::int64_t program_bytes =
      s.ops * static_cast<std::int64_t>(sizeof(st::Op)) +
      s.deps * static_cast<std::int64_t>(sizeof(st::OpId)) +
      s.effects * static_cast<std::int64_t>(sizeof(st::MemoryEffect));
  e.program = Bytes(program_bytes);
  e.simulation = Bytes(s.ops * kSimulatorBytesPerOp +
                       s.spans * static_cast<std::int64_t>(sizeof(traces::Span)) +
                       s.memory_samples * static_cast<std::int64_t>(sizeof(traces::MemorySample)));
  if (s.flow_network) {
    // hw::Topology holds at most its routing-table limit (ints) however many destinations.
    constexpr auto kTableCap =
        static_cast<std::int64_t>(hw::Topology::kDefaultRoutingTableLimit * sizeof(int));
    const std::int64_t tables = s.routing_tables ? s.devices * s.vertices : 0;
    e.network =
        Bytes(s.ops * kFlowBytesPerOp + std::min(tables * kRoutingBytesPerEntry, kTableCap));
  }
  e.base = Bytes(kBaseBytes);
  return e;
}

Bytes available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  std::int64_t value = 0;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return Bytes(value * 1024);  // kB
  }
#ifdef _SC_AVPHYS_PAGES
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return Bytes(static_cast<std::int64_t>(pages) * page);
#endif
  return Bytes(0);
}

namespace {

std::string with_commas(std::int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string describe(const HostMemoryEstimate& e) {
  std::string text = "needs about " + to_string(e.total()) + " of host memory for " +
                     with_commas(e.shape.ops) + " ops (program " + to_string(e.program) +
                     ", simulation " + to_string(e.simulation);
  if (e.shape.flow_network) text += ", flow network " + to_string(e.network);
  return text + ", base " + to_string(e.base) + ")";
}

std::string advice(const RunShape& shape, bool exact, const std::string& trace_ranks) {
  std::string text;
  auto add = [&](const std::string& item) { text += (text.empty() ? "" : "; ") + item; };
  if (exact) add("drop --exact (data-parallel replicas are then mirrored where exact)");
  if (trace_ranks == "all" || trace_ranks.find(',') != std::string::npos) {
    add("trace fewer ranks (--trace-ranks stages)");
  }
  if (shape.flow_network && !shape.mirrored) {
    add("on a symmetric fabric, --set cluster.flow_symmetry=auto (data-parallel replicas "
        "simulated once where that is exact)");
  }
  if (shape.flow_network) {
    add("use the analytical network (--set cluster.network_model=analytical): no routing "
        "tables, and replicas are mirrored");
  }
  add("simulate fewer devices or micro-batches, or ask `stratasim memory` (no timing)");
  return text;
}

}  // namespace stratasim::study
