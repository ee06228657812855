// Collectives through Tessera's multi-client backends against the raw MPI call on the same
// buffers, in one run: the MPI backend (a thin layer over MPI) and the shared-memory backend
// (the default when every client runs on one node). all_to_all_v with uneven counts is
// mixture-of-experts dispatch.
// Run: mpirun --oversubscribe -np 2 build/bench/mpi_bench   (also -np 4)
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include <tessera/tessera.hpp>

#include "comm/mpi_communicator.hpp"
#include "comm/shared_memory_communicator.hpp"
#include "comm/spin_barrier.hpp"

using namespace tessera;

namespace {

// Median over 7 repetitions of the slowest rank's time per call.
double median_seconds(const std::function<void()>& fn, int iterations) {
  std::vector<double> samples;
  for (int rep = 0; rep < 7; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iterations; ++i) fn();
    double t = (MPI_Wtime() - start) / iterations;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    samples.push_back(t);
  }
  std::sort(samples.begin(), samples.end());
  return samples[3];
}

MPI_Comm duplicate_world() {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  return dup;
}

std::string size_text(int64_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{:.1f} MB", double(bytes) / (1 << 20)) : fmt::format("{} KB", bytes >> 10);
}

int iterations_for(int64_t bytes) { return bytes <= 8192 ? 2000 : bytes <= (2 << 20) ? 100 : 3; }

struct Backends {
  std::shared_ptr<Communicator> mpi, shared;
};

void row(const char* what, int64_t bytes, const std::function<void()>& raw, const std::function<void(Communicator&)>& call,
         const Backends& backends) {
  const int iterations = iterations_for(bytes);
  const double t_raw = median_seconds(raw, iterations);
  const double t_mpi = median_seconds([&] { call(*backends.mpi); }, iterations);
  const double t_shared = backends.shared ? median_seconds([&] { call(*backends.shared); }, iterations) : 0.0;
  if (client_id() != 0) return;
  fmt::print("{:<11} {:>8} {:>10.1f} us {:>10.1f} us {:>7.3f}x", what, size_text(bytes), t_raw * 1e6, t_mpi * 1e6, t_raw / t_mpi);
  if (backends.shared)
    fmt::print(" {:>10.1f} us {:>7.3f}x\n", t_shared * 1e6, t_raw / t_shared);
  else
    fmt::print("   (no shared segment)\n");
}

}  // namespace

