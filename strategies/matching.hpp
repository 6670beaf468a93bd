// How the communication ops of a Program meet: the one implementation of the matching rule of
// strategies/program.hpp, used by validate(), the trace importers (traces/trace_builder.cpp),
// the simulator (sim/simulator.cpp) and the executor's plan (exec/plan.hpp).
//
// The rule (the Program's, which is NCCL's: every rank of a communicator calls its collectives
// in the same order, and ncclSend/ncclRecv between two peers pair in call order; NCCL user
// guide, "Group calls" and "Point-to-point communication"):
// - Collectives are numbered per (rank, group): the k-th collective that rank r issues on group
//   g (k = 0, 1, ... in r's issue order, i.e. op id order, whatever the streams) has sequence k.
//   The collectives of sequence k of the members of g meet: they form the rendezvous (g, k).
// - Messages are numbered per channel, an ordered pair of ranks (src, dst): the k-th Send that
//   src issues to dst and the k-th Recv that dst issues from src (issue order, whatever the
//   streams) have sequence k and meet: the rendezvous (src -> dst, k). A rank's sends to b and
//   its receives from b are on two channels, (a, b) and (b, a), numbered apart. (A rank's
//   messages to itself, which validate() refuses, are the channel (a, a).)
// - Mirrored ranks (Program::replica_of) issue no ops: a collective's rendezvous expects one op
//   from each member of the group that issues ops (Program::issues_ops), the representatives
//   standing for their mirrors. A message to or from a mirrored rank never meets its partner.
// - An op that can never meet anyone gets no rendezvous (kNone): a collective on a group out of
//   range, or issued by a rank that is not a member of the group that issues ops; a Send or
//   Recv whose peer is not a rank of the Program. validate() reports them as range errors, the
//   simulator as ops that can never run. Group members out of range or named twice are ignored
//   here (validate() reports them).
//
// Rendezvous ids are dense: first the collectives, group by group (g's rendezvous are
// rendezvous(g, 0) ... rendezvous(g, collectives_on(g) - 1), consecutive), then the messages,
// channel by channel in (src, dst) order. A group has as many rendezvous as the most
// collectives an issuing member issues on it, a channel max(sends, receives); so a rendezvous
// may miss some of the ops it expects (complete() is false): first_mismatch() reports the first
// such place, and the first whose ops disagree in kind, size or type. Every rendezvous of a
// Program that validate() accepts is complete, and its ops agree.
//
// Cost: building is O(ops + group members + world size) time, with no per-op allocation,
// hashing or sorting (one pass over the ops, one over the communication ops; sorting only the
// channels), with 12 bytes of scratch space per communication op (reserved for every op; pages
// never written are never resident); it keeps 4 bytes per communication op, 8 per rendezvous
// and, unless told not to, 4 per op (the per-op index).
#pragma once

#include <cassert>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::strategies {

class Matching {
 public:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFu;

  /// A channel some Send or Recv uses: messages from `src` to `dst`.
  struct Channel {
    std::int32_t src = 0;
    std::int32_t dst = 0;
    std::uint32_t sends = 0;  // Sends from src to dst
    std::uint32_t recvs = 0;  // Recvs at dst from src
    std::uint32_t first = 0;  // rendezvous id of (src -> dst, 0); max(sends, recvs) follow
  };

  class Builder;

  Matching() = default;
  /// Numbers `program`'s communication ops (Program::finish must have been called). Without
  /// `index_ops`, the per-op index (rendezvous_of, sequence) is not kept, saving 4 bytes per
  /// op for a caller that goes through the rendezvous' ops instead (the simulator). Throws
  /// std::length_error beyond 2^30 groups or channels, or 2^32 - 1 rendezvous.
  explicit Matching(const Program& program, bool index_ops = true);

