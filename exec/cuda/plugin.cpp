// The CUDA plugin's entry point (exec/cuda_plugin.hpp): the table of the device's entry points.
#include "exec/cuda/cuda_world.hpp"
#include "exec/cuda_plugin.hpp"

extern "C" __attribute__((visibility("default"))) const stratasim::exec::CudaPlugin*
stratasim_cuda_plugin() {
  using namespace stratasim::exec;
  static const CudaPlugin table{kCudaPluginAbi, kCudaPluginLayout, &cuda::visible_gpus,
                                &cuda::describe, &cuda::make_world};
  return &table;
}
