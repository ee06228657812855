// The CUDA device itself, on a GPU (run with TESSERA_DEVICE_TYPE=GPU; skipped where there is
// none): values stay in GPU memory between programs and are read back on demand, GEMMs by
// cuBLAS agree with the CPU's, fused kernels agree with the CPU's, and bad device names are typed
// errors. The differential suites (ops, redistribute, fuzz, training, ...) run again on GPU
// meshes through the same switch.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Array random_values(const std::vector<int64_t>& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Array a(shape, dtype);
  for (int64_t i = 0; i < a.numel(); ++i) store_from_double(a.mutable_bytes(), dtype, i, u(rng));
  return a;
}

// max |a - b| / max(1, max |b|)
double relative_difference(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.element_as_double(i), y = b.element_as_double(i);
    if (std::isnan(x) != std::isnan(y)) return INFINITY;
    if (!std::isnan(x)) diff = std::max(diff, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return diff / scale;
}

Mesh cpu_mesh(const std::vector<std::pair<std::string, int64_t>>& dims) {
  int64_t n = 1;
  for (const auto& d : dims) n *= d.second;
  return create_mesh(dims, cpu_devices(int(n)));
}

}  // namespace

TEST_CASE("gpu_devices(n) places n virtual devices on the GPUs present; meshes of them run programs") {
  const auto physical = gpu_devices();
  REQUIRE(!physical.empty());
  const auto four = gpu_devices(4);
  CHECK(four == std::vector<std::string>{"GPU:0", "GPU:1", "GPU:2", "GPU:3"});
  CHECK(gpu_devices().size() >= 4);
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}}, four);
  Array host = random_values({6, 5}, DType::f32, 1);
  Tensor t = distribute_tensor(host, mesh, {Shard(0), Shard(1)});
  Tensor doubled = t * 2.0f + 1.0f;
  // Computed on the GPUs and left there; read back on demand.
  const Array block = doubled.to_local();
  CHECK(block.memory_space() == MemorySpace::Cuda);
  CHECK(block.device() == "GPU:0");
  const Array full = doubled.full_tensor();
  for (int64_t i = 0; i < host.numel(); ++i) CHECK(full.data<float>()[i] == host.data<float>()[i] * 2.0f + 1.0f);
  // A GPU value feeds the next program without leaving the GPU.
  const Array again = (doubled - 1.0f).full_tensor();
  for (int64_t i = 0; i < host.numel(); ++i) CHECK(again.data<float>()[i] == full.data<float>()[i] - 1.0f);
}

TEST_CASE("GEMMs on GPU (cuBLAS) agree with the CPU's: f32 and f64, transposed operands, batches, sharded") {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tolerance = dtype == DType::f32 ? 1e-5 : 1e-12;
    Array a = random_values({3, 37, 29}, dtype, 2), b = random_values({3, 29, 41}, dtype, 3);
    Array c = random_values({41, 29}, dtype, 4);
    for (const auto& dims : std::vector<std::vector<std::pair<std::string, int64_t>>>{{{"x", 1}}, {{"x", 2}}, {{"x", 2}, {"y", 2}}}) {
      int64_t n = 1;
      for (const auto& d : dims) n *= d.second;
      Mesh gpu = create_mesh(dims, gpu_devices(int(n)));
      Mesh cpu = cpu_mesh(dims);
      auto product = [&](const Mesh& mesh) {
        // Rows of a sharded over the first mesh dim, the rest replicated.
        auto placements = [&](Placement first) {
          std::vector<Placement> out(size_t(mesh.ndim()), Replicate());
          out[0] = first;
          return out;
        };
        Tensor ta = distribute_tensor(a, mesh, placements(Shard(1)));
        Tensor tb = distribute_tensor(b, mesh, placements(Replicate()));
        Tensor tc = distribute_tensor(c, mesh, placements(Shard(0)));
        Tensor batched = matmul(ta, tb);                             // [3, 37, 41]
        Tensor transposed = matmul(ta, transpose(tc));               // b^T operand
        Tensor left_t = matmul(transpose(ta, {0, 2, 1}), ta);        // a^T a
        return std::vector<Array>{batched.full_tensor(), transposed.full_tensor(), left_t.full_tensor()};
      };
      const auto on_gpu = product(gpu), on_cpu = product(cpu);
      for (size_t i = 0; i < on_gpu.size(); ++i) {
        INFO(dtype_name(dtype), " mesh of ", n, " product ", i);
        CHECK(relative_difference(on_gpu[i], on_cpu[i]) < tolerance);
      }
    }
  }
}

TEST_CASE("a fused elementwise chain over 4M elements and reductions agree with the CPU's") {
  const int64_t n = 1 << 22;
  Array a = random_values({n}, DType::f32, 5), b = random_values({n}, DType::f32, 6), c = random_values({n}, DType::f32, 7),
        d = random_values({n}, DType::f32, 8);
  auto run = [&](const Mesh& mesh) {
    auto f = jit([](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) {
      Tensor y = relu(a * b + c) * 0.5f + d;
      return std::make_tuple(y, reduce_sum(y), reduce_max(exp(y), {0}));
    });
    auto [y, total, largest] = f(distribute_tensor(a, mesh, {Shard(0)}), distribute_tensor(b, mesh, {Shard(0)}),
                                 distribute_tensor(c, mesh, {Shard(0)}), distribute_tensor(d, mesh, {Shard(0)}));
    return std::vector<Array>{y.full_tensor(), total.full_tensor(), largest.full_tensor()};
  };
  const auto on_gpu = run(create_mesh({{"x", 2}}, gpu_devices(2)));
  const auto on_cpu = run(cpu_mesh({{"x", 2}}));
  CHECK(relative_difference(on_gpu[0], on_cpu[0]) < 1e-6);
  CHECK(relative_difference(on_gpu[1], on_cpu[1]) < 1e-4);  // 4M terms summed in another order
  CHECK(relative_difference(on_gpu[2], on_cpu[2]) < 1e-6);
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 GPU GEMMs sum in the CPU's fixed order: bitwise equal to the CPU's") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  Array a = random_values({2, 33, 70}, DType::f32, 9), b = random_values({2, 70, 19}, DType::f32, 10);
  auto product = [&](const Mesh& mesh) {
    return matmul(distribute_tensor(a, mesh, {Shard(1)}), distribute_tensor(b, mesh, {Replicate()})).full_tensor();
  };
  const Array on_gpu = product(create_mesh({{"x", 2}}, gpu_devices(2))), on_cpu = product(cpu_mesh({{"x", 2}}));
  unsetenv("TESSERA_DETERMINISTIC");
  CHECK(same_array(on_gpu, on_cpu));
}

TEST_CASE("GPU device names that do not exist are typed errors naming the device") {
  const int64_t count = int64_t(gpu_devices().size());
  CHECK_THROWS_AS(create_mesh({{"x", 1}}, {"GPU:" + std::to_string(count + 7)}), MeshError);
  CHECK_THROWS_WITH_AS(gpu_devices(-1), doctest::Contains("negative"), DeviceError);
}
