#include "strategies/lowering/communicators.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace stratasim::strategies {

namespace {
constexpr std::uint32_t kNoGroup = 0xFFFFFFFFu;
}  // namespace

Communicators::Communicators(Program& program, const PipelineSpec& spec, const Schedule& schedule)
    : mesh_(make_tp_mesh(spec.tp_mode, spec.layout.tp, spec.tp_depth)), tp_size_(spec.layout.tp) {
  const RankLayout& layout = spec.layout;
  const auto world = static_cast<std::size_t>(layout.world_size());
  tp_.assign(world, 0);
  dp_.assign(world, 0);
  embedding_.assign(world, 0);
  // A device's gradients are summed over its data-parallel replicas and, with Chimera, over
  // those of the device holding the same parts in the other direction.
  auto replica_device = [&schedule](int device) {
    return schedule.replica_device.empty()
               ? device
               : schedule.replica_device[static_cast<std::size_t>(device)];
  };
  dp_size_ = layout.dp * (schedule.replica_device.empty() ? 1 : 2);
  for (int stage = 0; stage < layout.pp; ++stage) {
    for (int d = 0; d < layout.dp && layout.tp > 1; ++d) {
      std::vector<std::int32_t> ranks;
      for (int t = 0; t < layout.tp; ++t) ranks.push_back(layout.rank(t, d, stage));
      auto id = program.add_group(ranks, "tp s" + std::to_string(stage) + " d" + std::to_string(d));
      for (int r : ranks) tp_[static_cast<std::size_t>(r)] = id;
    }
    const int partner = replica_device(stage);
    if (partner < stage) continue;  // its group exists already
    for (int t = 0; t < layout.tp && dp_size_ > 1; ++t) {
      std::vector<std::int32_t> ranks;
      for (int d = 0; d < layout.dp; ++d) ranks.push_back(layout.rank(t, d, stage));
      if (partner != stage) {
        for (int d = 0; d < layout.dp; ++d) ranks.push_back(layout.rank(t, d, partner));
      }
      const std::string name = "dp s" + std::to_string(stage) +
                               (partner != stage ? "+s" + std::to_string(partner) : "") + " t" +
                               std::to_string(t);
      auto id = program.add_group(ranks, name);
      for (int r : ranks) dp_[static_cast<std::size_t>(r)] = id;
    }
  }
  const int first_device = schedule.device_of_chunk.front();
  const int last_device = schedule.device_of_chunk.back();
  shared_embedding_ = spec.shared_embedding && first_device != last_device;
  if (shared_embedding_) {
    for (int d = 0; d < layout.dp; ++d) {
      for (int t = 0; t < layout.tp; ++t) {
        std::vector<std::int32_t> ranks = {layout.rank(t, d, first_device),
                                           layout.rank(t, d, last_device)};
        auto id =
            program.add_group(ranks, "embedding d" + std::to_string(d) + " t" + std::to_string(t));
        for (int r : ranks) embedding_[static_cast<std::size_t>(r)] = id;
      }
    }
  }
  // Made after all others so that 1D programs keep their groups.
  if (mesh_.mode != TpMode::one_d) make_mesh_groups(program, layout);
  if (spec.grad_clip > 0.0 || spec.loss_scaling != LossScaling::none) {
    make_grad_stats_groups(program, layout, spec.zero.stage >= 1);
  }
  const int shard = spec.zero.shard_group;
  if (shard > 1 && shard < layout.dp && layout.dp % shard == 0) {
    make_hybrid_groups(program, layout, shard);
  }
  if (spec.zero.stage == 3 && !spec.fsdp && spec.zero.zeropp()) {
    make_zeropp_groups(program, layout, spec.zero);
  }
  // Context parallelism: each block of cp consecutive dp indices (RankLayout), per stage and
  // tp index, in cp order (the ring's order).
  if (layout.cp > 1) {
    auto& groups = axis_[static_cast<std::size_t>(TpAxis::cp)];
    groups.assign(world, kNoGroup);
    for (int stage = 0; stage < layout.pp; ++stage) {
      for (int replica = 0; replica < layout.dp / layout.cp; ++replica) {
        for (int t = 0; t < layout.tp; ++t) {
          std::vector<std::int32_t> ranks;
          for (int c = 0; c < layout.cp; ++c) {
            ranks.push_back(layout.rank(t, c + layout.cp * replica, stage));
          }
          const auto id =
              program.add_group(ranks, "cp s" + std::to_string(stage) + " d" +
                                           std::to_string(replica) + " t" + std::to_string(t));
          for (int r : ranks) groups[static_cast<std::size_t>(r)] = id;
        }
      }
    }
  }
  if (spec.moe) make_expert_groups(program, layout, *spec.moe, schedule.replica_device);
  // FP8 delayed scaling's amax reduction group: every rank of a stage (made last, so that the
  // other groups keep their ids).
  if (spec.low_precision && reduces_amax(*spec.low_precision) && layout.tp * layout.dp > 1) {
    auto& groups = axis_[static_cast<std::size_t>(TpAxis::amax)];
    groups.assign(world, kNoGroup);
    for (int stage = 0; stage < layout.pp; ++stage) {
      std::vector<std::int32_t> ranks;
      for (int dp = 0; dp < layout.dp; ++dp) {
        for (int t = 0; t < layout.tp; ++t) ranks.push_back(layout.rank(t, dp, stage));
      }
      const auto id = program.add_group(ranks, "amax s" + std::to_string(stage));
      for (int r : ranks) groups[static_cast<std::size_t>(r)] = id;
    }
  }
}

