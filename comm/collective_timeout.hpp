// TESSERA_COMM_TIMEOUT=seconds: a collective of a multi-client group that waits longer reports
// which collective and which ranks never arrived, then ends the job (every MPI-based backend, and
// NCCL's where it waits for the GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// The limit in seconds; 0 (unset) waits forever.
double collective_timeout_seconds();

// Prints "client C: WHAT (collective #SEQUENCE of its group) waited more than T s; ranks that
// never arrived: [...]" with the missing group ranks of `mpi_comm` given as world ranks, then
// calls MPI_Abort.
[[noreturn]] void abort_on_collective_timeout(void* mpi_comm, const char* what, int64_t sequence, double timeout_seconds,
                                              const std::vector<int>& missing_group_ranks);

// The same report for a wait on a GPU library that cannot name the missing ranks (NCCL keeps
// them to itself): "client C: WHAT (collective #SEQUENCE of its group) waited more than T s;
// DETAIL", then MPI_Abort where MPI runs, else abort (a run of one client).
[[noreturn]] void abort_on_device_collective_timeout(const char* what, int64_t sequence, double timeout_seconds,
                                                     const std::string& detail);

}  // namespace tessera