int main(int argc, char** argv) {
  init(argc, argv);
  const int n = num_clients();
  Backends backends;
  backends.mpi = make_mpi_communicator(duplicate_world());
  MPI_Comm for_shared = duplicate_world();
  backends.shared = make_shared_memory_communicator(for_shared, spin_iterations_for(clients_on_this_node()));
  if (!backends.shared) MPI_Comm_free(&for_shared);
  if (client_id() == 0)
    fmt::print("np {}; ratio = raw MPI time / Tessera time (higher is faster)\n{:<11} {:>8} {:>13} {:>13} {:>8} {:>13} {:>8}\n", n,
               "collective", "size", "raw MPI", "MPI backend", "ratio", "shared mem", "ratio");
  // all_reduce: f32 sums, the sizes of issue 5 plus the training step's 256 KB.
  for (int64_t bytes : {int64_t(4) << 10, int64_t(256) << 10, int64_t(1) << 20, int64_t(64) << 20}) {
    const int64_t count = bytes / 4;
    std::vector<float> a(static_cast<size_t>(count), 1.0f), b(static_cast<size_t>(count));
    row("all_reduce", bytes, [&] { MPI_Allreduce(a.data(), b.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        [&](Communicator& c) { c.all_reduce(a.data(), b.data(), count, DType::f32, ReduceOp::Sum); }, backends);
  }
  // all_gather: each rank's block of the step's weights (W1: 1.1 MB, W2: 0.7 MB at np 2).
  for (int64_t bytes : {int64_t(179200), int64_t(700000), int64_t(1097600)}) {
    const int64_t count = bytes / 4 / n;
    std::vector<float> mine(static_cast<size_t>(count), 1.0f), all(static_cast<size_t>(count * n));
    row("all_gather", bytes, [&] { MPI_Allgather(mine.data(), int(count), MPI_FLOAT, all.data(), int(count), MPI_FLOAT, MPI_COMM_WORLD); },
        [&](Communicator& c) { c.all_gather(mine.data(), all.data(), count, DType::f32); }, backends);
  }
  // all_to_all: the step's input and hidden-activation exchanges (about 100 KB per rank).
  for (int64_t bytes : {int64_t(100352), int64_t(1) << 20}) {
    const int64_t count = bytes / 4 / n;
    std::vector<float> send(static_cast<size_t>(count * n), 1.0f), recv(static_cast<size_t>(count * n));
    row("all_to_all", bytes, [&] { MPI_Alltoall(send.data(), int(count), MPI_FLOAT, recv.data(), int(count), MPI_FLOAT, MPI_COMM_WORLD); },
        [&](Communicator& c) { c.all_to_all(send.data(), recv.data(), count, DType::f32); }, backends);
  }
  // all_to_all_v: mixture-of-experts dispatch, rows x 1024 f32 per rank sent to the ranks in
  // uneven shares (weights 1 + (rank + 2 * dest) % 3), as a router's counts come.
  for (int64_t rows : {int64_t(512), int64_t(4096)}) {
    constexpr int64_t features = 1024;
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(n)));  // rows, [from][to]
    for (int i = 0; i < n; ++i) {
      int64_t weights = 0, given = 0;
      for (int j = 0; j < n; ++j) weights += 1 + (i + 2 * j) % 3;
      for (int j = 0; j < n; ++j) {
        counts[size_t(i)][size_t(j)] = j == n - 1 ? rows - given : rows * (1 + (i + 2 * j) % 3) / weights;
        given += counts[size_t(i)][size_t(j)];
      }
    }
    const int me = client_id();
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<int> sc, rc, sd, rd;
    int64_t received = 0;
    for (int j = 0; j < n; ++j) {
      send_counts.push_back(counts[size_t(me)][size_t(j)] * features);
      recv_counts.push_back(counts[size_t(j)][size_t(me)] * features);
      sd.push_back(j == 0 ? 0 : sd.back() + sc.back());
      rd.push_back(j == 0 ? 0 : rd.back() + rc.back());
      sc.push_back(int(send_counts.back()));
      rc.push_back(int(recv_counts.back()));
      received += recv_counts.back();
    }
    std::vector<float> send(static_cast<size_t>(rows * features), 1.0f), recv(static_cast<size_t>(std::max<int64_t>(received, 1)));
    auto raw = [&] {
      MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, recv.data(), rc.data(), rd.data(), MPI_FLOAT, MPI_COMM_WORLD);
    };
    row("all_to_all_v", rows * features * 4, raw,
        [&](Communicator& c) { c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::f32); }, backends);
    // The same rows where the runtime puts an all_to_all_v's input: this rank's block of a
    // group buffer, which the shared-memory backend reads without staging (one copy, no system
    // call). Raw MPI keeps its own buffers.
    if (backends.shared) {
      const int64_t block = rows * features * 4;
      std::shared_ptr<std::byte[]> group = backends.shared->allocate_group_buffer(block * n);
      if (group) {
        float* mine = reinterpret_cast<float*>(group.get() + block * me);
        std::fill(mine, mine + rows * features, 1.0f);
        const int iterations = iterations_for(block);
        const int64_t staged = all_to_all_v_bytes_staged();
        const double t_raw = median_seconds(raw, iterations);
        const double t_group = median_seconds(
            [&] { backends.shared->all_to_all_v(mine, send_counts, recv.data(), recv_counts, DType::f32); }, iterations);
        if (me == 0)
          fmt::print("{:<11} {:>8} {:>10.1f} us {:>13} {:>8} {:>10.1f} us {:>7.3f}x  (rows in a group buffer{})\n", "all_to_all_v",
                     size_text(block), t_raw * 1e6, "", "", t_group * 1e6, t_raw / t_group,
                     all_to_all_v_bytes_staged() == staged ? "" : "; STAGED");
      }
    }
    // The op itself: a jit'd local_map over a mesh of one device per client (the shared-memory
    // backend), counts exchanged and checked on the devices, the received block zero-filled to
    // its bound (rows x clients).
    Mesh mesh = create_distributed_mesh({{"ep", n}});
    std::vector<int64_t> flat;
    for (const auto& r : counts) flat.insert(flat.end(), r.begin(), r.end());
    Tensor x = distribute_tensor(Array({n * rows, features}, DType::f32), mesh, {Shard{0}});
    Tensor c = distribute_tensor(Array::from<int64_t>(flat, {int64_t(n) * n}), mesh, {Shard{0}});
    auto dispatch = jit([&](const Tensor& a, const Tensor& cc) {
      return std::get<0>(local_map([](const Tensor& r, const Tensor& k) { return all_to_all_v(r, k, "ep"); },
                                   {{Shard{0}}, {Shard{0}}}, {{Shard{0}}, {Shard{0}}}, mesh)(a, cc));
    });
    dispatch(x, c);  // compiled once, outside the timing
    const int iterations = iterations_for(rows * features * 4);
    const int64_t staged = all_to_all_v_bytes_staged();
    const double t_raw = median_seconds(raw, iterations), t_op = median_seconds([&] { dispatch(x, c); }, iterations);
    if (client_id() == 0)
      fmt::print("{:<11} {:>8} {:>10.1f} us {:>13} {:>8} {:>10.1f} us {:>7.3f}x  (the jit'd op{})\n", "all_to_all_v",
                 size_text(rows * features * 4), t_raw * 1e6, "", "", t_op * 1e6, t_raw / t_op,
                 all_to_all_v_bytes_staged() == staged ? "" : "; STAGED");
  }
  backends = {};
  return 0;
}
