// The Program's matching rule, once (see matching.hpp).
#include "strategies/matching.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <variant>

namespace stratasim::strategies {

namespace {

constexpr std::uint32_t kNone = Matching::kNone;

// A communication op between the two passes: its provisional owner (a group, or an entry of
// the per-rank channel lists), tagged with its kind in the top two bits.
constexpr std::uint32_t kTagShift = 30;
constexpr std::uint32_t kOwnerMask = (1u << kTagShift) - 1;
enum Tag : std::uint32_t { kTagCollective = 0, kTagSend = 1, kTagRecv = 2 };

struct ChannelUse {
  std::int32_t src;
  std::int32_t dst;
  std::uint32_t count;
};

}  // namespace

Matching::Matching(const Program& program, bool index_ops) {
  const auto world = program.world_size();
  const auto& groups = program.groups();
  const auto group_count = static_cast<std::uint32_t>(groups.size());
  const auto n = program.op_count();
  if (group_count > kOwnerMask) throw std::length_error("Matching: more than 2^30 groups");

  // Issuing members of each group (distinct, valid, sorted) and, per rank, the groups it is
  // an issuing member of (CSR).
  group_members_begin_.assign(group_count + 1, 0);
  group_members_.clear();
  std::vector<std::uint32_t> rank_groups_begin(static_cast<std::size_t>(world) + 1, 0);
  for (std::uint32_t g = 0; g < group_count; ++g) {
    const auto begin = group_members_.size();
    for (std::int32_t r : groups[g].ranks) {
      if (r >= 0 && r < world && program.issues_ops(r)) group_members_.push_back(r);
    }
    const auto first = group_members_.begin() + static_cast<std::ptrdiff_t>(begin);
    std::sort(first, group_members_.end());
    group_members_.erase(std::unique(first, group_members_.end()), group_members_.end());
    group_members_begin_[g + 1] = static_cast<std::uint32_t>(group_members_.size());
    for (auto it = first; it != group_members_.end(); ++it) {
      ++rank_groups_begin[static_cast<std::size_t>(*it) + 1];
    }
  }
  for (int r = 0; r < world; ++r) {
    rank_groups_begin[static_cast<std::size_t>(r) + 1] +=
        rank_groups_begin[static_cast<std::size_t>(r)];
  }
  std::vector<std::uint32_t> rank_groups(rank_groups_begin.back());
  {
    std::vector<std::uint32_t> cursor(rank_groups_begin.begin(), rank_groups_begin.end() - 1);
    for (std::uint32_t g = 0; g < group_count; ++g) {
      for (std::int32_t r : issuing_members(g)) {
        rank_groups[cursor[static_cast<std::size_t>(r)]++] = g;
      }
    }
  }

  // Pass 1, rank by rank in issue order: the sequence of every communication op on its group
  // or on its channel. Channels are found per rank through arrays indexed by peer (reset after
  // each rank), so no op pays for a hash or a search.
  rank_first_.resize(static_cast<std::size_t>(world) + 1);
  for (int r = 0; r <= world; ++r) rank_first_[static_cast<std::size_t>(r)] = program.first_op(r);
  std::vector<std::uint32_t> calls(group_count, 0);  // of the current rank
  std::vector<std::uint32_t> group_calls(group_count, 0);
  std::vector<std::uint8_t> member(group_count, 0);
  std::vector<std::uint32_t> touched;
  std::vector<std::uint32_t> send_slot(static_cast<std::size_t>(world), kNone);
  std::vector<std::uint32_t> recv_slot(static_cast<std::size_t>(world), kNone);
  std::vector<ChannelUse> sends, recvs;  // per (rank, peer) used, in order of first use
  // Per communication op that can meet, in op order: its id, its provisional owner
  // (Tag << kTagShift | owner), and its sequence (pass 2 adds its owner's first rendezvous).
  std::vector<OpId> comm_ops;
  std::vector<std::uint32_t> comm_tag;
  std::vector<std::uint32_t> comm_rv;
  // Room for every op: pages never written are never resident, and no growth copies (or freed
  // buffers left behind in the heap).
  comm_ops.reserve(n);
  comm_tag.reserve(n);
  comm_rv.reserve(n);
  for (int r = 0; r < world; ++r) {
    const auto rg_begin = rank_groups_begin[static_cast<std::size_t>(r)];
    const auto rg_end = rank_groups_begin[static_cast<std::size_t>(r) + 1];
    for (auto i = rg_begin; i < rg_end; ++i) member[rank_groups[i]] = 1;
    const std::size_t sends_begin = sends.size();
    const std::size_t recvs_begin = recvs.size();
    const OpId first = program.first_op(r);
    const auto ops = program.ops_of(r);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const OpId id = first + static_cast<OpId>(i);
      switch (op.work.index()) {
        case 1: {
          const auto g = std::get<Collective>(op.work).group;
          if (g >= group_count || !member[g]) break;  // can never meet
          if (calls[g]++ == 0) touched.push_back(g);
          comm_rv.push_back(calls[g] - 1);
          comm_ops.push_back(id);
          comm_tag.push_back(kTagCollective << kTagShift | g);
          break;
        }
        case 2:
        case 3: {
          const bool send = op.work.index() == 2;
          const std::int32_t peer =
              send ? std::get<Send>(op.work).peer : std::get<Recv>(op.work).peer;
          if (peer < 0 || peer >= world) break;  // can never meet
          auto& slot = (send ? send_slot : recv_slot)[static_cast<std::size_t>(peer)];
          auto& uses = send ? sends : recvs;
          if (slot == kNone) {
            slot = static_cast<std::uint32_t>(uses.size());
            uses.push_back(send ? ChannelUse{r, peer, 0} : ChannelUse{peer, r, 0});
          }
          comm_rv.push_back(uses[slot].count++);
          comm_ops.push_back(id);
          comm_tag.push_back((send ? kTagSend : kTagRecv) << kTagShift | slot);
          break;
        }
        default:
          break;
      }
    }
    for (std::uint32_t g : touched) {
      group_calls[g] = std::max(group_calls[g], calls[g]);
      calls[g] = 0;
    }
    touched.clear();
    for (auto i = rg_begin; i < rg_end; ++i) member[rank_groups[i]] = 0;
    for (std::size_t i = sends_begin; i < sends.size(); ++i) {
      send_slot[static_cast<std::size_t>(sends[i].dst)] = kNone;
    }
    for (std::size_t i = recvs_begin; i < recvs.size(); ++i) {
      recv_slot[static_cast<std::size_t>(recvs[i].src)] = kNone;
    }
  }
  if (sends.size() > kOwnerMask || recvs.size() > kOwnerMask) {
    throw std::length_error("Matching: more than 2^30 channels");
  }

