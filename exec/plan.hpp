// What every device needs to know about a Program beyond its ops: how collectives and transfers
// match across ranks. Computed once per Program and shared (read-only) by every rank's device.
//
// Matching is strategies::Matching, the rule of strategies/program.hpp: the k-th collective a
// rank issues on a group matches the k-th of every other member; the k-th Send from a to b
// matches the k-th Recv at b from a.
#pragma once

#include <cstdint>
#include <vector>

#include "strategies/matching.hpp"
#include "strategies/program.hpp"

namespace stratasim::exec {

class ExecPlan {
 public:
  /// Checks the Program (strategies::validate) and numbers its collectives and transfers.
  explicit ExecPlan(const strategies::Program& program);

  const strategies::Program& program() const { return *program_; }
  /// For a collective op: k, its place among the collectives its rank issues on its group.
  /// For a Send or Recv: k, its place among the transfers between the same two ranks in the
  /// same direction. 0 for compute ops.
  std::uint32_t sequence(strategies::OpId id) const {
    const std::uint32_t k = matching_.sequence(id);
    return k == strategies::Matching::kNone ? 0 : k;
  }
  /// Position of `rank` in group `group` (its ring order), or -1 when not a member.
  int member_index(std::uint32_t group, int rank) const;
  /// Collectives each rank issues on `group` (the same for every member).
  std::uint32_t collectives_on(std::uint32_t group) const {
    return matching_.collectives_on(group);
  }
  /// Sends from `from` to `to` in the Program.
  std::uint32_t transfers(int from, int to) const;
  /// Which ops meet where.
  const strategies::Matching& matching() const { return matching_; }
  /// Ranks that issue ops (all of them: mirrored Programs are refused, since a real run needs
  /// every rank's ops).
  int world_size() const { return program_->world_size(); }
  /// Streams each rank uses (bit i: strategies::Stream i).
  std::uint32_t streams_of(int rank) const { return streams_[static_cast<std::size_t>(rank)]; }

 private:
  const strategies::Program* program_;
  strategies::Matching matching_;
  std::vector<std::vector<int>> member_index_;  // per group: rank -> index (-1)
  std::vector<std::uint32_t> streams_;
};

}  // namespace stratasim::exec
