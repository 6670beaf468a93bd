#include "exec/devices.hpp"

#include "exec/host_device.hpp"
#ifdef STRATASIM_HAVE_CUDA
#include "exec/cuda/cuda_world.hpp"
#endif

namespace stratasim::exec {

std::string_view name_of(DeviceKind kind) {
  return kind == DeviceKind::host ? "host" : "cuda";
}

std::optional<DeviceKind> device_kind_from_name(std::string_view name) {
  if (name == "host") return DeviceKind::host;
  if (name == "cuda") return DeviceKind::cuda;
  return std::nullopt;
}

bool cuda_built() {
#ifdef STRATASIM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int visible_gpus() {
#ifdef STRATASIM_HAVE_CUDA
  return cuda::visible_gpus();
#else
  return 0;
#endif
}

std::string cuda_description() {
#ifdef STRATASIM_HAVE_CUDA
  return cuda::describe();
#else
  return "this build of stratasim has no CUDA device (no CUDA toolkit was found when it was "
         "configured)";
#endif
}

std::unique_ptr<World> make_world(DeviceKind kind, const ExecPlan& plan,
                                  const WorldOptions& options) {
  if (kind == DeviceKind::host) return make_host_world(plan, options);
#ifdef STRATASIM_HAVE_CUDA
  return cuda::make_world(plan, options);
#else
  throw ExecError("cannot run on CUDA devices: " + cuda_description() +
                  "; use --device host to run on CPU threads");
#endif
}

}  // namespace stratasim::exec
