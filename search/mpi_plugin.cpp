// The MPI plugin of the distributed sweep (search/mpi_plugin.hpp): the transport's functions,
// each one MPI call on MPI_COMM_WORLD.
#include "search/mpi_plugin.hpp"

#include <mpi.h>

#include <cstdio>

namespace {

int init(int* rank, int* size, char* error, int error_size) {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    std::snprintf(error, static_cast<std::size_t>(error_size), "MPI_Init_thread failed");
    return 1;
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    std::snprintf(error, static_cast<std::size_t>(error_size),
                  "the MPI library does not support calls from worker threads "
                  "(MPI_THREAD_SERIALIZED)");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  return 0;
}

int finalize() {
  return MPI_Finalize() == MPI_SUCCESS ? 0 : 1;
}

int broadcast(long long* value) {
  return MPI_Bcast(value, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : 1;
}

int send(const void* bytes, int size, int tag) {
  return MPI_Send(bytes, size, MPI_CHAR, 0, tag, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : 1;
}

int poll(int* source, int* tag, int* size) {
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &status) != MPI_SUCCESS) {
    return -1;
  }
  if (flag == 0) return 0;
  *source = status.MPI_SOURCE;
  *tag = status.MPI_TAG;
  MPI_Get_count(&status, MPI_CHAR, size);
  return 1;
}

int receive(void* bytes, int size, int source, int tag) {
  return MPI_Recv(bytes, size, MPI_CHAR, source, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) ==
                 MPI_SUCCESS
             ? 0
             : 1;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const StratasimMpiTransport*
stratasim_mpi_transport(void) {
  static const StratasimMpiTransport table{
      STRATASIM_MPI_TRANSPORT_ABI, &init, &finalize, &broadcast, &send, &poll, &receive};
  return &table;
}
