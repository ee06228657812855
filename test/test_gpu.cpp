// The CUDA device itself, on a GPU (run with TESSERA_DEVICE_TYPE=GPU; skipped where there is
// none): values stay in GPU memory between programs and are read back on demand, GEMMs by
// cuBLAS agree with the CPU's, fused kernels agree with the CPU's, the GPU groups' collectives
// (virtual GPUs of one process, and NCCL's in a group of one client) give the CPU group's bits,
// and bad device names are typed errors. The differential suites (ops, redistribute, fuzz, training, ...) run again on GPU
// meshes through the same switch.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include <tessera/tessera.hpp>

#include "comm/in_process_communicator.hpp"
#include "jit/backend_registry.hpp"
#include "jit/mesh_communicators.hpp"
#include "plan_checks.hpp"
#include "reference_sharding.hpp"
#include "backend/cuda/cuda_graph_runs.hpp"
#include "backend/cuda/cuda_group_communicator.hpp"
#include "backend/cuda/nccl_communicator.hpp"
#include "backend/cuda/nccl_library.hpp"

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

TEST_CASE("GEMMs on GPU (cuBLAS) agree with the CPU's: f32, f64 and bf16, transposed operands, batches, sharded") {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    // bf16: both sides sum in f32 and round once; their orders differ, so an output may land one
    // bf16 step (2^-8 relative) apart.
    const double tolerance = dtype == DType::f32 ? 1e-5 : dtype == DType::f64 ? 1e-12 : 1e-2;
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

TEST_CASE("fused attention on GPU (backend/cuda/flash_attention.cu, bf16 on tensor cores) agrees with the CPU's: values and gradients, sharded queries") {
  // Heads of 40, 64 and 128 columns, a sequence split over 1 and 2 devices (the causal mask's
  // query offset), bf16 widened to f32 as on the CPU (on tensor cores from compute capability 8.0:
  // flash_attention_mma.cu), f64's own kernel.
  for (DType dtype : {DType::f32, DType::bf16, DType::f64})
    for (int64_t head : {40, 64, 128})
      for (bool causal : {true, false})
        for (int64_t n : {1, 2}) {
          INFO(dtype_name(dtype), " head ", head, " causal ", causal, " devices ", n);
          const double tolerance = dtype == DType::f64 ? 1e-11 : dtype == DType::bf16 ? 2e-2 : 1e-4;
          const Array q = random_values({2, 3, 300, head}, dtype, 11), k = random_values({2, 3, 300, head}, dtype, 12),
                      v = random_values({2, 3, 300, head}, dtype, 13), w = random_values({2, 3, 300, head}, DType::f32, 14);
          auto run = [&](const Mesh& mesh) {
            std::vector<Tensor> t;
            for (const Array* a : {&q, &k, &v, &w}) t.push_back(distribute_tensor(*a, mesh, {Shard(2)}));
            auto step = jit([causal](const Tensor& tq, const Tensor& tk, const Tensor& tv, const Tensor& tw) {
              const Tensor out = scaled_dot_product_attention(tq, tk, tv, causal);
              std::vector<Tensor> results = gradients(reduce_sum(cast(out, DType::f32) * tw), {tq, tk, tv});
              results.insert(results.begin(), out);
              return results;
            });
            std::vector<Array> out;
            for (const Tensor& r : step(t[0], t[1], t[2], t[3])) out.push_back(r.full_tensor());
            // The fused kernel runs there: the program holds attention steps, no [T, T] scores.
            CHECK(step.explain(t[0], t[1], t[2], t[3]).find("attention") != std::string::npos);
            return out;
          };
          const auto on_gpu = run(create_mesh({{"x", n}}, gpu_devices(int(n)))), on_cpu = run(cpu_mesh({{"x", n}}));
          for (size_t i = 0; i < on_gpu.size(); ++i) {
            INFO("output ", i, " (0: attention, then dq, dk, dv)");
            CHECK(relative_difference(on_gpu[i], on_cpu[i]) < tolerance);
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

namespace {

// Every rank's buffers of one collective call: inputs (the same values on CPU and GPU) and outputs.
struct RankBuffers {
  std::vector<Array> host;    // CPU group: host arrays
  std::vector<Array> device;  // GPU group: device arrays, filled from `host`
};

// Runs `call(rank, communicator, buffers)` on every rank's thread, for the CPU in-process group
// and the GPU group of `n` virtual GPUs (`gpu_group`, or the in-process one), and returns each
// rank's buffers as they end (GPU ones copied back).
using CollectiveCall = std::function<void(int rank, Communicator& comm, std::vector<void*>& buffers)>;
std::pair<std::vector<std::vector<Array>>, std::vector<std::vector<Array>>> run_both(
    int n, const std::vector<std::vector<Array>>& inputs, const CollectiveCall& call,
    std::vector<std::shared_ptr<Communicator>> gpu_group = {}) {
  std::vector<std::string> names = gpu_devices(n);
  std::vector<int64_t> indices;
  for (int r = 0; r < n; ++r) indices.push_back(r);
  auto cpu_group = create_in_process_group(n);
  if (gpu_group.empty()) gpu_group = create_cuda_group(indices);  // else GPU:r's communicators, given
  REQUIRE(int(gpu_group.size()) == n);
  CHECK(gpu_group[0]->memory_space() == MemorySpace::Cuda);
  std::vector<std::vector<Array>> cpu(static_cast<size_t>(n)), gpu(static_cast<size_t>(n));
  std::vector<std::unique_ptr<Device>> devices;
  for (int r = 0; r < n; ++r) devices.push_back(make_device(names[size_t(r)], DevicePlacement{r, n}, target_for(DeviceKind::GPU, false)));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::vector<void*> host_ptrs, device_ptrs;
      for (const Array& a : inputs[size_t(r)]) {
        cpu[size_t(r)].push_back(a.clone());
        host_ptrs.push_back(cpu[size_t(r)].back().mutable_bytes());
        Array d = devices[size_t(r)]->new_array(a.shape(), a.dtype());
        devices[size_t(r)]->copy_from_host(a.bytes(), d.device_bytes(), a.nbytes());
        gpu[size_t(r)].push_back(d);
        device_ptrs.push_back(d.device_bytes());
      }
      call(r, *cpu_group[size_t(r)], host_ptrs);
      call(r, *gpu_group[size_t(r)], device_ptrs);
      devices[size_t(r)]->synchronize();
    });
  for (auto& t : threads) t.join();
  return {cpu, gpu};
}

// Inputs per rank: random values of `dtype` (a NaN in rank 1's f32 and f64, for max/min's rule).
std::vector<std::vector<Array>> collective_inputs(int n, const std::vector<int64_t>& sizes, DType dtype, uint32_t seed) {
  std::vector<std::vector<Array>> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (size_t b = 0; b < sizes.size(); ++b) {
      Array a = random_values({sizes[b]}, dtype, seed + uint32_t(r * 17 + b));
      if (!is_floating(dtype) && dtype != DType::u8)
        for (int64_t i = 0; i < a.numel(); ++i) store_from_double(a.mutable_bytes(), dtype, i, double(int64_t(i * 7 + r) % 11) - 5);
      if (dtype == DType::u8)
        for (int64_t i = 0; i < a.numel(); ++i) store_from_double(a.mutable_bytes(), dtype, i, double((i + r) % 3 == 0));
      if (r == 1 && a.numel() > 3 && (dtype == DType::f32 || dtype == DType::f64))
        store_from_double(a.mutable_bytes(), dtype, 3, std::numeric_limits<double>::quiet_NaN());
      out[size_t(r)].push_back(a);
    }
  return out;
}

// Bitwise equal, except that a NaN computed by arithmetic (a sum with a NaN) may differ in its
// payload: GPUs return the canonical NaN, x86 the operand's.
bool same_bits_but_nan_payloads(const Array& a, const Array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const int64_t size = dtype_size(a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (is_floating(a.dtype()) && std::isnan(a.element_as_double(i)) && std::isnan(b.element_as_double(i))) continue;
    if (std::memcmp(a.bytes() + i * size, b.bytes() + i * size, size_t(size)) != 0) return false;
  }
  return true;
}

void check_same(const std::vector<std::vector<Array>>& cpu, const std::vector<std::vector<Array>>& gpu) {
  for (size_t r = 0; r < cpu.size(); ++r)
    for (size_t b = 0; b < cpu[r].size(); ++b) {
      INFO("rank ", r, " buffer ", b);
      CHECK(gpu[r][b].memory_space() == MemorySpace::Cuda);
      CHECK(same_bits_but_nan_payloads(gpu[r][b], cpu[r][b]));
    }
}

}  // namespace

namespace {

// Every collective of every dtype and op on a GPU group of `n` (`gpu_group()`: GPU:r's
// communicators, or empty for the in-process group of virtual GPUs), against the CPU group's bits.
using GroupFactory = std::function<std::vector<std::shared_ptr<Communicator>>()>;
void check_every_collective(int n, const GroupFactory& gpu_group) {
  const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16};
  const std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min};
  for (DType dtype : dtypes) {
    CAPTURE(dtype_name(dtype));
    for (ReduceOp op : ops) {
      CAPTURE(reduce_op_name(op));
      // all_reduce out of place (buffer 0 -> 1) and in place (buffer 2), 1001 elements: uneven slices.
      auto [cpu, gpu] = run_both(n, collective_inputs(n, {1001, 1001, 1001}, dtype, 3), [&](int, Communicator& c, auto& b) {
        c.all_reduce(b[0], b[1], 1001, dtype, op);
        c.all_reduce(b[2], b[2], 1001, dtype, op);
      }, gpu_group());
      check_same(cpu, gpu);
      // reduce_scatter_v with uneven blocks, one of them empty.
      std::vector<int64_t> counts;
      for (int r = 0; r < n; ++r) counts.push_back(r == 1 ? 0 : 37 + r);
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      auto [cpu2, gpu2] = run_both(n, collective_inputs(n, {total, 64}, dtype, 9), [&](int, Communicator& c, auto& b) {
        c.reduce_scatter_v(b[0], b[1], counts, dtype, op);
      }, gpu_group());
      check_same(cpu2, gpu2);
      // reduce_scatter_v with even blocks (NCCL's own reduce-scatter).
      const std::vector<int64_t> even(static_cast<size_t>(n), 40);
      auto [cpu3, gpu3] = run_both(n, collective_inputs(n, {40 * int64_t(n), 40}, dtype, 21), [&](int, Communicator& c, auto& b) {
        c.reduce_scatter_v(b[0], b[1], even, dtype, op);
      }, gpu_group());
      check_same(cpu3, gpu3);
    }
  }
  // Data movement of every dtype: all_gather_v (uneven, an empty block), all_to_all_v (uneven,
  // an empty block), broadcast, barrier, all_to_all_regions.
  std::vector<int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(r == 1 ? 0 : 5 + 3 * r);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  auto a2a = [](int src, int dst) -> int64_t { return src == 1 && dst == 0 ? 0 : 1 + (src + 2 * dst) % 4; };
  // Regions: a [2n + 1, 3n - 1] array from rows split n ways to columns split n ways (uneven).
  const int64_t rows = 2 * n + 1, cols = 3 * n - 1;
  auto row_block = [&](int r) { return ShardBox{{chunk_range(rows, n, r).length, cols}, {chunk_range(rows, n, r).start, 0}}; };
  auto col_block = [&](int r) { return ShardBox{{rows, chunk_range(cols, n, r).length}, {0, chunk_range(cols, n, r).start}}; };
  for (DType dtype : dtypes) {
    CAPTURE(dtype_name(dtype));
    std::vector<std::vector<Array>> inputs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      int64_t sends = 0, receives = 0;
      for (int p = 0; p < n; ++p) {
        sends += a2a(r, p);
        receives += a2a(p, r);
      }
      inputs[size_t(r)] = {random_values({counts[size_t(r)]}, dtype, 40 + uint32_t(r)), random_values({total}, dtype, 50),
                           random_values({sends}, dtype, 60 + uint32_t(r)), random_values({receives}, dtype, 70),
                           random_values({33}, dtype, 80 + uint32_t(r)),
                           random_values(row_block(r).local_shape, dtype, 90 + uint32_t(r)),
                           random_values(col_block(r).local_shape, dtype, 99)};
    }
    auto [cpu, gpu] = run_both(n, inputs, [&](int rank, Communicator& c, auto& b) {
      c.all_gather_v(b[0], counts[size_t(rank)], b[1], counts, dtype);
      std::vector<int64_t> send_counts, recv_counts;
      for (int p = 0; p < n; ++p) {
        send_counts.push_back(a2a(rank, p));
        recv_counts.push_back(a2a(p, rank));
      }
      c.all_to_all_v(b[2], send_counts, b[3], recv_counts, dtype);
      c.barrier();
      c.broadcast(b[4], 33, dtype, n - 1);
      std::vector<ShardBox> send, recv;
      for (int r = 0; r < n; ++r) {
        send.push_back(intersect(row_block(rank), col_block(r)));
        recv.push_back(intersect(row_block(r), col_block(rank)));
      }
      c.all_to_all_regions(b[5], row_block(rank), send, b[6], col_block(rank), recv, dtype);
    }, gpu_group());
    check_same(cpu, gpu);
  }
}

}  // namespace

