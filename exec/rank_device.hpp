// The interface between the interpreter (exec/interpreter.hpp) and a device that really runs
// ops: the host device (CPU threads, exec/host_device.hpp) or the CUDA device (streams, cuBLASLt,
// own kernels, NCCL; exec/cuda/). The interpreter hands one rank's ops to its RankDevice in
// issue order; the device runs them asynchronously with the Program's semantics (strategies/
// program.hpp): ops of one stream in order, each after its dependencies, collectives and
// send/recv pairs matched by the sequence numbers of the ExecPlan, memory effects applied to a
// pool when the op starts or ends. A device measures every op (and every kernel of a compute op)
// and reports the times relative to the start of the iteration on its own clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "exec/plan.hpp"
#include "hw_models/units.hpp"
#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::exec {

using strategies::OpId;

/// A failure of the real run: a CUDA or NCCL call, an allocation, a hang (watchdog), a wrong
/// collective result (host verification). The message names the rank, the op and the call.
class ExecError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A run that stopped making progress: every rank's ops that had not finished and what each
/// waits for ("rank 0 op 12 (recv from rank 1, 2 MiB on pp_recv): waiting for rank 1's send").
class HangError : public ExecError {
 public:
  using ExecError::ExecError;
};

/// A device allocation that did not fit: what was asked for, by which op, and what the pool held
/// by category at that moment.
class OutOfMemoryError : public ExecError {
 public:
  using ExecError::ExecError;
};

/// When one op ran, relative to the iteration's start on the rank's clock. For collectives and
/// transfers the host device starts the clock when every member is present (as the simulator
/// does); the CUDA device cannot see that and counts from the op's launch on its stream.
struct OpTiming {
  OpId op = 0;
  Time start;
  Time end;
};

/// When one kernel of a compute op ran (index: position in the op's kernel list).
struct KernelTiming {
  OpId op = 0;
  std::uint32_t index = 0;
  Time start;
  Time end;
};

/// What one rank measured in one iteration.
struct RankMeasurement {
  std::int32_t rank = 0;
  std::vector<OpTiming> ops;          // one per op of the rank, in issue order
  std::vector<KernelTiming> kernels;  // one per kernel of every compute op
  /// Peak of each memory tier's pool (initial memory plus op effects): bytes, when, the op that
  /// reached it and the breakdown by category; capacity is the pool's limit.
  traces::RankMemory memory;
  /// Every change of a pool's total, in time order (op: the op whose effect it was).
  std::vector<traces::MemorySample> samples;
  /// Bytes the device's allocator really reserved at most (the CUDA pool's high-water mark,
  /// fragmentation and rounding included); 0 where not known.
  Bytes reserved_peak;
};

/// Why an op has not finished, for the watchdog's message.
struct PendingOp {
  OpId op = 0;
  std::string waiting_for;  // "rank 1's send", "ranks 2, 3 of 'dp 0' (collective #4)", ...
};

/// Run settings every device honours.
struct DeviceOptions {
  /// Host device: check every collective's result (sums of known values) and every received
  /// byte; a mismatch is an ExecError. The CUDA device ignores it.
  bool verify = false;
  /// Seed of the random (never zero) data in every buffer.
  std::uint64_t seed = 1;
};

/// One rank's device. Not thread-safe: one thread drives it. Devices of different ranks talk
/// to each other through their world (shared memory, NCCL).
class RankDevice {
 public:
  virtual ~RankDevice() = default;

  /// Called before each iteration (after a barrier of all ranks): resets the pool to the
  /// rank's initial memory, starts the iteration's clock.
  virtual void begin_iteration() = 0;
  /// Issues op `id` of this rank (ops arrive in issue order). May return before the op runs.
  virtual void issue(OpId id) = 0;
  /// Waits until every issued op has finished. Returns true when they have; false when no op
  /// of this rank finished for `watchdog` while some were pending, or the world was aborted
  /// (another rank failed), in which case pending() says what is stuck.
  virtual bool synchronize(std::chrono::milliseconds watchdog) = 0;
  /// The ops issued in this iteration that have not finished, and what each waits for.
  virtual std::vector<PendingOp> pending() const = 0;
  /// The finished iteration's measurements.
  virtual RankMeasurement measurement() const = 0;
};

}  // namespace stratasim::exec
