// Choosing the device a real run uses: the host device (CPU threads, always built) or the CUDA
// device (exec/cuda/, built where the CUDA toolkit is found into a plugin, libstratasim_cuda.so,
// loaded the first time one of the functions below needs it: exec/cuda_plugin.hpp). This header
// is the only one the CLI and calibration need: it compiles without CUDA, and says at run time
// what is available; only a call that needs the CUDA device loads CUDA.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "exec/interpreter.hpp"
#include "exec/plan.hpp"
#include "exec/rank_device.hpp"
#include "hw_models/units.hpp"

namespace stratasim::exec {

enum class DeviceKind { host, cuda };
std::string_view name_of(DeviceKind kind);
std::optional<DeviceKind> device_kind_from_name(std::string_view name);

/// How the ranks of a CUDA run map onto processes.
enum class Launch {
  automatic,       // MPI when started under mpirun with several processes, else one process
  single_process,  // one process drives every GPU of this node, a thread per GPU
  mpi              // one process per GPU (mpirun -np N); rank 0 makes the NCCL id
};

struct WorldOptions {
  DeviceOptions device;
  /// Device-memory pool limit per rank; 0: the device's own memory (CUDA) or 4 GiB (host).
  Bytes capacity;
  Launch launch = Launch::automatic;
};

/// Whether the CUDA device is there: this build has it (the toolkit was found when it was
/// configured) and its plugin loads (loads it on the first call; says nothing about GPUs).
bool cuda_available();
/// GPUs this process can see (0 without the CUDA device, without a driver or without GPUs).
int visible_gpus();
/// "NVIDIA H100 80GB HBM3, CUDA 13.0, NCCL 2.28.3", or why there is no GPU: no driver, or no
/// CUDA device in this build, or its plugin not found or not loadable (naming what is missing).
std::string cuda_description();

/// A World running `plan` on `kind` devices. Throws ExecError when the devices are not there:
/// "the strategy needs 8 GPUs; this machine has 1" (CUDA), or the CUDA device is not available
/// (cuda_description() says why).
std::unique_ptr<World> make_world(DeviceKind kind, const ExecPlan& plan,
                                  const WorldOptions& options);

}  // namespace stratasim::exec
