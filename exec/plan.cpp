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
  validate(program);
  const auto world = static_cast<std::size_t>(program.world_size());
  sequence_.assign(program.op_count(), 0);
  group_calls_.assign(program.groups().size(), 0);
  member_index_.assign(program.groups().size(), std::vector<int>(world, -1));
  for (std::size_t g = 0; g < program.groups().size(); ++g) {
    const auto& ranks = program.groups()[g].ranks;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      member_index_[g][static_cast<std::size_t>(ranks[i])] = static_cast<int>(i);
    }
  }
  streams_.assign(world, 0);
  std::vector<std::vector<std::uint32_t>> calls(world,
                                                std::vector<std::uint32_t>(group_calls_.size()));
  for (OpId id = 0; id < program.op_count(); ++id) {
    const Op& op = program.op(id);
    const auto r = static_cast<std::size_t>(op.rank);
    streams_[r] |= 1u << static_cast<unsigned>(op.stream);
    if (const auto* c = std::get_if<Collective>(&op.work)) {
      sequence_[id] = calls[r][c->group]++;
      group_calls_[c->group] = std::max(group_calls_[c->group], calls[r][c->group]);
    } else if (const auto* s = std::get_if<Send>(&op.work)) {
      sequence_[id] = transfers_[{op.rank, s->peer}]++;
    }
  }
  // Receives are numbered per (peer, rank) in their own pass so that a rank's sends and
  // receives with one peer do not share a counter.
  std::map<std::pair<int, int>, std::uint32_t> received;
  for (OpId id = 0; id < program.op_count(); ++id) {
    const Op& op = program.op(id);
    if (const auto* r = std::get_if<Recv>(&op.work)) sequence_[id] = received[{r->peer, op.rank}]++;
  }
}

int ExecPlan::member_index(std::uint32_t group, int rank) const {
  return member_index_[group][static_cast<std::size_t>(rank)];
}

std::uint32_t ExecPlan::transfers(int from, int to) const {
  const auto it = transfers_.find({from, to});
  return it == transfers_.end() ? 0 : it->second;
}

}  // namespace stratasim::exec
