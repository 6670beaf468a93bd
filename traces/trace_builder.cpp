// Per-rank trace ops -> Program: ordering, cycle detection, cross-rank matching, validation.
#include "traces/trace_builder.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace stratasim::traces {

namespace st = stratasim::strategies;

std::string ordinal(std::size_t index) {
  const std::size_t n = index + 1;
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return std::to_string(n) + suffix;
}

namespace {

std::string node_list(const std::vector<std::uint64_t>& ids, std::size_t limit = 8) {
  std::string text;
  for (std::size_t i = 0; i < ids.size() && i < limit; ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ids[i]);
  }
  if (ids.size() > limit) text += ", ...";
  return text;
}

std::string rank_list(const std::vector<std::int32_t>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size() && i < 16; ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > 16) text += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return text;
}

// One rank's ops in issue order, with dependencies as positions in that order.
struct OrderedRank {
  std::vector<std::size_t> order;              // file positions in issue order
  std::vector<std::vector<std::size_t>> deps;  // per issue position: deps as issue positions
};

// Kahn's algorithm with the smallest file position first, so a file already in a topological
// order keeps it exactly (an exported Program comes back op for op).
OrderedRank order_rank(const TraceRank& rank) {
  const auto& ops = rank.ops;
  const std::size_t n = ops.size();
  std::unordered_map<std::uint64_t, std::size_t> position;
  position.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto [it, inserted] = position.emplace(ops[i].id, i);
    if (!inserted) {
      throw TraceError(rank.source, "node " + std::to_string(ops[i].id),
                       "the node id appears twice (the " + ordinal(it->second) + " and the " +
                           ordinal(i) + " node of the file)");
    }
  }
  // preds[i]: (file position, ordering-only) of each dependency of op i.
  std::vector<std::vector<std::pair<std::size_t, bool>>> preds(n);
  std::vector<std::vector<std::size_t>> succs(n);
  std::vector<std::size_t> waiting(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    auto add = [&](std::uint64_t dep, bool order_only) {
      auto it = position.find(dep);
      if (it == position.end()) {
        throw TraceError(rank.source, "node " + std::to_string(ops[i].id),
                         std::string(order_only ? "ctrl_deps" : "data_deps") + " names node " +
                             std::to_string(dep) + ", which the trace does not have");
      }
      preds[i].emplace_back(it->second, order_only);
      succs[it->second].push_back(i);
      ++waiting[i];
    };
    for (auto d : ops[i].deps) add(d, false);
    for (auto d : ops[i].order_deps) add(d, true);
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) ready.push(i);
  }
  OrderedRank result;
  result.order.reserve(n);
  std::vector<std::size_t> issue_of(n, n);
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    issue_of[i] = result.order.size();
    result.order.push_back(i);
    for (std::size_t s : succs[i]) {
      if (--waiting[s] == 0) ready.push(s);
    }
  }
  if (result.order.size() < n) {
    // Every op left waits for another op left: walk back through waiting deps until a node
    // repeats; the walk from its first visit is a cycle.
    std::size_t v = 0;
    while (issue_of[v] < n) ++v;
    std::vector<std::size_t> walk;
    std::vector<std::size_t> seen_at(n, n);
    while (seen_at[v] == n) {
      seen_at[v] = walk.size();
      walk.push_back(v);
      for (const auto& [p, order_only] : preds[v]) {
        if (issue_of[p] == n) {
          v = p;
          break;
        }
      }
    }
    std::vector<std::uint64_t> cycle;
    for (std::size_t k = seen_at[v]; k < walk.size(); ++k) cycle.push_back(ops[walk[k]].id);
    std::string text;
    for (auto id : cycle) text += std::to_string(id) + " -> ";
    text += std::to_string(cycle.front());
    throw TraceError(rank.source, "node " + std::to_string(cycle.front()),
                     "dependency cycle: node " + text +
                         " (each waits for the next); a trace's dependencies must be acyclic");
  }
  // Dependencies as issue positions. A skipped node passes its own (resolved) dependencies on.
  result.deps.resize(n);
  std::vector<std::vector<std::size_t>> passed(n);  // per file position, for skipped nodes
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = result.order[k];
    const TraceOp& op = ops[i];
    std::vector<std::size_t> deps;
    for (const auto& [p, order_only] : preds[i]) {
      if (ops[p].skip) {
        for (std::size_t q : passed[p]) {
          const bool implied = order_only && !op.skip && ops[result.order[q]].stream == op.stream;
          if (!implied) deps.push_back(q);
        }
        continue;
      }
      // An ordering-only dependency on an earlier op of the same stream is implied by FIFO.
      if (order_only && !op.skip && ops[p].stream == op.stream) continue;
      deps.push_back(issue_of[p]);
    }
    // Duplicates go; the order stays as the trace gave it (so an export comes back exactly).
    std::vector<std::size_t> unique;
    unique.reserve(deps.size());
    std::unordered_set<std::size_t> seen;
    for (std::size_t d : deps) {
      if (seen.insert(d).second) unique.push_back(d);
    }
    deps = std::move(unique);
    if (op.skip) {
      passed[i] = std::move(deps);
    } else {
      result.deps[k] = std::move(deps);
    }
  }
  return result;
}

