#include "comm/collective_timeout.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tessera {

double collective_timeout_seconds() {
  const char* v = std::getenv("TESSERA_COMM_TIMEOUT");
  return v && *v ? std::atof(v) : 0.0;
}

void abort_on_collective_timeout(void* mpi_comm, const char* what, int64_t sequence, double timeout_seconds,
                                 const std::vector<int>& missing_group_ranks) {
  MPI_Comm comm = static_cast<MPI_Comm>(mpi_comm);
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Group group, world_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::string missing;
  for (int p : missing_group_ranks) {
    int world_rank = -1;
    MPI_Group_translate_ranks(group, 1, &p, world_group, &world_rank);
    missing += (missing.empty() ? "" : ", ") + std::to_string(world_rank);
  }
  std::fprintf(stderr, "tessera: client %d: %s (collective #%lld of its group) waited more than %.1f s; ranks that never arrived: [%s]\n",
               world, what, (long long)sequence, timeout_seconds, missing.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

void abort_on_device_collective_timeout(const char* what, int64_t sequence, double timeout_seconds,
                                        const std::string& detail) {
  int initialized = 0, finalized = 0, world = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool mpi = initialized && !finalized;
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &world);
  std::fprintf(stderr, "tessera: client %d: %s (collective #%lld of its group) waited more than %.1f s; %s\n", world, what,
               (long long)sequence, timeout_seconds, detail.c_str());
  std::fflush(stderr);
  if (mpi) MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

}  // namespace tessera
