// MPI communicators over a subset of the clients, created by those clients alone
// (MPI_Comm_create_group): a sub-mesh or a mesh over some clients needs no one else.
// Internal to jit/ (the MPI types stay out of the public headers).
#pragma once

#include <mpi.h>

#include <vector>

namespace tessera {

// A new communicator over `clients` (world ranks, in the order they take as ranks). `tag`
// tells apart groups created at once by overlapping sets of clients.
MPI_Comm create_client_group(const std::vector<int>& clients, int tag);

// A communicator over `clients` kept for the life of the process (made once per set).
MPI_Comm cached_client_group(const std::vector<int>& clients);

}  // namespace tessera
