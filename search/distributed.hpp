// Sweeps across processes: under `mpirun -np K stratasim sweep ...` each process takes every
// K-th combination (with its own threads) and rank 0 gathers the rows as they finish and
// writes the one CSV, in the same order and with the same bytes as a threaded run. MPI is used
// only when a launcher started the process (launcher_world_size() > 0), so a plain run never
// loads it: the MPI calls are in a plugin, libstratasim_mpi.so (search/mpi_plugin.hpp), built
// only where CMake finds MPI and loaded by the first MpiWorld.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>

struct StratasimMpiTransport;

namespace stratasim::search {

/// The world size an MPI launcher announces in the environment (OMPI_COMM_WORLD_SIZE,
/// PMIX_SIZE / PMIX_RANK, PMI_SIZE, MV2_COMM_WORLD_SIZE); 0 when no launcher started us.
int launcher_world_size();

/// The MPI world of this process, initialised on construction (with MPI_THREAD_SERIALIZED:
/// worker threads send rows one at a time) and finalised on destruction. Throws
/// std::runtime_error when this build has no MPI, when the MPI plugin is not found or does not
/// load (naming what is missing), or when MPI fails to start.
class MpiWorld {
 public:
  MpiWorld();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank 0's value of `value` on every rank.
  long long broadcast(long long value) const;

  /// Evaluates items [first, count) across the world: rank r computes items first + r,
  /// first + r + size, ... with `jobs` threads and sends each finished line to rank 0, which
  /// calls `emit(i, line)` in index order as soon as the prefix up to i is complete
  /// (`on_done` once per finished item, any process's, for progress). When `stop` becomes true
  /// a process takes no further items; rank 0 still gathers what the others finished. Returns,
  /// on rank 0, how many items were emitted (0 elsewhere).
  std::size_t run(std::size_t first, std::size_t count, int jobs,
                  const std::function<std::string(std::size_t)>& work,
                  const std::function<void(std::size_t, std::string&&)>& emit,
                  const std::function<void()>& on_done, const std::atomic<bool>* stop) const;

 private:
  const StratasimMpiTransport* mpi_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace stratasim::search
