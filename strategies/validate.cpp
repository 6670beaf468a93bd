// Static checks of a Program before anything runs it. Each failure names the op(s) involved.
#include <algorithm>
#include <array>

#include "strategies/matching.hpp"
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
    const bool stream_order = !p.event_driven(r);  // Program::event_driven
    // Stream-order edges always point forward in issue order; when every dependency does too,
    // each edge goes from a lower to a higher index and there is no cycle (the lowering
    // depends only on ops already added, so this is the usual case and skips the sort).
    bool forward = true;
    for (std::size_t i = 0; i < n && forward; ++i) {
      for (OpId dep : p.deps_of(ops[i])) {
        if (dep < first || dep - first >= i) {
          forward = false;
          break;
        }
      }
    }
    if (forward) continue;
    indegree.assign(n, 0);
    offsets.assign(n + 1, 0);
    auto for_each_edge = [&](auto&& edge) {
      std::array<std::int64_t, kStreamCount> last_on_stream;
      last_on_stream.fill(-1);
      for (std::size_t i = 0; i < n; ++i) {
        auto s = static_cast<std::size_t>(ops[i].stream);
        if (stream_order && last_on_stream[s] >= 0)
          edge(static_cast<std::uint32_t>(last_on_stream[s]), i);
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

// The matching rule is strategies/matching.hpp's; this only words its first mismatch.
void check_matching(const Program& p, const Matching& m) {
  const auto mismatch = first_mismatch(p, m);
  if (!mismatch) return;
  const Mismatch& x = *mismatch;
  const std::string a = std::to_string(x.rank_a), b = std::to_string(x.rank_b);
  switch (x.kind) {
    case Mismatch::Kind::collective_count: {
      const std::string prefix =
          "collectives on group '" + p.groups()[m.group_of(x.rendezvous)].name + "' disagree: ";
      if (x.count_b > x.count_a) {
        fail(prefix + "rank " + b + " issues more than the " + std::to_string(x.count_a) +
             " of rank " + a + "; unmatched: " + p.describe(x.op_b));
      }
      fail(prefix + "rank " + b + " issues " + std::to_string(x.count_b) + " but rank " + a +
           " issues " + std::to_string(x.count_a) + "; unmatched: " + p.describe(x.op_a));
    }
    case Mismatch::Kind::collective_differs:
      fail("collectives on group '" + p.groups()[m.group_of(x.rendezvous)].name +
           "' disagree: the " + ordinal(x.k) + " is " + p.describe(x.op_a) + " but " +
           p.describe(x.op_b));
    case Mismatch::Kind::message_size:
      fail("the " + ordinal(x.k) + " message from rank " + a + " to rank " + b +
           " has different sizes: " + p.describe(x.op_a) + " vs " + p.describe(x.op_b));
    case Mismatch::Kind::message_count:
      if (x.count_a > x.count_b) {
        fail(p.describe(x.op_a) + " has no matching receive: rank " + b + " receives " +
             std::to_string(x.count_b) + " messages from rank " + a + ", which sends " +
             std::to_string(x.count_a));
      }
      fail(p.describe(x.op_b) + " has no matching send: rank " + a + " sends " +
           std::to_string(x.count_a) + " messages to rank " + b + ", which receives " +
           std::to_string(x.count_b));
  }
}

}  // namespace

void validate(const Program& program) {
  check_ops_and_ranges(program);
  check_acyclic(program);
  check_matching(program, Matching(program, /*index_ops=*/false));
}

void validate(const Program& program, const Matching& matching) {
  check_ops_and_ranges(program);
  check_acyclic(program);
  check_matching(program, matching);
}

}  // namespace stratasim::strategies
