// all_reduce through Tessera's MPI backend vs raw MPI_Allreduce on the same buffers, in one run.
// Run: mpirun --oversubscribe -np 2 build/bench/mpi_bench   (also -np 4)
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include <tessera/tessera.hpp>

#include "comm/mpi_communicator.hpp"

using namespace tessera;

namespace {

template <class F>
double median_seconds(F fn, int iterations) {
  std::vector<double> samples;
  for (int rep = 0; rep < 7; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iterations; ++i) fn();
    double t = (MPI_Wtime() - start) / iterations;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank
    samples.push_back(t);
  }
  std::sort(samples.begin(), samples.end());
  return samples[3];
}

}  // namespace

int main(int argc, char** argv) {
  init(argc, argv);
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  auto comm = make_mpi_communicator(dup);
  if (client_id() == 0)
    fmt::print("all_reduce f32 sum, np {}\n{:>8} {:>14} {:>14} {:>10}\n", num_clients(), "size", "raw MPI", "Tessera", "ratio");
  for (int64_t bytes : {int64_t(4) << 10, int64_t(1) << 20, int64_t(64) << 20}) {
    const int64_t n = bytes / 4;
    std::vector<float> a(static_cast<size_t>(n), 1.0f), b(static_cast<size_t>(n));
    const int iterations = bytes <= 8192 ? 2000 : bytes <= (2 << 20) ? 50 : 3;
    double raw = median_seconds([&] { MPI_Allreduce(a.data(), b.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, iterations);
    double ours = median_seconds([&] { comm->all_reduce(a.data(), b.data(), n, DType::f32, ReduceOp::Sum); }, iterations);
    if (client_id() == 0)
      fmt::print("{:>8} {:>11.1f} us {:>11.1f} us {:>9.3f}x\n",
                 bytes >= (1 << 20) ? fmt::format("{} MB", bytes >> 20) : fmt::format("{} KB", bytes >> 10), raw * 1e6, ours * 1e6,
                 raw / ours);
  }
  comm.reset();
  return 0;
}
