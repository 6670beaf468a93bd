// The shared last step of every trace importer: per-rank lists of ops as a trace gives them
// (any order, dependencies by the trace's own node ids) become a Program. Issue order is a
// topological order of the dependencies that keeps the file's order wherever it can; cycles,
// dependencies on missing nodes and collectives that cannot match across ranks are reported as
// TraceErrors naming the file and the nodes, never looped on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strategies/program.hpp"
#include "traces/import.hpp"

namespace stratasim::traces {

/// One op as an importer read it.
struct TraceOp {
  std::uint64_t id = 0;  // the trace's node id, unique within the rank (named in errors)
  /// Nodes that carry no work (metadata, CPU-only bookkeeping) are kept through the ordering so
  /// that dependencies through them still hold: a dependency on a skipped node becomes a
  /// dependency on what that node depended on.
  bool skip = false;
  strategies::Work work;                    // Collective::group indexes TraceInput::groups
  std::vector<strategies::Kernel> kernels;  // the work of a Compute op
  /// Compute ops of one stream with the same non-empty key have the same kernels and share one
  /// kernel list in the Program (an importer's text of the list: Chakra's stratasim.kernels);
  /// empty: the op gets a list of its own.
  std::string kernels_key;
  strategies::Stream stream = strategies::Stream::compute;
  strategies::Phase phase = strategies::Phase::other;
  std::int32_t microbatch = -1;
  std::int16_t layer_begin = -1;
  std::int16_t layer_end = -1;
  std::string label;
  /// Dependencies kept as the Program's explicit ones (Chakra's data_deps).
  std::vector<std::uint64_t> deps;
  /// Ordering-only dependencies (Chakra's ctrl_deps): kept too, except those on an earlier op of
  /// the same stream, which the stream's FIFO order already implies.
  std::vector<std::uint64_t> order_deps;
  std::vector<strategies::MemoryEffect> effects;
};

struct TraceRank {
  std::string source;        // the file the rank came from, for messages
  std::vector<TraceOp> ops;  // in file order
  std::vector<strategies::ResidentMemory> initial_memory;
};

struct TraceInput {
  std::vector<strategies::Group> groups;
  std::vector<TraceRank> ranks;  // rank r is ranks[r]; the world size is ranks.size()
};

/// Builds and validates the Program. Throws TraceError: a duplicate node id, a dependency on a
/// node the rank does not have, a dependency cycle (naming its nodes), a collective on a group
/// the rank is not in, collectives or point-to-point messages whose counts, kinds or sizes
/// differ between the ranks that must match them (naming the group, ranks and counts).
strategies::Program build_program(const TraceInput& input);

/// build_program a rank at a time, for importers that read one rank's file at a time: once a
/// rank is added its TraceOps may be freed, so what stays in memory is the Program. The checks
/// are build_program's; those of one rank (cycles, missing nodes, groups it is not in) come
/// when it is added, those across ranks (matching) at finish().
class ProgramBuilder {
 public:
  /// Throws TraceError when a group names a rank outside [0, world).
  ProgramBuilder(int world, std::vector<strategies::Group> groups, std::string first_source);
  /// A group found while reading ranks (an importer's "world" group): the next index.
  void add_group(strategies::Group group);
  std::size_t group_count() const { return groups_.size(); }
  void reserve(std::size_t ops) { program_.reserve(ops, 0, 0); }
  /// Adds the next rank (0, 1, ...).
  void add_rank(const TraceRank& rank);
  /// The Program, once every rank is added.
  strategies::Program finish() &&;

 private:
  /// The Program's kernel list for a compute op (shared by ops with its kernels_key).
  std::uint32_t kernel_list(const TraceOp& op);

  std::vector<strategies::Group> groups_;
  strategies::Program program_;
  std::string first_source_;
  std::vector<std::string> sources_;                             // per rank added: its file
  std::vector<std::uint64_t> node_of_;                           // per op: the trace's node id
  std::unordered_map<std::string, std::uint32_t> kernel_lists_;  // stream:kernels_key -> list
};

/// "1st", "2nd", "3rd", "4th", ... for messages (index 0 is "1st").
std::string ordinal(std::size_t index);

}  // namespace stratasim::traces
