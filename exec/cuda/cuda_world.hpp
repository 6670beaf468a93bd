// The CUDA device's entry points, compiled only where the CUDA toolkit is found, into the CUDA
// plugin (libstratasim_cuda.so), whose table (exec/cuda_plugin.hpp, exec/cuda/plugin.cpp) hands
// them to exec/devices.cpp; nothing outside the plugin includes CUDA headers.
#pragma once

#include <memory>
#include <string>

#include "exec/devices.hpp"

namespace stratasim::exec::cuda {

/// GPUs visible to this process (0 when the driver or the GPUs are missing; never throws).
int visible_gpus();
/// Device name, CUDA runtime and driver versions, NCCL version; or why no GPU is usable.
std::string describe();
/// A World of CUDA devices for `plan` (one thread per GPU in this process, or one process per
/// GPU under MPI). Throws ExecError naming what is missing (GPUs, MPI processes).
std::unique_ptr<World> make_world(const ExecPlan& plan, const WorldOptions& options);

}  // namespace stratasim::exec::cuda
