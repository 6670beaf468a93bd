// Pipeline schedules as data: a pure function from (stages, microbatches, options) to the
// ordered passes each pipeline device runs, over a map of model chunks to devices. The lowering
// turns passes into ops (receives, the chunk's segments, sends); the simulator never sees a
// schedule. docs/schedules.md compares the schedules (bubble, activation memory, p2p volume,
// constraints).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strategies/experiment.hpp"

namespace stratasim::strategies {

/// - forward (F): the chunk's forward for one microbatch;
/// - backward (B): its backward; input gradients only when the schedule splits the backward
///   (Schedule::split_backward), else input and weight gradients;
/// - weight (W): the weight gradients of a split backward (Zero Bubble);
/// - recompute (R): the recomputed forward that a backward starts with (activation
///   recomputation), issued apart and early, before the gradient it waits for arrives (Merak's
///   shifted critical path); the B that follows skips it.
enum class PassKind : std::uint8_t { forward, backward, weight, recompute };
std::string_view name_of(PassKind k);

struct Pass {
  PassKind kind = PassKind::forward;
  /// The unit of work flowing through the pipeline: a microbatch, or with TeraPipe one slice
  /// of one (microbatch * slices + slice).
  std::int32_t microbatch = 0;
  std::int16_t chunk = 0;  // model chunk (Schedule::chunks)
  bool operator==(const Pass&) const = default;
};

struct ScheduleOptions {
  int virtual_stages = 1;   // interleaved: model chunks per device
  int sequence_slices = 1;  // terapipe: slices per sequence
  /// interleaved: Megatron's batched point-to-point communication (Schedule::batched_p2p).
  bool batched_p2p = false;
  /// dualpipe: its forward-backward pairs overlapped (Schedule::overlap_next); false runs them
  /// one after the other.
  bool overlap_pairs = true;
};

/// A schedule: model chunks placed on the pipeline's devices and, per device, its passes in
/// issue order.
///
/// The model is cut into `parts` pieces of consecutive layers (part 0 holds the embedding, the
/// last part the head). A chunk is one placed copy of a part: chunk c runs part part_of_chunk[c]
/// on device device_of_chunk[c]. Chunks form chains in forward order (next_chunk / prev_chunk,
/// -1 at the ends); a microbatch runs the chain that starts at first_chunk_of(microbatch). Most
/// schedules have one chain of `parts` chunks; Chimera has two chains (its two pipelines) over
/// the same parts, so every part is held by two devices whose gradients are summed
/// (replica_device).
struct Schedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1;        // pipeline devices, p
  int microbatches = 1;  // microbatches per iteration, m
  int slices = 1;        // terapipe: slices per microbatch; passes count units = m * slices
  int parts = 1;
  int chunks = 1;
  std::vector<int> device_of_chunk, part_of_chunk, next_chunk, prev_chunk;
  /// Chimera: the first chunk of the chain each unit runs (empty: chunk 0 for all).
  std::vector<int> first_chunk;
  /// Chimera: per device, the other device holding the same parts (its gradients' partner);
  /// empty otherwise.
  std::vector<int> replica_device;
  bool split_backward = false;  // B and W passes apart (Zero Bubble)
  /// The schedule lets the next iteration start before this one has ended (PipeDream-2BW's
  /// asynchronous updates; ZB-H2's optimizer post-validation): what an iteration costs is the
  /// steady-state period, each device's busy window, not the first-to-last span.
  bool overlapping_iterations = false;
  /// PipeDream-2BW: backward passes of the previous iteration's last microbatches that each
  /// device runs at the start of this one (units >= microbatches - carried_backwards[device]
  /// in the device's first backwards), with their activations stored since then; their
  /// gradient input arrived in the previous iteration where the sender's backward was not
  /// carried itself.
  std::vector<int> carried_backwards;
  int weight_versions = 1;  // PipeDream-2BW keeps 2 versions of the weights
  /// Megatron-LM's batched point-to-point communication in its interleaved schedule
  /// (ScheduleOptions::batched_p2p: Megatron's batch_p2p_comm without overlap_p2p_comm,
  /// --no-overlap-p2p-communication; Megatron's default overlaps instead, which is what the
  /// schedules do without it: sends issued as soon as their pass ends, waited for by the
  /// receiver only): each step's sends and receives are one batch_isend_irecv that the next
  /// step waits for. A steady-state step (passes [steady_begin, steady_end) of the device, in
  /// pairs) is a forward then a backward (send_forward_backward_recv_forward_backward), so the
  /// forward sends its output only after that backward, with the backward's own send; the
  /// device's next pass waits for every send of the step before it to complete.
  bool batched_p2p = false;
  std::vector<int> steady_begin, steady_end;  // per device, with batched_p2p
  std::vector<std::vector<Pass>> passes;      // per device, in issue order
  /// DualPipe's overlapped forward-backward chunks: per device (empty: none), true at index i
  /// when passes i (a forward) and i + 1 (a backward of the other direction) run as one pair,
  /// their segments interleaved so that either's communication (expert all-to-alls, tensor-
  /// parallel collectives) runs while the other computes (the lowering alternates the two at
  /// every communication step: RankEmitter).
  std::vector<std::vector<bool>> overlap_next;

