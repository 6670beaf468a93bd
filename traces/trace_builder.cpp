// Per-rank trace ops -> Program: ordering, cycle detection, cross-rank matching, validation.
#include "traces/trace_builder.hpp"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "strategies/matching.hpp"

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

// What a collective or message is, as the trace named it: "all_reduce of 4 MiB (node 17)".
std::string describe_use(const st::Program& program, const std::vector<std::uint64_t>& node_of,
                         st::OpId id, bool with_dtype = false) {
  const st::Op& op = program.op(id);
  std::string text;
  if (const auto* c = std::get_if<st::Collective>(&op.work)) {
    text = std::string(st::name_of(c->kind)) + " of " + to_string(c->bytes);
    if (with_dtype) text += " in " + std::string(name_of(c->dtype));
  }
  return text + " (node " + std::to_string(node_of[id]) + ")";
}

// Before rank r's ops are built: what would make one unable to meet anyone, in the trace's
// words (strategies::Matching leaves such ops out).
void check_ranges(const std::vector<st::Group>& groups, int world, std::int32_t r,
                  const TraceRank& rank, const OrderedRank& ordered) {
  for (std::size_t i : ordered.order) {
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
    } else if (const auto* s = std::get_if<st::Send>(&op.work)) {
      if (s->peer < 0 || s->peer >= world || s->peer == r) {
        throw TraceError(rank.source, where,
                         "a send to rank " + std::to_string(s->peer) +
                             ", which is not another rank of the trace's " + std::to_string(world) +
                             " ranks");
      }
    } else if (const auto* v = std::get_if<st::Recv>(&op.work)) {
      if (v->peer < 0 || v->peer >= world || v->peer == r) {
        throw TraceError(rank.source, where,
                         "a receive from rank " + std::to_string(v->peer) +
                             ", which is not another rank of the trace's " + std::to_string(world) +
                             " ranks");
      }
    }
  }
}

// The first mismatch of the built Program (strategies::first_mismatch: the Program's matching
// rule), in the trace's words: files, node ids, kinds and sizes.
void check_matching(const std::vector<st::Group>& groups, const std::vector<std::string>& sources,
                    const st::Program& program, const st::Matching& matching,
                    const std::vector<std::uint64_t>& node_of) {
  const auto mismatch = st::first_mismatch(program, matching);
  if (!mismatch) return;
  const st::Mismatch& x = *mismatch;
  auto source = [&](std::int32_t r) -> const std::string& {
    return sources[static_cast<std::size_t>(r)];
  };
  auto node = [&](st::OpId id) { return "node " + std::to_string(node_of[id]); };
  const std::string a = std::to_string(x.rank_a), b = std::to_string(x.rank_b);
  switch (x.kind) {
    case st::Mismatch::Kind::collective_count:
    case st::Mismatch::Kind::collective_differs: {
      const auto& group = groups[matching.group_of(x.rendezvous)];
      const std::string name = "group '" + group.name + "' (ranks " + rank_list(group.ranks) + ")";
      if (x.kind == st::Mismatch::Kind::collective_differs) {
        const auto& ca = std::get<st::Collective>(program.op(x.op_a).work);
        const auto& cb = std::get<st::Collective>(program.op(x.op_b).work);
        const bool dtype = ca.kind == cb.kind && ca.bytes == cb.bytes;
        throw TraceError(source(x.rank_b), node(x.op_b),
                         "the " + ordinal(x.k) + " collective on " + name + " is " +
                             describe_use(program, node_of, x.op_a, dtype) + " on rank " + a +
                             " but " + describe_use(program, node_of, x.op_b, dtype) + " on rank " +
                             b);
      }
      const bool a_more = x.count_a > x.count_b;
      const st::OpId unmatched = a_more ? x.op_a : x.op_b;
      throw TraceError(source(a_more ? x.rank_a : x.rank_b), node(unmatched),
                       "unmatched collective on " + name + ": rank " + a + " issues " +
                           std::to_string(x.count_a) + " collectives on it, rank " + b +
                           " issues " + std::to_string(x.count_b) + "; the " + ordinal(x.k) +
                           " on rank " + (a_more ? a : b) + ", " +
                           describe_use(program, node_of, unmatched) + ", has no partner on rank " +
                           (a_more ? b : a));
    }
    case st::Mismatch::Kind::message_size:
      throw TraceError(source(x.rank_b), node(x.op_b),
                       "the " + ordinal(x.k) + " message from rank " + a + " to rank " + b +
                           " is sent with " +
                           to_string(std::get<st::Send>(program.op(x.op_a).work).bytes) + " (" +
                           node(x.op_a) + ") but received with " +
                           to_string(std::get<st::Recv>(program.op(x.op_b).work).bytes));
    case st::Mismatch::Kind::message_count: {
      const auto& channel = matching.channel_of(x.rendezvous);
      std::vector<std::uint64_t> s_nodes, v_nodes;
      for (std::uint32_t k = 0; k < std::max(channel.sends, channel.recvs); ++k) {
        for (st::OpId id : matching.ops_of(channel.first + k)) {
          (std::holds_alternative<st::Send>(program.op(id).work) ? s_nodes : v_nodes)
              .push_back(node_of[id]);
        }
      }
      throw TraceError(source(x.count_a > x.count_b ? x.rank_a : x.rank_b), "",
                       "unmatched send/receive: rank " + a + " sends " + std::to_string(x.count_a) +
                           " messages to rank " + b +
                           (s_nodes.empty() ? "" : " (nodes " + node_list(s_nodes) + ")") +
                           " but rank " + b + " receives " + std::to_string(x.count_b) +
                           " from rank " + a +
                           (v_nodes.empty() ? "" : " (nodes " + node_list(v_nodes) + ")"));
    }
  }
}

}  // namespace

