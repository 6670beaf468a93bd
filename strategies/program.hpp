// The Program: per-rank lists of typed ops, the contract between strategies and the back ends
// (the simulator in sim/ and the CUDA executor in exec/). Nothing downstream knows what a
// pipeline schedule or a parallel strategy is: it sees ops, their streams, dependencies,
// collectives over communicator groups, and memory effects.
//
// Semantics (as on CUDA):
// - ops of one (rank, stream) run one after another in issue order;
// - an op also waits for its dependencies (ops of the same rank, any stream), like CUDA events;
// - a collective starts when every member of its group has reached it; the k-th collective a
//   rank issues on a group matches the k-th of every other member;
// - the k-th Send from rank a to rank b matches the k-th Recv at b from a; both start when
//   both are reached (a rendezvous, as NCCL send/recv);
//   (both rules are implemented once, in strategies/matching.hpp, which every consumer uses);
// - memory effects change a rank's allocation of a category on a tier when the op starts or
//   ends; `initial_memory` is what each rank holds before its first op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "hw_models/dtype.hpp"
#include "hw_models/kernel_model.hpp"
#include "hw_models/units.hpp"

namespace stratasim::strategies {

enum class Stream : std::uint8_t { compute, tp_comm, dp_comm, pp_send, pp_recv, copy, host };
inline constexpr int kStreamCount = 7;
std::string_view name_of(Stream s);

/// `recompute`: forward work repeated during backward (activation recomputation); it counts in
/// hardware FLOPs, not model FLOPs.
enum class Phase : std::uint8_t { forward, backward, optimizer, other, recompute };
inline constexpr int kPhaseCount = 5;
std::string_view name_of(Phase p);

enum class MemoryTier : std::uint8_t { device, host, nvme };
inline constexpr int kMemoryTierCount = 3;
std::string_view name_of(MemoryTier t);

enum class MemoryCategory : std::uint8_t {
  parameters,
  gradients,
  optimizer_states,
  activations,
  workspace,
  comm_buffers,
  /// Held back from the tensors: CUDA context, NCCL buffers, the allocator's slack
  /// (sim/memory.hpp MemoryOverheads; never allocated by ops).
  other
};
inline constexpr int kMemoryCategoryCount = 7;
std::string_view name_of(MemoryCategory c);

// ---- Kernels: pieces of work with real meaning that the simulator costs and the executor runs.

/// C[m, n] = A[m, k] * B[k, n], `batch` independent times.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::bf16;
  /// How FP8 operands are scaled (which FP8 kernel class runs it); ignored for other dtypes.
  hw::GemmScaling scaling = hw::GemmScaling::tensor;
};

/// Fused attention core (softmax(QK^T)V), forward or backward.
struct Attention {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = true;
  DType dtype = DType::bf16;
  bool backward = false;
  /// Which fused kernel runs it (its calibrated rate differs: hw_models/kernel_model.hpp).
  hw::AttentionImpl impl = hw::AttentionImpl::flash_attention_2;
  /// Sliding-window (local) attention, causal only: each query sees at most the `window`
  /// latest keys, itself included (Mistral's and Gemma's sliding_window; FlashAttention's
  /// window_size = (window - 1, 0)). 0: no window.
  std::int64_t window = 0;
  /// Chunked (block-local) attention, causal only: the keys are cut into chunks of `chunk`
  /// positions (0 to chunk - 1, chunk to 2 chunk - 1, ...) and a query sees the keys of its own
  /// chunk up to itself (Llama 4's attention_chunk_size on its RoPE layers). Not a sliding
  /// window: a query early in its chunk sees few keys however many precede it. 0: no chunking.
  /// At most one of `window` and `chunk` is set.
  std::int64_t chunk = 0;
};

/// Memory-bound work: norms, activations, dropout, residual adds, softmax.
struct Elementwise {
  std::int64_t elements = 0;
  Bytes bytes_read;
  Bytes bytes_written;
};

