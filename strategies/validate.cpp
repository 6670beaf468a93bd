// Static checks of a Program before anything runs it. Each failure names the op(s) involved.
#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "strategies/program.hpp"

namespace stratasim::strategies {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw ProgramError(message);
}

std::string ordinal(std::size_t i) {
  std::size_t n = i + 1;
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return std::to_string(n) + suffix;
}

void check_ops_and_ranges(const Program& p) {
  const auto world = p.world_size();
  for (std::size_t g = 0; g < p.groups().size(); ++g) {
    const auto& group = p.groups()[g];
    if (group.ranks.empty())
      fail("group " + std::to_string(g) + " ('" + group.name + "') is empty");
    std::vector<std::int32_t> sorted = group.ranks;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] < 0 || sorted[i] >= world) {
        fail("group '" + group.name + "' names rank " + std::to_string(sorted[i]) +
             ", outside the program's " + std::to_string(world) + " ranks");
      }
      if (i > 0 && sorted[i] == sorted[i - 1]) {
        fail("group '" + group.name + "' names rank " + std::to_string(sorted[i]) + " twice");
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    OpId first = p.first_op(r);
    auto ops = p.ops_of(r);
    if (!p.issues_ops(r) && !ops.empty()) {
      fail("rank " + std::to_string(r) + " mirrors rank " + std::to_string(p.replica_of(r)) +
           " but issues " + std::to_string(ops.size()) + " ops of its own");
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      OpId id = first + static_cast<OpId>(i);
      if (op.rank != r)
        fail(p.describe(id) + " is stored among rank " + std::to_string(r) + "'s ops");
      if (static_cast<int>(op.stream) >= kStreamCount)
        fail(p.describe(id) + " has an unknown stream");
      if (const auto* c = std::get_if<Compute>(&op.work)) {
        if (c->kernels >= p.kernel_lists().size())
          fail(p.describe(id) + " names a missing kernel list");
      } else if (const auto* c2 = std::get_if<Collective>(&op.work)) {
        if (c2->group >= p.groups().size()) {
          fail(p.describe(id) + " uses group " + std::to_string(c2->group) +
               ", but the program has " + std::to_string(p.groups().size()) + " groups");
        }
        const auto& members = p.groups()[c2->group].ranks;
        if (std::find(members.begin(), members.end(), r) == members.end()) {
          fail(p.describe(id) + " is a collective on group '" + p.groups()[c2->group].name +
               "', of which rank " + std::to_string(r) + " is not a member");
        }
        if (c2->bytes.count() < 0) fail(p.describe(id) + " has a negative size");
      } else {
        std::int32_t peer = std::holds_alternative<Send>(op.work) ? std::get<Send>(op.work).peer
                                                                  : std::get<Recv>(op.work).peer;
        if (peer < 0 || peer >= world || peer == r) {
          fail(p.describe(id) + " names peer rank " + std::to_string(peer) +
               ", which is not another rank of the program");
        }
      }
      for (OpId dep : p.deps_of(op)) {
        if (dep >= p.op_count() || p.op(dep).rank != r) {
          fail(p.describe(id) + " depends on " + p.describe(dep) +
               ": dependencies must be ops of the same rank");
        }
        if (dep == id) fail(p.describe(id) + " depends on itself");
      }
      for (const auto& e : p.effects_of(op)) {
        if (static_cast<int>(e.category) >= kMemoryCategoryCount ||
            static_cast<int>(e.tier) >= kMemoryTierCount) {
          fail(p.describe(id) + " has a memory effect of an unknown category or tier");
        }
      }
    }
  }
}

// Kahn's algorithm over each rank's graph: stream order edges plus dependencies (CSR, buffers
// reused across ranks: programs have millions of ops).
void check_acyclic(const Program& p) {
  std::vector<std::uint32_t> indegree, offsets, successors, fill, ready;
  for (int r = 0; r < p.world_size(); ++r) {
    auto ops = p.ops_of(r);
    const OpId first = p.first_op(r);
    const std::size_t n = ops.size();
    indegree.assign(n, 0);
    offsets.assign(n + 1, 0);
    auto for_each_edge = [&](auto&& edge) {
      std::array<std::int64_t, kStreamCount> last_on_stream;
      last_on_stream.fill(-1);
      for (std::size_t i = 0; i < n; ++i) {
        auto s = static_cast<std::size_t>(ops[i].stream);
        if (last_on_stream[s] >= 0) edge(static_cast<std::uint32_t>(last_on_stream[s]), i);
        last_on_stream[s] = static_cast<std::int64_t>(i);
        for (OpId dep : p.deps_of(ops[i])) edge(dep - first, i);
      }
    };
    for_each_edge([&](std::uint32_t from, std::size_t to) {
      ++offsets[from + 1];
      ++indegree[to];
    });
    for (std::size_t i = 0; i < n; ++i) offsets[i + 1] += offsets[i];
    successors.resize(offsets[n]);
    fill.assign(offsets.begin(), offsets.end() - 1);
    for_each_edge([&](std::uint32_t from, std::size_t to) {
      successors[fill[from]++] = static_cast<std::uint32_t>(to);
    });
    ready.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (indegree[i] == 0) ready.push_back(static_cast<std::uint32_t>(i));
    }
    std::size_t visited = 0;
    while (!ready.empty()) {
      std::uint32_t i = ready.back();
      ready.pop_back();
      ++visited;
      for (std::uint32_t k = offsets[i]; k < offsets[i + 1]; ++k) {
        if (--indegree[successors[k]] == 0) ready.push_back(successors[k]);
      }
    }
    if (visited != n) {
      std::size_t stuck = 0;
      while (indegree[stuck] == 0) ++stuck;
      fail("the dependencies of rank " + std::to_string(r) + " form a cycle through " +
           p.describe(first + static_cast<OpId>(stuck)) +
           " (with the stream order: ops of one stream run in issue order)");
    }
  }
}

