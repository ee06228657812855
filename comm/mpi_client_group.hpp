// The MPI implementation of ClientGroup (comm/client_group.hpp). Internal to comm/.
#pragma once

#include <functional>
#include <memory>

#include "comm/client_group.hpp"

namespace tessera {

// Initialises MPI (MPI_THREAD_MULTIPLE) unless the program did, makes an escaping exception end
// the job (MPI_Abort after printing it), finalises MPI at exit after `before_shutdown`, and
// returns the world group.
std::unique_ptr<ClientGroup> start_mpi_clients(int& argc, char**& argv, std::function<void()> before_shutdown);

}  // namespace tessera