TEST_CASE("GPU group collectives of every dtype and op on 1 to 5 virtual GPUs give the CPU group's bits") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    check_every_collective(n, [] { return std::vector<std::shared_ptr<Communicator>>(); });
  }
}

TEST_CASE("collectives inside GPU programs run on the device and give the CPU's bits under TESSERA_DETERMINISTIC=1") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  // Sharded GEMMs and reductions: all_reduce (a Partial sum, a bucket of small ones), all_gather
  // and reduce_scatter over uneven shards (13 rows over 2 and 4 devices), on 1-D and 2-D meshes.
  Array a = random_values({13, 24}, DType::f32, 11), w = random_values({24, 10}, DType::f32, 12);
  auto run = [&](const Mesh& mesh) {
    auto f = jit([](const Tensor& a, const Tensor& w) {
      Tensor h = matmul(a, w);                               // rows sharded
      Tensor col = reduce_sum(h, {0});                       // Partial -> all_reduce
      Tensor g = matmul(transpose(a), h);                    // Partial over the rows
      Tensor gathered = h.redistribute(std::vector<Placement>(size_t(h.device_mesh().ndim()), Replicate()));
      return std::make_tuple(col, g, gathered, reduce_mean(h * h));
    });
    std::vector<Placement> rows(size_t(mesh.ndim()), Replicate());
    rows[0] = Shard(0);
    auto [col, g, gathered, mean] = f(distribute_tensor(a, mesh, rows), distribute_tensor(w, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate())));
    // The Partial gradient scattered back over the rows' dim (reduce_scatter).
    std::vector<Placement> scattered(size_t(mesh.ndim()), Replicate());
    scattered[0] = Shard(0);
    Tensor rs = g.redistribute(scattered);
    return std::vector<Array>{col.full_tensor(), g.full_tensor(), gathered.full_tensor(), mean.full_tensor(), rs.full_tensor()};
  };
  for (const auto& dims : std::vector<std::vector<std::pair<std::string, int64_t>>>{{{"x", 2}}, {{"x", 4}}, {{"x", 2}, {"y", 2}}}) {
    int64_t n = 1;
    for (const auto& d : dims) n *= d.second;
    const Mesh gpu = create_mesh(dims, gpu_devices(int(n)));
    CHECK(!mesh_dim_device_communicators(gpu, 0).empty());
    CHECK(mesh_dim_device_communicators(cpu_mesh(dims), 0).empty());
    const auto on_gpu = run(gpu), on_cpu = run(cpu_mesh(dims));
    for (size_t i = 0; i < on_gpu.size(); ++i) {
      INFO("mesh of ", n, " output ", i);
      CHECK(same_array(on_gpu[i], on_cpu[i]));
    }
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("block reductions (the loss, whole sums, bias gradients) and check_index agree with the CPU's; deterministic: bitwise") {
  // MNIST-shaped: logits [4096, 10] and labels, the loss a scalar over the batch (a block; in
  // deterministic mode a warp folding in lane order), bias gradients (column sums of 700 columns),
  // a whole sum; on 1 and 2 virtual GPUs (rows sharded) against the CPU's meshes.
  Array logits = random_values({4096, 10}, DType::f32, 31), h = random_values({4096, 700}, DType::f32, 32);
  Array labels({4096}, DType::i64);
  for (int64_t i = 0; i < 4096; ++i) labels.mutable_data<int64_t>()[i] = (i * 7) % 10;
  auto run = [&](const Mesh& mesh, const Array& ids) {
    auto f = jit([](const Tensor& y, const Tensor& x, const Tensor& h) {
      return std::make_tuple(reduce_mean(sparse_softmax_cross_entropy_with_logits(y, x)), reduce_sum(h, {0}), reduce_sum(h * h));
    });
    auto [loss, bias, total] = f(distribute_tensor(ids, mesh, {Shard(0)}), distribute_tensor(logits, mesh, {Shard(0)}),
                                 distribute_tensor(h, mesh, {Shard(0)}));
    return std::vector<Array>{loss.full_tensor(), bias.full_tensor(), total.full_tensor()};
  };
  for (const bool deterministic : {false, true}) {
    if (deterministic) setenv("TESSERA_DETERMINISTIC", "1", 1);
    for (const int64_t n : {1, 2}) {
      INFO("devices ", n, " deterministic ", deterministic);
      const auto on_gpu = run(create_mesh({{"x", n}}, gpu_devices(int(n))), labels), on_cpu = run(cpu_mesh({{"x", n}}), labels);
      for (size_t i = 0; i < on_gpu.size(); ++i) {
        INFO("output ", i);
        if (deterministic) CHECK(same_array(on_gpu[i], on_cpu[i]));
        else CHECK(relative_difference(on_gpu[i], on_cpu[i]) < 1e-5);
      }
      // The first label out of range, in index order, is the one named.
      Array bad = labels.clone();
      bad.mutable_data<int64_t>()[3001] = 12;
      bad.mutable_data<int64_t>()[2222] = -1;
      auto message = [&](const Mesh& mesh) -> std::string {
        try {
          run(mesh, bad);
        } catch (const IndexError& e) {
          return e.what();
        }
        return "no error";
      };
      const std::string gpu_message = message(create_mesh({{"x", n}}, gpu_devices(int(n))));
      CHECK(gpu_message.find("label -1") != std::string::npos);
      CHECK(gpu_message == message(cpu_mesh({{"x", n}})));
    }
    unsetenv("TESSERA_DETERMINISTIC");
  }
}

TEST_CASE("a compiled step's runs replay as CUDA graphs: recorded once per set of buffers, the same bits as queued") {
  if (!CudaGraphRuns::enabled()) {
    MESSAGE("TESSERA_CUDA_GRAPHS=0: runs are not recorded");
    return;
  }
  const Mesh mesh = create_mesh({{"x", 1}}, gpu_devices(1));
  Array a = random_values({64, 48}, DType::f32, 41), w = random_values({48, 32}, DType::f32, 42);
  auto f = jit([](const Tensor& a, const Tensor& w) {
    Tensor h = relu(matmul(a, w) + 0.5f);
    return std::make_tuple(h * 2.0f, reduce_sum(h * h));
  });
  Tensor ta = distribute_tensor(a, mesh, {Replicate()}), tw = distribute_tensor(w, mesh, {Replicate()});
  auto [first, first_sum] = f(ta, tw);  // queued step by step
  const Array expected = first.full_tensor(), expected_sum = first_sum.full_tensor();
  for (int call = 0; call < 6; ++call) {  // recorded or replayed where the buffers repeat: the same bits
    auto [out, sum] = f(ta, tw);
    CHECK(same_array(out.full_tensor(), expected));
    CHECK(same_array(sum.full_tensor(), expected_sum));
  }
  // One output, dropped before the next call: the stream-ordered pool hands its memory back, so
  // the run's buffers repeat and the runs replay (gpu_bench's 20-op loop: 1,799 of 1,809 runs).
  auto single = jit([](const Tensor& a, const Tensor& w) { return relu(matmul(a, w) + 0.5f) * 2.0f; });
  const CudaGraphCounts before = cuda_graph_counts();
  for (int call = 0; call < 20; ++call) single(ta, tw);
  const CudaGraphCounts after = cuda_graph_counts();
  CHECK(after.recorded - before.recorded >= 1);
  CHECK(after.replayed - before.replayed >= 10);
  CHECK(relative_difference(single(ta, tw).full_tensor(), expected) < 1e-6);
  // New input values in the same buffers: a replay reads them (the recording holds addresses).
  const Mesh cpu = cpu_mesh({{"x", 1}});
  for (int step = 0; step < 4; ++step) {
    Array a2 = random_values({64, 48}, DType::f32, uint32_t(50 + step));
    Tensor moved = distribute_tensor(a2, mesh, {Replicate()});
    auto [out, sum] = f(moved, tw);
    auto [want, want_sum] = f(distribute_tensor(a2, cpu, {Replicate()}), distribute_tensor(w, cpu, {Replicate()}));
    CHECK(relative_difference(out.full_tensor(), want.full_tensor()) < 1e-5);
    CHECK(relative_difference(sum.full_tensor(), want_sum.full_tensor()) < 1e-5);
  }
}

TEST_CASE("memory_stats on GPU meshes: the MNIST step's peak device bytes are its plan's, to the byte") {
  // Device memory is charged to the device whose run allocates it (CudaDevice::allocate), so the
  // plan's exact-memory promise is checked on GPUs as on CPUs (test_planning).
  for (const int64_t n : {1, 2}) {
    CAPTURE(n);
    const Mesh mesh = create_mesh({{"batch", n}}, gpu_devices(int(n)));
    MnistTrainingStep step(mesh, false);
    check_plan_is_measured(mesh, [&] { return step.plan(); }, [&] { step.run(); });
  }
}

TEST_CASE("calibrate_gpu measures this GPU's rates onto a published profile: a valid profile that plans") {
  const Hardware base = published_hardware("h100-sxm");
  const Hardware measured = calibrate_gpu(base);
  CHECK(measured.name == "h100-sxm-measured");
  CHECK(measured.device == DeviceKind::GPU);
  CHECK(measured.memory_bytes == base.memory_bytes);  // kept: not measured
  CHECK(measured.intra_node == base.intra_node);
  CHECK(measured.launch_seconds > 0);
  CHECK(measured.gemm_rate(DType::bf16) > measured.gemm_rate(DType::f32));  // tensor cores
  CHECK(!measured.gemm_efficiency.empty());
  CHECK(measured.memory_bytes_per_second > 1e11);
  MESSAGE(hardware_to_json(measured));
  CHECK(hardware_from_json(hardware_to_json(measured)) == measured);
}

TEST_CASE("GPU device names that do not exist are typed errors naming the device") {
  const int64_t count = int64_t(gpu_devices().size());
  CHECK_THROWS_AS(create_mesh({{"x", 1}}, {"GPU:" + std::to_string(count + 7)}), MeshError);
  CHECK_THROWS_WITH_AS(gpu_devices(-1), doctest::Contains("negative"), DeviceError);
}

TEST_CASE("NCCL: a group of one client gives the CPU group's bits for every collective, dtype and op") {
  // A missing library is a typed error naming it, found before any GPU is touched.
  const char* chosen = std::getenv("TESSERA_NCCL_LIBRARY");
  const std::string before = chosen ? chosen : "";
  setenv("TESSERA_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  CHECK_THROWS_WITH_AS(create_nccl_communicator(world_clients(), 0), doctest::Contains("/nonexistent/libnccl.so.2"),
                       DeviceError);
  if (!before.empty()) setenv("TESSERA_NCCL_LIBRARY", before.c_str(), 1);
  else unsetenv("TESSERA_NCCL_LIBRARY");

  if (gpu_devices().empty()) {
    MESSAGE("skipped: this process has no GPU");
    return;
  }
  if (!NcclLibrary::get()) {
    MESSAGE("skipped: " << NcclLibrary::why_unavailable());
    return;
  }
  if (world_clients().size() != 1) {
    MESSAGE("skipped: the comparison runs in a group of one client (no mpirun)");
    return;
  }
  MESSAGE("NCCL version code " << NcclLibrary::get()->version);
  auto nccl = create_nccl_communicator(world_clients(), 0);
  REQUIRE(nccl->size() == 1);
  CHECK(nccl->rank() == 0);
  CHECK(nccl->memory_space() == MemorySpace::Cuda);
  const GroupFactory group = [&] { return std::vector<std::shared_ptr<Communicator>>{nccl}; };
  check_every_collective(1, group);
  // Rank-ordered: every reduction through device scratch and the ordered kernels.
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  check_every_collective(1, group);
  unsetenv("TESSERA_DETERMINISTIC");
  nccl->barrier();
}