  // Dense ids: collectives group by group, then messages channel by channel in (src, dst)
  // order.
  group_first_.assign(group_count + 1, 0);
  std::uint64_t total = 0;
  for (std::uint32_t g = 0; g < group_count; ++g) {
    group_first_[g] = static_cast<std::uint32_t>(total);
    total += group_calls[g];
    if (total >= kNone) throw std::length_error("Matching: more than 2^32 - 1 rendezvous");
  }
  group_first_[group_count] = static_cast<std::uint32_t>(total);
  collective_rendezvous_ = static_cast<std::uint32_t>(total);
  channels_.clear();
  channels_.reserve(sends.size() + recvs.size());
  for (const auto& u : sends) channels_.push_back({u.src, u.dst, 0, 0, 0});
  for (const auto& u : recvs) channels_.push_back({u.src, u.dst, 0, 0, 0});
  auto by_pair = [](const Channel& a, const Channel& b) {
    return std::tie(a.src, a.dst) < std::tie(b.src, b.dst);
  };
  std::sort(channels_.begin(), channels_.end(), by_pair);
  channels_.erase(std::unique(channels_.begin(), channels_.end(),
                              [](const Channel& a, const Channel& b) {
                                return a.src == b.src && a.dst == b.dst;
                              }),
                  channels_.end());
  // Per-rank channel list entry -> channel index.
  std::vector<std::uint32_t> send_channel(sends.size()), recv_channel(recvs.size());
  auto index_of = [&](const ChannelUse& u) {
    const Channel key{u.src, u.dst, 0, 0, 0};
    return static_cast<std::uint32_t>(
        std::lower_bound(channels_.begin(), channels_.end(), key, by_pair) - channels_.begin());
  };
  for (std::size_t i = 0; i < sends.size(); ++i) {
    send_channel[i] = index_of(sends[i]);
    channels_[send_channel[i]].sends = sends[i].count;
  }
  for (std::size_t i = 0; i < recvs.size(); ++i) {
    recv_channel[i] = index_of(recvs[i]);
    channels_[recv_channel[i]].recvs = recvs[i].count;
  }
  for (auto& c : channels_) {
    c.first = static_cast<std::uint32_t>(total);
    total += std::max(c.sends, c.recvs);
    if (total >= kNone) throw std::length_error("Matching: more than 2^32 - 1 rendezvous");
  }