/// The optimizers (strategies/optimizer.hpp has what each keeps and moves: one table).
enum class OptimizerKind : std::uint8_t {
  adam,
  sgd,
  adamw,
  sgd_momentum,
  rmsprop,
  adagrad,
  adafactor,
  lion,
  adam8bit
};
inline constexpr int kOptimizerKindCount = 9;
std::string_view name_of(OptimizerKind k);

/// One optimizer update of `params` parameters whose weights the layers use in `dtype` (with a
/// dtype under 4 bytes, mixed precision: fp32 master weights). Gradients are read in `dtype`,
/// or in fp32 with `fp32_grads` (fp32 gradient buffers) or `on_host` (ZeRO-Offload keeps fp32
/// gradients on the host). strategies/optimizer.hpp: optimizer_update_bytes().
struct OptimizerStep {
  std::int64_t params = 0;
  OptimizerKind kind = OptimizerKind::adam;
  DType dtype = DType::bf16;
  bool on_host = false;
  bool fp32_grads = false;
};

/// A copy between memory tiers (or within one).
struct Copy {
  Bytes bytes;
  MemoryTier from = MemoryTier::device;
  MemoryTier to = MemoryTier::device;
};

/// Work whose duration was measured (layer tables, imported traces).
struct Measured {
  Time duration;
};

/// Work known only by its FLOPs and memory traffic (layer tables): costed at the device's
/// roofline, max(flops / peak, bytes / memory bandwidth) with the device's efficiencies.
struct RooflineWork {
  Flops flops;  // FLOPs (2 per multiply-add)
  Bytes bytes;  // bytes read and written in device memory
  DType dtype = DType::bf16;
};

using KernelWork =
    std::variant<Gemm, Attention, Elementwise, OptimizerStep, Copy, Measured, RooflineWork>;

struct Kernel {
  KernelWork work;
  std::string name;  // e.g. "qkv", "fc1.dgrad", "attention.bwd"
};

/// FLOPs of matrix work by the Megatron convention (2 per multiply-add; attention counts the
/// full seq_q x seq_kv score matrix, causal or not; a backward pass counts twice its forward).
/// RooflineWork counts its FLOPs. Zero for elementwise, optimizer, copy and measured kernels.
Flops matmul_flops(const Kernel& k);
/// The FLOPs of an attention kernel as the cost model counts them against an attention rate
/// (sim/cost.cpp, a measured profile's "attention", exec/calibrate.hpp and a rate fitted from a
/// trace): matmul_flops times the unmasked share. A causal kernel skips the masked part of the
/// score matrix: half of it when queries and keys are the same tokens; when the queries are
/// the last seq_q of seq_kv tokens (a TeraPipe slice after its prefix), each query sees the
/// prefix and the causal half of its own slice: seq_kv - seq_q / 2 keys on average.
Flops attention_flops(const Attention& a);
/// Keys each query of `a` attends to, on average: seq_kv without a mask; with a causal mask the
/// queries are the last seq_q of seq_kv positions and query p (0-based among the seq_kv) sees
/// keys 0..p, counted continuously as Megatron's FLOPs formulas do (seq_kv - seq_q / 2 when
/// seq_q = seq_kv: half the score matrix); with a window w, query p sees min(p, w) keys:
/// (F(seq_kv) - F(seq_kv - seq_q)) / seq_q with F(n) = n^2 / 2 for n <= w, else w^2 / 2 +
/// (n - w) w; with chunks of c, query p sees (p mod c) of its chunk's keys plus itself, counted
/// continuously as c^2 / 2 per whole chunk: F(n) = floor(n / c) c^2 / 2 + (n mod c)^2 / 2 (so
/// c / 2 per query when seq_q = seq_kv is a multiple of c). attention_flops is matmul_flops x
/// keys / seq_kv.
double attention_keys_per_query(const Attention& a);

// ---- Ops.

// Packed to 2-byte alignment like Collective, Send and Recv below (see there).
#pragma pack(push, 2)
struct Compute {
  std::uint32_t kernels = 0;  // index into Program::kernel_lists
};
#pragma pack(pop)

