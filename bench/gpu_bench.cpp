// Tessera on a GPU against the hardware and cuBLAS, in one process: a device-to-device copy's
// bandwidth (the elementwise ceiling), the fused relu(a*b+c)*0.5+d over 64M f32, sgemm 4096^3
// through a jit matmul and through cuBLAS directly, the host time of one call of a 20-op
// function, the MNIST MLP training step (Adam) at batch 128 and 4096, and the cold and warm
// (disk cache) compile of that step. bench/gpu_peers.py times PyTorch on the same cases.
// Usage: gpu_bench   (the warm-start probe re-runs this binary with --compile-probe DIR)
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"
#include "mnist_mlp.hpp"
#include "backend/cuda/cublas_library.hpp"
#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/cuda_graph_runs.hpp"
#include "backend/cuda/virtual_gpu.hpp"
#include "jit/backend_registry.hpp"

using namespace tessera;
using tessera::bench::median_seconds;
using Clock = std::chrono::steady_clock;

namespace {

// Seconds per call of fn, timed with events on the device's stream (fn queues work only).
double event_seconds(VirtualGpu& gpu, const std::function<void()>& fn, int iterations = 20) {
  const CudaDriver& cu = cuda_driver();
  gpu.make_current();
  CUevent start, stop;
  cu.check(cu.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  cu.check(cu.cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  fn();
  gpu.synchronize();
  cu.check(cu.cuEventRecord(start, gpu.stream()), "cuEventRecord");
  for (int i = 0; i < iterations; ++i) fn();
  cu.check(cu.cuEventRecord(stop, gpu.stream()), "cuEventRecord");
  cu.check(cu.cuEventSynchronize(stop), "cuEventSynchronize");
  float ms = 0;
  cu.check(cu.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
  return ms / 1e3 / iterations;
}

using Model = tessera::bench::MnistMlp;

// A batch made on the GPU (random numbers are kernels), so steps read device memory only.
std::pair<Tensor, Tensor> gpu_batch(const Mesh& mesh, int64_t rows) {
  auto make = jit([&] {
    return std::make_tuple(random_uniform({rows, 784}, 7, Layout::replicated(mesh, 2)),
                           cast(random_uniform({rows}, 8, Layout::replicated(mesh, 1), 0, 9.99), DType::i32));
  });
  auto [x, y] = make();
  return {x, y};
}

double training_step_seconds(const Mesh& mesh, int64_t batch) {
  Model model(mesh);
  auto step = model.step();
  auto [x, y] = gpu_batch(mesh, batch);
  return median_seconds([&] { step(x, y); }, 9, 20);
}

int compile_probe(const std::string& dir) {
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  Mesh mesh = create_mesh({{"batch", 1}}, gpu_devices(1));
  Model model(mesh);
  auto step = model.step();
  auto [x, y] = gpu_batch(mesh, 128);
  auto start = Clock::now();
  step.executable(x, y);  // trace + partition + NVRTC compile (or disk cache) + module load
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("%.2f 0 0\n", ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--compile-probe") return compile_probe(argv[2]);
  if (gpu_devices().empty()) {
    fmt::print("gpu_bench: no GPU in this process ({})\n", CudaDriver::why_unavailable());
    return 0;
  }
  Mesh mesh = create_mesh({{"x", 1}}, gpu_devices(1));
  VirtualGpu& gpu = VirtualGpu::get(0);
  fmt::print("GPU: {} (sm_{}, {} multiprocessors)\n", gpu.gpu().name(), gpu.gpu().compute_capability(), gpu.gpu().multiprocessors());

  // 1. The ceiling: a device-to-device copy, bytes read plus written.
  const int64_t n = int64_t(1) << 26;  // 64M f32
  CudaDevice device("GPU:0", 0, target_for(DeviceKind::GPU, false));
  auto src = device.allocate(n * 4), dst = device.allocate(n * 4);
  const CudaDriver& cu = cuda_driver();
  const double copy_s = event_seconds(gpu, [&] {
    cu.check(cu.cuMemcpyDtoDAsync(CUdeviceptr(uintptr_t(dst.get())), CUdeviceptr(uintptr_t(src.get())), size_t(n * 4), gpu.stream()),
             "cuMemcpyDtoDAsync");
  });
  const double copy_gbs = 2.0 * n * 4 / copy_s / 1e9;
  fmt::print("{:<52} {:9.3f} ms  {:7.0f} GB/s\n", "device-to-device copy, 256 MiB", copy_s * 1e3, copy_gbs);

  // 2. relu(a*b+c)*0.5+d: one fused kernel, 4 reads and 1 write per element.
  {
    auto make = jit([&] {
      Layout l = Layout::replicated(mesh, 1);
      return std::make_tuple(random_uniform({n}, 1, l), random_uniform({n}, 2, l), random_uniform({n}, 3, l), random_uniform({n}, 4, l));
    });
    auto [a, b, c, d] = make();
    auto fused = jit([](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) { return relu(a * b + c) * 0.5f + d; });
    const double s = median_seconds([&] { fused(a, b, c, d); }, 9, 10);
    const double gbs = 5.0 * n * 4 / s / 1e9;
    fmt::print("{:<52} {:9.3f} ms  {:7.0f} GB/s  = {:.2f}x the copy's bandwidth\n", "fused relu(a*b+c)*0.5+d, 64M f32 (jit call)", s * 1e3,
               gbs, gbs / copy_gbs);
  }

  // 3. sgemm 4096^3: a jit matmul against cuBLAS on the same buffers' sizes.
  {
    const int64_t m = 4096;
    auto make = jit([&] {
      Layout l = Layout::replicated(mesh, 2);
      return std::make_tuple(random_uniform({m, m}, 5, l, -1, 1), random_uniform({m, m}, 6, l, -1, 1));
    });
    auto [a, b] = make();
    auto product = jit([](const Tensor& a, const Tensor& b) { return matmul(a, b); });
    const double s = median_seconds([&] { product(a, b); }, 9, 5);
    const CublasLibrary& blas = cublas();
    auto ca = device.allocate(m * m * 4), cb = device.allocate(m * m * 4), cc = device.allocate(m * m * 4);
    const float one = 1, zero = 0;
    const double direct = event_seconds(gpu, [&] {
      blas.check(blas.gemm_strided_batched(gpu.cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, int(m), int(m), int(m), &one, cb.get(),
                                           CUDA_R_32F, int(m), m * m, ca.get(), CUDA_R_32F, int(m), m * m, &zero, cc.get(),
                                           CUDA_R_32F, int(m), m * m, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "gemm");
    }, 10);
    const double flops = 2.0 * m * m * m;
    fmt::print("{:<52} {:9.3f} ms  {:7.1f} TFLOP/s\n", "sgemm 4096^3, cuBLAS called directly", direct * 1e3, flops / direct / 1e12);
    fmt::print("{:<52} {:9.3f} ms  {:7.1f} TFLOP/s  = {:.3f}x cuBLAS\n", "sgemm 4096^3, jit matmul", s * 1e3, flops / s / 1e12,
               direct / s);
  }

  // 4. Host time of one call of a 20-op function on small tensors (launches and bookkeeping).
  {
    auto make = jit([&] { return random_uniform({4, 8}, 9, Layout::replicated(mesh, 2)); });
    Tensor x = make();
    auto twenty = jit([](const Tensor& x) {
      Tensor y = x;
      for (int i = 0; i < 5; ++i) y = reduce_sum(exp(y * 0.5f) + y, {1}, true) * y - 1.0f;  // 4 ops a round, 2 kernels
      return y;
    });
    const CudaGraphCounts before = cuda_graph_counts();
    const double s = median_seconds([&] { twenty(x); }, 9, 200);
    const CudaGraphCounts after = cuda_graph_counts();
    fmt::print("{:<52} {:9.1f} us per call  ({} of the runs replayed as CUDA graphs{})\n", "20-op function, one call (host + GPU)",
               s * 1e6, after.replayed - before.replayed, CudaGraphRuns::enabled() ? "" : "; TESSERA_CUDA_GRAPHS=0");
  }

  // 5. The MNIST MLP training step.
  for (int64_t batch : {128, 4096}) {
    const double s = training_step_seconds(mesh, batch);
    fmt::print("{:<52} {:9.3f} ms\n", fmt::format("MNIST MLP step (Adam), batch {}", batch), s * 1e3);
  }
  for (int64_t batch : {128, 4096}) {
    Mesh two = create_mesh({{"batch", 2}}, gpu_devices(2));
    Model model(two);
    auto step = model.step();
    auto make = jit([&] {
      return std::make_tuple(random_uniform({batch, 784}, 7, Layout::batch_sharded(two, "batch", 2)),
                             cast(random_uniform({batch}, 8, Layout::batch_sharded(two, "batch", 1), 0, 9.99), DType::i32));
    });
    auto [x, y] = make();
    const double s = median_seconds([&] { step(x, y); }, 9, 20);
    fmt::print("{:<52} {:9.3f} ms\n", fmt::format("MNIST MLP step, batch {} over 2 virtual GPUs (dp)", batch), s * 1e3);
  }

  // 6. Compile of the training step in fresh processes: cold, then from the disk cache.
  if (auto runs = tessera::bench::cold_and_warm(argv[0], "--compile-probe")) {
    fmt::print("{:<52} {:9.1f} ms\n", "training step compile, cold (NVRTC)", runs->first.ms);
    fmt::print("{:<52} {:9.1f} ms\n", "training step compile, warm (disk cache)", runs->second.ms);
  }
  return 0;
}