  owner_.resize(total);
  for (std::uint32_t g = 0; g < group_count; ++g) {
    std::fill(owner_.begin() + group_first_[g], owner_.begin() + group_first_[g + 1], g);
  }
  for (std::size_t c = 0; c < channels_.size(); ++c) {
    const auto begin = owner_.begin() + channels_[c].first;
    std::fill(begin, begin + std::max(channels_[c].sends, channels_[c].recvs),
              static_cast<std::uint32_t>(c));
  }

  // Pass 2, over the communication ops only: sequence -> rendezvous id, and the ops of each
  // rendezvous (CSR, in op order).
  members_begin_.assign(total + 1, 0);
  for (std::size_t i = 0; i < comm_ops.size(); ++i) {
    const std::uint32_t owner = comm_tag[i] & kOwnerMask;
    std::uint32_t base = 0;
    switch (comm_tag[i] >> kTagShift) {
      case kTagCollective:
        base = group_first_[owner];
        break;
      case kTagSend:
        base = channels_[send_channel[owner]].first;
        break;
      default:
        base = channels_[recv_channel[owner]].first;
        break;
    }
    std::uint32_t& rv = comm_rv[i];
    rv += base;
    ++members_begin_[rv + 1];
  }
  for (std::size_t i = 0; i < total; ++i) members_begin_[i + 1] += members_begin_[i];
  members_.resize(comm_ops.size());
  {
    std::vector<std::uint32_t> cursor(members_begin_.begin(), members_begin_.end() - 1);
    for (std::size_t i = 0; i < comm_ops.size(); ++i) members_[cursor[comm_rv[i]]++] = comm_ops[i];
  }
  if (index_ops) {
    rendezvous_of_.assign(n, kNone);
    for (std::size_t i = 0; i < comm_ops.size(); ++i) rendezvous_of_[comm_ops[i]] = comm_rv[i];
  }
}