struct CollectiveRecord {
  OpId op;
  CollectiveKind kind;
  Bytes bytes;
  DType dtype;
};

// Ops are visited rank by rank, so the lowest-ranked member of each group issues all of its
// collectives first; every other member is compared with that sequence as it goes.
void check_collectives(const Program& p) {
  const std::size_t groups = p.groups().size();
  std::vector<std::int32_t> reference_rank(groups);
  std::vector<std::vector<CollectiveRecord>> reference(groups);
  std::vector<std::vector<std::uint32_t>> seen(groups);  // per member position
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> membership(
      static_cast<std::size_t>(p.world_size()));  // rank -> (group, position)
  // Mirrored members issue nothing (their representative stands for them): the sequences that
  // must agree are those of the members that issue ops.
  for (std::size_t g = 0; g < groups; ++g) {
    const auto& ranks = p.groups()[g].ranks;
    reference_rank[g] = -1;
    for (std::int32_t r : ranks) {
      if (p.issues_ops(r) && (reference_rank[g] < 0 || r < reference_rank[g]))
        reference_rank[g] = r;
    }
    seen[g].assign(ranks.size(), 0);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      membership[static_cast<std::size_t>(ranks[i])].emplace_back(static_cast<std::uint32_t>(g),
                                                                  static_cast<std::uint32_t>(i));
    }
  }
  for (OpId id = 0; id < p.op_count(); ++id) {
    const Op& op = p.op(id);
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr) continue;
    const auto& group = p.groups()[c->group];
    if (op.rank == reference_rank[c->group]) {
      reference[c->group].push_back({id, c->kind, c->bytes, c->dtype});
      continue;
    }
    std::uint32_t position = 0;
    for (auto [g, pos] : membership[static_cast<std::size_t>(op.rank)]) {
      if (g == c->group) position = pos;
    }
    std::uint32_t k = seen[c->group][position]++;
    const auto& ref = reference[c->group];
    if (k >= ref.size()) {
      fail("collectives on group '" + group.name + "' disagree: rank " + std::to_string(op.rank) +
           " issues more than the " + std::to_string(ref.size()) + " of rank " +
           std::to_string(reference_rank[c->group]) + "; unmatched: " + p.describe(id));
    }
    if (ref[k].kind != c->kind || ref[k].bytes != c->bytes || ref[k].dtype != c->dtype) {
      fail("collectives on group '" + group.name + "' disagree: the " + ordinal(k) + " is " +
           p.describe(ref[k].op) + " but " + p.describe(id));
    }
  }
  for (std::size_t g = 0; g < groups; ++g) {
    const auto& group = p.groups()[g];
    for (std::size_t m = 0; m < group.ranks.size(); ++m) {
      if (!p.issues_ops(group.ranks[m])) continue;
      if (group.ranks[m] == reference_rank[g] || seen[g][m] == reference[g].size()) continue;
      fail("collectives on group '" + group.name + "' disagree: rank " +
           std::to_string(group.ranks[m]) + " issues " + std::to_string(seen[g][m]) + " but rank " +
           std::to_string(reference_rank[g]) + " issues " + std::to_string(reference[g].size()) +
           "; unmatched: " + p.describe(reference[g][seen[g][m]].op));
    }
  }
}

void check_point_to_point(const Program& p) {
  // channel (src, dst) -> sends in order, receives in order
  std::map<std::pair<std::int32_t, std::int32_t>, std::pair<std::vector<OpId>, std::vector<OpId>>>
      channels;
  for (OpId id = 0; id < p.op_count(); ++id) {
    const Op& op = p.op(id);
    if (const auto* s = std::get_if<Send>(&op.work))
      channels[{op.rank, s->peer}].first.push_back(id);
    if (const auto* r = std::get_if<Recv>(&op.work))
      channels[{r->peer, op.rank}].second.push_back(id);
  }
  for (const auto& [channel, ends] : channels) {
    const auto& [sends, recvs] = ends;
    std::size_t common = std::min(sends.size(), recvs.size());
    for (std::size_t k = 0; k < common; ++k) {
      Bytes sent = std::get<Send>(p.op(sends[k]).work).bytes;
      Bytes received = std::get<Recv>(p.op(recvs[k]).work).bytes;
      if (sent != received) {
        fail("the " + ordinal(k) + " message from rank " + std::to_string(channel.first) +
             " to rank " + std::to_string(channel.second) +
             " has different sizes: " + p.describe(sends[k]) + " vs " + p.describe(recvs[k]));
      }
    }
    if (sends.size() > recvs.size()) {
      fail(p.describe(sends[common]) + " has no matching receive: rank " +
           std::to_string(channel.second) + " receives " + std::to_string(recvs.size()) +
           " messages from rank " + std::to_string(channel.first) + ", which sends " +
           std::to_string(sends.size()));
    }
    if (recvs.size() > sends.size()) {
      fail(p.describe(recvs[common]) + " has no matching send: rank " +
           std::to_string(channel.first) + " sends " + std::to_string(sends.size()) +
           " messages to rank " + std::to_string(channel.second) + ", which receives " +
           std::to_string(recvs.size()));
    }
  }
}

}  // namespace

void validate(const Program& program) {
  check_ops_and_ranges(program);
  check_acyclic(program);
  check_collectives(program);
  check_point_to_point(program);
}

}  // namespace stratasim::strategies