enum class CollectiveKind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all
};
inline constexpr int kCollectiveKindCount = 6;

/// Everything that depends only on a collective's kind: one row per kind, in enum order. Every
/// layer reads it here instead of switching on the kind (the switches left are the collective
/// algorithms themselves: sim/collectives.cpp's schedules, exec's reference implementations).
/// `bytes` below is the Collective's size as nccl-tests counts it (see Collective).
/// - name: reports, labels and the timeline files ("all-reduce");
/// - config_name: config files, device profiles and `--op` ("all_reduce"; the same list as
///   hw::kCollectiveKindNames, which hw_models keeps for its configs: program.cpp checks that
///   they agree);
/// - nccl_name: NCCL's and nccl-tests' name ("AllReduce": ncclAllReduce, all_reduce_perf);
///   lower-cased it is what a PyTorch profiler trace's collective names contain;
/// - chakra_name: the Chakra execution trace's CollectiveCommType ("ALL_REDUCE");
/// - busbw factor over n ranks (nccl-tests, doc/PERFORMANCE.md: all-reduce 2(n-1)/n,
///   reduce-scatter, all-gather and all-to-all (n-1)/n, broadcast and reduce 1):
///   busbw_scale * (n-1)/n when busbw_per_peer, else busbw_scale;
/// - sliced: the buffer is cut in n equal slices, one per member (reduce-scatter: each member
///   gets its reduced slice; all-gather: each member gives its slice; all-to-all: slice j goes
///   to member j); input_is_slice / output_is_slice: a member's input / output is bytes / n
///   (all-gather / reduce-scatter), else the whole `bytes`.
struct CollectiveTraits {
  CollectiveKind kind;
  std::string_view name;
  std::string_view config_name;
  std::string_view nccl_name;
  std::string_view chakra_name;
  double busbw_scale;
  bool busbw_per_peer;
  bool sliced;
  bool input_is_slice;
  bool output_is_slice;
};
inline constexpr CollectiveTraits kCollectiveTraits[kCollectiveKindCount] = {
    // kind, name, config, NCCL, Chakra, busbw scale, per peer, sliced, input, output slice
    {CollectiveKind::all_reduce, "all-reduce", "all_reduce", "AllReduce", "ALL_REDUCE", 2.0, true,
     false, false, false},
    {CollectiveKind::reduce_scatter, "reduce-scatter", "reduce_scatter", "ReduceScatter",
     "REDUCE_SCATTER", 1.0, true, true, false, true},
    {CollectiveKind::all_gather, "all-gather", "all_gather", "AllGather", "ALL_GATHER", 1.0, true,
     true, true, false},
    {CollectiveKind::broadcast, "broadcast", "broadcast", "Broadcast", "BROADCAST", 1.0, false,
     false, false, false},
    {CollectiveKind::reduce, "reduce", "reduce", "Reduce", "REDUCE", 1.0, false, false, false,
     false},
    {CollectiveKind::all_to_all, "all-to-all", "all_to_all", "AllToAll", "ALL_TO_ALL", 1.0, true,
     true, false, false},
};
/// The row of `k`.
constexpr const CollectiveTraits& traits_of(CollectiveKind k) {
  return kCollectiveTraits[static_cast<std::size_t>(k)];
}
std::string_view name_of(CollectiveKind k);
/// The kind whose config_name is `name` ("all_reduce"), if any.
std::optional<CollectiveKind> collective_kind_from_config_name(std::string_view name);

/// `bytes` is the collective's size as nccl-tests counts it: the whole buffer (the input of an
/// all-reduce or reduce-scatter, the output of an all-gather).
///
/// `sms` (Collective and Send): the streaming multiprocessors the transfer's kernels hold on each
/// member while it runs, which the simulator's interference model takes from the kernels beside
/// it (hw_models/interference.hpp, sim/interference_tracker.hpp). kNcclSms: NCCL's, one per
/// channel (the cluster's interference.communication_units under collectives.max_channels);
/// 0: a copy-engine transfer that holds none (cudaMemcpyAsync between peers, Transformer
/// Engine's userbuffers with use_ce); n > 0: a kernel launched on n SMs (Transformer Engine's
/// num_sm). A Recv takes its Send's.
inline constexpr std::int16_t kNcclSms = -1;

