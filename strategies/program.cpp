#include "strategies/program.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <stdexcept>

#include "hw_models/cluster.hpp"

namespace stratasim::strategies {

std::string_view name_of(Stream s) {
  switch (s) {
    case Stream::compute:
      return "compute";
    case Stream::tp_comm:
      return "tp-comm";
    case Stream::dp_comm:
      return "dp-comm";
    case Stream::pp_send:
      return "pp-send";
    case Stream::pp_recv:
      return "pp-recv";
    case Stream::copy:
      return "copy";
    case Stream::host:
      return "host";
  }
  return "?";
}

std::string_view name_of(Phase p) {
  switch (p) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
    case Phase::other:
      return "other";
    case Phase::recompute:
      return "recompute";
  }
  return "?";
}

std::string_view name_of(MemoryTier t) {
  switch (t) {
    case MemoryTier::device:
      return "device";
    case MemoryTier::host:
      return "host";
    case MemoryTier::nvme:
      return "nvme";
  }
  return "?";
}

std::string_view name_of(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameters:
      return "parameters";
    case MemoryCategory::gradients:
      return "gradients";
    case MemoryCategory::optimizer_states:
      return "optimizer_states";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::workspace:
      return "workspace";
    case MemoryCategory::comm_buffers:
      return "comm_buffers";
    case MemoryCategory::other:
      return "other";
  }
  return "?";
}

// The table is in enum order, and its config names are hw_models' (configs and profiles).
static_assert([] {
  for (int k = 0; k < kCollectiveKindCount; ++k) {
    if (kCollectiveTraits[k].kind != static_cast<CollectiveKind>(k)) return false;
    if (kCollectiveTraits[k].config_name != hw::kCollectiveKindNames[k]) return false;
  }
  return std::size(hw::kCollectiveKindNames) == static_cast<std::size_t>(kCollectiveKindCount);
}());

std::string_view name_of(CollectiveKind k) {
  if (static_cast<int>(k) >= kCollectiveKindCount) return "?";
  return traits_of(k).name;
}

std::optional<CollectiveKind> collective_kind_from_config_name(std::string_view name) {
  for (const auto& t : kCollectiveTraits) {
    if (t.config_name == name) return t.kind;
  }
  return std::nullopt;
}

Flops matmul_flops(const Kernel& k) {
  if (const auto* g = std::get_if<Gemm>(&k.work)) {
    return Flops(2.0 * static_cast<double>(g->m) * static_cast<double>(g->n) *
                 static_cast<double>(g->k) * static_cast<double>(g->batch));
  }
  if (const auto* a = std::get_if<Attention>(&k.work)) {
    // Q K^T and P V: two matmuls of 2 * seq_q * seq_kv * head_dim FLOPs per head.
    double forward = 4.0 * static_cast<double>(a->batch) * static_cast<double>(a->heads) *
                     static_cast<double>(a->seq_q) * static_cast<double>(a->seq_kv) *
                     static_cast<double>(a->head_dim);
    return Flops(a->backward ? 2 * forward : forward);
  }
  if (const auto* r = std::get_if<RooflineWork>(&k.work)) return r->flops;
  return Flops(0);
}

double attention_keys_per_query(const Attention& a) {
  const double kv = static_cast<double>(a.seq_kv);
  if (!a.causal || a.seq_kv <= 0 || a.seq_q <= 0) return kv;
  const double q = static_cast<double>(std::min(a.seq_q, a.seq_kv));
  if (a.chunk > 0 && a.chunk < a.seq_kv) {
    // Keys seen by the queries at positions 0..n-1: c^2 / 2 per whole chunk, r^2 / 2 for the
    // r positions of a partial one.
    const double c = static_cast<double>(a.chunk);
    const auto visible = [c](double n) {
      const double whole = std::floor(n / c), r = n - whole * c;
      return whole * c * c / 2 + r * r / 2;
    };
    return (visible(kv) - visible(kv - q)) / q;
  }
  if (a.window <= 0 || a.window >= a.seq_kv) return kv - q / 2;
  const double w = static_cast<double>(a.window);
  const auto visible = [w](double n) { return n <= w ? n * n / 2 : w * w / 2 + (n - w) * w; };
  return (visible(kv) - visible(kv - q)) / q;
}

