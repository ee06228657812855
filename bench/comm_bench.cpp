// In-process collectives vs memcpy, in one run (issue: foundation benchmark).
// Each device runs the collective in a loop on its own worker thread (the path relayout uses);
// the time per collective is the median over repetitions of rank 0's loop time / iterations.
// Usage: comm_bench [--quick]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"
#include "jit/mesh_communicators.hpp"

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int iterations_for(int64_t bytes) { return bytes <= 8192 ? 2000 : bytes <= (2 << 20) ? 100 : 5; }

double time_memcpy(int64_t bytes, int repetitions) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  int iters = iterations_for(bytes);
  std::vector<double> samples;
  for (int rep = 0; rep < repetitions; ++rep) {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" ::"r"(b.data()) : "memory");
    }
    samples.push_back(std::chrono::duration<double>(Clock::now() - start).count() / iters);
  }
  return median(samples);
}

// kind: "all_reduce" or "all_gather"; bytes = the all_reduce buffer / the gathered output.
double time_collective(const std::string& kind, int devices, int64_t bytes, int repetitions) {
  Mesh mesh = create_mesh({{"x", devices}});
  auto comms = mesh_dim_communicators(mesh, 0);
  const int64_t count = bytes / 4;
  const int64_t per_rank = count / devices;
  std::vector<std::vector<float>> send(devices), recv(devices);
  std::vector<int64_t> workers = mesh_worker_indices(mesh);
  // First touch on the owning worker thread.
  run_on_devices(workers, [&](int64_t i) {
    send[i].assign(kind == "all_reduce" ? count : per_rank, 1.0f);
    recv[i].assign(kind == "all_reduce" ? count : per_rank * devices, 0.0f);
  });
  const int iters = iterations_for(bytes);
  std::vector<double> samples;
  for (int rep = 0; rep < repetitions; ++rep) {
    double seconds = 0;
    run_on_devices(workers, [&](int64_t i) {
      Communicator& c = *comms[i];
      c.barrier();
      auto start = Clock::now();
      for (int it = 0; it < iters; ++it) {
        if (kind == "all_reduce") c.all_reduce(send[i].data(), recv[i].data(), count, DType::f32, ReduceOp::Sum);
        else c.all_gather(send[i].data(), recv[i].data(), per_rank, DType::f32);
      }
      if (i == 0) seconds = std::chrono::duration<double>(Clock::now() - start).count() / iters;
    });
    samples.push_back(seconds);
  }
  return median(samples);
}

std::string human(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.1f} us", seconds * 1e6);
  return fmt::format("{:.2f} ms", seconds * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int repetitions = quick ? 3 : 7;
  fmt::print("{:<11} {:>7} {:>8} {:>12} {:>12} {:>9} {:>9}\n", "collective", "devices", "size", "time", "memcpy",
             "x memcpy", "GB/s");
  for (int64_t bytes : {int64_t(4) << 10, int64_t(1) << 20, int64_t(64) << 20}) {
    const double copy = time_memcpy(bytes, repetitions);
    for (const std::string kind : {"all_reduce", "all_gather"})
      for (int devices : {2, 4}) {
        double t = time_collective(kind, devices, bytes, repetitions);
        std::string size = bytes >= (1 << 20) ? fmt::format("{} MB", bytes >> 20) : fmt::format("{} KB", bytes >> 10);
        fmt::print("{:<11} {:>7} {:>8} {:>12} {:>12} {:>9.2f} {:>9.1f}\n", kind, devices, size, human(t), human(copy),
                   t / copy, double(bytes) / t / 1e9);
      }
  }
  return 0;
}