// Compute, Collective, Send and Recv are packed to 2-byte alignment so that Work is 18 bytes
// instead of 32 and an Op 48 instead of 64 (issue 19's lean exact mode: a 98,304-GPU --exact run
// holds 85.8 M ops). Their Bytes fields then sit at even addresses, which is all a Bytes needs
// (hw_models/units.hpp stores it as 2-byte parts), so reading them is well defined; the 4-byte
// fields (group, peer) are read as packed members by the compiler.
#pragma pack(push, 2)
struct Collective {
  CollectiveKind kind = CollectiveKind::all_reduce;
  DType dtype = DType::bf16;
  std::uint32_t group = 0;  // index into Program::groups
  Bytes bytes;
  std::int16_t sms = kNcclSms;
};

/// `eager`: how a send meets its receive. false (rendezvous; NCCL's send/recv, what lowering
/// emits): the transfer starts when both the send and its receive have started, and both end
/// with it. true (eager; Chakra's and ASTRA-sim's COMM_SEND_NODE, MPI's eager protocol): the
/// send does not wait for the receiver; its transfer starts when the send starts, the send ends
/// when the transfer ends, and the receive ends once it has started and the data has arrived
/// (ASTRA-sim's analytical network: CommonNetworkApi::process_chunk_arrival). The rule is
/// sim/simulator.cpp's, in one place.
///
/// `detached` (eager too; MPI_Ibsend's buffered, non-blocking send; a parameter server's push
/// and pull, which a framework hands to its communication threads): the send ends as soon as its
/// transfer starts, so its stream goes on and several detached sends of one rank are in flight
/// together; the transfer runs on, and its receive ends as an eager message's does. The buffer
/// is taken to be copied out when the send ends (its memory effects apply then). The CUDA
/// executor (exec/) runs eager and detached sends as NCCL's rendezvous sends.
struct Send {
  std::int32_t peer = 0;
  Bytes bytes;
  std::int16_t sms = kNcclSms;
  bool eager = false;
  bool detached = false;
};

struct Recv {
  std::int32_t peer = 0;
  Bytes bytes;
};
#pragma pack(pop)
static_assert(sizeof(Compute) == 4 && sizeof(Collective) == 16 && sizeof(Send) == 16 &&
              sizeof(Recv) == 12);

using Work = std::variant<Compute, Collective, Send, Recv>;
static_assert(sizeof(Work) == 18, "Work: the packed alternatives and a 1-byte index");

// Packed to 4-byte alignment: 12 bytes instead of 16.
#pragma pack(push, 4)
struct MemoryEffect {
  Bytes delta;  // + allocates, - releases
  MemoryCategory category = MemoryCategory::activations;
  MemoryTier tier = MemoryTier::device;
  bool at_end = true;  // applied when the op ends (else when it starts)
};
#pragma pack(pop)
static_assert(sizeof(MemoryEffect) == 12);

struct ResidentMemory {
  MemoryCategory category;
  MemoryTier tier;
  Bytes bytes;
};

using OpId = std::uint32_t;

/// 48 bytes, laid out without holes (the exact mode of a 100,000-GPU run holds ~86 M of them):
/// the 18-byte Work, then the 1-byte stream and phase, then 4-byte and 2-byte fields.
struct Op {
  Work work;
  Stream stream = Stream::compute;
  // Provenance: which phase, microbatch and layers the op belongs to, and a readable label.
  Phase phase = Phase::other;
  std::int32_t rank = 0;
  std::int32_t microbatch = -1;  // -1 when the op belongs to no microbatch
  std::uint32_t label = 0;       // index into Program::labels
  // Ranges in Program::deps and Program::effects.
  std::uint32_t deps_begin = 0;
  std::uint32_t effects_begin = 0;
  std::int16_t layer_begin = -1;  // first layer covered, -1 when none
  std::int16_t layer_end = -1;    // one past the last layer covered
  std::uint16_t deps_count = 0;
  std::uint16_t effects_count = 0;
};
static_assert(sizeof(Op) == 48, "Op: see the layout above");