Flops attention_flops(const Attention& a) {
  const double share =
      a.seq_kv > 0 ? attention_keys_per_query(a) / static_cast<double>(a.seq_kv) : 1.0;
  return Flops(matmul_flops(Kernel{a, {}}).count() * share);
}

namespace {
int checked_world_size(int world_size) {
  if (world_size < 1) throw std::invalid_argument("a program needs at least one rank");
  return world_size;
}
}  // namespace

Program::Program(int world_size)
    : world_size_(checked_world_size(world_size)),
      rank_begin_(static_cast<std::size_t>(world_size) + 1, 0),
      initial_memory_(static_cast<std::size_t>(world_size)),
      replica_of_(static_cast<std::size_t>(world_size)),
      multiplicity_(static_cast<std::size_t>(world_size), 1),
      event_driven_(static_cast<std::size_t>(world_size), 0) {
  for (int r = 0; r < world_size; ++r) replica_of_[static_cast<std::size_t>(r)] = r;
  labels_.emplace_back("");
  label_ids_.emplace("", 0);
}

std::span<const Op> Program::ops_of(int rank) const {
  auto r = static_cast<std::size_t>(rank);
  return std::span<const Op>(ops_.data() + rank_begin_[r], rank_begin_[r + 1] - rank_begin_[r]);
}

std::span<const OpId> Program::deps_of(const Op& op) const {
  return std::span<const OpId>(deps_.data() + op.deps_begin, op.deps_count);
}

std::span<const MemoryEffect> Program::effects_of(const Op& op) const {
  return std::span<const MemoryEffect>(effects_.data() + op.effects_begin, op.effects_count);
}

std::string Program::describe(OpId id, std::int32_t as_rank) const {
  if (id >= ops_.size()) return "op " + std::to_string(id) + " (out of range)";
  const Op& o = ops_[id];
  std::string kind = std::visit(
      [&](const auto& w) -> std::string {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, Compute>) return "compute";
        if constexpr (std::is_same_v<W, Collective>) {
          std::string g =
              w.group < groups_.size() ? groups_[w.group].name : "group " + std::to_string(w.group);
          return std::string(name_of(w.kind)) + " on " + g + ", " + to_string(w.bytes);
        }
        if constexpr (std::is_same_v<W, Send>) {
          return "send to rank " + std::to_string(w.peer) + ", " + to_string(w.bytes);
        }
        if constexpr (std::is_same_v<W, Recv>) {
          return "recv from rank " + std::to_string(w.peer) + ", " + to_string(w.bytes);
        }
      },
      o.work);
  std::string text = "rank " + std::to_string(as_rank >= 0 ? as_rank : o.rank) + " op " +
                     std::to_string(id - rank_begin_[static_cast<std::size_t>(o.rank)]) + " (" +
                     kind + " on " + std::string(name_of(o.stream));
  if (!labels_[o.label].empty()) text += ", '" + labels_[o.label] + "'";
  if (o.microbatch >= 0) text += ", microbatch " + std::to_string(o.microbatch);
  return text + ")";
}

void Program::set_replica(int rank, int representative) {
  if (rank < 0 || rank >= world_size_ || representative < 0 || representative >= world_size_ ||
      representative >= rank || !issues_ops(representative) || !issues_ops(rank) ||
      multiplicity(rank) != 1) {
    throw std::logic_error("Program::set_replica: rank " + std::to_string(rank) +
                           " cannot mirror rank " + std::to_string(representative));
  }
  replica_of_[static_cast<std::size_t>(rank)] = representative;
  multiplicity_[static_cast<std::size_t>(rank)] = 0;
  ++multiplicity_[static_cast<std::size_t>(representative)];
  mirrored_ = true;
}