  // ---- Per op (only when built with index_ops).
  /// The rendezvous `id` belongs to; kNone for compute ops and for ops that can never meet.
  std::uint32_t rendezvous_of(OpId id) const {
    assert(id < rendezvous_of_.size());
    return rendezvous_of_[id];
  }
  /// k: the op's place among its rank's collectives on its group, or among the messages of its
  /// channel. kNone where rendezvous_of is kNone.
  std::uint32_t sequence(OpId id) const {
    const std::uint32_t rv = rendezvous_of(id);
    return rv == kNone ? kNone : sequence_of(rv);
  }

  // ---- Rendezvous.
  std::uint32_t rendezvous_count() const { return static_cast<std::uint32_t>(owner_.size()); }
  /// Rendezvous ids below this are collectives, the others messages.
  std::uint32_t collective_rendezvous() const { return collective_rendezvous_; }
  bool is_collective(std::uint32_t rv) const { return rv < collective_rendezvous_; }
  /// The ops that meet at `rv`, in op id order (hence in rank order); at most expected(rv).
  std::span<const OpId> ops_of(std::uint32_t rv) const {
    return {members_.data() + members_begin_[rv], members_.data() + members_begin_[rv + 1]};
  }
  /// How many ops meet at `rv` when nobody is missing: the group's issuing members, or 2.
  std::uint32_t expected(std::uint32_t rv) const {
    return is_collective(rv) ? static_cast<std::uint32_t>(issuing_members(owner_[rv]).size()) : 2;
  }
  bool complete(std::uint32_t rv) const { return ops_of(rv).size() == expected(rv); }
  /// The group of a collective rendezvous.
  std::uint32_t group_of(std::uint32_t rv) const { return owner_[rv]; }
  /// The channel of a message rendezvous.
  const Channel& channel_of(std::uint32_t rv) const { return channels_[owner_[rv]]; }
  /// k of rendezvous (g, k) or (src -> dst, k).
  std::uint32_t sequence_of(std::uint32_t rv) const {
    return rv - (is_collective(rv) ? group_first_[owner_[rv]] : channels_[owner_[rv]].first);
  }

  // ---- Groups.
  /// The members of group `g` that issue ops: distinct, in increasing rank order.
  std::span<const std::int32_t> issuing_members(std::uint32_t g) const {
    return {group_members_.data() + group_members_begin_[g],
            group_members_.data() + group_members_begin_[g + 1]};
  }
  /// How many rendezvous group `g` has: the most collectives an issuing member issues on it.
  std::uint32_t collectives_on(std::uint32_t g) const {
    return group_first_[g + 1] - group_first_[g];
  }
  /// The id of rendezvous (g, k), k < collectives_on(g).
  std::uint32_t rendezvous(std::uint32_t g, std::uint32_t k) const { return group_first_[g] + k; }
  /// How many collectives `rank` issues on group `g` (0 for a non-member); O(log^2 calls).
  std::uint32_t issued(std::uint32_t g, std::int32_t rank) const;

  // ---- Channels.
  /// Every channel some Send or Recv uses, in (src, dst) order.
  std::span<const Channel> channels() const { return channels_; }
  /// The channel from `src` to `dst`, or nullptr when no op uses it; O(log channels).
  const Channel* find_channel(std::int32_t src, std::int32_t dst) const;

 private:
  std::vector<std::uint32_t> rendezvous_of_;        // per op
  std::vector<std::uint32_t> owner_;                // per rendezvous: group or channel index
  std::vector<std::uint32_t> members_begin_;        // per rendezvous + 1: offsets into members_
  std::vector<OpId> members_;                       // ops of each rendezvous, in op order
  std::uint32_t collective_rendezvous_ = 0;         // rendezvous below this are collectives
  std::vector<std::uint32_t> group_first_;          // per group + 1: first rendezvous
  std::vector<std::uint32_t> group_members_begin_;  // per group + 1: offsets into group_members_
  std::vector<std::int32_t> group_members_;         // issuing members of each group, sorted
  std::vector<Channel> channels_;                   // in (src, dst) order
  std::vector<OpId> rank_first_;                    // per rank + 1: Program::first_op
};

