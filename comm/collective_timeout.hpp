// TESSERA_COMM_TIMEOUT=seconds: a collective of a multi-client group that waits longer reports
// which collective and which ranks never arrived, then ends the job (every MPI-based backend).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// The limit in seconds; 0 (unset) waits forever.
double collective_timeout_seconds();

// Prints "client C: WHAT (collective #SEQUENCE of its group) waited more than T s; ranks that
// never arrived: [...]" with the missing group ranks of `mpi_comm` given as world ranks, then
// calls MPI_Abort.
[[noreturn]] void abort_on_collective_timeout(void* mpi_comm, const char* what, int64_t sequence, double timeout_seconds,
                                              const std::vector<int>& missing_group_ranks);

}  // namespace tessera
