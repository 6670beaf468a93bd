// The communicator groups of one pipeline, made once per Program and looked up by axis: the
// tensor-parallel group of a rank (and, with tp_mode 2d, 2.5d and 3d, its mesh row, column and
// depth lines, strategies/tp_modes.hpp), its data-parallel group and its embedding group.
//
// Layout as Megatron-LM (arXiv:2104.04473): a data-parallel group holds the ranks of one stage
// with the same tp index; with Chimera (a schedule that holds every stage on two devices,
// Schedule::replica_device) it spans both devices, so that gradients are summed over the
// replicas of both directions. The embedding group (Megatron's) pairs each rank of the first
// device with the rank of the same tp and dp index on the last device holding the model's end,
// when tied embeddings are split over two devices.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strategies/lowering/pipeline_spec.hpp"
#include "strategies/tp_modes.hpp"

namespace stratasim::strategies {

class Communicators {
 public:
  /// Registers the groups in `program`: per stage, its tp groups then its dp groups (none of a
  /// size 1); then the embedding groups when spec.shared_embedding holds and the first and
  /// last chunk sit on different devices; then the mesh lines of a 2D, 2.5D or 3D mesh.
  Communicators(Program& program, const PipelineSpec& spec, const Schedule& schedule);

  /// The group of `rank` on tensor-parallel axis `axis` (TpAxis::tp: the whole tp group).
  /// Throws std::invalid_argument when the spec's mesh has no such axis.
  std::uint32_t tp(TpAxis axis, int rank) const;
  /// The data-parallel group of `rank` (only meaningful when dp_size() > 1).
  std::uint32_t dp(int rank) const { return dp_[static_cast<std::size_t>(rank)]; }
  /// The embedding group of `rank` (only meaningful when shared_embedding()).
  std::uint32_t embedding(int rank) const { return embedding_[static_cast<std::size_t>(rank)]; }
  /// Members of a data-parallel group: dp, twice that with Chimera.
  int dp_size() const { return dp_size_; }
  /// Whether the tied embeddings' gradients are all-reduced between two devices.
  bool shared_embedding() const { return shared_embedding_; }
  /// The group over which statistics of all gradients (the clipping norm, the loss scale's
  /// inf/nan flag) are reduced, as Megatron-LM's optimizer does: the ranks holding distinct
  /// gradients of one model replica (its tensor- and pipeline-parallel ranks: same dp index),
  /// or every rank when ZeRO shards the gradients' optimizer (stage >= 1: each rank checks its
  /// shard only). Made (after all other groups) when the spec clips or scales the loss;
  /// nullopt for a group of one rank or when not made.
  std::optional<std::uint32_t> grad_stats(int rank) const;
  /// FSDP's HYBRID_SHARD (spec.zero.shard_group s with 1 < s < dp): the shard group of `rank`
  /// (the s data-parallel ranks of its block, dp index / s, which sit on one node) and its
  /// replicate group (the dp / s ranks with the same dp index mod s, one per block). Otherwise
  /// the shard group is the dp group and there is no replicate group. Made after every other.
  std::uint32_t shard(int rank) const;
  std::optional<std::uint32_t> replicate(int rank) const;
  /// ZeRO++ (spec.zero, stage 3): hpZ's group of `rank` (the hpz_partition_size consecutive
  /// data-parallel ranks of its block, dp index / n), and qgZ's node group (the node_ranks
  /// data-parallel ranks of its node) and cross-node group (the dp / node_ranks ranks with the
  /// same dp index mod node_ranks). A size equal to the data-parallel group's is that group;
  /// groups of the same ranks are made once. Made after every other.
  std::uint32_t hpz(int rank) const { return pick(hpz_, rank); }
  std::uint32_t node(int rank) const { return pick(node_, rank); }
  std::uint32_t cross_node(int rank) const { return pick(cross_node_, rank); }
  /// Mixture of experts (spec.moe), Megatron-Core's expert layout: within a stage, the rank of
  /// tp index t and dp index d has the flat index i = t + tp d and, with etp tp-fastest,
  /// etp index i mod etp, ep index (i / etp) mod ep and expert-data-parallel index
  /// i / (etp ep). Its ep group (TpAxis::ep through tp()) shares the stage, etp and
  /// expert-dp indices; its etp group (TpAxis::etp) the stage, ep and expert-dp indices; its
  /// expert-data-parallel group the stage, etp and ep indices (nullopt for a group of one),
  /// and with a schedule holding every part on two devices (Schedule::replica_device) the
  /// same ranks of the replica device too, whose experts' gradients are summed with them.
  /// Made after every other group.
  std::optional<std::uint32_t> expert_dp(int rank) const;

 private:
  void make_mesh_groups(Program& program, const RankLayout& layout);
  void make_grad_stats_groups(Program& program, const RankLayout& layout, bool sharded);
  void make_hybrid_groups(Program& program, const RankLayout& layout, int shard);
  /// Per stage and tp index: when `blocks` is given, the blocks of `size` consecutive dp ranks
  /// ("<block_name> s<stage> t<t> b<block>") into it, then, when `strided` is given, the ranks
  /// of equal dp index mod `size` ("<strided_name> s<stage> t<t> o<offset>") into it.
  void make_block_groups(Program& program, const RankLayout& layout, int size,
                         const std::string& block_name, std::vector<std::uint32_t>* blocks,
                         const std::string& strided_name, std::vector<std::uint32_t>* strided);
  void make_expert_groups(Program& program, const RankLayout& layout, const MoeSetting& moe,
                          const std::vector<int>& replica_device);
  void make_zeropp_groups(Program& program, const RankLayout& layout, const ZeroSettings& zero);
  std::uint32_t pick(const std::vector<std::uint32_t>& groups, int rank) const {
    return groups.empty() ? dp(rank) : groups[static_cast<std::size_t>(rank)];
  }

  TpMesh mesh_;
  int tp_size_ = 1;
  int dp_size_ = 1;
  bool shared_embedding_ = false;
  std::vector<std::uint32_t> tp_, dp_, embedding_, grad_stats_, shard_, replicate_;
  std::vector<std::uint32_t> hpz_, node_, cross_node_, expert_dp_;
  std::array<std::vector<std::uint32_t>, kTpAxisCount> axis_;
};

}  // namespace stratasim::strategies
