#include "exec/plan.hpp"

#include <stdexcept>
#include <variant>

namespace stratasim::exec {

using namespace strategies;

ExecPlan::ExecPlan(const Program& program) : program_(&program) {
  if (program.mirrored()) {
    throw std::invalid_argument(
        "a real run needs every rank's ops; lower the experiment without data-parallel "
        "mirroring");
  }
  matching_ = Matching(program);
  validate(program, matching_);
  const auto world = static_cast<std::size_t>(program.world_size());
  member_index_.assign(program.groups().size(), std::vector<int>(world, -1));
  for (std::size_t g = 0; g < program.groups().size(); ++g) {
    const auto& ranks = program.groups()[g].ranks;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      member_index_[g][static_cast<std::size_t>(ranks[i])] = static_cast<int>(i);
    }
  }
  streams_.assign(world, 0);
  for (const Op& op : program.ops()) {
    streams_[static_cast<std::size_t>(op.rank)] |= 1u << static_cast<unsigned>(op.stream);
  }
}

int ExecPlan::member_index(std::uint32_t group, int rank) const {
  return member_index_[group][static_cast<std::size_t>(rank)];
}

std::uint32_t ExecPlan::transfers(int from, int to) const {
  const auto* channel = matching_.find_channel(from, to);
  return channel == nullptr ? 0 : channel->sends;
}

}  // namespace stratasim::exec