/// Builds a Matching op by op, for a caller that reads every op anyway (the simulator): the
/// numbering of Matching(program) fused into the caller's own pass over the ops, which are too
/// many to read twice. Give the ranks in order 0 ... world_size - 1 (begin_rank, then the
/// rank's ops in issue order, then end_rank); every communication op must be given, compute ops
/// may be left out.
class Matching::Builder {
 public:
  explicit Builder(const Program& program);
  void begin_rank(int rank);
  /// Numbers op `id` of the rank begun last: false when it can never meet anyone (kNone) or is
  /// a compute op.
  bool add(OpId id, const Op& op);
  void end_rank();
  /// The Matching (see Matching's constructor); the builder is spent.
  Matching finish(bool index_ops = true);

 private:
  struct ChannelUse {
    std::int32_t src;
    std::int32_t dst;
    std::uint32_t count;
  };
  const Program& program_;
  Matching m_;
  int rank_ = -1;
  std::vector<std::uint32_t> rank_groups_begin_;   // per rank + 1: offsets into rank_groups_
  std::vector<std::uint32_t> rank_groups_;         // groups each rank issues ops in
  std::vector<std::uint32_t> calls_;               // per group, of the current rank
  std::vector<std::uint32_t> group_calls_;         // per group: the most calls of a member
  std::vector<std::uint8_t> member_;               // per group: the current rank issues in it
  std::vector<std::uint32_t> touched_;             // groups the current rank called
  std::vector<std::uint32_t> send_slot_;           // per peer: index into sends_, or kNone
  std::vector<std::uint32_t> recv_slot_;           // per peer: index into recvs_, or kNone
  std::vector<ChannelUse> sends_, recvs_;          // per (rank, peer) used, in order of first use
  std::size_t sends_begin_ = 0, recvs_begin_ = 0;  // the current rank's first entries
  // Per communication op that can meet, in op order: its id, its provisional owner
  // (Tag << kTagShift | owner), and its sequence (finish adds its owner's first rendezvous).
  std::vector<OpId> comm_ops_;
  std::vector<std::uint32_t> comm_tag_;
  std::vector<std::uint32_t> comm_rv_;
};

/// The first place where the communication ops of a Program do not match.
struct Mismatch {
  enum class Kind : std::uint8_t {
    /// Members of a group issue different numbers of collectives on it.
    collective_count,
    /// The k-th collectives of two members differ in kind, size or data type.
    collective_differs,
    /// A channel carries different numbers of Sends and Recvs.
    message_count,
    /// The k-th Send and Recv of a channel have different sizes.
    message_size,
  };
  static constexpr OpId kNoOp = 0xFFFFFFFFu;

  Kind kind = Kind::collective_count;
  std::uint32_t rendezvous = 0;  // (group, k) or (channel, k): where they first disagree
  std::uint32_t k = 0;
  /// Collectives: the group's lowest issuing member (the reference every member is compared
  /// with) and the member that disagrees with it (for a count, the lowest member issuing a
  /// different number). Messages: the channel's sender and receiver.
  std::int32_t rank_a = 0;
  std::int32_t rank_b = 0;
  /// How many collectives rank_a and rank_b issue on the group; or how many messages rank_a
  /// sends and rank_b receives on the channel.
  std::uint32_t count_a = 0;
  std::uint32_t count_b = 0;
  /// rank_a's and rank_b's ops at rendezvous k. For a count, the rank that issues fewer has
  /// none there (kNoOp): the other's op is the first without a partner.
  OpId op_a = kNoOp;
  OpId op_b = kNoOp;
};

/// The first mismatch of `program`, or none: groups in index order, each from k = 0 up (the
/// first incomplete rendezvous is a count mismatch, earlier ones are compared op by op with the
/// reference's), then channels in (src, dst) order, the same way. Ops without a rendezvous
/// (Matching::kNone) are not looked at. O(communication ops).
std::optional<Mismatch> first_mismatch(const Program& program, const Matching& matching);

/// validate(program) with the matching already built (saves building it twice).
void validate(const Program& program, const Matching& matching);

}  // namespace stratasim::strategies