  int units() const { return microbatches * slices; }
  int first_chunk_of(int unit) const {
    return first_chunk.empty() ? 0 : first_chunk[static_cast<std::size_t>(unit)];
  }
  /// The chunks device `d` holds, in increasing order.
  std::vector<int> chunks_of(int device) const;
};

/// The model parts (pieces of consecutive layers) `kind` cuts the model into for `stages`
/// devices: p, p * virtual_stages (interleaved) or 2p (zb-v).
int schedule_parts(ScheduleKind kind, int stages, const ScheduleOptions& options = {});

/// Why `kind` cannot run `stages` x `microbatches` with `options` (e.g. "interleaved needs the
/// microbatches (6) to be a multiple of the stages (4)"), or nullopt when it can.
std::optional<std::string> schedule_constraint(ScheduleKind kind, int stages, int microbatches,
                                               const ScheduleOptions& options = {});

/// The schedule of `kind`. Throws std::invalid_argument with schedule_constraint's message when
/// it does not apply.
/// - gpipe: all forwards, then all backwards (m in flight).
/// - 1f1b (PipeDream-Flush): stage s runs min(p - s - 1, m) warm-up forwards, then alternates
///   F and B, then drains the backwards; at most p - s microbatches in flight.
/// - interleaved (Megatron-LM): v chunks per device, chunk c on device c mod p; Megatron's order
///   of virtual microbatches with (p - s - 1) * 2 + (v - 1) * p warm-up forwards; m % p == 0.
/// - pipedream-2bw: 1F1B's steady state in every iteration (no flush): stage s runs F(k) then
///   the backward of microbatch k - (p - 1 - s), the first p - 1 - s of them carried from the
///   previous iteration; two weight versions; m >= p.
/// - merak-scp: 1F1B in which each backward's recomputation is a pass of its own, issued right
///   after the pass before that backward, so it runs while the gradient is in flight.
/// - zb-h1: 1F1B's warm-up, W deferred so that stage s keeps s weight passes pending (Zero
///   Bubble's ZB-H1: activation memory as 1F1B, bubble (p - 1)(T_F + T_B - T_W)).
/// - zb-h2: 2(p - 1 - s) + 1 warm-up forwards, then B, W when more than 2s are pending, F;
///   iterations overlap (post-validation): bubble (p - 1)(T_F + T_B - 2 T_W) of the period.
/// - zb-v: 2p chunks in a V (device d holds chunks d and 2p - 1 - d), split backward, ordered
///   by list scheduling of unit-time passes (B first, then F, W filling idle time) with at most
///   2p chunk forwards in flight per device (activation memory of 1F1B).
/// - chimera: two pipelines, down (chunk s on device s) and up (part s on device p - 1 - s),
///   even units down and odd units up; the order is list scheduling of the two with forward
///   time 1 and backward 2, forwards first, at most 2p forwards in flight per device (their
///   weight passes not yet run, for zb-v); p even, m even.
/// - dualpipe (DeepSeek-V3, arXiv:2412.19437 section 3.2.1; deepseek-ai/DualPipe): Chimera's
///   chunk map (device d holds part d of the down pipeline and part p - 1 - d of the up one, even
///   units down, odd up, parameters twice); per device, the reference step() order with its
///   relative phases (the direction the device is nearer the start of is phase 0) and
///   h = min(d, p - 1 - d), H = m / 2: 2(p/2 - h - 1) F0; h + 1 (F0 F1); p/2 - h - 1 (B1 W F1);
///   H - p + h + 1 ((F0&B1) (F1&B0)), the middle devices' first pair not overlapped;
///   p/2 - h - 1 (B1 (F1&B0)); h + 1 (B1 B0), the zero-bubble split from the middle on;
///   p/2 - h - 1 (W B0); h + 1 W. A & marks an overlapped pair (Schedule::overlap_next); W
///   passes pop the oldest split backward (FIFO), a backward not split is followed by its W at
///   once (after its pair). Bubble (p/2 - 1)(F&B + B - 3W); p even, m even, m >= 2p.
/// - terapipe: GPipe over token slices: each microbatch's sequence cut into `sequence_slices`
///   slices, all forwards in order, then the backwards with slices in reverse (a slice's keys and
///   values serve the slices after it, whose backwards produce their gradients first).
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches,
                       const ScheduleOptions& options = {});

/// Per device, the passes in issue order (make_schedule(kind, stages, microbatches).passes).
std::vector<std::vector<Pass>> pipeline_schedule(ScheduleKind kind, int stages, int microbatches,
                                                 const ScheduleOptions& options = {});

}  // namespace stratasim::strategies
