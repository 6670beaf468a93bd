// Re-targeting a Program to another data-parallel width (`stratasim replay --ranks N`,
// docs/replay.md): the ranks are replicated k times and the data-parallel groups made k times
// larger, so that a trace recorded (or simulated) on W ranks answers "what if we trained on
// k x W?".
//
// Rules:
// - data-parallel groups are those whose names match RetargetOptions::dp_groups (by default
//   stratasim's "dp ..." groups, Megatron's "DATA_PARALLEL", PyTorch's "data"); each becomes one
//   group of k times the members, replica 0's members first, then replica 1's, ...;
// - every other group is copied once per replica (names get " r<j>" for replica j >= 1);
// - sends and receives stay within their replica; dependencies, kernels, memory effects and
//   initial memory are copied unchanged;
// - collective sizes stay (nccl-tests counting: the whole buffer), so a data-parallel
//   all-reduce of a gradient bucket costs what it costs on the larger group. ZeRO shard sizes
//   and per-rank optimizer work do not shrink (a note says so when the dp groups carry
//   reduce-scatters or all-gathers).
// Placement: replica j of old rank r becomes rank (r / B) * B * k + j * B + r % B, where B is
// the smallest block size dividing W such that every data-parallel group lies within one
// aligned block of B ranks. With stratasim's layout (rank = tp_index + tp * (dp_index + dp *
// stage), strategies/lowering.hpp) B = tp * dp and replica j's copy of data-parallel index d
// lands on index j * dp + d: exactly where a direct lowering with dp * k puts it. With the data
// dimension outermost B = W, and the replicas follow one another.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::strategies {

struct RetargetOptions {
  /// ECMAScript regular expression, case-insensitive, searched in group names: a match is a
  /// data-parallel group.
  std::string dp_groups = R"(^dp\b|^data\b|data[ _-]?parallel)";
  /// Mark every new replica (j >= 1) as a mirror of replica 0 (Program::set_replica), so that
  /// it is simulated once: exact on a network without contention (the analytical one).
  bool mirror = false;
  /// Where to append notes for the user (approximations), when given.
  std::vector<std::string>* notes = nullptr;
};

/// Bad re-targeting requests: a world size that is not a multiple, no data-parallel group, a
/// regular expression that does not parse. The message says what to change.
class RetargetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `program` re-targeted to `new_world_size` = k x its world size (k >= 1 integer); see the
/// rules above. k = 1 returns a copy. Throws RetargetError.
Program retarget_data_parallel(const Program& program, int new_world_size,
                               const RetargetOptions& options = {});

/// The block size B of the placement above for `program` (the smallest that holds every
/// data-parallel group in one aligned block; the world size when there is none). Throws
/// RetargetError when options.dp_groups does not parse.
int data_parallel_block(const Program& program, const RetargetOptions& options = {});

/// Whether a group named `group_name` is data parallel under `pattern` (the semantics of
/// RetargetOptions::dp_groups: ECMAScript, case-insensitive, searched). Importers that classify
/// groups themselves (traces/kineto.hpp) let a user's --dp-groups decide through this. Throws
/// RetargetError when `pattern` does not parse.
bool matches_data_parallel(const std::string& group_name, const std::string& pattern);

/// The new rank of replica `replica` of old rank `rank` for block size `block` and factor `k`.
inline int retargeted_rank(int rank, int replica, int block, int k) {
  return (rank / block) * block * k + replica * block + rank % block;
}
/// The old rank whose replica `new_rank` is (the inverse of retargeted_rank).
inline int retarget_source_rank(int new_rank, int block, int k) {
  return (new_rank / (block * k)) * block + (new_rank % (block * k)) % block;
}

}  // namespace stratasim::strategies
