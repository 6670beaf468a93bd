// Data-parallel re-targeting; the rules and the placement are in the header.
#include "strategies/retarget.hpp"

#include <algorithm>
#include <regex>
#include <set>

namespace stratasim::strategies {

namespace {

// The smallest block size dividing `world` such that every group of `groups` lies within one
// aligned block.
int block_size(int world, const std::vector<const Group*>& groups) {
  for (int b = 1; b <= world; ++b) {
    if (world % b != 0) continue;
    bool fits = true;
    for (const Group* g : groups) {
      if (g->ranks.empty()) continue;
      const int block = g->ranks.front() / b;
      fits = std::all_of(g->ranks.begin(), g->ranks.end(),
                         [&](std::int32_t r) { return r / b == block; });
      if (!fits) break;
    }
    if (fits) return b;
  }
  return world;
}

std::regex dp_pattern(const RetargetOptions& options) {
  try {
    return std::regex(options.dp_groups, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& e) {
    throw RetargetError("--dp-groups \"" + options.dp_groups +
                        "\" is not a regular expression: " + e.what());
  }
}

}  // namespace

bool matches_data_parallel(const std::string& group_name, const std::string& pattern) {
  RetargetOptions options;
  options.dp_groups = pattern;
  return std::regex_search(group_name, dp_pattern(options));
}

int data_parallel_block(const Program& program, const RetargetOptions& options) {
  const std::regex pattern = dp_pattern(options);
  std::vector<const Group*> dp_groups;
  for (const auto& g : program.groups()) {
    if (std::regex_search(g.name, pattern)) dp_groups.push_back(&g);
  }
  return block_size(program.world_size(), dp_groups);
}

Program retarget_data_parallel(const Program& program, int new_world_size,
                               const RetargetOptions& options) {
  const int world = program.world_size();
  if (program.has_event_driven()) {
    throw RetargetError(
        "cannot re-target a program with event-driven ranks (parameter servers): its servers "
        "are not data-parallel replicas; simulate the experiment at the new size instead");
  }
  if (new_world_size < world) {
    throw RetargetError("cannot re-target " + std::to_string(world) + " ranks to " +
                        std::to_string(new_world_size) +
                        ": only growing the data-parallel width (by a whole factor) is supported");
  }
  if (new_world_size % world != 0) {
    throw RetargetError("cannot re-target " + std::to_string(world) + " ranks to " +
                        std::to_string(new_world_size) + ": the new world must be a multiple of " +
                        std::to_string(world) +
                        " (the data-parallel width grows by a whole factor)");
  }
  const int k = new_world_size / world;
  const std::regex pattern = dp_pattern(options);
  const auto& groups = program.groups();
  std::vector<char> is_dp(groups.size(), 0);
  std::vector<const Group*> dp_groups;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (std::regex_search(groups[g].name, pattern)) {
      is_dp[g] = 1;
      dp_groups.push_back(&groups[g]);
    }
  }
  if (dp_groups.empty() && k > 1) {
    std::set<std::string> names;
    std::string list;
    for (const auto& g : groups) {
      if (names.size() == 8) {
        list += ", ...";
        break;
      }
      if (names.insert(g.name).second) list += (list.empty() ? "\"" : ", \"") + g.name + "\"";
    }
    throw RetargetError("no data-parallel group to widen: no group name matches \"" +
                        options.dp_groups + "\"" +
                        (groups.empty() ? std::string(" (the trace has no groups)")
                                        : " (the trace's groups: " + list + ")") +
                        "; name them with --dp-groups REGEX, e.g. --dp-groups \"^dp \"");
  }
  const int block = block_size(world, dp_groups);

  Program out(new_world_size);
  out.reserve(program.op_count() * static_cast<std::size_t>(options.mirror ? 1 : k), 0, 0);
  for (const auto& label : program.labels()) out.intern_label(label);  // same ids
  for (const auto& list : program.kernel_lists()) out.add_kernels(list);
  // new_group[g * k + j]: the group replica j's copy of old group g uses.
  std::vector<std::uint32_t> new_group(groups.size() * static_cast<std::size_t>(k));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (is_dp[g]) {
      std::vector<std::int32_t> ranks;
      for (int j = 0; j < k; ++j) {
        for (std::int32_t r : groups[g].ranks) ranks.push_back(retargeted_rank(r, j, block, k));
      }
      const auto id = out.add_group(std::move(ranks), groups[g].name);
      for (int j = 0; j < k; ++j)
        new_group[g * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)] = id;
      continue;
    }
    for (int j = 0; j < k; ++j) {
      std::vector<std::int32_t> ranks;
      for (std::int32_t r : groups[g].ranks) ranks.push_back(retargeted_rank(r, j, block, k));
      new_group[g * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)] = out.add_group(
          std::move(ranks), j == 0 ? groups[g].name : groups[g].name + " r" + std::to_string(j));
    }
  }

  std::vector<OpId> deps;
  for (int nr = 0; nr < new_world_size; ++nr) {
    const int j = (nr % (block * k)) / block;
    const int r = retarget_source_rank(nr, block, k);
    out.begin_rank(nr);
    // A mirror holds nothing of its own: its representative's memory is reported for it.
    if (!program.issues_ops(r) || (options.mirror && j > 0)) continue;
    for (const auto& m : program.initial_memory(r)) out.add_initial_memory(nr, m);
    const OpId old_first = program.first_op(r);
    const auto new_first = static_cast<OpId>(out.op_count());
    for (const Op& op : program.ops_of(r)) {
      Work work = op.work;
      if (auto* c = std::get_if<Collective>(&work)) {
        c->group = new_group[c->group * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)];
      } else if (auto* s = std::get_if<Send>(&work)) {
        s->peer = retargeted_rank(s->peer, j, block, k);
      } else if (auto* v = std::get_if<Recv>(&work)) {
        v->peer = retargeted_rank(v->peer, j, block, k);
      }
      deps.clear();
      for (OpId d : program.deps_of(op)) deps.push_back(new_first + (d - old_first));
      OpInfo info = info_of(op);
      out.add(work, info, deps, program.effects_of(op));
    }
  }
  out.finish();
  out.set_overlapping_iterations(program.overlapping_iterations());
  for (int nr = 0; nr < new_world_size; ++nr) {
    const int j = (nr % (block * k)) / block;
    const int r = retarget_source_rank(nr, block, k);
    const int rep = program.replica_of(r);
    if (options.mirror && j > 0) {
      out.set_replica(nr, retargeted_rank(rep, 0, block, k));
    } else if (rep != r) {
      out.set_replica(nr, retargeted_rank(rep, j, block, k));
    }
  }
  if (options.notes != nullptr && k > 1) {
    bool sharded = false;
    for (const Op& op : program.ops()) {
      if (const auto* c = std::get_if<Collective>(&op.work)) {
        sharded |= is_dp[c->group] && (c->kind == CollectiveKind::reduce_scatter ||
                                       c->kind == CollectiveKind::all_gather);
      }
    }
    if (sharded) {
      options.notes->push_back(
          "the data-parallel groups carry reduce-scatters or all-gathers (ZeRO): re-targeting "
          "keeps the trace's shard sizes, optimizer work and memory per rank; a direct "
          "simulation at the new width would shard over " +
          std::to_string(k) + "x more ranks");
    }
  }
  return out;
}

}  // namespace stratasim::strategies