void Program::set_event_driven(int rank) {
  if (rank < 0 || rank >= world_size_) {
    throw std::logic_error("Program::set_event_driven: rank " + std::to_string(rank) +
                           " out of range");
  }
  event_driven_[static_cast<std::size_t>(rank)] = 1;
  has_event_driven_ = true;
}

std::uint32_t Program::add_group(std::vector<std::int32_t> ranks, std::string name) {
  groups_.push_back(Group{std::move(ranks), std::move(name)});
  return static_cast<std::uint32_t>(groups_.size() - 1);
}

std::uint32_t Program::add_kernels(std::vector<Kernel> kernels) {
  kernel_lists_.push_back(std::move(kernels));
  return static_cast<std::uint32_t>(kernel_lists_.size() - 1);
}

std::uint32_t Program::intern_label(std::string_view label) {
  auto it = label_ids_.find(label);
  if (it != label_ids_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(labels_.size());
  labels_.emplace_back(label);
  label_ids_.emplace(std::string(label), id);
  return id;
}

void Program::reserve(std::size_t ops, std::size_t deps, std::size_t effects) {
  ops_.reserve(ops);
  deps_.reserve(deps);
  effects_.reserve(effects);
}

int Program::iteration_of(OpId id) const {
  if (iterations_ <= 1) return 0;
  const int rank = ops_[id].rank;
  const auto per_iteration = ops_of(rank).size() / static_cast<std::size_t>(iterations_);
  return per_iteration == 0 ? 0 : static_cast<int>((id - first_op(rank)) / per_iteration);
}

void Program::begin_rank(int rank) {
  if (rank <= building_rank_ || rank >= world_size_) {
    throw std::logic_error("Program::begin_rank: ranks must be built in increasing order below " +
                           std::to_string(world_size_) + ", got " + std::to_string(rank));
  }
  auto current = static_cast<OpId>(ops_.size());
  for (int r = building_rank_ + 1; r <= rank; ++r)
    rank_begin_[static_cast<std::size_t>(r)] = current;
  building_rank_ = rank;
}

void Program::add_initial_memory(int rank, ResidentMemory m) {
  initial_memory_.at(static_cast<std::size_t>(rank)).push_back(m);
}

OpId Program::add(Work work, const OpInfo& info, std::span<const OpId> deps,
                  std::span<const MemoryEffect> effects) {
  if (building_rank_ < 0) throw std::logic_error("Program::add before begin_rank");
  if (deps.size() > 0xFFFF || effects.size() > 0xFFFF) {
    throw std::logic_error("Program::add: too many dependencies or effects on one op");
  }
  if (ops_.size() >= 0xFFFFFFFFu) throw std::length_error("Program: more than 2^32 ops");
  Op op;
  op.work = work;
  op.rank = building_rank_;
  op.stream = info.stream;
  op.phase = info.phase;
  op.microbatch = info.microbatch;
  op.layer_begin = info.layer_begin;
  op.layer_end = info.layer_end;
  op.label = info.label_id != OpInfo::kNoLabel ? info.label_id : intern_label(info.label);
  op.deps_begin = static_cast<std::uint32_t>(deps_.size());
  op.deps_count = static_cast<std::uint16_t>(deps.size());
  deps_.insert(deps_.end(), deps.begin(), deps.end());
  op.effects_begin = static_cast<std::uint32_t>(effects_.size());
  op.effects_count = static_cast<std::uint16_t>(effects.size());
  effects_.insert(effects_.end(), effects.begin(), effects.end());
  ops_.push_back(op);
  return static_cast<OpId>(ops_.size() - 1);
}

void Program::finish() {
  auto end = static_cast<OpId>(ops_.size());
  for (int r = building_rank_ + 1; r <= world_size_; ++r) {
    rank_begin_[static_cast<std::size_t>(r)] = end;
  }
  building_rank_ = world_size_;
}

}  // namespace stratasim::strategies
