// Sweeps across MPI processes (see distributed.hpp). Rows travel as one message each: 8 bytes
// of item index then the CSV line (tag kRow); a process that has finished its share sends an
// empty kDone message. Rank 0 polls for messages (MPI_Iprobe and a short sleep, not a blocking
// probe that would spin a core its own worker threads need).
#include "search/distributed.hpp"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "search/sweep.hpp"

#ifdef STRATASIM_HAVE_MPI
#include <mpi.h>
#endif

namespace stratasim::search {

int launcher_world_size() {
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  // PMIx launchers (prterun, OpenMPI 5) always set the rank, not always a size.
  if (const char* v = std::getenv("PMIX_RANK"); v != nullptr && *v != '\0') return 1;
  return 0;
}

#ifdef STRATASIM_HAVE_MPI

bool mpi_built() {
  return true;
}

namespace {
constexpr int kRow = 1;
constexpr int kDone = 2;
}  // namespace

MpiWorld::MpiWorld() {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    throw std::runtime_error("MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw std::runtime_error(
        "the MPI library does not support calls from worker threads (MPI_THREAD_SERIALIZED)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiWorld::~MpiWorld() {
  MPI_Finalize();
}

long long MpiWorld::broadcast(long long value) const {
  MPI_Bcast(&value, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return value;
}

std::size_t MpiWorld::run(std::size_t first, std::size_t count, int jobs,
                          const std::function<std::string(std::size_t)>& work,
                          const std::function<void(std::size_t, std::string&&)>& emit,
                          const std::function<void()>& on_done,
                          const std::atomic<bool>* stop) const {
  std::vector<std::size_t> mine;
  for (std::size_t i = first + static_cast<std::size_t>(rank_); i < count;
       i += static_cast<std::size_t>(size_)) {
    mine.push_back(i);
  }
  if (rank_ != 0) {
    auto send = [](std::size_t i, std::string&& line) {
      std::string message(sizeof(std::uint64_t), '\0');
      const auto index = static_cast<std::uint64_t>(i);
      std::memcpy(message.data(), &index, sizeof index);
      message += line;
      MPI_Send(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, kRow, MPI_COMM_WORLD);
    };
    std::exception_ptr error;
    if (!mine.empty()) {
      try {
        run_ordered(0, 0, jobs, work, send, stop, mine);
      } catch (...) {
        error = std::current_exception();
      }
    }
    MPI_Send(nullptr, 0, MPI_CHAR, 0, kDone, MPI_COMM_WORLD);
    if (error) std::rethrow_exception(error);
    return 0;
  }

  // Rank 0: its own share in worker threads, the others' rows from this thread, merged in
  // index order.
  std::mutex mutex;
  std::map<std::size_t, std::string> pending;
  std::size_t next = first, emitted = 0;
  auto arrived = [&](std::size_t i, std::string&& line) {
    std::lock_guard lock(mutex);
    pending.emplace(i, std::move(line));
    while (!pending.empty() && pending.begin()->first == next) {
      emit(next, std::move(pending.begin()->second));
      pending.erase(pending.begin());
      ++next;
      ++emitted;
    }
  };
  std::exception_ptr error;
  std::thread local([&] {
    if (mine.empty()) return;
    try {
      run_ordered(
          0, 0, jobs,
          [&](std::size_t i) {
            std::string line = work(i);
            if (on_done) on_done();
            return line;
          },
          arrived, stop, mine);
    } catch (...) {
      error = std::current_exception();
    }
  });
  int senders = size_ - 1;
  std::vector<char> buffer;
  while (senders > 0) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &status);
    if (flag == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    buffer.resize(static_cast<std::size_t>(std::max(length, 1)));
    MPI_Recv(buffer.data(), length, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (status.MPI_TAG == kDone) {
      --senders;
      continue;
    }
    std::uint64_t index = 0;
    std::memcpy(&index, buffer.data(), sizeof index);
    arrived(
        static_cast<std::size_t>(index),
        std::string(buffer.data() + sizeof index, static_cast<std::size_t>(length) - sizeof index));
    if (on_done) on_done();
  }
  local.join();
  if (error) std::rethrow_exception(error);
  return emitted;
}

#else

bool mpi_built() {
  return false;
}

MpiWorld::MpiWorld() {
  throw std::runtime_error(
      "started by an MPI launcher (mpirun), but this stratasim was built without MPI: install "
      "OpenMPI's development files (libopenmpi-dev) and rebuild, or run the sweep without "
      "mpirun (it uses threads: --jobs)");
}
MpiWorld::~MpiWorld() = default;
long long MpiWorld::broadcast(long long value) const {
  return value;
}
std::size_t MpiWorld::run(std::size_t, std::size_t, int,
                          const std::function<std::string(std::size_t)>&,
                          const std::function<void(std::size_t, std::string&&)>&,
                          const std::function<void()>&, const std::atomic<bool>*) const {
  return 0;
}

#endif

}  // namespace stratasim::search
