// The MPI World (see mpi_world.hpp). Built only with STRATASIM_HAVE_MPI.
#include "exec/cuda/mpi_world.hpp"

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "exec/cuda/check.hpp"
#include "exec/cuda/cuda_device.hpp"
#include "exec/cuda/cuda_world.hpp"

namespace stratasim::exec::cuda {

namespace {

std::atomic<bool> g_aborted{false};
bool g_finalize = false;  // whether this library initialised MPI (and so finalises it)

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A failed run leaves the other processes waiting in collectives: end the whole job.
  if (g_aborted) MPI_Abort(MPI_COMM_WORLD, 1);
  if (g_finalize) MPI_Finalize();
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Calls come from the rank's thread and, after it joined, the main thread.
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      g_finalize = true;
    }
    std::atexit(finalize_at_exit);
  });
}

// ---- Measurements as bytes (every process has the same binary: plain memcpy of fields).

class Writer {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_time(Time t) { put(t.picoseconds()); }
  void put_bytes(Bytes b) { put(b.count()); }
  std::vector<char>& bytes() { return bytes_; }

 private:
  std::vector<char> bytes_;
};

class Reader {
 public:
  Reader(const char* data, std::size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    if (static_cast<std::size_t>(end_ - p_) < sizeof(T)) {
      throw ExecError("MPI gather: a process sent a truncated measurement");
    }
    T value;
    std::memcpy(&value, p_, sizeof(T));
    p_ += sizeof(T);
    return value;
  }
  Time get_time() { return Time::ps(get<std::int64_t>()); }
  Bytes get_bytes() { return Bytes(get<std::int64_t>()); }

 private:
  const char* p_;
  const char* end_;
};

void write(Writer& w, const RankMeasurement& m) {
  w.put(m.rank);
  w.put(static_cast<std::uint64_t>(m.ops.size()));
  for (const OpTiming& o : m.ops) {
    w.put(o.op);
    w.put_time(o.start);
    w.put_time(o.end);
  }
  w.put(static_cast<std::uint64_t>(m.kernels.size()));
  for (const KernelTiming& k : m.kernels) {
    w.put(k.op);
    w.put(k.index);
    w.put_time(k.start);
    w.put_time(k.end);
  }
  for (const traces::TierPeak& t : m.memory.tiers) {
    w.put_bytes(t.capacity);
    w.put_bytes(t.peak);
    w.put_time(t.time);
    w.put(t.op);
    for (const Bytes& b : t.breakdown) w.put_bytes(b);
  }
  w.put(static_cast<std::uint64_t>(m.samples.size()));
  for (const traces::MemorySample& s : m.samples) {
    w.put(s.rank);
    w.put(static_cast<std::uint8_t>(s.tier));
    w.put_time(s.time);
    w.put_bytes(s.total);
    w.put(s.op);
  }
  w.put_bytes(m.reserved_peak);
}

RankMeasurement read(Reader& r) {
  RankMeasurement m;
  m.rank = r.get<std::int32_t>();
  m.ops.resize(r.get<std::uint64_t>());
  for (OpTiming& o : m.ops) {
    o.op = r.get<OpId>();
    o.start = r.get_time();
    o.end = r.get_time();
  }
  m.kernels.resize(r.get<std::uint64_t>());
  for (KernelTiming& k : m.kernels) {
    k.op = r.get<OpId>();
    k.index = r.get<std::uint32_t>();
    k.start = r.get_time();
    k.end = r.get_time();
  }
  for (traces::TierPeak& t : m.memory.tiers) {
    t.capacity = r.get_bytes();
    t.peak = r.get_bytes();
    t.time = r.get_time();
    t.op = r.get<OpId>();
    for (Bytes& b : t.breakdown) b = r.get_bytes();
  }
  m.samples.resize(r.get<std::uint64_t>());
  for (traces::MemorySample& s : m.samples) {
    s.rank = r.get<std::int32_t>();
    s.tier = static_cast<strategies::MemoryTier>(r.get<std::uint8_t>());
    s.time = r.get_time();
    s.total = r.get_bytes();
    s.op = r.get<OpId>();
  }
  m.reserved_peak = r.get_bytes();
  return m;
}

