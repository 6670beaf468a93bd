// The host device: the interpreter's devices on CPU threads, one per rank, in one process. It
// runs real programs without a GPU, so the interpreter, dependency handling, collective matching,
// memory pools and the watchdog are tested everywhere:
// - each rank's thread runs its streams cooperatively, like a GPU runs its streams: the head op of
//   any stream whose dependencies have finished may start; a collective or transfer that waits
//   for its peers lets the rank's other streams go on;
// - kernels are naive CPU implementations on float data (exec/host_kernels.hpp): GEMMs of the
//   op's exact shape, attention with softmax, elementwise passes, Adam; sizes are limited (a
//   tiny model), larger kernels are refused with a clear error;
// - collectives run in shared memory on real buffers, one float per element of the collective's
//   dtype; transfers copy their bytes; with DeviceOptions::verify every result is checked (sums of
//   known values, known byte patterns);
// - memory effects allocate real host memory from per-tier pools that record their peaks.
#pragma once

#include <cstdint>
#include <memory>

#include "exec/devices.hpp"
#include "exec/interpreter.hpp"

namespace stratasim::exec {

/// Largest kernel the host device runs, in multiply-adds (a GEMM's m n k batch, attention's
/// score and value products) or elements; beyond it a kernel is an ExecError that suggests a
/// smaller model.
inline constexpr std::int64_t kHostKernelLimit = std::int64_t{1} << 28;
/// Largest collective or transfer, in bytes.
inline constexpr std::int64_t kHostTransferLimit = std::int64_t{1} << 28;

std::unique_ptr<World> make_host_world(const ExecPlan& plan, const WorldOptions& options);

}  // namespace stratasim::exec
