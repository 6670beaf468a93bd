// The MPI World of the CUDA device: one process per GPU, started by mpirun (exec/cuda/
// mpi_world.cpp, built only where CMake finds MPI: STRATASIM_HAVE_MPI).
//
// MPI is initialised on first use (MPI_Init_thread) and finalised at exit. Each process drives
// one rank, its MPI rank, on the GPU of its node-local rank; rank 0 makes the NCCL id and
// broadcasts it; barriers are MPI_Barrier; the measurements of every process are gathered on
// rank 0, which alone reports. A failure aborts the whole job (MPI_Abort) once it is reported.
#pragma once

#include <memory>

#include "exec/devices.hpp"
#include "exec/interpreter.hpp"
#include "exec/plan.hpp"

namespace stratasim::exec::cuda {

/// Processes of the MPI job this process belongs to, from the launcher's environment
/// (OMPI_COMM_WORLD_SIZE, PMI_SIZE, MV2_COMM_WORLD_SIZE); 0 when not started by a launcher.
int mpi_processes_from_environment();

#ifdef STRATASIM_HAVE_MPI
/// The World of this MPI job for `plan`: needs one process per rank of the Program and a GPU
/// per process on each node. Throws ExecError (on every process) otherwise.
std::unique_ptr<World> make_mpi_world(const ExecPlan& plan, const WorldOptions& options);
#endif

}  // namespace stratasim::exec::cuda