class MpiWorld final : public World {
 public:
  MpiWorld(const ExecPlan& plan, const WorldOptions& options, const ncclUniqueId& id, int rank,
           int local_rank, int local_size)
      : plan_(plan),
        options_(options),
        id_(id),
        rank_(rank),
        local_rank_(local_rank),
        local_size_(local_size) {}

  std::vector<int> local_ranks() const override { return {rank_}; }

  std::unique_ptr<RankDevice> make_device(int rank) override {
    return make_cuda_device(device_setup(plan_, rank, local_rank_, id_, options_, local_size_,
                                         [this] { return aborted(); }));
  }

  bool barrier() override {
    if (g_aborted) return false;
    MPI_Barrier(MPI_COMM_WORLD);
    return !g_aborted;
  }

  // The error is reported by the caller (run() throws it to the CLI, which prints it); the job
  // ends at exit (finalize_at_exit calls MPI_Abort), or 30 s from now if this process lingers.
  void abort() override {
    if (g_aborted.exchange(true)) return;
    std::fprintf(stderr,
                 "stratasim: MPI rank %d: the run failed; every process of the job will be "
                 "stopped (MPI_Abort)\n",
                 rank_);
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(30));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }).detach();
  }

  bool aborted() const override { return g_aborted; }

  void gather(std::vector<std::vector<RankMeasurement>>& measured) override {
    Writer w;
    for (const auto& iteration : measured) write(w, iteration[static_cast<std::size_t>(rank_)]);
    std::vector<char>& mine = w.bytes();
    int size = static_cast<int>(mine.size());
    int processes = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &processes);
    std::vector<int> sizes(static_cast<std::size_t>(processes)),
        offsets(static_cast<std::size_t>(processes));
    MPI_Gather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<char> all;
    if (rank_ == 0) {
      long long total = 0;
      for (int p = 0; p < processes; ++p) {
        offsets[static_cast<std::size_t>(p)] = static_cast<int>(total);
        total += sizes[static_cast<std::size_t>(p)];
      }
      if (total > 0x7FFFFFFF) throw ExecError("MPI gather: the measurements exceed 2 GiB");
      all.resize(static_cast<std::size_t>(total));
    }
    MPI_Gatherv(mine.data(), size, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, 0,
                MPI_COMM_WORLD);
    if (rank_ != 0) return;
    for (int p = 1; p < processes; ++p) {
      Reader r(all.data() + offsets[static_cast<std::size_t>(p)],
               static_cast<std::size_t>(sizes[static_cast<std::size_t>(p)]));
      for (auto& iteration : measured) {
        RankMeasurement m = read(r);
        iteration[static_cast<std::size_t>(m.rank)] = std::move(m);
      }
    }
  }

  bool reports() const override { return rank_ == 0; }

 private:
  const ExecPlan& plan_;
  WorldOptions options_;
  ncclUniqueId id_;
  int rank_, local_rank_, local_size_;
};

}  // namespace

std::unique_ptr<World> make_mpi_world(const ExecPlan& plan, const WorldOptions& options) {
  ensure_mpi();
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  // Every process checks, then all agree, so that they fail together instead of waiting for
  // each other.
  std::string problem;
  ncclUniqueId id{};
  if (size != plan.world_size()) {
    problem = "the strategy needs " + std::to_string(plan.world_size()) +
              " ranks; mpirun started " + std::to_string(size) + " processes (use mpirun -np " +
              std::to_string(plan.world_size()) + ", one process per GPU)";
  } else if (const int gpus = visible_gpus(); local_rank >= gpus) {
    problem = "MPI rank " + std::to_string(rank) + " is process " + std::to_string(local_rank) +
              " of its node, which has " + std::to_string(gpus) + " GPU(s) visible" +
              (gpus == 0 ? " (" + describe() + ")" : std::string()) +
              "; start at most one process per GPU on each node";
  } else if (rank == 0) {
    prepare_nccl_environment();
    const ncclResult_t status = ncclGetUniqueId(&id);
    if (status != ncclSuccess) {
      problem = std::string("MPI rank 0: ncclGetUniqueId failed: ") + ncclGetErrorString(status);
    }
  }
  int bad = problem.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any) {
    throw ExecError(problem.empty() ? "another MPI process could not start the run (see its "
                                      "message)"
                                    : problem);
  }
  prepare_nccl_environment();
  MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD);
  return std::make_unique<MpiWorld>(plan, options, id, rank, local_rank, local_size);
}

}  // namespace stratasim::exec::cuda
