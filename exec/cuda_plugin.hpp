// The contract between stratasim_exec and the CUDA device's plugin, libstratasim_cuda.so, built
// from exec/cuda/ where the CUDA toolkit with cuBLASLt and NCCL is found (exec/CMakeLists.txt).
// exec/devices.cpp loads it with dlopen (hw_models/plugin.hpp: where it is looked for) the first
// time something asks for the CUDA device — `run`, `validate` or `calibrate` with --device cuda
// — so that no other command maps CUDA, cuBLASLt, NCCL or MPI (the plugin links MPI for its
// one-process-per-GPU world, exec/cuda/mpi_world.hpp).
//
// The plugin's one C-linkage entry point, stratasim_cuda_plugin(), returns a table of the CUDA
// device's entry points (exec/cuda/cuda_world.hpp). They are C++ functions taking and returning
// stratasim types, and the plugin resolves the stratasim code it uses (the interpreter's
// LocalWorld, the memory pool, the Program) against the executable that loads it, which exports
// its stratasim symbols (exec/exports.map): so a plugin works only with an executable of the
// same build. The loader checks `abi` (this contract's version) and `layout` (the sizes of the
// types that cross), and refuses a plugin of another build with a message that says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "exec/devices.hpp"
#include "exec/interpreter.hpp"
#include "exec/plan.hpp"
#include "exec/rank_device.hpp"
#include "strategies/program.hpp"

namespace stratasim::exec {

/// The version of this contract; raise it when CudaPlugin changes.
inline constexpr int kCudaPluginAbi = 1;

/// A fingerprint of the sizes of the types that cross between the executable and the plugin.
inline constexpr std::uint64_t kCudaPluginLayout = [] {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the sizes
  for (std::size_t s : {sizeof(ExecPlan), sizeof(WorldOptions), sizeof(DeviceOptions),
                        sizeof(World), sizeof(LocalWorld), sizeof(RankMeasurement),
                        sizeof(strategies::Program), sizeof(std::string)}) {
    h = (h ^ static_cast<std::uint64_t>(s)) * 1099511628211ULL;
  }
  return h;
}();

/// The CUDA device's entry points (exec/cuda/cuda_world.hpp says what each does).
struct CudaPlugin {
  int abi = 0;               // kCudaPluginAbi of the plugin's build (first: read before the rest)
  std::uint64_t layout = 0;  // kCudaPluginLayout of the plugin's build
  int (*visible_gpus)() = nullptr;
  std::string (*describe)() = nullptr;
  std::unique_ptr<World> (*make_world)(const ExecPlan& plan, const WorldOptions& options) = nullptr;
};

/// The entry point's name and type.
inline constexpr const char* kCudaPluginEntry = "stratasim_cuda_plugin";
using CudaPluginEntry = const CudaPlugin*();

}  // namespace stratasim::exec

/// The entry point, defined by the plugin (exec/cuda/plugin.cpp): its table, never null.
extern "C" const stratasim::exec::CudaPlugin* stratasim_cuda_plugin();
