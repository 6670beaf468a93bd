#include "strategies/lowering/rank_emitter.hpp"

#include <algorithm>
#include <array>
#include <cstddef>

namespace stratasim::strategies {

RankEmitter::RankEmitter(Assembly& a, const std::vector<std::unique_ptr<TechniqueHook>>& hooks)
    : assembly(a), program(a.program), hooks_(hooks) {
  // A ring exchange step over the tp group sends to the next tp rank and receives from the
  // previous one: a message to or from a mirrored rank never meets its partner
  // (strategies/matching.hpp), so plans with such ring steps are lowered for every tp rank.
  // (Context parallelism's ring steps stay among the ranks of one tp index.)
  bool ring_steps = false;
  for (const StageTemplate& st : a.templates) {
    for (const auto* steps : {&st.forward, &st.backward, &st.weight}) {
      for (const TemplateStep& step : *steps) {
        ring_steps |= step.ring_step && step.axis != TpAxis::cp;
      }
    }
  }
  mirror_tp_ = a.spec.mirror_tensor_parallel && a.spec.tp_mode == TpMode::one_d && !ring_steps;
  recv_input_label_ = program.intern_label("wait for input");
  no_kernels_ = program.add_kernels({});
}

void RankEmitter::reserve() {
  const RankLayout& layout = assembly.spec.layout;
  std::size_t ops = 0, effects = 0;
  for (int d = 0; d < layout.pp; ++d) {
    OpCount device_count;
    for (const Pass& x : assembly.schedule.passes[static_cast<std::size_t>(d)]) {
      const SegmentRange r = assembly.range_of(x);
      device_count.ops += 2 * (r.end - r.begin) + 3;  // a ring step is two ops
      device_count.effects += r.end - r.begin;
      for (const auto& hook : hooks_) {
        const OpCount c = hook->count_pass(x);
        device_count.ops += c.ops;
        device_count.effects += c.effects;
      }
    }
    for (int c : assembly.schedule.chunks_of(d)) {
      device_count.ops += assembly.at(c, 0).plan.grad_units.size() + 8;
      for (const auto& hook : hooks_) device_count.ops += hook->count_chunk(c).ops;
    }
    const auto replicas =
        static_cast<std::size_t>(mirror_tp_ ? 1 : layout.tp) *
        static_cast<std::size_t>(assembly.spec.mirror_data_parallel
                                     ? layout.cp * std::max(assembly.spec.mirror_period, 1)
                                     : layout.dp);
    ops += replicas * device_count.ops;
    effects += replicas * device_count.effects;
  }
  program.reserve(ops, 2 * ops, effects);
}

bool RankEmitter::mirrored(int r) const {
  // Parameter servers message every worker: a mirrored worker would never meet its server.
  if (assembly.spec.parameter_servers > 0) return false;
  const RankLayout& layout = assembly.spec.layout;
  const int t = layout.tp_index(r), d = layout.dp_index(r);
  // Replica d runs what replica 0 runs; with 1D tensor parallelism, tp rank t what rank 0 runs.
  // The cp ranks of a replica exchange keys and values with each other: each is emitted, and
  // mirrored by the rank of the same cp index in the other replicas. With a mirror period P,
  // replica r mirrors replica r mod P.
  const int period = std::max(assembly.spec.mirror_period, 1);
  const int source = layout.replica(r) % period;
  const bool mirror_dp = assembly.spec.mirror_data_parallel && layout.replica(r) >= period;
  if (mirror_dp || (mirror_tp_ && t > 0)) {
    program.set_replica(
        r, layout.rank(
               mirror_tp_ ? 0 : t,
               assembly.spec.mirror_data_parallel ? layout.cp_index(r) + layout.cp * source : d,
               layout.stage(r)));
    return true;
  }
  return false;
}

void RankEmitter::emit(int r) {
  program.begin_rank(r);
  if (mirrored(r)) return;
  const RankLayout& layout = assembly.spec.layout;
  rank = r;
  device = layout.stage(r);
  tp_index = layout.tp_index(r);
  dp_index = layout.dp_index(r);
  passes = &assembly.schedule.passes[static_cast<std::size_t>(device)];
  held = assembly.schedule.chunks_of(device);
  for (int chunk : held) {
    hold_chunk(chunk);
    for (const auto& hook : hooks_) hook->chunk_held(*this, chunk);
  }
  find_gradient_passes();
  last_dp_comm.reset();
  last_copy.reset();
  step_gate.reset();
  pass_end_.clear();
  deferred_send_.reset();
  batch_sends_.clear();
  for (const auto& hook : hooks_) hook->rank_begins(*this);
  for (std::size_t p = 0; p < passes->size(); ++p) emit_pass(p);
  flush_deferred_send(passes->size(), std::nullopt);
  emit_chunk_ends();
}

std::vector<OpId> RankEmitter::gradients_synchronised() const {
  std::vector<OpId> deps;
  for (OpId op : last_backward) {
    if (op != 0) deps.push_back(op);
  }
  if (last_dp_comm) deps.push_back(*last_dp_comm);
  if (last_copy) deps.push_back(*last_copy);
  return deps;
}

std::size_t RankEmitter::slot_of(int chunk) const {
  return static_cast<std::size_t>(std::find(held.begin(), held.end(), chunk) - held.begin());
}

int RankEmitter::device_of(int chunk) const {
  return chunk < 0 ? -1 : assembly.schedule.device_of_chunk[static_cast<std::size_t>(chunk)];
}

// PipeDream-2BW: unit `unit`'s backward on `device` belongs to the previous iteration.
bool RankEmitter::carried(int on_device, int unit) const {
  const int count = assembly.schedule.carried_backwards[static_cast<std::size_t>(on_device)];
  return count > 0 && unit >= assembly.spec.microbatches - count;
}

std::uint64_t RankEmitter::pass_key(PassKind kind, int unit, int chunk) const {
  const auto chunks = static_cast<std::uint64_t>(assembly.schedule.chunks);
  return (static_cast<std::uint64_t>(unit) * chunks + static_cast<std::uint64_t>(chunk)) * 4 +
         static_cast<std::uint64_t>(kind);
}

// Model states of a chunk the device holds (ZeRO's shares, strategies/lowering/pipeline_spec.hpp),
// PipeDream-2BW's stashed weights and the activations of its carried backwards.
void RankEmitter::hold_chunk(int chunk) {
  const StageTemplate& st = chunk_template(chunk);
  const Schedule& schedule = assembly.schedule;
  const DeviceModelStates on_device = assembly.model_states(st);
  program.add_initial_memory(
      rank, {MemoryCategory::parameters, MemoryTier::device, on_device.parameters});
  program.add_initial_memory(rank,
                             {MemoryCategory::gradients, MemoryTier::device, on_device.gradients});
  program.add_initial_memory(
      rank, {MemoryCategory::optimizer_states, MemoryTier::device, on_device.optimizer});
  if (on_device.hpz_secondary.count() > 0) {  // ZeRO++'s hpZ: the secondary partition
    program.add_initial_memory(
        rank, {MemoryCategory::parameters, MemoryTier::device, on_device.hpz_secondary});
  }
  if (schedule.weight_versions > 1) {  // PipeDream-2BW's stashed weight version
    program.add_initial_memory(
        rank, {MemoryCategory::parameters, MemoryTier::device,
               on_device.parameters * static_cast<std::int64_t>(schedule.weight_versions - 1)});
  }
  const int carried_units = schedule.carried_backwards[static_cast<std::size_t>(device)];
  if (carried_units > 0) {  // activations of the backwards carried from the last iteration
    program.add_initial_memory(rank, {MemoryCategory::activations, MemoryTier::device,
                                      st.stash * static_cast<std::int64_t>(carried_units)});
  }
}

void RankEmitter::find_gradient_passes() {
  const auto& list = *passes;
  last_grad_pass.assign(held.size(), 0);
  for (std::size_t p = 0; p < list.size(); ++p) {
    if (list[p].kind == assembly.of(list[p]).grad_kind) last_grad_pass[slot_of(list[p].chunk)] = p;
  }
  unit_done.assign(held.size(), {});
  for (std::size_t k = 0; k < held.size(); ++k) {
    unit_done[k].assign(chunk_template(held[k]).plan.grad_units.size(), 0);
  }
  last_backward.assign(held.size(), 0);
}

void RankEmitter::emit_pass(std::size_t p) {
  const auto& pairs = assembly.schedule.overlap_next;
  if (!pairs.empty() && pairs[static_cast<std::size_t>(device)][p]) return emit_pair(p);
  if (p > 0 && !pairs.empty() && pairs[static_cast<std::size_t>(device)][p - 1]) return;
  Cursor& c = cursors_[0];
  if (!begin_pass(p, c)) return;
  while (!c.done()) emit_segment(c, c.next++);
  end_pass(c);
}

// DualPipe's overlapped forward and backward (Schedule::overlap_next): both receive first and
// both wait for both inputs (the reference waits for the pair's receives together), then
// their segments alternate, each running up to and including its next communication step, so
// that one's collective (an expert all-to-all, a tensor-parallel reduction) is in flight while
// the other's compute runs (DeepSeek-V3's overlapped_forward_backward); then both end and send.
void RankEmitter::emit_pair(std::size_t p) {
  Cursor& f = cursors_[0];
  Cursor& b = cursors_[1];
  const bool f_open = begin_pass(p, f);
  const bool b_open = begin_pass(p + 1, b);
  if (f_open && b_open) {  // the pair starts once both inputs are in (one batch_isend_irecv)
    const std::size_t f_inputs = f.input.size();
    f.input.insert(f.input.end(), b.input.begin(), b.input.end());
    b.input.insert(b.input.end(), f.input.begin(),
                   f.input.begin() + static_cast<std::ptrdiff_t>(f_inputs));
  }
  while ((f_open && !f.done()) || (b_open && !b.done())) {
    if (f_open) advance_to_communication(f);
    if (b_open) advance_to_communication(b);
  }
  if (f_open) end_pass(f);
  if (b_open) end_pass(b);
}

void RankEmitter::advance_to_communication(Cursor& c) {
  while (!c.done()) {
    const bool compute = (*c.ps.range.steps)[c.next].compute;
    emit_segment(c, c.next++);
    if (!compute) return;
  }
}

bool RankEmitter::begin_pass(std::size_t p, Cursor& c) {
  const Schedule& schedule = assembly.schedule;
  PassState& ps = c.ps;
  ps = PassState{};
  ps.index = p;
  ps.pass = (*passes)[p];
  const Pass& pass = ps.pass;
  ps.st = &assembly.of(pass);
  ps.slot = slot_of(pass.chunk);
  ps.microbatch = pass.microbatch / assembly.slices;
  const bool forward = pass.kind == PassKind::forward;
  ps.grad_pass = pass.kind == ps.st->grad_kind;
  ps.final_grad_pass = ps.grad_pass && p == last_grad_pass[ps.slot];
  ps.phase = forward                            ? Phase::forward
             : pass.kind == PassKind::recompute ? Phase::recompute
                                                : Phase::backward;
  ps.range = assembly.range_of(pass);
  if (pass.kind == PassKind::weight && ps.range.begin == ps.range.end) return false;
  if (pass.kind == PassKind::recompute && ps.range.begin == ps.range.end) return false;
  // Where the input comes from and where the output goes: the neighbouring chunks of the chain
  // (forward: previous, backward: next), on another device or on this one.
  const auto ch = static_cast<std::size_t>(pass.chunk);
  const int from_chunk = forward                           ? schedule.prev_chunk[ch]
                         : pass.kind == PassKind::backward ? schedule.next_chunk[ch]
                                                           : -1;
  c.to_chunk = forward                           ? schedule.next_chunk[ch]
               : pass.kind == PassKind::backward ? schedule.prev_chunk[ch]
                                                 : -1;
  for (const auto& hook : hooks_) hook->pass_begins(*this, ps);
  receive_input(c, from_chunk);
  c.chain_last.clear();
  c.last_ring_recv.reset();
  c.next = ps.range.begin;
  return true;
}

void RankEmitter::end_pass(Cursor& c) {
  PassState& ps = c.ps;
  const Pass& pass = ps.pass;
  if (!ps.previous) {  // a pass without segments passes its input on
    if (c.input.empty()) return;
    OpInfo info{Stream::compute, ps.phase, ps.microbatch, -1, -1, {}};
    info.label_id = recv_input_label_;
    ps.previous = program.add(Compute{no_kernels_}, info, c.input);
    c.chain_last.assign(1, ps.previous);
  }
  pass_end_[pass_key(pass.kind, pass.microbatch, pass.chunk)] = *ps.previous;
  if (ps.grad_pass) last_backward[ps.slot] = *ps.previous;
  for (const auto& hook : hooks_) hook->pass_ends(*this, ps, *ps.previous);
  // The held forward send goes first: each channel keeps its order of sends.
  flush_deferred_send(ps.index, ps.previous);
  send_output(c);
}

// Schedule::batched_p2p: a steady-state step's forward sends with the backward after it.
bool RankEmitter::send_waits_for_next(std::size_t index) const {
  const Schedule& schedule = assembly.schedule;
  if (!schedule.batched_p2p) return false;
  const auto i = static_cast<int>(index);
  const auto d = static_cast<std::size_t>(device);
  return i >= schedule.steady_begin[d] && i < schedule.steady_end[d] &&
         (i - schedule.steady_begin[d]) % 2 == 0;
}

// The forward's send held back by send_output goes with the backward after it, after its
// last op (`after`).
void RankEmitter::flush_deferred_send(std::size_t index, std::optional<OpId> after) {
  if (!deferred_send_ || deferred_send_->pass == index) return;
  DeferredSend& d = *deferred_send_;
  if (after) d.deps.push_back(*after);
  batch_sends_.push_back(program.add(d.send, d.info, d.deps));
  deferred_send_.reset();
}

// The pass's input: received from another device, or the end of the pass it follows here.
void RankEmitter::receive_input(Cursor& c, int from_chunk) {
  const PassState& ps = c.ps;
  std::vector<OpId>& input = c.input;
  const Pass& pass = ps.pass;
  const int unit = pass.microbatch;
  const int from_device = device_of(from_chunk);
  input.clear();
  // Schedule::batched_p2p: the sends of the device's previous step complete first.
  input.insert(input.end(), batch_sends_.begin(), batch_sends_.end());
  batch_sends_.clear();
  if (from_device >= 0 && from_device != device) {
    // PipeDream-2BW: a carried backward's gradient came in the previous iteration unless the
    // sender's backward is carried too.
    const bool received_before =
        pass.kind == PassKind::backward && carried(device, unit) && !carried(from_device, unit);
    if (!received_before) {
      const bool forward = pass.kind == PassKind::forward;
      OpInfo info{Stream::pp_recv, ps.phase, ps.microbatch, -1, -1, {}};
      info.label_id = forward ? ps.st->recv_activation : ps.st->recv_gradient;
      // An activation is the previous chunk's output; a gradient, that of this chunk's.
      const Bytes bytes =
          forward ? assembly.at(from_chunk, unit).plan.boundary_bytes : ps.st->plan.boundary_bytes;
      const RankLayout& layout = assembly.spec.layout;
      received_.assign(1, program.add(Recv{layout.rank(tp_index, dp_index, from_device),
                                           assembly.pipeline_message(bytes)},
                                      info));
      for (const auto& hook : hooks_) hook->input_received(*this, ps, bytes, received_);
      input.insert(input.end(), received_.begin(), received_.end());
    }
  } else if (from_device == device) {  // the neighbouring chunk on this device
    const auto it = pass_end_.find(pass_key(pass.kind, unit, from_chunk));
    if (it != pass_end_.end()) input.push_back(it->second);
  }
  if (pass.kind == PassKind::backward && assembly.separate_recompute) {
    const auto it = pass_end_.find(pass_key(PassKind::recompute, unit, pass.chunk));
    if (it != pass_end_.end()) input.push_back(it->second);
  }
  if (pass.kind == PassKind::weight) {
    const auto it = pass_end_.find(pass_key(PassKind::backward, unit, pass.chunk));
    if (it != pass_end_.end()) input.push_back(it->second);
  }
}

void RankEmitter::emit_segment(Cursor& c, std::size_t i) {
  PassState& ps = c.ps;
  auto& chain_last = c.chain_last;
  const TemplateStep& step = (*ps.range.steps)[i];
  const auto chain = static_cast<std::size_t>(step.chain);
  if (chain_last.size() <= chain) chain_last.resize(chain + 1);
  OpInfo info{step.compute ? Stream::compute : Stream::tp_comm,
              step.recompute ? Phase::recompute : ps.phase,
              ps.microbatch,
              step.layer_begin,
              step.layer_end,
              {}};
  info.label_id = step.label;
  deps_.clear();
  if (chain_last[chain]) {
    deps_.push_back(*chain_last[chain]);
  } else {
    deps_.insert(deps_.end(), c.input.begin(), c.input.end());
  }
  effects_.clear();
  const Bytes device_activations = step.activation_delta + step.checkpoint_delta;
  if (device_activations.count() != 0) {
    effects_.push_back({device_activations, MemoryCategory::activations, MemoryTier::device, true});
  }
  SegmentState seg{step, static_cast<int>(i - ps.range.begin), deps_, effects_};
  for (const auto& hook : hooks_) hook->before_segment(*this, ps, seg);
  OpId op = 0;
  if (step.ring_step) {
    op = emit_ring_step(c, step, info);
  } else {
    const Work work =
        step.compute ? Work(Compute{step.kernels})
                     : Work(Collective{step.kind, assembly.spec.dtype,
                                       assembly.groups.tp(step.axis, rank), step.bytes, step.sms});
    op = program.add(work, info, deps_, effects_);
  }
  ps.earlier = ps.previous;
  ps.previous = op;
  chain_last[chain] = op;
  if (ps.final_grad_pass && step.compute) {
    for (int u : *step.grads_done) unit_done[ps.slot][static_cast<std::size_t>(u)] = op;
  }
  for (const auto& hook : hooks_) hook->after_segment(*this, ps, seg, op);
}

// One step of a ring exchange over the rank's tp group: a Send of the step's bytes to the next
// rank of the group's ring (tp-comm stream) and a Recv of as many from the previous one, on the
// receive stream (pp-recv) so that the two, issued by every rank in the same order, run at once
// (on one stream every rank's send would wait for its successor's, which waits for its own).
// Both wait for the step's dependencies, the Send also for the pass's previous ring Recv (a step
// forwards the shard the step before it brought; the previous exchange's last Recv, long done,
// for a first step); the Recv carries its memory effects, and what follows in the chain waits
// for it (the shard it brings). Returns the Recv.
OpId RankEmitter::emit_ring_step(Cursor& c, const TemplateStep& step, OpInfo info) {
  const Group& group = program.groups()[assembly.groups.tp(step.axis, rank)];
  const auto n = static_cast<std::ptrdiff_t>(group.ranks.size());
  const std::ptrdiff_t at =
      std::find(group.ranks.begin(), group.ranks.end(), rank) - group.ranks.begin();
  const std::int32_t next = group.ranks[static_cast<std::size_t>((at + 1) % n)];
  const std::int32_t prev = group.ranks[static_cast<std::size_t>((at + n - 1) % n)];
  info.stream = Stream::tp_comm;
  ring_deps_.assign(deps_.begin(), deps_.end());
  if (c.last_ring_recv) ring_deps_.push_back(*c.last_ring_recv);
  program.add(Send{next, step.bytes, step.sms}, info, ring_deps_);
  info.stream = Stream::pp_recv;
  c.last_ring_recv = program.add(Recv{prev, step.bytes}, info, deps_, effects_);
  return *c.last_ring_recv;
}

void RankEmitter::send_output(const Cursor& c) {
  const PassState& ps = c.ps;
  const Pass& pass = ps.pass;
  const int to_chunk = c.to_chunk;
  const int to_device = device_of(to_chunk);
  if (to_device < 0 || to_device == device) return;
  const bool received_later = pass.kind == PassKind::backward &&
                              carried(to_device, pass.microbatch) &&
                              !carried(device, pass.microbatch);
  if (received_later) return;
  const bool forward = pass.kind == PassKind::forward;
  OpInfo info{Stream::pp_send, ps.phase, ps.microbatch, -1, -1, {}};
  info.label_id = forward ? ps.st->send_activation : ps.st->send_gradient;
  deps_.clear();
  for (const auto& last : c.chain_last) {
    if (last) deps_.push_back(*last);
  }
  const Bytes bytes = forward ? ps.st->plan.boundary_bytes
                              : assembly.at(to_chunk, pass.microbatch).plan.boundary_bytes;
  const RankLayout& layout = assembly.spec.layout;
  const Send send{layout.rank(tp_index, dp_index, to_device), assembly.pipeline_message(bytes)};
  if (send_waits_for_next(ps.index)) {
    deferred_send_ = DeferredSend{send, info, deps_, ps.index};
    return;
  }
  const OpId op = program.add(send, info, deps_);
  if (assembly.schedule.batched_p2p) batch_sends_.push_back(op);
}

// Per chunk held, in the order their gradients complete: the gradient synchronisation of every
// chunk, then each chunk's optimizer step and what follows it.
void RankEmitter::emit_chunk_ends() {
  std::vector<std::size_t> order(held.size());
  for (std::size_t k = 0; k < held.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return last_grad_pass[a] < last_grad_pass[b]; });
  for (std::size_t slot : order) {
    for (const auto& hook : hooks_) hook->gradients_complete(*this, slot);
  }
  for (const auto& hook : hooks_) hook->before_optimizer_steps(*this);
  for (std::size_t slot : order) {
    std::optional<OpId> step;
    for (const auto& hook : hooks_) {
      if (auto op = hook->optimizer_step(*this, slot)) step = op;
    }
    if (!step) continue;
    for (const auto& hook : hooks_) hook->after_optimizer_step(*this, slot, *step);
  }
}

}  // namespace stratasim::strategies
