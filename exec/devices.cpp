#include "exec/devices.hpp"

#include "exec/cuda_plugin.hpp"
#include "exec/host_device.hpp"
#include "hw_models/plugin.hpp"

namespace stratasim::exec {

namespace {

/// The CUDA plugin, loaded once: its table, or why there is none.
struct CudaDevice {
  const CudaPlugin* api = nullptr;
  std::string why_not;
};

CudaDevice load_cuda() {
  CudaDevice d;
#ifndef STRATASIM_CUDA_PLUGIN
  d.why_not =
      "this build of stratasim has no CUDA device (no CUDA toolkit was found when it was "
      "configured)";
#else
  try {
    const Plugin plugin = load_plugin(STRATASIM_CUDA_PLUGIN);
    const CudaPlugin* api = plugin_function<CudaPluginEntry>(plugin, kCudaPluginEntry)();
    if (api == nullptr || api->abi != kCudaPluginAbi || api->layout != kCudaPluginLayout) {
      throw PluginError(plugin.path.string() +
                        " comes from another build of stratasim than this executable; build "
                        "both together (ninja -C build stratasim)");
    }
    d.api = api;
  } catch (const PluginError& e) {
    d.why_not = std::string("the CUDA device could not be loaded: ") + e.what();
  }
#endif
  return d;
}

const CudaDevice& cuda() {
  static const CudaDevice device = load_cuda();
  return device;
}

}  // namespace

std::string_view name_of(DeviceKind kind) {
  return kind == DeviceKind::host ? "host" : "cuda";
}

std::optional<DeviceKind> device_kind_from_name(std::string_view name) {
  if (name == "host") return DeviceKind::host;
  if (name == "cuda") return DeviceKind::cuda;
  return std::nullopt;
}

bool cuda_available() {
  return cuda().api != nullptr;
}

int visible_gpus() {
  return cuda_available() ? cuda().api->visible_gpus() : 0;
}

std::string cuda_description() {
  return cuda_available() ? cuda().api->describe() : cuda().why_not;
}

std::unique_ptr<World> make_world(DeviceKind kind, const ExecPlan& plan,
                                  const WorldOptions& options) {
  if (kind == DeviceKind::host) return make_host_world(plan, options);
  if (!cuda_available()) {
    throw ExecError("cannot run on CUDA devices: " + cuda().why_not +
                    "; use --device host to run on CPU threads");
  }
  return cuda().api->make_world(plan, options);
}

}  // namespace stratasim::exec
