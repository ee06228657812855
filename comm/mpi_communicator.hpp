// The MPI backend: a Communicator over an MPI communicator (one per mesh-dim group, made with
// MPI_Comm_split). Every collective, dtype and ReduceOp of the interface; bf16 / f16 reductions
// go through float32 (MPI has no 16-bit float types), avg is a sum divided by the group size.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace tessera {

// Wraps `comm` (an MPI_Comm, passed as its integer handle to keep mpi.h out of this header;
// OpenMPI's handles are pointers, so it travels as a void*). The communicator is freed with it.
std::shared_ptr<Communicator> make_mpi_communicator(void* mpi_comm);

}  // namespace tessera