void Communicators::make_expert_groups(Program& program, const RankLayout& layout,
                                       const MoeSetting& moe,
                                       const std::vector<int>& replica_device) {
  const int flat = layout.tp * layout.dp, etp = moe.etp, ep = moe.ep;
  const int edp = flat / (etp * ep);
  const auto world = static_cast<std::size_t>(layout.world_size());
  // The stage's rank of flat index i (t = i mod tp, d = i / tp).
  auto rank_of = [&](int i, int stage) { return layout.rank(i % layout.tp, i / layout.tp, stage); };
  // Groups of `size` ranks of a stage; with `both_copies` (a schedule holding every part on two
  // devices) of the stage and its replica device (the same part's other copy), 2 size ranks.
  auto make = [&](std::vector<std::uint32_t>& out, int size, const std::string& name, auto member,
                  bool both_copies) {  // member(group, j): flat index of member j
    out.assign(world, kNoGroup);
    const bool twice = both_copies && !replica_device.empty();
    if (size * (twice ? 2 : 1) <= 1) return;
    for (int stage = 0; stage < layout.pp; ++stage) {
      const int partner = twice ? replica_device[static_cast<std::size_t>(stage)] : stage;
      if (partner < stage) continue;  // made with the partner's
      for (int g = 0; g < flat / size; ++g) {
        std::vector<std::int32_t> ranks;
        for (int j = 0; j < size; ++j) ranks.push_back(rank_of(member(g, j), stage));
        if (partner != stage) {
          for (int j = 0; j < size; ++j) ranks.push_back(rank_of(member(g, j), partner));
        }
        const std::string stages =
            " s" + std::to_string(stage) + (partner != stage ? "+s" + std::to_string(partner) : "");
        const auto id = program.add_group(ranks, name + stages + " g" + std::to_string(g));
        for (int r : ranks) out[static_cast<std::size_t>(r)] = id;
      }
    }
  };
  // ep group g: etp index g mod etp, expert-dp index g / etp.
  make(
      axis_[static_cast<std::size_t>(TpAxis::ep)], ep, "ep",
      [&](int g, int j) { return g % etp + etp * (j + ep * (g / etp)); }, false);
  make(
      axis_[static_cast<std::size_t>(TpAxis::etp)], etp, "etp",
      [&](int g, int j) { return j + etp * g; }, false);
  // expert-dp group g: etp and ep indices g mod (etp ep); over both copies of a part held twice.
  make(
      expert_dp_, edp, "expert dp", [&](int g, int j) { return g + etp * ep * j; }, true);
}

std::optional<std::uint32_t> Communicators::expert_dp(int rank) const {
  if (expert_dp_.empty() || expert_dp_[static_cast<std::size_t>(rank)] == kNoGroup) {
    return std::nullopt;
  }
  return expert_dp_[static_cast<std::size_t>(rank)];
}

void Communicators::make_hybrid_groups(Program& program, const RankLayout& layout, int shard) {
  make_block_groups(program, layout, shard, "fsdp shard", &shard_, "fsdp replicate", &replicate_);
}

void Communicators::make_block_groups(Program& program, const RankLayout& layout, int size,
                                      const std::string& block_name,
                                      std::vector<std::uint32_t>* blocks,
                                      const std::string& strided_name,
                                      std::vector<std::uint32_t>* strided) {
  const auto world = static_cast<std::size_t>(layout.world_size());
  if (blocks != nullptr) blocks->assign(world, kNoGroup);
  if (strided != nullptr) strided->assign(world, kNoGroup);
  for (int stage = 0; stage < layout.pp; ++stage) {
    for (int t = 0; t < layout.tp; ++t) {
      const std::string where = " s" + std::to_string(stage) + " t" + std::to_string(t);
      for (int block = 0; blocks != nullptr && block < layout.dp / size; ++block) {
        std::vector<std::int32_t> ranks;
        for (int d = block * size; d < (block + 1) * size; ++d) {
          ranks.push_back(layout.rank(t, d, stage));
        }
        const auto id = program.add_group(ranks, block_name + where + " b" + std::to_string(block));
        for (int r : ranks) (*blocks)[static_cast<std::size_t>(r)] = id;
      }
      for (int offset = 0; strided != nullptr && offset < size; ++offset) {
        std::vector<std::int32_t> ranks;
        for (int d = offset; d < layout.dp; d += size) ranks.push_back(layout.rank(t, d, stage));
        const auto id =
            program.add_group(ranks, strided_name + where + " o" + std::to_string(offset));
        for (int r : ranks) (*strided)[static_cast<std::size_t>(r)] = id;
      }
    }
  }
}

