// The contract between the distributed sweep (search/distributed.cpp) and its MPI plugin,
// libstratasim_mpi.so (search/mpi_plugin.cpp, built where CMake finds MPI; search/
// CMakeLists.txt). The sweep loads it with dlopen (hw_models/plugin.hpp: where it is looked for)
// only when an MPI launcher started the process (launcher_world_size() > 0), so that no other
// command maps MPI. The plugin's one C-linkage entry point, stratasim_mpi_transport(), returns
// a table of C functions over MPI_COMM_WORLD, the few calls the sweep makes; only C types cross,
// so any build of the plugin with the same `abi` serves.
//
// Semantics: init is MPI_Init_thread with MPI_THREAD_SERIALIZED (worker threads send rows one
// at a time); finalize is MPI_Finalize; broadcast is MPI_Bcast of one 64-bit integer from rank
// 0; send is a blocking MPI_Send of `size` bytes (MPI_CHAR) to rank 0 with `tag`; poll is
// MPI_Iprobe of any source and tag; receive is MPI_Recv of the message poll announced. Each
// returns 0 on success (poll: 1 when a message waits, 0 when none, -1 on failure).
#pragma once

extern "C" {

/// The version of this contract; raise it when StratasimMpiTransport changes.
#define STRATASIM_MPI_TRANSPORT_ABI 1

struct StratasimMpiTransport {
  int abi;  // STRATASIM_MPI_TRANSPORT_ABI of the plugin's build
  /// On failure writes why (NUL-terminated) into error[0, error_size).
  int (*init)(int* rank, int* size, char* error, int error_size);
  int (*finalize)(void);
  int (*broadcast)(long long* value);
  int (*send)(const void* bytes, int size, int tag);
  int (*poll)(int* source, int* tag, int* size);
  int (*receive)(void* bytes, int size, int source, int tag);
};

/// The entry point, defined by the plugin: its table, never null.
const StratasimMpiTransport* stratasim_mpi_transport(void);
}

namespace stratasim::search {
/// The entry point's name and type.
inline constexpr const char* kMpiTransportEntry = "stratasim_mpi_transport";
using MpiTransportEntry = const StratasimMpiTransport*();
}  // namespace stratasim::search
