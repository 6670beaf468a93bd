// Sweeps across MPI processes (see distributed.hpp). Rows travel as one message each: 8 bytes
// of item index then the CSV line (tag kRow); a process that has finished its share sends an
// empty kDone message. Rank 0 polls for messages (MPI_Iprobe and a short sleep, not a blocking
// probe that would spin a core its own worker threads need). The MPI calls go through the MPI
// plugin's table (search/mpi_plugin.hpp).
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

#include "hw_models/plugin.hpp"
#include "search/mpi_plugin.hpp"
#include "search/sweep.hpp"

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

namespace {

constexpr int kRow = 1;
constexpr int kDone = 2;

const char* const kWithoutMpi = "; or run the sweep without mpirun (it uses threads: --jobs)";

// The MPI plugin's table, loaded once; throws std::runtime_error saying why there is none.
const StratasimMpiTransport& transport() {
#ifndef STRATASIM_MPI_PLUGIN
  throw std::runtime_error(
      "started by an MPI launcher (mpirun), but this stratasim was built without MPI: install "
      "OpenMPI's development files (libopenmpi-dev) and rebuild" +
      std::string(kWithoutMpi));
#else
  static const StratasimMpiTransport* const table = [] {
    try {
      const Plugin plugin = load_plugin(STRATASIM_MPI_PLUGIN);
      const StratasimMpiTransport* t =
          plugin_function<MpiTransportEntry>(plugin, kMpiTransportEntry)();
      if (t == nullptr || t->abi != STRATASIM_MPI_TRANSPORT_ABI) {
        throw PluginError(plugin.path.string() +
                          " comes from another version of stratasim; build it with this one");
      }
      return t;
    } catch (const PluginError& e) {
      throw std::runtime_error(
          "started by an MPI launcher (mpirun), but MPI could not be loaded: " +
          std::string(e.what()) + kWithoutMpi);
    }
  }();
  return *table;
#endif
}

void check(int status, const char* call) {
  if (status != 0) throw std::runtime_error(std::string("MPI: ") + call + " failed");
}

}  // namespace

MpiWorld::MpiWorld() : mpi_(&transport()) {
  char error[256] = "";
  if (mpi_->init(&rank_, &size_, error, sizeof error) != 0) throw std::runtime_error(error);
}

MpiWorld::~MpiWorld() {
  mpi_->finalize();
}

long long MpiWorld::broadcast(long long value) const {
  check(mpi_->broadcast(&value), "MPI_Bcast");
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
    auto send = [this](std::size_t i, std::string&& line) {
      std::string message(sizeof(std::uint64_t), '\0');
      const auto index = static_cast<std::uint64_t>(i);
      std::memcpy(message.data(), &index, sizeof index);
      message += line;
      check(mpi_->send(message.data(), static_cast<int>(message.size()), kRow), "MPI_Send");
    };
    std::exception_ptr error;
    if (!mine.empty()) {
      try {
        run_ordered(0, 0, jobs, work, send, stop, mine);
      } catch (...) {
        error = std::current_exception();
      }
    }
    check(mpi_->send(nullptr, 0, kDone), "MPI_Send");
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
    int source = 0, tag = 0, length = 0;
    const int waiting = mpi_->poll(&source, &tag, &length);
    if (waiting == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (waiting > 0) buffer.resize(static_cast<std::size_t>(std::max(length, 1)));
    if (waiting < 0 || mpi_->receive(buffer.data(), length, source, tag) != 0) {
      local.join();  // (MPI's default error handler aborts first; this is for one that returns)
      throw std::runtime_error("MPI: receiving the other processes' rows failed");
    }
    if (tag == kDone) {
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

}  // namespace stratasim::search