void Communicators::make_zeropp_groups(Program& program, const RankLayout& layout,
                                       const ZeroSettings& zero) {
  const int dp = layout.dp;
  auto proper = [dp](int size) { return size > 1 && size < dp && dp % size == 0; };
  const int hpz = zero.hpz_partition_size;
  if (proper(hpz)) make_block_groups(program, layout, hpz, "zero++ hpz", &hpz_, "", nullptr);
  const int node = zero.node_ranks;
  if (!zero.quantized_gradients || node >= dp || dp % node != 0) return;
  if (node == 1) return;  // one rank per node: the cross-node group is the dp group
  const bool reuse = node == hpz && !hpz_.empty();
  if (reuse) node_ = hpz_;
  make_block_groups(program, layout, node, "zero++ node", reuse ? nullptr : &node_,
                    "zero++ cross-node", &cross_node_);
}

std::uint32_t Communicators::shard(int rank) const {
  return shard_.empty() ? dp(rank) : shard_[static_cast<std::size_t>(rank)];
}

std::optional<std::uint32_t> Communicators::replicate(int rank) const {
  if (replicate_.empty()) return std::nullopt;
  return replicate_[static_cast<std::size_t>(rank)];
}

void Communicators::make_grad_stats_groups(Program& program, const RankLayout& layout,
                                           bool sharded) {
  grad_stats_.assign(static_cast<std::size_t>(layout.world_size()), kNoGroup);
  const int groups = sharded ? 1 : layout.dp;
  for (int g = 0; g < groups; ++g) {
    std::vector<std::int32_t> ranks;
    for (int stage = 0; stage < layout.pp; ++stage) {
      for (int d = sharded ? 0 : g; d < (sharded ? layout.dp : g + 1); ++d) {
        for (int t = 0; t < layout.tp; ++t) ranks.push_back(layout.rank(t, d, stage));
      }
    }
    if (ranks.size() < 2) continue;
    std::sort(ranks.begin(), ranks.end());
    const auto id =
        program.add_group(ranks, sharded ? "grad stats" : "grad stats d" + std::to_string(g));
    for (int r : ranks) grad_stats_[static_cast<std::size_t>(r)] = id;
  }
}

std::optional<std::uint32_t> Communicators::grad_stats(int rank) const {
  if (grad_stats_.empty()) return std::nullopt;
  const std::uint32_t id = grad_stats_[static_cast<std::size_t>(rank)];
  if (id == kNoGroup) return std::nullopt;
  return id;
}

void Communicators::make_mesh_groups(Program& program, const RankLayout& layout) {
  for (TpAxis axis : {TpAxis::tp_row, TpAxis::tp_col, TpAxis::tp_depth}) {
    if (mesh_.axis_size(axis) <= 1) continue;
    auto& groups = axis_[static_cast<std::size_t>(axis)];
    groups.assign(static_cast<std::size_t>(layout.world_size()), kNoGroup);
    for (int stage = 0; stage < layout.pp; ++stage) {
      for (int d = 0; d < layout.dp; ++d) {
        for (int t = 0; t < layout.tp; ++t) {
          const std::vector<int> members = mesh_.axis_members(axis, t);
          if (members.front() != t) continue;  // made by the line's first member
          std::vector<std::int32_t> ranks;
          for (int member : members) ranks.push_back(layout.rank(member, d, stage));
          const auto id =
              program.add_group(ranks, std::string(name_of(axis)) + " s" + std::to_string(stage) +
                                           " d" + std::to_string(d) + " t" + std::to_string(t));
          for (int r : ranks) groups[static_cast<std::size_t>(r)] = id;
        }
      }
    }
  }
}

std::uint32_t Communicators::tp(TpAxis axis, int rank) const {
  const auto r = static_cast<std::size_t>(rank);
  if (axis == TpAxis::tp) return tp_[r];
  const auto& groups = axis_[static_cast<std::size_t>(axis)];
  if (groups.empty() || groups[r] == kNoGroup) {
    if (axis == TpAxis::cp) {
      throw std::invalid_argument(
          "assemble_pipeline: a context-parallel step in a plan lowered without cp > 1");
    }
    throw std::invalid_argument("assemble_pipeline: a collective on axis " +
                                std::string(name_of(axis)) + ", which tp_mode " +
                                std::string(name_of(mesh_.mode)) + " with tp " +
                                std::to_string(tp_size_) + " does not have");
  }
  return groups[r];
}

}  // namespace stratasim::strategies