ProgramBuilder::ProgramBuilder(int world, std::vector<st::Group> groups, std::string first_source)
    : program_(world), first_source_(std::move(first_source)) {
  for (auto& g : groups) add_group(std::move(g));
  sources_.reserve(static_cast<std::size_t>(world));
}

void ProgramBuilder::add_group(st::Group group) {
  const int world = program_.world_size();
  for (auto r : group.ranks) {
    if (r < 0 || r >= world) {
      throw TraceError(first_source_, "group '" + group.name + "'",
                       "names rank " + std::to_string(r) + ", but the trace has ranks 0 to " +
                           std::to_string(world - 1));
    }
  }
  program_.add_group(group.ranks, group.name);
  groups_.push_back(std::move(group));
}

void ProgramBuilder::add_rank(const TraceRank& rank) {
  const int r = static_cast<int>(sources_.size());
  sources_.push_back(rank.source);
  const OrderedRank o = order_rank(rank);
  check_ranges(groups_, program_.world_size(), r, rank, o);
  program_.begin_rank(r);
  for (const auto& m : rank.initial_memory) program_.add_initial_memory(r, m);
  // Issue position -> op id (skipped nodes have none; their dependents were given their deps).
  std::vector<st::OpId> ids(o.order.size(), 0);
  std::vector<st::OpId> deps;
  for (std::size_t k = 0; k < o.order.size(); ++k) {
    const TraceOp& op = rank.ops[o.order[k]];
    if (op.skip) continue;
    deps.clear();
    for (std::size_t q : o.deps[k]) deps.push_back(ids[q]);
    if (deps.size() > 0xFFFF || op.effects.size() > 0xFFFF) {
      throw TraceError(rank.source, "node " + std::to_string(op.id),
                       "the node has " + std::to_string(deps.size()) + " dependencies and " +
                           std::to_string(op.effects.size()) +
                           " memory effects; at most 65535 of each are supported");
    }
    st::Work work = op.work;
    if (auto* c = std::get_if<st::Compute>(&work)) c->kernels = kernel_list(op);
    st::OpInfo info;
    info.stream = op.stream;
    info.phase = op.phase;
    info.microbatch = op.microbatch;
    info.layer_begin = op.layer_begin;
    info.layer_end = op.layer_end;
    info.label = op.label;
    ids[k] = program_.add(work, info, deps, op.effects);
    node_of_.push_back(op.id);
  }
}

std::uint32_t ProgramBuilder::kernel_list(const TraceOp& op) {
  if (op.kernels_key.empty()) return program_.add_kernels(op.kernels);
  // Per stream too: passes that treat a list by the stream of its ops (a replay's
  // --scale-compute leaves host-stream lists alone) see lists as unshared across streams.
  const auto [it, added] = kernel_lists_.try_emplace(
      std::to_string(static_cast<int>(op.stream)) + ":" + op.kernels_key, 0);
  if (added) it->second = program_.add_kernels(op.kernels);
  return it->second;
}

st::Program ProgramBuilder::finish() && {
  if (sources_.empty()) throw TraceError(first_source_, "", "the trace has no ranks");
  program_.finish();
  const st::Matching matching(program_, /*index_ops=*/false);
  check_matching(groups_, sources_, program_, matching, node_of_);
  try {
    st::validate(program_, matching);
  } catch (const st::ProgramError& e) {
    throw TraceError(first_source_, "",
                     std::string("the imported program is invalid: ") + e.what());
  }
  return std::move(program_);
}

st::Program build_program(const TraceInput& input) {
  const std::string first_source = input.ranks.empty() ? "trace" : input.ranks.front().source;
  if (input.ranks.empty()) throw TraceError(first_source, "", "the trace has no ranks");
  ProgramBuilder builder(static_cast<int>(input.ranks.size()), input.groups, first_source);
  std::size_t ops = 0;
  for (const auto& rank : input.ranks) ops += rank.ops.size();
  builder.reserve(ops);
  for (const auto& rank : input.ranks) builder.add_rank(rank);
  return std::move(builder).finish();
}

}  // namespace stratasim::traces
