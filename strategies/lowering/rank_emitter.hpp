// The rank emitter: stamps out one rank's ops following the schedule (the pipeline itself:
// model states, receives, the segments of each pass on the compute and tp-comm streams, sends)
// and calls the technique hooks (strategies/lowering/hooks.hpp) at their moments. It holds what
// the hooks share about the rank: which chunks it holds, when each chunk's gradient units are
// complete, and the last op issued on the dp-comm and copy streams.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "strategies/lowering/hooks.hpp"

namespace stratasim::strategies {

class RankEmitter {
 public:
  RankEmitter(Assembly& assembly, const std::vector<std::unique_ptr<TechniqueHook>>& hooks);

  /// Room for every op in the program (programs reach tens of millions of ops).
  void reserve();
  /// Issues every op of `rank` (Program::begin_rank first), or marks it a mirror of the rank it
  /// behaves like (PipelineSpec::mirror_data_parallel, mirror_tensor_parallel).
  void emit(int rank);

  Assembly& assembly;
  Program& program;

  // The rank being emitted.
  int rank = 0, device = 0, tp_index = 0, dp_index = 0;
  const std::vector<Pass>* passes = nullptr;  // the device's, in issue order
  std::vector<int> held;                      // chunks the device holds
  /// Per chunk held: the index of the last pass completing its gradients, the op of that pass
  /// completing each gradient unit (0 when none), and the last op of its last gradient pass.
  std::vector<std::size_t> last_grad_pass;
  std::vector<std::vector<OpId>> unit_done;
  std::vector<OpId> last_backward;
  /// The last op issued on the rank's dp-comm and copy streams (the optimizer step waits for
  /// them: both run in order).
  std::optional<OpId> last_dp_comm, last_copy;
  /// The last op every optimizer step of the rank waits for besides the above (set by the
  /// before_optimizer_steps hooks: the clipping scale, the loss-scale check).
  std::optional<OpId> step_gate;

  /// What a pass over all of the rank's synchronised gradients waits for: the last op of each
  /// chunk's last gradient pass and the last ops of the dp-comm and copy streams.
  std::vector<OpId> gradients_synchronised() const;

  std::size_t slot_of(int chunk) const;
  const StageTemplate& chunk_template(int chunk) const { return assembly.at(chunk, 0); }

 private:
  bool mirrored(int rank) const;
  void hold_chunk(int chunk);
  void find_gradient_passes();
  // A pass being emitted: what the hooks see of it and where its ops chain. Two are open at
  // once when a pair of passes is interleaved (Schedule::overlap_next).
  struct Cursor {
    PassState ps;
    int to_chunk = -1;
    std::vector<OpId> input;                      // what its first segment of each chain waits for
    std::vector<std::optional<OpId>> chain_last;  // per chain of segments, its last op
    std::optional<OpId> last_ring_recv;           // its last ring-step Recv
    std::size_t next = 0;                         // its next segment
    bool done() const { return next >= ps.range.end; }
  };
  void emit_pass(std::size_t index);
  void emit_pair(std::size_t index);
  bool begin_pass(std::size_t index, Cursor& c);
  void end_pass(Cursor& c);
  /// Emits `c`'s segments up to and including its next communication step (or to its end).
  void advance_to_communication(Cursor& c);
  void receive_input(Cursor& c, int from_chunk);
  void emit_segment(Cursor& c, std::size_t i);
  OpId emit_ring_step(Cursor& c, const TemplateStep& step, OpInfo info);
  void send_output(const Cursor& c);
  bool send_waits_for_next(std::size_t index) const;
  void flush_deferred_send(std::size_t index, std::optional<OpId> after);
  void emit_chunk_ends();
  int device_of(int chunk) const;
  bool carried(int device, int unit) const;
  std::uint64_t pass_key(PassKind kind, int unit, int chunk) const;

  const std::vector<std::unique_ptr<TechniqueHook>>& hooks_;
  bool mirror_tp_ = false;
  std::uint32_t recv_input_label_ = 0, no_kernels_ = 0;
  std::vector<OpId> deps_, received_;
  std::vector<MemoryEffect> effects_;
  std::array<Cursor, 2> cursors_;  // the pass (and its pair) being emitted
  std::vector<OpId> ring_deps_;
  std::unordered_map<std::uint64_t, OpId> pass_end_;  // last op of each pass of the rank
  // Schedule::batched_p2p: a forward's send held until the backward after it, and the sends
  // the device's next pass waits for.
  struct DeferredSend {
    Send send;
    OpInfo info;
    std::vector<OpId> deps;
    std::size_t pass;  // the forward's index
  };
  std::optional<DeferredSend> deferred_send_;
  std::vector<OpId> batch_sends_;
};

}  // namespace stratasim::strategies