std::uint32_t Matching::issued(std::uint32_t g, std::int32_t rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) + 1 >= rank_first_.size()) return 0;
  const OpId lo_id = rank_first_[static_cast<std::size_t>(rank)];
  const OpId hi_id = rank_first_[static_cast<std::size_t>(rank) + 1];
  // A member that issues c collectives on g is at its rendezvous 0 ... c - 1 and at none after;
  // the ops of a rendezvous are in op id order, and a rank's ops are ids [lo_id, hi_id).
  auto present = [&](std::uint32_t k) {
    const auto ops = ops_of(rendezvous(g, k));
    const auto it = std::lower_bound(ops.begin(), ops.end(), lo_id);
    return it != ops.end() && *it < hi_id;
  };
  std::uint32_t lo = 0, hi = collectives_on(g);  // the answer is in [lo, hi]
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (present(mid)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

const Matching::Channel* Matching::find_channel(std::int32_t src, std::int32_t dst) const {
  const auto it =
      std::lower_bound(channels_.begin(), channels_.end(), std::pair{src, dst},
                       [](const Channel& c, const std::pair<std::int32_t, std::int32_t>& key) {
                         return std::pair{c.src, c.dst} < key;
                       });
  return it != channels_.end() && it->src == src && it->dst == dst ? &*it : nullptr;
}

std::optional<Mismatch> first_mismatch(const Program& program, const Matching& matching) {
  using Kind = Mismatch::Kind;
  const auto group_count = static_cast<std::uint32_t>(program.groups().size());
  for (std::uint32_t g = 0; g < group_count; ++g) {
    const auto members = matching.issuing_members(g);
    if (members.empty()) continue;
    const std::int32_t reference = members.front();
    for (std::uint32_t k = 0; k < matching.collectives_on(g); ++k) {
      const std::uint32_t rv = matching.rendezvous(g, k);
      const auto ops = matching.ops_of(rv);  // not empty: some member issues a k-th
      Mismatch m;
      m.rendezvous = rv;
      m.k = k;
      m.rank_a = reference;
      if (ops.size() != members.size()) {
        // Every member is at the rendezvous before k: those missing at k issue exactly k.
        m.kind = Kind::collective_count;
        if (program.op(ops.front()).rank == reference) {
          std::size_t i = 0;
          while (i < ops.size() && program.op(ops[i]).rank == members[i]) ++i;
          m.rank_b = members[i];
          m.count_a = matching.issued(g, reference);
          m.count_b = k;
          m.op_a = ops.front();
        } else {
          m.rank_b = program.op(ops.front()).rank;
          m.count_a = k;
          m.count_b = matching.issued(g, m.rank_b);
          m.op_b = ops.front();
        }
        return m;
      }
      const auto& first = std::get<Collective>(program.op(ops.front()).work);
      for (std::size_t i = 1; i < ops.size(); ++i) {
        const auto& c = std::get<Collective>(program.op(ops[i]).work);
        if (c.kind == first.kind && c.bytes == first.bytes && c.dtype == first.dtype) continue;
        m.kind = Kind::collective_differs;
        m.rank_b = program.op(ops[i]).rank;
        m.count_a = matching.issued(g, m.rank_a);
        m.count_b = matching.issued(g, m.rank_b);
        m.op_a = ops.front();
        m.op_b = ops[i];
        return m;
      }
    }
  }
  for (const auto& c : matching.channels()) {
    Mismatch m;
    m.rank_a = c.src;
    m.rank_b = c.dst;
    m.count_a = c.sends;
    m.count_b = c.recvs;
    auto place = [&](std::uint32_t k) {
      m.k = k;
      m.rendezvous = c.first + k;
      for (OpId id : matching.ops_of(m.rendezvous)) {
        (std::holds_alternative<Send>(program.op(id).work) ? m.op_a : m.op_b) = id;
      }
    };
    const std::uint32_t common = std::min(c.sends, c.recvs);
    for (std::uint32_t k = 0; k < common; ++k) {
      const auto ops = matching.ops_of(c.first + k);
      const auto& a = program.op(ops[0]).work;
      const auto& b = program.op(ops[1]).work;
      const Bytes sent =
          std::holds_alternative<Send>(a) ? std::get<Send>(a).bytes : std::get<Send>(b).bytes;
      const Bytes received =
          std::holds_alternative<Recv>(a) ? std::get<Recv>(a).bytes : std::get<Recv>(b).bytes;
      if (sent == received) continue;
      m.kind = Kind::message_size;
      place(k);
      return m;
    }
    if (c.sends != c.recvs) {
      m.kind = Kind::message_count;
      place(common);
      return m;
    }
  }
  return std::nullopt;
}

}  // namespace stratasim::strategies