struct CollectiveUse {
  std::uint64_t node;
  st::CollectiveKind kind;
  Bytes bytes;
};

std::string describe_use(const CollectiveUse& u) {
  return std::string(st::name_of(u.kind)) + " of " + to_string(u.bytes) + " (node " +
         std::to_string(u.node) + ")";
}

void check_matching(const TraceInput& input, const std::vector<OrderedRank>& ordered) {
  const auto world = static_cast<std::int32_t>(input.ranks.size());
  const auto& groups = input.groups;
  // uses[g][rank]: the rank's collectives on group g in issue order.
  std::vector<std::map<std::int32_t, std::vector<CollectiveUse>>> uses(groups.size());
  // messages[{from, to}]: sends from `from` to `to`, and receives at `to` from `from`.
  std::map<std::pair<std::int32_t, std::int32_t>, std::vector<CollectiveUse>> sends, recvs;
  for (std::int32_t r = 0; r < world; ++r) {
    const TraceRank& rank = input.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i : ordered[static_cast<std::size_t>(r)].order) {
      const TraceOp& op = rank.ops[i];
      if (op.skip) continue;
      const std::string where = "node " + std::to_string(op.id);
      if (const auto* c = std::get_if<st::Collective>(&op.work)) {
        if (c->group >= groups.size()) {
          throw TraceError(rank.source, where,
                           "the collective names group " + std::to_string(c->group) +
                               ", but the trace has " + std::to_string(groups.size()) + " groups");
        }
        const auto& members = groups[c->group].ranks;
        if (std::find(members.begin(), members.end(), r) == members.end()) {
          throw TraceError(rank.source, where,
                           "a collective on group '" + groups[c->group].name + "' (ranks " +
                               rank_list(members) + "), of which rank " + std::to_string(r) +
                               " is not a member");
        }
        uses[c->group][r].push_back({op.id, c->kind, c->bytes});
      } else if (const auto* s = std::get_if<st::Send>(&op.work)) {
        if (s->peer < 0 || s->peer >= world || s->peer == r) {
          throw TraceError(rank.source, where,
                           "a send to rank " + std::to_string(s->peer) +
                               ", which is not another rank of the trace's " +
                               std::to_string(world) + " ranks");
        }
        sends[{r, s->peer}].push_back({op.id, st::CollectiveKind::all_reduce, s->bytes});
      } else if (const auto* v = std::get_if<st::Recv>(&op.work)) {
        if (v->peer < 0 || v->peer >= world || v->peer == r) {
          throw TraceError(rank.source, where,
                           "a receive from rank " + std::to_string(v->peer) +
                               ", which is not another rank of the trace's " +
                               std::to_string(world) + " ranks");
        }
        recvs[{v->peer, r}].push_back({op.id, st::CollectiveKind::all_reduce, v->bytes});
      }
    }
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (uses[g].empty()) continue;
    const auto& members = groups[g].ranks;
    const std::string name = "group '" + groups[g].name + "' (ranks " + rank_list(members) + ")";
    static const std::vector<CollectiveUse> kNone;
    auto of = [&](std::int32_t r) -> const std::vector<CollectiveUse>& {
      auto it = uses[g].find(r);
      return it == uses[g].end() ? kNone : it->second;
    };
    const std::int32_t first = members.front();
    for (std::int32_t r : members) {
      const auto& a = of(first);
      const auto& b = of(r);
      if (a.size() != b.size()) {
        const bool a_more = a.size() > b.size();
        const auto& longer = a_more ? a : b;
        const std::int32_t more_rank = a_more ? first : r;
        const std::int32_t less_rank = a_more ? r : first;
        const std::size_t k = std::min(a.size(), b.size());
        throw TraceError(input.ranks[static_cast<std::size_t>(more_rank)].source,
                         "node " + std::to_string(longer[k].node),
                         "unmatched collective on " + name + ": rank " + std::to_string(first) +
                             " issues " + std::to_string(a.size()) + " collectives on it, rank " +
                             std::to_string(r) + " issues " + std::to_string(b.size()) + "; the " +
                             ordinal(k) + " on rank " + std::to_string(more_rank) + ", " +
                             describe_use(longer[k]) + ", has no partner on rank " +
                             std::to_string(less_rank));
      }
      for (std::size_t k = 0; k < a.size(); ++k) {
        if (a[k].kind != b[k].kind || a[k].bytes != b[k].bytes) {
          throw TraceError(input.ranks[static_cast<std::size_t>(r)].source,
                           "node " + std::to_string(b[k].node),
                           "the " + ordinal(k) + " collective on " + name + " is " +
                               describe_use(a[k]) + " on rank " + std::to_string(first) + " but " +
                               describe_use(b[k]) + " on rank " + std::to_string(r));
        }
      }
    }
  }
  auto check_pairs = [&](const auto& from_map, const auto& to_map, bool sends_first) {
    static const std::vector<CollectiveUse> kNone;
    for (const auto& [pair, list] : from_map) {
      auto it = to_map.find(pair);
      const auto& other = it == to_map.end() ? kNone : it->second;
      const auto& s = sends_first ? list : other;
      const auto& v = sends_first ? other : list;
      const std::string a = std::to_string(pair.first), b = std::to_string(pair.second);
      if (s.size() != v.size()) {
        std::vector<std::uint64_t> s_nodes, v_nodes;
        for (const auto& u : s) s_nodes.push_back(u.node);
        for (const auto& u : v) v_nodes.push_back(u.node);
        throw TraceError(
            input.ranks[static_cast<std::size_t>(s.size() > v.size() ? pair.first : pair.second)]
                .source,
            "",
            "unmatched send/receive: rank " + a + " sends " + std::to_string(s.size()) +
                " messages to rank " + b +
                (s.empty() ? "" : " (nodes " + node_list(s_nodes) + ")") + " but rank " + b +
                " receives " + std::to_string(v.size()) + " from rank " + a +
                (v.empty() ? "" : " (nodes " + node_list(v_nodes) + ")"));
      }
      for (std::size_t k = 0; k < s.size(); ++k) {
        if (s[k].bytes != v[k].bytes) {
          throw TraceError(input.ranks[static_cast<std::size_t>(pair.second)].source,
                           "node " + std::to_string(v[k].node),
                           "the " + ordinal(k) + " message from rank " + a + " to rank " + b +
                               " is sent with " + to_string(s[k].bytes) + " (node " +
                               std::to_string(s[k].node) + ") but received with " +
                               to_string(v[k].bytes));
        }
      }
    }
  };
  check_pairs(sends, recvs, true);
  check_pairs(recvs, sends, false);
}

}  // namespace

