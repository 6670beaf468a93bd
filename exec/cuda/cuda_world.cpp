// The CUDA device's entry points (cuda_world.hpp): what GPUs there are, and the single-process
// World (a thread per GPU) or, under mpirun, the MPI World (mpi_world.hpp).
#include "exec/cuda/cuda_world.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "exec/cuda/check.hpp"
#include "exec/cuda/cuda_device.hpp"
#include "exec/cuda/mpi_world.hpp"

namespace stratasim::exec::cuda {

namespace {

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

/// A World whose ranks are threads of this process, rank r on GPU r.
class CudaLocalWorld final : public LocalWorld {
 public:
  CudaLocalWorld(const ExecPlan& plan, const WorldOptions& options, const ncclUniqueId& id)
      : LocalWorld(plan.world_size(), [this](int rank) { return make(rank); }),
        plan_(plan),
        options_(options),
        id_(id) {}

 private:
  std::unique_ptr<RankDevice> make(int rank) {
    return make_cuda_device(device_setup(plan_, rank, rank, id_, options_, plan_.world_size(),
                                         [this] { return aborted(); }));
  }

  const ExecPlan& plan_;
  WorldOptions options_;
  ncclUniqueId id_;
};

}  // namespace

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string describe() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no usable CUDA GPU: cudaGetDeviceCount: ") + cudaGetErrorString(status);
  }
  if (count == 0) return "no CUDA GPU is visible to this process";
  // Device names, grouped: "8 x NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)".
  std::map<std::string, int> names;
  std::vector<std::string> order;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    const std::string name = std::string(p.name) + " (sm_" + std::to_string(p.major) +
                             std::to_string(p.minor) + ", " +
                             to_string(Bytes(static_cast<std::int64_t>(p.totalGlobalMem))) + ")";
    if (names[name]++ == 0) order.push_back(name);
  }
  std::string text;
  for (const auto& name : order) {
    if (!text.empty()) text += ", ";
    text += (names[name] > 1 ? std::to_string(names[name]) + " x " : std::string()) + name;
  }
  int runtime = 0, driver = 0, nccl = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  text += ", CUDA runtime " + version_text(runtime) + " (driver " + version_text(driver) + ")";
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    text += ", NCCL " + std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) +
            "." + std::to_string(nccl % 100);
  }
  return text;
}

std::unique_ptr<World> make_world(const ExecPlan& plan, const WorldOptions& options) {
  const int processes = mpi_processes_from_environment();
  if (options.launch == Launch::mpi || (options.launch == Launch::automatic && processes > 1)) {
#ifdef STRATASIM_HAVE_MPI
    return make_mpi_world(plan, options);
#else
    throw ExecError(
        (options.launch == Launch::mpi ? std::string("an MPI launch was asked for")
                                       : "this process was started by mpirun with " +
                                             std::to_string(processes) + " processes") +
        ", but this build of stratasim has no MPI (no MPI was found when it was configured): "
        "install MPI (Debian: libopenmpi-dev) and build again, or run one process, which "
        "drives every GPU of this node");
#endif
  }
  const int gpus = visible_gpus();
  if (plan.world_size() > gpus) {
    throw ExecError("the strategy needs " + std::to_string(plan.world_size()) +
                    " GPUs; this machine has " + std::to_string(gpus) +
                    (gpus == 0 ? " (" + describe() + ")" : std::string()) +
                    "; one process drives the GPUs of one node (use mpirun with one process per "
                    "GPU for more)");
  }
  prepare_nccl_environment();
  ncclUniqueId id{};
  CallContext ctx;
  STRATASIM_CUDA_CHECK(ctx, ncclGetUniqueId(&id));
  return std::make_unique<CudaLocalWorld>(plan, options, id);
}

int mpi_processes_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      const int n = std::atoi(value);
      if (n > 0) return n;
    }
  }
  return 0;
}

}  // namespace stratasim::exec::cuda