struct Group {
  std::vector<std::int32_t> ranks;  // members in ring order
  std::string name;                 // e.g. "tp 3", "dp 0", "pp 12", "embedding 0"
};

/// Provenance given to ops when they are added.
struct OpInfo {
  Stream stream = Stream::compute;
  Phase phase = Phase::other;
  std::int32_t microbatch = -1;
  std::int16_t layer_begin = -1;
  std::int16_t layer_end = -1;
  std::string_view label;
  /// An id from Program::intern_label, used instead of `label` when set (saves a lookup per op
  /// when building millions of ops).
  std::uint32_t label_id = kNoLabel;
  static constexpr std::uint32_t kNoLabel = 0xFFFFFFFFu;
};

/// The provenance of an existing op (stream, phase, microbatch, layers, label id), for passes
/// that copy ops from one Program into another with the same labels (re-targeting, replay).
inline OpInfo info_of(const Op& op) {
  OpInfo info;
  info.stream = op.stream;
  info.phase = op.phase;
  info.microbatch = op.microbatch;
  info.layer_begin = op.layer_begin;
  info.layer_end = op.layer_end;
  info.label_id = op.label;
  return info;
}

class Program {
 public:
  explicit Program(int world_size = 1);

  int world_size() const { return world_size_; }
  const std::vector<Group>& groups() const { return groups_; }
  const std::vector<std::vector<Kernel>>& kernel_lists() const { return kernel_lists_; }
  const std::vector<std::string>& labels() const { return labels_; }
  const std::vector<Op>& ops() const { return ops_; }
  std::size_t op_count() const { return ops_.size(); }
  const Op& op(OpId id) const { return ops_[id]; }

  /// Ops of one rank, in issue order; ids are first_op(rank) + index.
  std::span<const Op> ops_of(int rank) const;
  OpId first_op(int rank) const { return rank_begin_[static_cast<std::size_t>(rank)]; }
  std::span<const OpId> deps_of(const Op& op) const;
  std::span<const MemoryEffect> effects_of(const Op& op) const;
  const std::vector<ResidentMemory>& initial_memory(int rank) const {
    return initial_memory_[static_cast<std::size_t>(rank)];
  }
  const std::string& label_of(const Op& op) const { return labels_[op.label]; }
  const std::vector<Kernel>& kernels_of(const Compute& c) const { return kernel_lists_[c.kernels]; }

  /// Data-parallel mirroring. A rank may stand for identical replicas of itself: it issues the
  /// ops, they issue none and would behave the same (same ops on their own groups and peers,
  /// which holds for symmetric strategies on a network without contention). Back ends run the
  /// representative once and report it for every rank it stands for; collectives cost what the
  /// whole group costs but wait only for the members that issue ops.
  std::int32_t replica_of(int rank) const { return replica_of_[static_cast<std::size_t>(rank)]; }
  bool issues_ops(int rank) const { return replica_of(rank) == rank; }
  /// How many ranks `rank` stands for (itself included); 0 for a rank that mirrors another.
  std::int32_t multiplicity(int rank) const {
    return multiplicity_[static_cast<std::size_t>(rank)];
  }
  bool mirrored() const { return mirrored_; }

  /// The schedule lets the next iteration start before this one ends (PipeDream-2BW,
  /// Zero Bubble's ZB-H2 with optimizer post-validation): reports take the steady-state period,
  /// the longest busy window of a rank, as the iteration time.
  bool overlapping_iterations() const { return overlapping_iterations_; }
  void set_overlapping_iterations(bool overlap) { overlapping_iterations_ = overlap; }
  /// Training iterations the Program holds back to back (strategies/iterations.hpp): each
  /// rank's ops are one iteration's ops `iterations()` times over, so the op at index k of a
  /// rank's list belongs to iteration k / (ops_of(rank).size() / iterations()). 1 for a
  /// lowering's one-iteration Program.
  int iterations() const { return iterations_; }
  void set_iterations(int n) { iterations_ = n; }
  /// The iteration (0-based) op `id` belongs to.
  int iteration_of(OpId id) const;
  /// Makes `rank` a mirror of `representative`, a lower rank that issues its own ops.
  void set_replica(int rank, int representative);