st::Program build_program(const TraceInput& input) {
  const std::string first_source = input.ranks.empty() ? "trace" : input.ranks.front().source;
  if (input.ranks.empty()) throw TraceError(first_source, "", "the trace has no ranks");
  const auto world = static_cast<int>(input.ranks.size());
  std::vector<OrderedRank> ordered;
  ordered.reserve(input.ranks.size());
  std::size_t total_ops = 0, total_deps = 0, total_effects = 0;
  for (const auto& rank : input.ranks) {
    ordered.push_back(order_rank(rank));
    total_ops += rank.ops.size();
    for (const auto& d : ordered.back().deps) total_deps += d.size();
    for (const auto& op : rank.ops) total_effects += op.effects.size();
  }
  for (const auto& g : input.groups) {
    for (auto r : g.ranks) {
      if (r < 0 || r >= world) {
        throw TraceError(first_source, "group '" + g.name + "'",
                         "names rank " + std::to_string(r) + ", but the trace has ranks 0 to " +
                             std::to_string(world - 1));
      }
    }
  }
  check_matching(input, ordered);

  st::Program program(world);
  program.reserve(total_ops, total_deps, total_effects);
  for (const auto& g : input.groups) program.add_group(g.ranks, g.name);
  std::vector<st::OpId> ids;
  for (int r = 0; r < world; ++r) {
    const TraceRank& rank = input.ranks[static_cast<std::size_t>(r)];
    const OrderedRank& o = ordered[static_cast<std::size_t>(r)];
    program.begin_rank(r);
    for (const auto& m : rank.initial_memory) program.add_initial_memory(r, m);
    // Issue position -> op id (skipped nodes have none; their dependents were given their deps).
    ids.assign(o.order.size(), 0);
    for (std::size_t k = 0; k < o.order.size(); ++k) {
      const TraceOp& op = rank.ops[o.order[k]];
      if (op.skip) continue;
      std::vector<st::OpId> deps;
      deps.reserve(o.deps[k].size());
      for (std::size_t q : o.deps[k]) deps.push_back(ids[q]);
      if (deps.size() > 0xFFFF || op.effects.size() > 0xFFFF) {
        throw TraceError(rank.source, "node " + std::to_string(op.id),
                         "the node has " + std::to_string(deps.size()) + " dependencies and " +
                             std::to_string(op.effects.size()) +
                             " memory effects; at most 65535 of each are supported");
      }
      st::Work work = op.work;
      if (auto* c = std::get_if<st::Compute>(&work)) c->kernels = program.add_kernels(op.kernels);
      st::OpInfo info;
      info.stream = op.stream;
      info.phase = op.phase;
      info.microbatch = op.microbatch;
      info.layer_begin = op.layer_begin;
      info.layer_end = op.layer_end;
      info.label = op.label;
      ids[k] = program.add(work, info, deps, op.effects);
    }
  }
  program.finish();
  try {
    st::validate(program);
  } catch (const st::ProgramError& e) {
    throw TraceError(first_source, "", std::string("the imported program is invalid: ") + e.what());
  }
  return program;
}

}  // namespace stratasim::traces
