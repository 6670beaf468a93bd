// The Program's matching rule, once (see matching.hpp).
#include "strategies/matching.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <variant>

namespace stratasim::strategies {

namespace {

// A communication op between the two passes: its provisional owner (a group, or an entry of
// the per-rank channel lists), tagged with its kind in the top two bits.
constexpr std::uint32_t kTagShift = 30;
constexpr std::uint32_t kOwnerMask = (1u << kTagShift) - 1;
enum Tag : std::uint32_t { kTagCollective = 0, kTagSend = 1, kTagRecv = 2 };

}  // namespace

Matching::Matching(const Program& program, bool index_ops) {
  Builder builder(program);
  for (int r = 0; r < program.world_size(); ++r) {
    builder.begin_rank(r);
    const OpId first = program.first_op(r);
    const auto ops = program.ops_of(r);
    for (std::size_t i = 0; i < ops.size(); ++i) builder.add(first + static_cast<OpId>(i), ops[i]);
    builder.end_rank();
  }
  *this = builder.finish(index_ops);
}

Matching::Builder::Builder(const Program& program) : program_(program) {
  const auto world = program.world_size();
  const auto& groups = program.groups();
  const auto group_count = static_cast<std::uint32_t>(groups.size());
  const auto n = program.op_count();
  if (group_count > kOwnerMask) throw std::length_error("Matching: more than 2^30 groups");

  // Issuing members of each group (distinct, valid, sorted) and, per rank, the groups it is
  // an issuing member of (CSR).
  auto& members = m_.group_members_;
  m_.group_members_begin_.assign(group_count + 1, 0);
  rank_groups_begin_.assign(static_cast<std::size_t>(world) + 1, 0);
  for (std::uint32_t g = 0; g < group_count; ++g) {
    const auto begin = members.size();
    for (std::int32_t r : groups[g].ranks) {
      if (r >= 0 && r < world && program.issues_ops(r)) members.push_back(r);
    }
    const auto first = members.begin() + static_cast<std::ptrdiff_t>(begin);
    std::sort(first, members.end());
    members.erase(std::unique(first, members.end()), members.end());
    m_.group_members_begin_[g + 1] = static_cast<std::uint32_t>(members.size());
    for (auto it = first; it != members.end(); ++it) {
      ++rank_groups_begin_[static_cast<std::size_t>(*it) + 1];
    }
  }
  for (int r = 0; r < world; ++r) {
    rank_groups_begin_[static_cast<std::size_t>(r) + 1] +=
        rank_groups_begin_[static_cast<std::size_t>(r)];
  }
  rank_groups_.resize(rank_groups_begin_.back());
  {
    std::vector<std::uint32_t> cursor(rank_groups_begin_.begin(), rank_groups_begin_.end() - 1);
    for (std::uint32_t g = 0; g < group_count; ++g) {
      for (std::int32_t r : m_.issuing_members(g)) {
        rank_groups_[cursor[static_cast<std::size_t>(r)]++] = g;
      }
    }
  }
  m_.rank_first_.resize(static_cast<std::size_t>(world) + 1);
  for (int r = 0; r <= world; ++r)
    m_.rank_first_[static_cast<std::size_t>(r)] = program.first_op(r);

  // Rank by rank in issue order (add): the sequence of every communication op on its group or
  // on its channel. Channels are found per rank through arrays indexed by peer (reset after
  // each rank), so no op pays for a hash or a search.
  calls_.assign(group_count, 0);
  group_calls_.assign(group_count, 0);
  member_.assign(group_count, 0);
  send_slot_.assign(static_cast<std::size_t>(world), kNone);
  recv_slot_.assign(static_cast<std::size_t>(world), kNone);
  // Room for every op: pages never written are never resident, and no growth copies (or freed
  // buffers left behind in the heap).
  comm_ops_.reserve(n);
  comm_tag_.reserve(n);
  comm_rv_.reserve(n);
}

void Matching::Builder::begin_rank(int rank) {
  rank_ = rank;
  const auto r = static_cast<std::size_t>(rank);
  for (auto i = rank_groups_begin_[r]; i < rank_groups_begin_[r + 1]; ++i) {
    member_[rank_groups_[i]] = 1;
  }
  sends_begin_ = sends_.size();
  recvs_begin_ = recvs_.size();
}

bool Matching::Builder::add(OpId id, const Op& op) {
  switch (op.work.index()) {
    case 1: {
      const auto g = std::get<Collective>(op.work).group;
      if (g >= calls_.size() || !member_[g]) return false;  // can never meet
      if (calls_[g]++ == 0) touched_.push_back(g);
      comm_rv_.push_back(calls_[g] - 1);
      comm_ops_.push_back(id);
      comm_tag_.push_back(kTagCollective << kTagShift | g);
      return true;
    }
    case 2:
    case 3: {
      const bool send = op.work.index() == 2;
      const std::int32_t peer = send ? std::get<Send>(op.work).peer : std::get<Recv>(op.work).peer;
      if (peer < 0 || peer >= program_.world_size()) return false;  // can never meet
      auto& slot = (send ? send_slot_ : recv_slot_)[static_cast<std::size_t>(peer)];
      auto& uses = send ? sends_ : recvs_;
      if (slot == kNone) {
        slot = static_cast<std::uint32_t>(uses.size());
        uses.push_back(send ? ChannelUse{rank_, peer, 0} : ChannelUse{peer, rank_, 0});
      }
      comm_rv_.push_back(uses[slot].count++);
      comm_ops_.push_back(id);
      comm_tag_.push_back((send ? kTagSend : kTagRecv) << kTagShift | slot);
      return true;
    }
    default:
      return false;
  }
}

void Matching::Builder::end_rank() {
  for (std::uint32_t g : touched_) {
    group_calls_[g] = std::max(group_calls_[g], calls_[g]);
    calls_[g] = 0;
  }
  touched_.clear();
  const auto r = static_cast<std::size_t>(rank_);
  for (auto i = rank_groups_begin_[r]; i < rank_groups_begin_[r + 1]; ++i) {
    member_[rank_groups_[i]] = 0;
  }
  for (std::size_t i = sends_begin_; i < sends_.size(); ++i) {
    send_slot_[static_cast<std::size_t>(sends_[i].dst)] = kNone;
  }
  for (std::size_t i = recvs_begin_; i < recvs_.size(); ++i) {
    recv_slot_[static_cast<std::size_t>(recvs_[i].src)] = kNone;
  }
}

Matching Matching::Builder::finish(bool index_ops) {
  if (sends_.size() > kOwnerMask || recvs_.size() > kOwnerMask) {
    throw std::length_error("Matching: more than 2^30 channels");
  }
  const auto group_count = static_cast<std::uint32_t>(group_calls_.size());
  auto& group_first = m_.group_first_;
  auto& channels = m_.channels_;

  // Dense ids: collectives group by group, then messages channel by channel in (src, dst)
  // order.
  group_first.assign(group_count + 1, 0);
  std::uint64_t total = 0;
  for (std::uint32_t g = 0; g < group_count; ++g) {
    group_first[g] = static_cast<std::uint32_t>(total);
    total += group_calls_[g];
    if (total >= kNone) throw std::length_error("Matching: more than 2^32 - 1 rendezvous");
  }
  group_first[group_count] = static_cast<std::uint32_t>(total);
  m_.collective_rendezvous_ = static_cast<std::uint32_t>(total);
  channels.reserve(sends_.size() + recvs_.size());
  for (const auto& u : sends_) channels.push_back({u.src, u.dst, 0, 0, 0});
  for (const auto& u : recvs_) channels.push_back({u.src, u.dst, 0, 0, 0});
  auto by_pair = [](const Channel& a, const Channel& b) {
    return std::tie(a.src, a.dst) < std::tie(b.src, b.dst);
  };
  std::sort(channels.begin(), channels.end(), by_pair);
  channels.erase(std::unique(channels.begin(), channels.end(),
                             [](const Channel& a, const Channel& b) {
                               return a.src == b.src && a.dst == b.dst;
                             }),
                 channels.end());
  // Per-rank channel list entry -> channel index.
  std::vector<std::uint32_t> send_channel(sends_.size()), recv_channel(recvs_.size());
  auto index_of = [&](const ChannelUse& u) {
    const Channel key{u.src, u.dst, 0, 0, 0};
    return static_cast<std::uint32_t>(
        std::lower_bound(channels.begin(), channels.end(), key, by_pair) - channels.begin());
  };
  for (std::size_t i = 0; i < sends_.size(); ++i) {
    send_channel[i] = index_of(sends_[i]);
    channels[send_channel[i]].sends = sends_[i].count;
  }
  for (std::size_t i = 0; i < recvs_.size(); ++i) {
    recv_channel[i] = index_of(recvs_[i]);
    channels[recv_channel[i]].recvs = recvs_[i].count;
  }
  for (auto& c : channels) {
    c.first = static_cast<std::uint32_t>(total);
    total += std::max(c.sends, c.recvs);
    if (total >= kNone) throw std::length_error("Matching: more than 2^32 - 1 rendezvous");
  }

  auto& owner = m_.owner_;
  owner.resize(total);
  for (std::uint32_t g = 0; g < group_count; ++g) {
    std::fill(owner.begin() + group_first[g], owner.begin() + group_first[g + 1], g);
  }
  for (std::size_t c = 0; c < channels.size(); ++c) {
    const auto begin = owner.begin() + channels[c].first;
    std::fill(begin, begin + std::max(channels[c].sends, channels[c].recvs),
              static_cast<std::uint32_t>(c));
  }

  // Over the communication ops only: sequence -> rendezvous id, and the ops of each rendezvous
  // (CSR, in op order).
  auto& begin = m_.members_begin_;
  begin.assign(total + 1, 0);
  for (std::size_t i = 0; i < comm_ops_.size(); ++i) {
    const std::uint32_t o = comm_tag_[i] & kOwnerMask;
    std::uint32_t base = 0;
    switch (comm_tag_[i] >> kTagShift) {
      case kTagCollective:
        base = group_first[o];
        break;
      case kTagSend:
        base = channels[send_channel[o]].first;
        break;
      default:
        base = channels[recv_channel[o]].first;
        break;
    }
    std::uint32_t& rv = comm_rv_[i];
    rv += base;
    ++begin[rv + 1];
  }
  for (std::size_t i = 0; i < total; ++i) begin[i + 1] += begin[i];
  m_.members_.resize(comm_ops_.size());
  {
    std::vector<std::uint32_t> cursor(begin.begin(), begin.end() - 1);
    for (std::size_t i = 0; i < comm_ops_.size(); ++i) {
      m_.members_[cursor[comm_rv_[i]]++] = comm_ops_[i];
    }
  }
  if (index_ops) {
    m_.rendezvous_of_.assign(program_.op_count(), kNone);
    for (std::size_t i = 0; i < comm_ops_.size(); ++i) {
      m_.rendezvous_of_[comm_ops_[i]] = comm_rv_[i];
    }
  }
  // The scratch space goes now, before the caller allocates more.
  comm_ops_ = {};
  comm_tag_ = {};
  comm_rv_ = {};
  return std::move(m_);
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
