// The CUDA device: one rank of a Program on one GPU (exec/cuda/cuda_device.cpp). The worlds of
// exec/cuda/cuda_world.cpp (threads in one process) and exec/cuda/mpi_world.cpp (one process per
// GPU) make one per rank, on the rank's thread.
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>

#include "exec/devices.hpp"
#include "exec/plan.hpp"
#include "exec/rank_device.hpp"
#include "hw_models/units.hpp"

namespace stratasim::exec::cuda {

struct DeviceSetup {
  const ExecPlan* plan = nullptr;
  int rank = 0;
  /// CUDA device ordinal of the rank's GPU in this process.
  int gpu = 0;
  /// The world communicator's id, the same for every rank (ncclGetUniqueId on one rank).
  ncclUniqueId nccl_id{};
  /// Device-memory pool limit; 0: the GPU's memory.
  Bytes capacity;
  DeviceOptions options;
  /// Whether the world was aborted (another rank failed): waits give up when it says so.
  std::function<bool()> aborted;
  /// CPU threads for a host optimizer step (the process's cores shared by its ranks).
  int host_threads = 1;
};

/// The setup of `rank` on CUDA device `gpu` of a process whose `ranks_in_process` ranks share
/// its CPU cores (for host optimizer steps).
DeviceSetup device_setup(const ExecPlan& plan, int rank, int gpu, const ncclUniqueId& id,
                         const WorldOptions& options, int ranks_in_process,
                         std::function<bool()> aborted);

/// Creates the rank's device: selects the GPU, creates its streams, cuBLASLt handle, memory pool
/// and NCCL communicators (the world's, then one per group and one per direction of every pair
/// that transfers, all by ncclCommSplit in an order every rank follows). Every rank of the world
/// must call it at the same time (communicator creation is collective); it gives up with an
/// ExecError when the world is aborted meanwhile or after 10 minutes.
std::unique_ptr<RankDevice> make_cuda_device(const DeviceSetup& setup);

/// Environment for NCCL, set before the first communicator is created unless the user set it:
/// NCCL_RUNTIME_CONNECT=0 (connect every algorithm's channels when a communicator is created,
/// so that no collective blocks the issuing thread to connect while its peers issue other work).
void prepare_nccl_environment();

}  // namespace stratasim::exec::cuda