  /// Event-driven ranks: a process that handles each request when it arrives (a parameter
  /// server: ps-lite's server loop, MXNet's dependency engine) rather than a device running its
  /// streams in order. Such a rank has no stream order: each of its ops starts as soon as its
  /// dependencies are met (a communication op then meets its peers as any does), whatever the
  /// ops before it on its stream, and nothing waits for an op because it came earlier in the
  /// list. Its program order still numbers its messages and collectives (strategies::Matching:
  /// the k-th message of a channel meets the peer's k-th). The simulator runs it so; the CUDA
  /// executor (exec/) runs its streams in program order as for any rank, which a lowering that
  /// sets the property keeps free of deadlock (strategies/lowering/techniques.hpp
  /// ParameterServer). False for every rank unless set.
  bool event_driven(int rank) const { return event_driven_[static_cast<std::size_t>(rank)] != 0; }
  void set_event_driven(int rank);
  /// Whether any rank is event-driven.
  bool has_event_driven() const { return has_event_driven_; }

  /// "rank 3 op 120 (compute, 'fwd layers 0-5', microbatch 2)": for error messages.
  /// With `as_rank`, the op is described as the mirrored rank `as_rank` issues it (same place
  /// in the rank's program).
  std::string describe(OpId id, std::int32_t as_rank = -1) const;

  // ---- Building. Ranks are built in order 0, 1, ..., world_size - 1.
  /// Reserves room for this many ops, dependencies and memory effects in all.
  void reserve(std::size_t ops, std::size_t deps, std::size_t effects);
  std::uint32_t add_group(std::vector<std::int32_t> ranks, std::string name);
  std::uint32_t add_kernels(std::vector<Kernel> kernels);
  std::uint32_t intern_label(std::string_view label);
  /// Starts the ops of `rank`; every earlier rank is finished.
  void begin_rank(int rank);
  void add_initial_memory(int rank, ResidentMemory m);
  /// Adds an op to the rank begun last and returns its id.
  OpId add(Work work, const OpInfo& info, std::span<const OpId> deps = {},
           std::span<const MemoryEffect> effects = {});
  /// Marks the end of building (ranks not begun get no ops).
  void finish();

 private:
  int world_size_;
  int building_rank_ = -1;
  std::vector<Group> groups_;
  std::vector<std::vector<Kernel>> kernel_lists_;
  std::vector<std::string> labels_;
  struct LabelHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::uint32_t, LabelHash, std::equal_to<>> label_ids_;
  std::vector<Op> ops_;
  std::vector<OpId> deps_;
  std::vector<MemoryEffect> effects_;
  std::vector<OpId> rank_begin_;  // world_size + 1 offsets into ops_
  std::vector<std::vector<ResidentMemory>> initial_memory_;
  std::vector<std::int32_t> replica_of_;    // per rank: the rank whose ops it mirrors (itself)
  std::vector<std::int32_t> multiplicity_;  // per rank: ranks it stands for
  std::vector<std::uint8_t> event_driven_;  // per rank: 1 for an event-driven rank
  bool has_event_driven_ = false;
  bool mirrored_ = false;
  bool overlapping_iterations_ = false;
  int iterations_ = 1;
};

/// Raised by validate() with a message naming the offending op(s).
class ProgramError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Checks that every receive has its send (and sizes agree), that collective membership and
/// order agree on every member of each group, that dependencies are acyclic and stay within a
/// rank, and that ranks, groups and kernel lists are in range. Throws ProgramError.
void validate(const Program& program);

}  // namespace stratasim::strategies
